#include "agent/routing/peer_route_sync.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "agent/metrics/agent_metrics.h"
#include "agent/metrics/health.h"
#include "agent/routing/node_setup.h"
#include "spdlog/spdlog.h"

namespace sluice::agent {
namespace {

// The fewest IPv4 prefixes covering exactly the addresses `prefixes` cover: a prefix inside
// another goes, two halves of one prefix become that prefix. sluice_nomasq4 answers only "is the
// destination in the set", so the datapath's answer is the same for every address. Pod CIDRs are
// carved in order from the cluster's range and node addresses come from a few subnets: the
// 2 x 5,000 prefixes of a 5,000-node cluster are a handful, where they overflowed the map's 1024
// entries at ~500 nodes (and the tunnel map, written after it, stayed empty). IPv6 prefixes pass
// unchanged.
std::vector<IpPrefix> Aggregate(const std::vector<IpPrefix>& prefixes) {
  std::vector<std::pair<uint32_t, int>> v4;  // (network, length), host order
  std::vector<IpPrefix> out;
  for (const auto& p : prefixes) {
    if (!p.network().is_v4()) {
      out.push_back(p);
      continue;
    }
    const int len = p.length();
    const uint32_t mask = len == 0 ? 0 : ~uint32_t{0} << (32 - len);
    v4.push_back({p.network().v4_host_order() & mask, len});
  }
  std::sort(v4.begin(), v4.end());
  std::vector<std::pair<uint32_t, int>> kept;  // sorted, none inside another, siblings merged
  auto end_of = [](const std::pair<uint32_t, int>& p) {
    return uint64_t{p.first} + (uint64_t{1} << (32 - p.second));
  };
  for (const auto& p : v4) {
    if (!kept.empty() && p.first < end_of(kept.back())) continue;  // inside the last one kept
    kept.push_back(p);
    while (kept.size() >= 2) {
      const auto& b = kept[kept.size() - 1];
      const auto& a = kept[kept.size() - 2];
      if (a.second != b.second || a.second == 0) break;
      const uint32_t half = uint32_t{1} << (32 - a.second);
      if ((a.first & half) != 0 || a.first + half != b.first) break;
      const std::pair<uint32_t, int> parent{a.first, a.second - 1};
      kept.pop_back();
      kept.back() = parent;
    }
  }
  for (const auto& [network, len] : kept) {
    if (auto p = IpPrefix::Make(IpAddress::V4(network), len); p.ok()) out.push_back(*p);
  }
  return out;
}

}  // namespace

PeerRouteSync::PeerRouteSync(KubernetesState& k8s, Netlink& netlink, maps::NoMasqMap& nomasq,
                             maps::Tunnel4Map& tunnel, std::vector<IpPrefix> base_nomasq,
                             bool direct_routes, const Clock* clock)
    : k8s_(k8s),
      netlink_(netlink),
      nomasq_(nomasq),
      tunnel_(tunnel),
      base_nomasq_(std::move(base_nomasq)),
      direct_routes_(direct_routes),
      clock_(clock) {
  k8s_.nodes().AddListener([this](const k8s::Change<k8s::Node>& change) {
    // A Node's status moves all the time (every kubelet's heartbeat, its conditions): an update
    // that keeps what Peers() reads runs no pass, which reads both maps whole and writes every
    // never-masqueraded prefix (at 5,000 nodes ~20,000 LPM-trie syscalls per heartbeat).
    if (change.type == k8s::ChangeType::kUpdated && change.old_obj && change.new_obj &&
        change.old_obj->pod_cidrs == change.new_obj->pod_cidrs &&
        change.old_obj->internal_ips == change.new_obj->internal_ips) {
      return;
    }
    absl::MutexLock l(&mu_);
    dirty_ = true;
  });
  thread_ = std::thread([this] { Run(); });
}

PeerRouteSync::~PeerRouteSync() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  thread_.join();
}

std::vector<PeerNode> PeerRouteSync::Peers() {
  std::vector<PeerNode> peers;
  for (const auto& node : k8s_.nodes().List()) {
    if (node->meta.name == k8s_.node_name() || node->pod_cidrs.empty() ||
        node->internal_ips.empty()) {
      continue;
    }
    auto cidr = IpPrefix::Parse(node->pod_cidrs.front());
    auto ip = IpAddress::Parse(node->internal_ips.front());
    if (!cidr.ok() || !ip.ok() || !cidr->network().is_v4() || !ip->is_v4()) continue;
    peers.push_back({node->meta.name, *cidr, *ip});
  }
  return peers;
}

void PeerRouteSync::Run() {
  bool was_synced = false;
  // After a failure the whole pass is retried a second later; a Node change meanwhile is not
  // held back by the wait (the maps must follow a node within a second even while, say, a
  // route to an unreachable peer keeps failing).
  std::optional<absl::Time> retry_at;
  std::unique_ptr<metrics::Heartbeat> beat =
      metrics::DefaultHeartbeats().Register("peer routes", metrics::kLoopWedgedAfter);
  while (true) {
    beat->Beat();
    {
      absl::MutexLock l(&mu_);
      // Wake on a Node change, on stop, or to notice the first full sync of every kind.
      mu_.AwaitWithTimeout(absl::Condition(
                               +[](PeerRouteSync* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
                                 return s->dirty_ || s->stop_;
                               },
                               this),
                           absl::Milliseconds(200));
      if (stop_) return;
      bool synced = k8s_.synced();
      bool retry = retry_at.has_value() && clock_->Now() >= *retry_at;
      if (!dirty_ && synced == was_synced && !retry) continue;
      dirty_ = false;
      was_synced = synced;
    }
    if (!k8s_.nodes().HasSynced()) continue;
    std::vector<PeerNode> peers = Peers();
    std::vector<IpPrefix> nomasq = base_nomasq_;
    for (const auto& p : peers) {
      nomasq.push_back(p.pod_cidr);
      // Without connection tracking, a pod's reply to another node (e.g. its kubelet probing it)
      // must keep the pod's address: that node routes pod CIDRs, not masqueraded ports.
      if (auto host = IpPrefix::Make(p.internal_ip, 32); host.ok()) nomasq.push_back(*host);
    }
    // Never-masqueraded first: a new peer's traffic must not be NATed once the datapath sends
    // it there (its tunnel entry or route).
    const absl::Time started = clock_->Now();
    absl::Status st = ReconcileNoMasquerade(nomasq_, Aggregate(nomasq), was_synced);
    if (st.ok()) st = ReconcileTunnelMap(tunnel_, peers, was_synced).status();
    // Without direct routes, Sluice's routes of an earlier configuration go (once synced).
    if (st.ok()) {
      st = ReconcilePeerRoutes(netlink_, direct_routes_ ? peers : std::vector<PeerNode>{},
                               was_synced)
               .status();
    }
    metrics::ObserveReconcile("routing", clock_->Now() - started, st.ok());
    if (!st.ok()) {
      spdlog::warn("peers: {}; retrying in 1s", st.ToString());
      retry_at = clock_->Now() + absl::Seconds(1);
    } else {
      retry_at.reset();
    }
  }
}

}  // namespace sluice::agent
