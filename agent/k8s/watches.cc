#include "agent/k8s/watches.h"

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace sluice::agent {

absl::StatusOr<std::unique_ptr<KubernetesState>> KubernetesState::Start(
    const KubernetesOptions& options) {
  auto config = k8s::LoadClientConfig(options.config);
  if (!config.ok()) return config.status();
  std::unique_ptr<KubernetesState> k(new KubernetesState());
  k->node_name_ = options.node_name;
  k->clock_ = options.clock;
  spdlog::info("kubernetes: apiserver {} ({}), node {}", config->server, config->source,
               options.node_name);
  k->http_ = std::make_unique<k8s::HttpClient>(*config);

  auto add = [&](std::unique_ptr<k8s::ReflectorSink> sink, k8s::ReflectorOptions opts) {
    k->reflectors_.push_back(
        std::make_unique<k8s::Reflector>(k->http_.get(), std::move(sink), opts));
  };
  k8s::ReflectorOptions proxied;
  proxied.clock = options.clock;
  k8s::ReflectorOptions all;
  all.clock = options.clock;
  proxied.label_selector = k8s::kServiceProxyLabelSelector;
  add(std::make_unique<k8s::StoreSink<k8s::Service>>(&k->services_), proxied);
  add(std::make_unique<k8s::StoreSink<k8s::EndpointSlice>>(&k->slices_), proxied);
  add(std::make_unique<k8s::StoreSink<k8s::Pod>>(&k->pods_), all);
  add(std::make_unique<k8s::StoreSink<k8s::Namespace>>(&k->namespaces_), all);
  add(std::make_unique<k8s::StoreSink<k8s::Node>>(&k->nodes_), all);
  add(std::make_unique<k8s::StoreSink<k8s::NetworkPolicy>>(&k->policies_), all);
  for (auto& r : k->reflectors_) r->Start();
  return k;
}

std::vector<KubernetesState::WatchState> KubernetesState::watch_states() const {
  // The reflectors were added in this order (Start).
  const bool synced[] = {services_.HasSynced(),   slices_.HasSynced(), pods_.HasSynced(),
                         namespaces_.HasSynced(), nodes_.HasSynced(),  policies_.HasSynced()};
  std::vector<WatchState> out;
  for (size_t i = 0; i < reflectors_.size(); ++i) {
    out.push_back({std::string(reflectors_[i]->kind()), i < std::size(synced) && synced[i],
                   reflectors_[i]->counters()});
  }
  return out;
}

KubernetesState::~KubernetesState() {
  for (auto& r : reflectors_) r->Stop();
}

absl::StatusOr<IpPrefix> KubernetesState::WaitForPodCidr(absl::Duration timeout) {
  const absl::Time deadline = clock_->Now() + timeout;
  absl::Time next_log = clock_->Now();
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
    if (clock_->Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no pod CIDR for Node ", node_name_, " after ", absl::FormatDuration(timeout),
          nodes_.HasSynced() ? " (the Node has no spec.podCIDR)" : " (Nodes not listed yet)"));
    }
    if (clock_->Now() >= next_log) {
      spdlog::info("waiting for Node {} and its spec.podCIDR", node_name_);
      next_log = clock_->Now() + absl::Seconds(10);
    }
    // The store offers change listeners, not a wait; poll it briefly.
    absl::SleepFor(absl::Milliseconds(50));
  }
}

}  // namespace sluice::agent
