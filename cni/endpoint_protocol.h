// Typed encode/decode of the endpoint API messages described in agent/endpoint/api_protocol.h, so the
// plugin (client side) and the agent (server side) share one implementation of the wire format.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cni/netconf.h"
#include "nlohmann/json.hpp"

namespace sluice::cni {

// The verbs forwarded to the agent (VERSION is answered by the plugin itself).
inline constexpr std::string_view kCommandAdd = "ADD";
inline constexpr std::string_view kCommandDel = "DEL";
inline constexpr std::string_view kCommandCheck = "CHECK";
inline constexpr std::string_view kCommandGc = "GC";
inline constexpr std::string_view kCommandStatus = "STATUS";
inline constexpr std::string_view kCommandVersion = "VERSION";

struct EndpointRequest {
  std::string command;       // "command"
  std::string container_id;  // "containerID"
  std::string netns;         // "netns": the path, for messages and records only
  std::string if_name;       // "ifName"
  std::string args;          // "args": CNI_ARGS verbatim
  nlohmann::json config;     // "config": the network configuration object, verbatim
  // "netnsFd": the plugin opened CNI_NETNS itself and passes the descriptor with the request
  // (SCM_RIGHTS on the socket). Absent or false: a plugin from before descriptors were passed,
  // whose ADD and CHECK the agent serves by opening the path itself.
  bool netns_fd = false;
};

[[nodiscard]] nlohmann::json EncodeRequest(const EndpointRequest& request);

// Decodes a request and validates it the way the plugin does before forwarding: a known command,
// the attachment parameters the command requires (container ID, netns, ifname), CNI_ARGS syntax,
// and a config object. Failures carry CNI codes (6 for undecodable bytes, 4 for bad parameters,
// 7 for a missing config); the config itself is parsed separately with NetConfFromJson().
[[nodiscard]] absl::StatusOr<EndpointRequest> ParseEndpointRequest(std::string_view bytes);

// Validates the attachment parameters for `request.command` (shared by plugin and agent). The
// messages name the CNI environment variable that carried the bad value.
[[nodiscard]] absl::Status ValidateAttachmentParameters(const EndpointRequest& request);

// One reply: ok with an optional result, or a CNI failure.
struct EndpointReply {
  bool ok = false;
  nlohmann::json result;  // null when absent
  CniFailure failure;     // meaningful when !ok
};

// {"ok":true,"result":...}; `result` null means "no result" (DEL, GC, STATUS).
[[nodiscard]] std::string EncodeSuccessReply(const nlohmann::json& result = nullptr);
// {"ok":false,"code":...,"msg":...,"details":...}.
[[nodiscard]] std::string EncodeFailureReply(const CniFailure& failure);
[[nodiscard]] std::string EncodeFailureReply(const absl::Status& status);

// Decodes a reply. A reply that is not JSON, lacks a boolean "ok", or (when not ok) lacks an
// integer "code" fails with kSluiceInternal.
[[nodiscard]] absl::StatusOr<EndpointReply> ParseEndpointReply(std::string_view bytes);

}  // namespace sluice::cni
