// Direct routing between nodes on a shared L2: a route to every other node's pod CIDR via that
// node's InternalIP (as kindnet and Cilium's autoDirectNodeRoutes do), kept equal to the Nodes
// the agent knows, and told apart from other routes by kSluiceRouteProtocol.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "agent/endpoint/ipam.h"
#include "agent/kernel/netlink.h"

namespace sluice::agent {

struct PeerNode {
  std::string name;
  IpPrefix pod_cidr;
  IpAddress internal_ip;
};

struct PeerRouteChanges {
  int replaced = 0;
  int deleted = 0;
  int kept_stale = 0;  // not deleted because deletes were not yet allowed
};

// Makes Sluice's routes exactly `peers`. Until `allow_deletes` (the first full list of Nodes has
// been seen), routes of peers not in `peers` are kept: a restarted agent must not cut traffic to
// nodes it simply has not heard of yet.
[[nodiscard]] absl::StatusOr<PeerRouteChanges> ReconcilePeerRoutes(
    Netlink& netlink, const std::vector<PeerNode>& peers, bool allow_deletes);

}  // namespace sluice::agent
