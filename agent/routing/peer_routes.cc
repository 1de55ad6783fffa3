#include "agent/routing/peer_routes.h"

#include <map>

#include "spdlog/spdlog.h"

namespace sluice::agent {

absl::StatusOr<PeerRouteChanges> ReconcilePeerRoutes(Netlink& netlink,
                                                     const std::vector<PeerNode>& peers,
                                                     bool allow_deletes) {
  PeerRouteChanges changes;
  auto current = netlink.ListPeerRoutes();
  if (!current.ok()) return current.status();
  std::map<IpPrefix, IpAddress> have;
  for (const auto& r : *current) {
    if (r.gateway) have[r.dst] = *r.gateway;
  }
  std::map<IpPrefix, const PeerNode*> want;
  for (const auto& p : peers) want[p.pod_cidr] = &p;

  for (const auto& [cidr, peer] : want) {
    auto it = have.find(cidr);
    if (it != have.end() && it->second == peer->internal_ip) continue;
    if (auto st = netlink.ReplacePeerRoute(cidr, peer->internal_ip); !st.ok()) return st;
    spdlog::info("route {} via {} (node {})", cidr.ToString(), peer->internal_ip.ToString(),
                 peer->name);
    ++changes.replaced;
  }
  for (const auto& [cidr, via] : have) {
    if (want.contains(cidr)) continue;
    if (!allow_deletes) {
      ++changes.kept_stale;
      continue;
    }
    if (auto st = netlink.DeletePeerRoute(cidr); !st.ok()) return st;
    spdlog::info("route {} via {} removed: no such node", cidr.ToString(), via.ToString());
    ++changes.deleted;
  }
  return changes;
}

}  // namespace sluice::agent
