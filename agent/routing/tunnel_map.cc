#include "agent/routing/tunnel_map.h"

#include <arpa/inet.h>

#include <map>
#include <utility>

#include "spdlog/spdlog.h"

namespace sluice::agent {
namespace {

using Key = std::pair<uint32_t, uint32_t>;  // prefixlen, address (network order)

Key KeyOf(const IpPrefix& p) {
  return {static_cast<uint32_t>(p.length()), htonl(p.network().v4_host_order())};
}

}  // namespace

absl::StatusOr<TunnelMapChanges> ReconcileTunnelMap(maps::Tunnel4Map& map,
                                                    const std::vector<PeerNode>& peers,
                                                    bool allow_deletes) {
  std::map<Key, sluice_tunnel4_entry> want;
  for (const auto& p : peers) {
    if (!p.pod_cidr.network().is_v4() || !p.internal_ip.is_v4()) continue;
    sluice_tunnel4_entry e{};
    e.node_ip4 = htonl(p.internal_ip.v4_host_order());
    e.flags = SLUICE_TUNNEL_F_POD_CIDR;
    want[KeyOf(p.pod_cidr)] = e;
    e.flags = 0;
    want[{32, e.node_ip4}] = e;
  }
  std::map<Key, sluice_tunnel4_entry> have;
  auto st = map.ForEach([&](const sluice_lpm4_key& k, const sluice_tunnel4_entry& v) {
    have[{k.prefixlen, k.addr}] = v;
  });
  if (!st.ok()) return st;

  TunnelMapChanges changes;
  for (const auto& [key, entry] : want) {
    auto it = have.find(key);
    if (it != have.end() && it->second.node_ip4 == entry.node_ip4 &&
        it->second.flags == entry.flags) {
      continue;
    }
    if (auto up = map.Update(sluice_lpm4_key{key.first, key.second}, entry); !up.ok()) return up;
    ++changes.updated;
  }
  for (const auto& [key, entry] : have) {
    if (want.contains(key)) continue;
    if (!allow_deletes) {
      ++changes.kept_stale;
      continue;
    }
    if (auto del = map.Delete(sluice_lpm4_key{key.first, key.second}); !del.ok()) return del;
    ++changes.deleted;
  }
  if (changes.updated != 0 || changes.deleted != 0) {
    spdlog::info("tunnel map: {} peers, {} entries written, {} deleted", peers.size(),
                 changes.updated, changes.deleted);
  }
  return changes;
}

}  // namespace sluice::agent
