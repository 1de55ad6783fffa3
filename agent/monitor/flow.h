// A flow: one datapath event (maps/events.h) decoded, timed on the wall clock and named from the
// agent's stores (pods, Services). Its JSON form (one object per line) is what `sluicectl
// observe -o json` prints and what the observe socket sends; docs/observe.md lists the fields.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "maps/events.h"
#include "nlohmann/json_fwd.hpp"

namespace sluice::monitor {

struct FlowPeer {
  std::string ip;          // "" when the packet had no IP header Sluice could read
  uint16_t port = 0;       // TCP/UDP/SCTP port; ICMP echo id for the source
  std::string namespace_;  // the pod's, when the address is a pod's
  std::string pod;         // the pod's name
};

struct Flow {
  absl::Time time;
  std::string node;
  std::string type;              // drop | policy | translate | close
  std::string verdict;           // forwarded | dropped
  std::string drop_reason;       // sluice_drop_reason_name (dropped flows only)
  std::string point;             // ingress | egress (drops: the hook's direction on `interface`)
  std::string policy_direction;  // ingress | egress (policy verdicts)
  bool policy_enforced = false;  // the policy direction is enforced (else the endpoint is open)
  uint32_t endpoint_id = 0;      // policy verdicts: the endpoint whose policy point judged
  uint32_t ifindex = 0;
  std::string interface;  // name of ifindex on this node, when it has one
  std::string protocol;   // tcp | udp | icmp | sctp | a number
  std::string tcp_flags;  // "SYN", "ACK|FIN", ...
  FlowPeer source;
  FlowPeer destination;
  // Service translations and closes: the Service (from the frontend's rev_nat_id) and backend.
  uint32_t rev_nat_id = 0;
  std::string service_namespace;
  std::string service;
  FlowPeer backend;
  uint32_t bytes = 0;
  uint32_t cpu = 0;
};

// The flow of a raw event, without names. `mono_to_wall` is added to the event's
// CLOCK_MONOTONIC time to place it on the wall clock.
Flow DecodeEvent(const sluice_event& e, absl::Duration mono_to_wall, const std::string& node);

// CLOCK_REALTIME - CLOCK_MONOTONIC now.
absl::Duration MonotonicToWallOffset();

nlohmann::json FlowToJson(const Flow& f);
absl::StatusOr<Flow> FlowFromJson(const nlohmann::json& j);

// "10.0.0.1", or "default/web-0" (pod), for tables.
std::string PeerText(const FlowPeer& p);

const char* ProtocolText(uint8_t proto, char (&buf)[8]);
std::string TcpFlagsText(uint8_t flags);

}  // namespace sluice::monitor
