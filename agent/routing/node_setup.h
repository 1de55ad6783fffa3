// The node-wide part of the datapath: forwarding on, the node's addressing in sluice_node, the
// never-masqueraded destinations, the masquerade programs on the native device, and in tunnel
// mode the VXLAN device (agent/routing/overlay.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/endpoint/ipam.h"
#include "agent/kernel/netlink.h"
#include "agent/routing/overlay.h"
#include "loader/datapath.h"

namespace sluice::agent {

struct NodeOptions {
  IpPrefix pod_cidr;
  std::string native_device;  // empty: the device of the IPv4 default route
  std::string node_ip;        // empty: the native device's first IPv4 address
  bool masquerade = true;
  std::vector<IpPrefix> non_masquerade_cidrs;  // besides the pod CIDR
  uint16_t nat_port_min = 61000;
  uint16_t nat_port_max = 65535;
  std::optional<IpPrefix> service_cidr;  // ClusterIP range: unallocated addresses are dropped
  // The agent's default is tunnel (--routing_mode); set up without one, a node routes natively.
  RoutingMode routing_mode = RoutingMode::kNative;
  uint16_t tunnel_port = kDefaultTunnelPort;  // VXLAN UDP port (tunnel mode)
};

struct Node {
  IpPrefix pod_cidr;
  IpAddress gateway;
  IpAddress node_ip;
  std::string native_device;
  int native_ifindex = 0;
  uint32_t native_mtu = 0;
  int tunnel_ifindex = 0;  // the VXLAN device (tunnel mode), else 0
};

// Parses "61000-65535".
[[nodiscard]] absl::Status ParsePortRange(absl::string_view text, uint16_t* min, uint16_t* max);

// Idempotent: a restarted agent rewrites the same values and re-attaches (replacing) programs.
// With `prune_nomasq` false (the never-masqueraded set also holds other nodes' pod CIDRs, known
// only once Nodes are listed) entries are only added here.
[[nodiscard]] absl::StatusOr<Node> SetUpNode(Netlink& netlink, loader::Datapath& dp,
                                             const NodeOptions& options, const IpAddress& gateway,
                                             bool prune_nomasq);

// Makes sluice_nomasq4 hold every prefix of `want`; with `allow_deletes`, nothing else.
[[nodiscard]] absl::Status ReconcileNoMasquerade(maps::NoMasqMap& nomasq,
                                                 const std::vector<IpPrefix>& want,
                                                 bool allow_deletes);

}  // namespace sluice::agent
