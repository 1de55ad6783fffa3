#include "agent/kubernetes.h"

#include "absl/strings/str_cat.h"
#include "agent/node.h"
#include "spdlog/spdlog.h"

namespace sluice::agent {

absl::StatusOr<std::unique_ptr<KubernetesState>> KubernetesState::Start(
    const KubernetesOptions& options) {
  auto config = k8s::LoadClientConfig(options.config);
  if (!config.ok()) return config.status();
  std::unique_ptr<KubernetesState> k(new KubernetesState());
  k->node_name_ = options.node_name;
  spdlog::info("kubernetes: apiserver {} ({}), node {}", config->server, config->source,
               options.node_name);
  k->http_ = std::make_unique<k8s::HttpClient>(*config);

  auto add = [&](std::unique_ptr<k8s::ReflectorSink> sink, k8s::ReflectorOptions opts) {
    k->reflectors_.push_back(
        std::make_unique<k8s::Reflector>(k->http_.get(), std::move(sink), opts));
  };
  k8s::ReflectorOptions proxied;
  proxied.label_selector = k8s::kServiceProxyLabelSelector;
  add(std::make_unique<k8s::StoreSink<k8s::Service>>(&k->services_), proxied);
  add(std::make_unique<k8s::StoreSink<k8s::EndpointSlice>>(&k->slices_), proxied);
  add(std::make_unique<k8s::StoreSink<k8s::Pod>>(&k->pods_), {});
  add(std::make_unique<k8s::StoreSink<k8s::Namespace>>(&k->namespaces_), {});
  add(std::make_unique<k8s::StoreSink<k8s::Node>>(&k->nodes_), {});
  add(std::make_unique<k8s::StoreSink<k8s::NetworkPolicy>>(&k->policies_), {});
  for (auto& r : k->reflectors_) r->Start();
  return k;
}

KubernetesState::~KubernetesState() {
  for (auto& r : reflectors_) r->Stop();
}

absl::StatusOr<IpPrefix> KubernetesState::WaitForPodCidr(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Time next_log = absl::Now();
  while (true) {
    if (nodes_.HasSynced()) {
      for (const auto& node : nodes_.List()) {
        if (node->meta.name != node_name_ || node->pod_cidrs.empty()) continue;
        auto cidr = IpPrefix::Parse(node->pod_cidrs.front());
        if (!cidr.ok()) {
          return absl::InvalidArgumentError(absl::StrCat("Node ", node_name_, " spec.podCIDR ",
                                                         node->pod_cidrs.front(), ": ",
                                                         cidr.status().message()));
        }
        return *cidr;
      }
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no pod CIDR for Node ", node_name_, " after ", absl::FormatDuration(timeout),
          nodes_.HasSynced() ? " (the Node has no spec.podCIDR)" : " (Nodes not listed yet)"));
    }
    if (absl::Now() >= next_log) {
      spdlog::info("waiting for Node {} and its spec.podCIDR", node_name_);
      next_log = absl::Now() + absl::Seconds(10);
    }
    // The store offers change listeners, not a wait; poll it briefly.
    absl::SleepFor(absl::Milliseconds(50));
  }
}

PeerRouteSync::PeerRouteSync(KubernetesState& k8s, Netlink& netlink, maps::NoMasqMap& nomasq,
                             std::vector<IpPrefix> base_nomasq)
    : k8s_(k8s), netlink_(netlink), nomasq_(nomasq), base_nomasq_(std::move(base_nomasq)) {
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
  while (true) {
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
      if (!dirty_ && synced == was_synced) continue;
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
    // Never-masqueraded first: a new peer's traffic must not be NATed once its route exists.
    absl::Status st = ReconcileNoMasquerade(nomasq_, nomasq, was_synced);
    auto changes = st.ok() ? ReconcilePeerRoutes(netlink_, peers, was_synced)
                           : absl::StatusOr<PeerRouteChanges>(st);
    if (!changes.ok()) {
      spdlog::warn("peer routes: {}; retrying in 1s", changes.status().ToString());
      absl::SleepFor(absl::Seconds(1));
      absl::MutexLock l(&mu_);
      dirty_ = true;
    }
  }
}

}  // namespace sluice::agent
