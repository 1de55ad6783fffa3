#include "agent/routing/start.h"

#include <vector>

namespace sluice::agent {

absl::StatusOr<Node> StartNode(const StartPieces& pieces, const NodeOptions& options,
                               const IpAddress& gateway) {
  auto node = SetUpNode(*pieces.netlink, *pieces.datapath, options, gateway,
                        /*prune_nomasq=*/pieces.k8s == nullptr);
  if (!node.ok()) return StartError(node.status(), "set up node");
  return node;
}

std::unique_ptr<PeerRouteSync> StartPeerRoutes(const StartPieces& pieces,
                                               const NodeOptions& options, bool direct_routes) {
  std::vector<IpPrefix> base = options.non_masquerade_cidrs;
  base.push_back(options.pod_cidr);
  return std::make_unique<PeerRouteSync>(
      *pieces.k8s, *pieces.netlink, pieces.datapath->nomasq(), pieces.datapath->tunnel4(), base,
      options.routing_mode == RoutingMode::kNative && direct_routes, pieces.clock);
}

}  // namespace sluice::agent
