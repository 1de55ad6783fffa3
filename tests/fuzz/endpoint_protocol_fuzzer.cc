// libFuzzer target: the endpoint API's wire protocol (cni/protocol/wire.h), both directions.
//
// Agent side, as one connection is served: the request bytes are decoded once, the way
// agent/endpoint/api_server.cc's Serve() does (ParseEndpointRequest: bounded depth, an object,
// the attachment parameters), then the "config" the way EndpointService::Handle reads it
// (NetConfFromJson), and every failure is turned into the reply the agent would send, encoded
// once (EncodeReply). Plugin side: the same bytes as an agent reply (ParseEndpointReply).
//
// Invariants beyond "no crash, no leak, no UB":
//   - every reply the agent would send decodes as a reply on the plugin's side;
//   - an accepted request re-encoded by the plugin's EncodeRequest decodes to the same request;
//   - a prevResult the config carries survives ParseResult -> FormatResult(1.1.0) -> ParseResult;
//   - a decoded failure reply re-encoded by EncodeFailureReply decodes to the same failure.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cni/protocol/messages.h"
#include "cni/protocol/netconf.h"
#include "cni/protocol/wire.h"
#include "nlohmann/json.hpp"

namespace {

using nlohmann::json;
using namespace sluice::cni;

[[noreturn]] void Fail(const char* what) {
  fprintf(stderr, "endpoint_protocol_fuzzer: invariant broken: %s\n", what);
  abort();
}

// The agent's reply as it goes out (EncodeReply), which the plugin must be able to decode.
void Answer(const EndpointReply& reply) {
  absl::StatusOr<EndpointReply> read = ParseEndpointReply(EncodeReply(reply));
  if (!read.ok() || read->ok != reply.ok) Fail("a reply the agent sends does not decode");
}

bool SameRequest(const EndpointRequest& a, const EndpointRequest& b) {
  return a.command == b.command && a.container_id == b.container_id && a.netns == b.netns &&
         a.if_name == b.if_name && a.args == b.args && a.config == b.config;
}

void ServeRequest(std::string_view bytes) {
  // Decoded once, as agent/endpoint/api_server.cc decodes a request.
  absl::StatusOr<EndpointRequest> req = ParseEndpointRequest(bytes);
  if (!req.ok()) {
    Answer(FailureReply(req.status()));
    return;
  }
  absl::StatusOr<EndpointRequest> again = ParseEndpointRequest(EncodeRequest(*req).dump());
  if (!again.ok() || !SameRequest(*req, *again)) Fail("EncodeRequest does not round-trip");

  absl::StatusOr<NetConf> conf = NetConfFromJson(req->config);
  if (!conf.ok()) {
    Answer(FailureReply(conf.status()));
    return;
  }
  if (!conf->prev_result.is_null()) {
    absl::StatusOr<ResultV1> prev = ParseResult(conf->prev_result);
    if (!prev.ok()) Fail("NetConfFromJson accepted a prevResult ParseResult refuses");
    absl::StatusOr<ResultV1> back = ParseResult(FormatResult(*prev, kLatestCniVersion));
    if (!back.ok() || !(*back == *prev)) Fail("a Result does not round-trip through 1.1.0");
    // Older versions only drop fields; they must still parse.
    for (std::string_view version : SupportedVersions()) {
      if (!ParseResult(FormatResult(*prev, version)).ok()) Fail("FormatResult unparsable");
    }
  }
  Answer(SuccessReply(FormatResult(ResultV1{}, conf->cni_version)));
}

void ReadReply(std::string_view bytes) {
  absl::StatusOr<EndpointReply> reply = ParseEndpointReply(bytes);
  if (!reply.ok()) {
    if (CniFailureFromStatus(reply.status()).code != sluice::api::kSluiceInternal) {
      Fail("a malformed reply is not kSluiceInternal");
    }
    return;
  }
  if (reply->ok) return;
  absl::StatusOr<EndpointReply> back = ParseEndpointReply(EncodeFailureReply(reply->failure));
  if (!back.ok() || back->ok || !(back->failure == reply->failure)) {
    Fail("EncodeFailureReply does not round-trip");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  ServeRequest(bytes);
  ReadReply(bytes);
  return 0;
}
