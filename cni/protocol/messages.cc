#include "cni/protocol/messages.h"

#include <utility>

#include "cni/protocol/strings.h"

namespace sluice::cni {
namespace {

using json = nlohmann::json;

bool IsForwardedCommand(std::string_view command) {
  return command == kCommandAdd || command == kCommandDel || command == kCommandCheck ||
         command == kCommandGc || command == kCommandStatus;
}

absl::Status ReadString(const json& object, std::string_view key, std::string& out) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_string()) {
    return CniStatus(api::kCniDecodeFailure,
                     StrCat("endpoint request field \"", key, "\" must be a string"));
  }
  out = it->get<std::string>();
  return absl::OkStatus();
}

absl::Status MalformedReply(std::string_view why, std::string_view bytes) {
  constexpr size_t kMaxQuoted = 512;
  return CniStatus(api::kSluiceInternal, StrCat("malformed reply from sluice-agent: ", why),
                   bytes.substr(0, kMaxQuoted));
}

}  // namespace

json EncodeRequest(const EndpointRequest& request) {
  json encoded = {{"command", request.command}, {"containerID", request.container_id},
                  {"netns", request.netns},     {"ifName", request.if_name},
                  {"args", request.args},       {"config", request.config}};
  if (request.netns_fd) encoded["netnsFd"] = true;
  return encoded;
}

absl::Status ValidateAttachmentParameters(const EndpointRequest& request) {
  if (!IsForwardedCommand(request.command)) {
    return CniStatus(api::kCniInvalidEnvironment,
                     StrCat("CNI_COMMAND \"", request.command,
                            "\" is not one of ADD, DEL, CHECK, GC, STATUS, VERSION"));
  }
  const bool per_attachment = request.command == kCommandAdd || request.command == kCommandDel ||
                              request.command == kCommandCheck;
  if (per_attachment) {
    if (absl::Status s = ValidateContainerId(request.container_id); !s.ok()) return s;
    if (absl::Status s = ValidateInterfaceName(request.if_name); !s.ok()) return s;
    if (absl::Status s = ValidateAttachmentKeyLength(request.container_id, request.if_name);
        !s.ok()) {
      return s;
    }
  }
  if (request.netns_fd && request.command != kCommandAdd && request.command != kCommandCheck) {
    return CniStatus(api::kCniInvalidEnvironment,
                     StrCat(request.command, " takes no network namespace descriptor (only ADD "
                                             "and CHECK carry one)"));
  }
  if (request.command == kCommandAdd || request.command == kCommandCheck) {
    if (request.netns.empty()) {
      return CniStatus(api::kCniInvalidEnvironment,
                       StrCat("CNI_NETNS is required for ", request.command));
    }
  }
  if (absl::Status s = ValidateNetnsPath(request.netns); !s.ok()) return s;
  if (absl::StatusOr<std::map<std::string, std::string>> args = ParseCniArgs(request.args);
      !args.ok()) {
    return args.status();
  }
  return absl::OkStatus();
}

absl::StatusOr<EndpointRequest> ParseEndpointRequest(std::string_view bytes) {
  absl::StatusOr<json> parsed = ParseJsonBounded(bytes, "endpoint request");
  if (!parsed.ok()) return parsed.status();
  json& value = *parsed;
  if (!value.is_object()) {
    return CniStatus(api::kCniDecodeFailure, "endpoint request is not a JSON object");
  }
  EndpointRequest request;
  for (auto [key, field] : {std::pair<std::string_view, std::string*>{"command", &request.command},
                            {"containerID", &request.container_id},
                            {"netns", &request.netns},
                            {"ifName", &request.if_name},
                            {"args", &request.args}}) {
    if (absl::Status s = ReadString(value, key, *field); !s.ok()) return s;
  }
  if (auto fd = value.find("netnsFd"); fd != value.end() && !fd->is_null()) {
    if (!fd->is_boolean()) {
      return CniStatus(api::kCniDecodeFailure, "endpoint request field \"netnsFd\" must be a boolean");
    }
    request.netns_fd = fd->get<bool>();
  }
  auto config = value.find("config");
  if (config == value.end() || !config->is_object()) {
    return CniStatus(api::kCniInvalidNetworkConfig,
                     "endpoint request needs the network configuration object in \"config\"");
  }
  request.config = std::move(*config);
  if (absl::Status s = ValidateAttachmentParameters(request); !s.ok()) return s;
  return request;
}

EndpointReply SuccessReply(json result) {
  EndpointReply reply;
  reply.ok = true;
  reply.result = std::move(result);
  return reply;
}

EndpointReply FailureReply(const absl::Status& status) {
  EndpointReply reply;
  reply.failure = CniFailureFromStatus(status);
  return reply;
}

std::string EncodeReply(const EndpointReply& reply) {
  return reply.ok ? EncodeSuccessReply(reply.result) : EncodeFailureReply(reply.failure);
}

std::string EncodeSuccessReply(const json& result) {
  json reply = {{"ok", true}};
  if (!result.is_null()) reply["result"] = result;
  return reply.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string EncodeFailureReply(const CniFailure& failure) {
  json reply = {{"ok", false}, {"code", failure.code}, {"msg", failure.msg}};
  if (!failure.details.empty()) reply["details"] = failure.details;
  return reply.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string EncodeFailureReply(const absl::Status& status) {
  return EncodeFailureReply(CniFailureFromStatus(status));
}

absl::StatusOr<EndpointReply> ParseEndpointReply(std::string_view bytes) {
  absl::StatusOr<json> parsed = ParseJsonBounded(bytes, "reply");
  if (!parsed.ok() || !parsed->is_object()) {
    std::string why = bytes.empty()  ? "empty reply"
                      : parsed.ok() ? "not a JSON object"
                                    : std::string(parsed.status().message());
    return MalformedReply(why, bytes);
  }
  const json& value = *parsed;
  auto ok = value.find("ok");
  if (ok == value.end() || !ok->is_boolean()) return MalformedReply("no boolean \"ok\"", bytes);
  EndpointReply reply;
  reply.ok = ok->get<bool>();
  if (reply.ok) {
    if (auto result = value.find("result"); result != value.end()) {
      if (!result->is_object() && !result->is_null()) {
        return MalformedReply("\"result\" is not an object", bytes);
      }
      reply.result = *result;
    }
    return reply;
  }
  auto code = value.find("code");
  if (code == value.end() || !code->is_number_integer()) {
    return MalformedReply("failure without an integer \"code\"", bytes);
  }
  reply.failure.code = code->get<int>();
  if (auto msg = value.find("msg"); msg != value.end() && msg->is_string()) {
    reply.failure.msg = msg->get<std::string>();
  }
  if (auto details = value.find("details"); details != value.end() && details->is_string()) {
    reply.failure.details = details->get<std::string>();
  }
  return reply;
}

}  // namespace sluice::cni
