// sluice_tunnel4 (docs/routing.md): every other node's pod CIDR and address -> its address, kept
// equal to the Nodes the agent knows. Used by both routing modes.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "agent/routing/peer_routes.h"
#include "maps/sluice_maps.h"

namespace sluice::agent {

struct TunnelMapChanges {
  int updated = 0;
  int deleted = 0;
  int kept_stale = 0;  // not deleted because deletes were not yet allowed
};

// Makes sluice_tunnel4 hold, for each peer, pod CIDR -> address (SLUICE_TUNNEL_F_POD_CIDR) and
// address/32 -> address; entries already right are not rewritten. Until `allow_deletes` (the
// first full list of Nodes), entries of peers not in `peers` are kept, as peer routes are.
[[nodiscard]] absl::StatusOr<TunnelMapChanges> ReconcileTunnelMap(
    maps::Tunnel4Map& map, const std::vector<PeerNode>& peers, bool allow_deletes);

}  // namespace sluice::agent
