// cluster-pool IPAM, the allocation itself (a pure function, the core of sluice-operator): which
// per-node CIDR each Node without one gets, carved out of clusterPoolIPv4PodCIDRList at
// clusterPoolIPv4MaskSize. The API is the only state: a Node's spec.podCIDR, once set, is its
// allocation (kept across operator restarts and failover, never changed); a deleted Node's CIDR
// is free again because no Node holds it. The operator around it (leader election through a
// coordination.k8s.io Lease, the PATCH of spec.podCIDR) is operator.h.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/base/net.h"

namespace sluice::agent {

struct ClusterPool {
  std::vector<IpPrefix> pools;  // IPv4
  int mask_size = 24;           // each node's prefix length, >= every pool's, <= 30

  // Checks the pools (IPv4, non-overlapping, no longer than mask_size) and mask_size.
  [[nodiscard]] static absl::StatusOr<ClusterPool> Make(std::vector<IpPrefix> pools, int mask_size);
};

struct PoolAllocation {
  std::map<std::string, IpPrefix> assign;  // node -> the CIDR to write into its spec.podCIDR
  std::vector<std::string> exhausted;      // nodes left without one: the pools are full
  // Nodes whose existing spec.podCIDR the pool does not account for (outside every pool, not
  // of mask_size, or held by another node too): reported, never changed; their space is taken.
  std::vector<std::string> foreign;
  size_t free_after = 0;  // node CIDRs still free once `assign` is written
};

// `nodes`: every Node's name and spec.podCIDR ("" when it has none). Deterministic: nodes are
// served in name order, each the lowest free CIDR.
PoolAllocation AllocateNodeCidrs(const ClusterPool& pool,
                                 const std::map<std::string, std::string>& nodes);

}  // namespace sluice::agent
