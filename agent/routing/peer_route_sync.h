// Keeps this node's view of the other nodes (the peer map sluice_tunnel4, routes to their pod
// CIDRs in native mode with direct routes, the never-masqueraded destinations) equal to the Node
// objects the agent watches.
#pragma once

#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "agent/base/clock.h"
#include "agent/base/net.h"
#include "agent/k8s/watches.h"
#include "agent/kernel/netlink.h"
#include "agent/routing/peer_routes.h"
#include "agent/routing/tunnel_map.h"
#include "maps/sluice_maps.h"

namespace sluice::agent {

// Keeps sluice_tunnel4 (every peer's pod CIDR and address), the routes to other nodes' pod CIDRs
// (only with `direct_routes`, native mode's autoDirectNodeRoutes; otherwise Sluice's routes of an
// earlier configuration are removed), and the never-masqueraded destinations (this node's `base`
// prefixes plus every peer's pod CIDR and address: traffic between pods and the cluster's nodes
// keeps its addresses) equal to the Node objects: reconciles on every Node change, on its own
// thread, deleting only once every watch has synced.
class PeerRouteSync {
 public:
  PeerRouteSync(KubernetesState& k8s, Netlink& netlink, maps::NoMasqMap& nomasq,
                maps::Tunnel4Map& tunnel, std::vector<IpPrefix> base_nomasq, bool direct_routes,
                const Clock* clock = RealClock::Get());
  ~PeerRouteSync();

 private:
  void Run();
  std::vector<PeerNode> Peers();

  KubernetesState& k8s_;
  Netlink& netlink_;
  maps::NoMasqMap& nomasq_;
  maps::Tunnel4Map& tunnel_;
  const std::vector<IpPrefix> base_nomasq_;
  const bool direct_routes_;
  const Clock* const clock_;
  absl::Mutex mu_;
  bool dirty_ ABSL_GUARDED_BY(mu_) = true;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace sluice::agent
