// Keeps this node's routes to the other nodes and its never-masqueraded destinations equal to
// the Node objects the agent watches.
#pragma once

#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "agent/base/net.h"
#include "agent/k8s/watches.h"
#include "agent/kernel/netlink.h"
#include "agent/routing/peer_routes.h"
#include "maps/sluice_maps.h"

namespace sluice::agent {

// Keeps the routes to other nodes' pod CIDRs, and the never-masqueraded destinations (this
// node's `base` prefixes plus every peer's pod CIDR and address: traffic between pods and the
// cluster's nodes keeps its addresses),
// equal to the Node objects: reconciles on every Node change, on its own thread, deleting only
// once every watch has synced.
class PeerRouteSync {
 public:
  PeerRouteSync(KubernetesState& k8s, Netlink& netlink, maps::NoMasqMap& nomasq,
                std::vector<IpPrefix> base_nomasq);
  ~PeerRouteSync();

 private:
  void Run();
  std::vector<PeerNode> Peers();

  KubernetesState& k8s_;
  Netlink& netlink_;
  maps::NoMasqMap& nomasq_;
  const std::vector<IpPrefix> base_nomasq_;
  absl::Mutex mu_;
  bool dirty_ ABSL_GUARDED_BY(mu_) = true;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace sluice::agent
