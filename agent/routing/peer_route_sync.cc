#include "agent/routing/peer_route_sync.h"

#include <optional>
#include <utility>

#include "agent/metrics/agent_metrics.h"
#include "agent/metrics/health.h"
#include "agent/routing/node_setup.h"
#include "spdlog/spdlog.h"

namespace sluice::agent {

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
  k8s_.nodes().AddListener([this](const k8s::Change<k8s::Node>&) {
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
    absl::Status st = ReconcileNoMasquerade(nomasq_, nomasq, was_synced);
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
