// libFuzzer target: the endpoint API's wire protocol (agent/endpoint/api_protocol.h), both directions.
//
// Agent side, as one connection is served: the request bytes are parsed the way
// agent/endpoint/api_server.cc's Serve() does (nlohmann, no exceptions, must be an object), then
// decoded the way EndpointService::Handle does before it acts (ParseEndpointRequest of the
// re-serialised object, NetConfFromJson of its "config"), and every failure is turned into the
// reply the agent would send. Plugin side: the same bytes as an agent reply (ParseEndpointReply).
//
// Invariants beyond "no crash, no leak, no UB":
//   - every reply the agent would send is valid JSON it can parse itself (Handle re-parses it);
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
#include "agent/endpoint/api_protocol.h"
#include "cni/endpoint_protocol.h"
#include "cni/netconf.h"
#include "nlohmann/json.hpp"

namespace {

using nlohmann::json;
using namespace sluice::cni;

[[noreturn]] void Fail(const char* what) {
  fprintf(stderr, "endpoint_protocol_fuzzer: invariant broken: %s\n", what);
  abort();
}

// What the server writes back (api_server.cc's Dump: never throws on a handler's strings).
std::string Dump(const json& reply) {
  return reply.dump(-1, ' ', false, json::error_handler_t::replace);
}

// EndpointService::Handle re-parses every encoded reply; a reply it cannot parse would become an
// exception (answered as "agent error") instead of the CNI error the client deserves.
json Reply(const std::string& encoded) {
  json reply = json::parse(encoded, nullptr, /*allow_exceptions=*/false);
  if (reply.is_discarded() || !reply.is_object()) Fail("an encoded reply is not a JSON object");
  return reply;
}

bool SameRequest(const EndpointRequest& a, const EndpointRequest& b) {
  return a.command == b.command && a.container_id == b.container_id && a.netns == b.netns &&
         a.if_name == b.if_name && a.args == b.args && a.config == b.config;
}

void ServeRequest(std::string_view bytes) {
  // Depth-bounded, as agent/endpoint/api_server.cc parses a request.
  absl::StatusOr<json> parsed = ParseJsonBounded(bytes, "request");
  if (!parsed.ok() || !parsed->is_object()) return;  // answered by the server itself
  const json& request = *parsed;

  absl::StatusOr<EndpointRequest> req = ParseEndpointRequest(request.dump());
  if (!req.ok()) {
    (void)Dump(Reply(EncodeFailureReply(req.status())));
    return;
  }
  absl::StatusOr<EndpointRequest> again = ParseEndpointRequest(EncodeRequest(*req).dump());
  if (!again.ok() || !SameRequest(*req, *again)) Fail("EncodeRequest does not round-trip");

  absl::StatusOr<NetConf> conf = NetConfFromJson(req->config);
  if (!conf.ok()) {
    (void)Dump(Reply(EncodeFailureReply(conf.status())));
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
  (void)Dump(Reply(EncodeSuccessReply(FormatResult(ResultV1{}, conf->cni_version))));
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
