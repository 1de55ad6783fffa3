#include "agent/operator/cluster_pool.h"

#include <algorithm>
#include <cstdint>
#include <set>

#include "absl/strings/str_cat.h"

namespace sluice::agent {
namespace {

uint64_t First(const IpPrefix& p) { return p.network().v4_host_order(); }
uint64_t Last(const IpPrefix& p) { return First(p) + (uint64_t{1} << (32 - p.length())) - 1; }

}  // namespace

absl::StatusOr<ClusterPool> ClusterPool::Make(std::vector<IpPrefix> pools, int mask_size) {
  if (pools.empty()) return absl::InvalidArgumentError("no pool (clusterPoolIPv4PodCIDRList)");
  if (mask_size < 8 || mask_size > 30) {
    return absl::InvalidArgumentError(
        absl::StrCat("mask size /", mask_size, ": want /8 to /30 (a /30 holds one pod)"));
  }
  std::sort(pools.begin(), pools.end());
  for (size_t i = 0; i < pools.size(); ++i) {
    const IpPrefix& p = pools[i];
    if (!p.network().is_v4()) {
      return absl::InvalidArgumentError(absl::StrCat("pool ", p.ToString(), ": IPv4 only"));
    }
    if (p.length() > mask_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("pool ", p.ToString(), " is smaller than one node's /", mask_size));
    }
    if (i > 0 && First(p) <= Last(pools[i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("pools ", pools[i - 1].ToString(), " and ", p.ToString(), " overlap"));
    }
  }
  return ClusterPool{std::move(pools), mask_size};
}

PoolAllocation AllocateNodeCidrs(const ClusterPool& pool,
                                 const std::map<std::string, std::string>& nodes) {
  PoolAllocation out;
  const uint64_t block = uint64_t{1} << (32 - pool.mask_size);
  auto in_pool = [&](const IpPrefix& p) {
    return std::any_of(pool.pools.begin(), pool.pools.end(), [&](const IpPrefix& q) {
      return First(p) >= First(q) && Last(p) <= Last(q);
    });
  };
  // Taken: the first address of every block a Node already holds (a foreign CIDR takes every
  // block it touches).
  std::set<uint64_t> taken;
  std::map<uint64_t, int> holders;
  std::vector<std::string> waiting;
  for (const auto& [name, cidr] : nodes) {
    if (cidr.empty()) {
      waiting.push_back(name);
      continue;
    }
    auto p = IpPrefix::Parse(cidr);
    if (p.ok() && p->network().is_v4() && p->length() == pool.mask_size && in_pool(*p)) {
      if (++holders[First(*p)] == 2) out.foreign.push_back(name);  // a duplicate: reported
      taken.insert(First(*p));
      continue;
    }
    out.foreign.push_back(name);
    if (p.ok() && p->network().is_v4()) {
      for (uint64_t a = First(*p) & ~(block - 1); a <= Last(*p); a += block) taken.insert(a);
    }
  }
  // Lowest free block first, pool by pool.
  auto next = waiting.begin();
  for (const IpPrefix& q : pool.pools) {
    for (uint64_t a = First(q); a + block - 1 <= Last(q); a += block) {
      if (taken.contains(a)) continue;
      if (next == waiting.end()) {
        ++out.free_after;
        continue;
      }
      out.assign.emplace(*next++,
                         *IpPrefix::Make(IpAddress::V4(static_cast<uint32_t>(a)), pool.mask_size));
    }
  }
  out.exhausted.assign(next, waiting.end());
  std::sort(out.foreign.begin(), out.foreign.end());
  return out;
}

}  // namespace sluice::agent
