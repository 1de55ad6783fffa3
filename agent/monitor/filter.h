// Which flows an observer wants, as `hubble observe` reads its flags: every option given must
// match (AND), any of the values given for one option may (OR); a pod, namespace, IP or port
// matches the flow's source, its destination or, for a Service translation, its backend.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/monitor/flow.h"
#include "nlohmann/json_fwd.hpp"

namespace sluice::monitor {

struct FlowFilter {
  std::vector<std::string> pods;  // "namespace/name", or "name" in namespace default
  std::vector<std::string> namespaces;
  std::vector<std::string> ips;  // an address or a CIDR
  std::vector<uint16_t> ports;
  std::vector<std::string> protocols;     // tcp, udp, icmp, sctp
  std::string verdict;                    // "", forwarded, dropped
  std::vector<std::string> drop_reasons;  // sluice_drop_reason_name spellings
  std::vector<std::string> services;      // "namespace/name", or "name" in namespace default
  std::vector<std::string> types;         // drop, policy, translate, close

  bool empty() const;
};

bool Matches(const FlowFilter& filter, const Flow& flow);

nlohmann::json FilterToJson(const FlowFilter& filter);
// Checks every value (a known verdict, protocol, drop reason and type, IPs and CIDRs that parse),
// so a typo is an error rather than a filter that matches nothing.
absl::StatusOr<FlowFilter> FilterFromJson(const nlohmann::json& j);

}  // namespace sluice::monitor
