// libFuzzer target: apiserver response bodies through the agent's Kubernetes decoding path, as a
// reflector runs it (agent/k8s/reflector.cc): a list body through ListFramer, its metadata into
// ListMeta and every item into a StoreSink<T>; a watch stream through EventFramer, every event
// into RawEvent and then by type: ADDED/MODIFIED/DELETED into the sink, BOOKMARK's
// resourceVersion, ERROR's Status. Every input is tried as an error body (Status), as a list body
// and as a watch stream, for every kind the agent watches.
//
// Beyond "no crash, no leak, no UB", it checks that framing does not depend on how the body is cut
// into reads: the bytes are also fed in pieces (sizes derived from the input) and must give the
// same items, events and verdict as one Feed of the whole body.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "agent/k8s/decode.h"
#include "agent/k8s/framing.h"
#include "agent/k8s/model.h"
#include "agent/k8s/reflector.h"
#include "agent/k8s/store.h"

namespace sluice::k8s {
namespace {

[[noreturn]] void Fail(const char* what) {
  fprintf(stderr, "k8s_decode_fuzzer: invariant broken: %s\n", what);
  abort();
}

// Piece sizes for a chunked feed: 1..64 bytes, from a cheap hash of the input so that a given
// input always splits the same way (reproducible crashes) while different inputs split differently.
std::vector<std::string_view> Pieces(std::string_view body) {
  uint32_t h = 2166136261u;
  for (unsigned char c : body) h = (h ^ c) * 16777619u;
  std::vector<std::string_view> out;
  while (!body.empty()) {
    h = h * 1103515245u + 12345u;
    const size_t n = std::min<size_t>(body.size(), 1 + (h >> 16) % 64);
    out.push_back(body.substr(0, n));
    body.remove_prefix(n);
  }
  return out;
}

struct Framed {
  std::string metadata;
  std::vector<std::string> objects;
  bool ok = true;
  bool partial = false;
};

Framed FrameList(const std::vector<std::string_view>& pieces) {
  Framed out;
  ListFramer framer;
  ListFramer::Callbacks cb;
  cb.on_metadata = [&](std::string_view json) {
    out.metadata = std::string(json);
    return absl::OkStatus();
  };
  cb.on_item = [&](std::string_view json) {
    out.objects.emplace_back(json);
    return absl::OkStatus();
  };
  for (std::string_view piece : pieces) {
    if (!framer.Feed(piece, cb).ok()) {
      out.ok = false;
      return out;
    }
  }
  out.ok = framer.Finish().ok();
  return out;
}

Framed FrameWatch(const std::vector<std::string_view>& pieces) {
  Framed out;
  EventFramer framer;
  auto on_object = [&](std::string_view json) {
    out.objects.emplace_back(json);
    return absl::OkStatus();
  };
  for (std::string_view piece : pieces) {
    if (!framer.Feed(piece, on_object).ok()) {
      out.ok = false;
      return out;
    }
  }
  out.partial = framer.HasPartial();
  return out;
}

bool SameFraming(const Framed& a, const Framed& b) {
  return a.ok == b.ok && a.partial == b.partial && a.metadata == b.metadata &&
         a.objects == b.objects;
}

// One store per kind, as the agent keeps them (fresh for every input, so a crash reproduces
// from its input alone).
struct Stores {
  Store<Service> services;
  Store<EndpointSlice> slices;
  Store<Pod> pods;
  Store<Namespace> namespaces;
  Store<Node> nodes;
  Store<NetworkPolicy> policies;
  std::vector<std::unique_ptr<ReflectorSink>> sinks;

  Stores() {
    sinks.push_back(std::make_unique<StoreSink<Service>>(&services));
    sinks.push_back(std::make_unique<StoreSink<EndpointSlice>>(&slices));
    sinks.push_back(std::make_unique<StoreSink<Pod>>(&pods));
    sinks.push_back(std::make_unique<StoreSink<Namespace>>(&namespaces));
    sinks.push_back(std::make_unique<StoreSink<Node>>(&nodes));
    sinks.push_back(std::make_unique<StoreSink<NetworkPolicy>>(&policies));
  }
};

void DecodeList(const Framed& list, Decoder& decoder, Stores& stores) {
  ListMeta meta;
  if (!list.metadata.empty()) (void)decoder.Decode(list.metadata, &meta);
  for (auto& sink : stores.sinks) {
    sink->BeginList();
    for (const std::string& item : list.objects) (void)sink->AddListItem(item, decoder);
    if (list.ok) sink->CommitList(meta.resource_version);
  }
}

void DecodeWatch(const Framed& watch, Decoder& decoder, Stores& stores) {
  for (const std::string& json : watch.objects) {
    RawEvent ev;
    if (!decoder.Decode(json, &ev).ok()) return;  // the reflector ends the stream here
    switch (ev.type) {
      case EventType::kAdded:
      case EventType::kModified:
      case EventType::kDeleted:
        for (auto& sink : stores.sinks) {
          std::string rv;
          (void)sink->ApplyEvent(ev.type, ev.object_json, decoder, &rv);
        }
        break;
      case EventType::kBookmark: {
        std::string rv;
        (void)decoder.DecodeResourceVersion(ev.object_json, &rv);
        break;
      }
      case EventType::kError: {
        ApiStatus st;
        (void)decoder.Decode(ev.object_json, &st);
        (void)st.IsExpired();
        (void)st.IsTooLargeResourceVersion();
        return;  // nothing after an ERROR is trusted
      }
      case EventType::kUnknown:
        break;
    }
  }
}

}  // namespace
}  // namespace sluice::k8s

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sluice::k8s;
  Stores stores;
  static Decoder* decoder = new Decoder();
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const std::vector<std::string_view> whole = {body};
  const std::vector<std::string_view> pieces = Pieces(body);

  // A non-2xx response body is decoded as a Status (reflector.cc's ResponseStatus).
  ApiStatus status;
  (void)decoder->Decode(body, &status);

  const Framed list = FrameList(whole);
  if (!SameFraming(list, FrameList(pieces))) Fail("list framing depends on read boundaries");
  DecodeList(list, *decoder, stores);

  const Framed watch = FrameWatch(whole);
  if (!SameFraming(watch, FrameWatch(pieces))) Fail("watch framing depends on read boundaries");
  DecodeWatch(watch, *decoder, stores);

  // A fresh decoder must agree with the long-lived one (no state leaks between documents).
  for (const std::string& item : list.objects) {
    Service a, b;
    Decoder fresh;
    const bool ok_a = decoder->Decode(item, &a).ok();
    const bool ok_b = fresh.Decode(item, &b).ok();
    if (ok_a != ok_b || (ok_a && !(a == b))) Fail("decoding depends on the decoder's history");
  }
  return 0;
}
