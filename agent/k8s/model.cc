#include "agent/k8s/model.h"

#include <netinet/in.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace sluice::k8s {

std::string ObjectMeta::Key() const {
  if (namespace_.empty()) return name;
  return absl::StrCat(namespace_, "/", name);
}

std::string_view ProtocolName(Protocol p) {
  switch (p) {
    case Protocol::kTCP:
      return "TCP";
    case Protocol::kUDP:
      return "UDP";
    case Protocol::kSCTP:
      return "SCTP";
    case Protocol::kUnknown:
      break;
  }
  return "Unknown";
}

Protocol ParseProtocol(std::string_view s) {
  if (s.empty() || s == "TCP") return Protocol::kTCP;
  if (s == "UDP") return Protocol::kUDP;
  if (s == "SCTP") return Protocol::kSCTP;
  return Protocol::kUnknown;
}

bool ApiStatus::IsExpired() const {
  return code == 410 || reason == "Expired" || reason == "Gone";
}

bool ApiStatus::IsTooLargeResourceVersion() const {
  if (code != 504 && reason != "Timeout") return false;
  return std::find(cause_reasons.begin(), cause_reasons.end(), "ResourceVersionTooLarge") !=
         cause_reasons.end();
}

std::optional<uint8_t> IpProtocolNumber(Protocol p) {
  switch (p) {
    case Protocol::kTCP:
      return IPPROTO_TCP;
    case Protocol::kUDP:
      return IPPROTO_UDP;
    case Protocol::kSCTP:
      return IPPROTO_SCTP;
    case Protocol::kUnknown:
      break;
  }
  return std::nullopt;
}

}  // namespace sluice::k8s
