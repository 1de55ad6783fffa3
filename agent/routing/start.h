// Routing as the agent runs it: the node set up (agent/routing/node_setup.h), then, with
// Kubernetes, the peer map and the never-masqueraded set following the Node objects.
#pragma once

#include <memory>

#include "agent/routing/node_setup.h"
#include "agent/routing/peer_route_sync.h"
#include "agent/start/pieces.h"

namespace sluice::agent {

// The node's device, addresses and MTU; without Kubernetes the never-masqueraded set is pruned to
// this node's (no other node's pod CIDR is known).
[[nodiscard]] absl::StatusOr<Node> StartNode(const StartPieces& pieces, const NodeOptions& options,
                                             const IpAddress& gateway);

// Needs the pieces' Kubernetes state. With `direct_routes` (native routing only) it also routes
// every other node's pod CIDR via its InternalIP.
[[nodiscard]] std::unique_ptr<PeerRouteSync> StartPeerRoutes(const StartPieces& pieces,
                                                             const NodeOptions& options,
                                                             bool direct_routes);

}  // namespace sluice::agent
