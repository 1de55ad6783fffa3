// The agent's view of Kubernetes: one reflector per kind the agent reads (Services and
// EndpointSlices filtered as kube-proxy does, Pods, Namespaces, Nodes, NetworkPolicies), their
// typed stores, and the gate that says when every one has completed its first full list.
// The agent's features (service/, routing/, ...) read these stores and listen to their changes.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "agent/base/clock.h"
#include "agent/base/net.h"
#include "agent/k8s/config.h"
#include "agent/k8s/http_client.h"
#include "agent/k8s/model.h"
#include "agent/k8s/reflector.h"
#include "agent/k8s/store.h"

namespace sluice::agent {

struct KubernetesOptions {
  k8s::ConfigOptions config;
  std::string node_name;
  const Clock* clock = RealClock::Get();  // the reflectors' back-off and the waits; borrowed
};

class KubernetesState {
 public:
  // Loads the client configuration and starts every reflector.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<KubernetesState>> Start(
      const KubernetesOptions& options);
  ~KubernetesState();

  // Waits until Nodes are listed and this node has a pod CIDR; the apiserver may be absent for a
  // while (the reflectors retry with back-off).
  [[nodiscard]] absl::StatusOr<IpPrefix> WaitForPodCidr(absl::Duration timeout);
  // Waits for the first full list of every kind.
  bool WaitForSync(absl::Duration timeout) { return gate_.WaitAllSynced(timeout); }
  bool synced() const { return gate_.AllSynced(); }

  k8s::Store<k8s::Node>& nodes() { return nodes_; }
  k8s::Store<k8s::Service>& services() { return services_; }
  k8s::Store<k8s::EndpointSlice>& endpoint_slices() { return slices_; }
  k8s::Store<k8s::Pod>& pods() { return pods_; }
  k8s::Store<k8s::Namespace>& namespaces() { return namespaces_; }
  k8s::Store<k8s::NetworkPolicy>& network_policies() { return policies_; }
  const std::string& node_name() const { return node_name_; }

  // Per watched kind, for metrics and readiness: the store's name, whether its first list is
  // complete, and its reflector's counters.
  struct WatchState {
    std::string kind;
    bool synced = false;
    k8s::ReflectorCounters counters;
  };
  std::vector<WatchState> watch_states() const;
  const k8s::ClientConfig& client_config() const { return http_->config(); }
  // The client the reflectors use, for the agent's few writes (Events).
  k8s::HttpClient& http() { return *http_; }

 private:
  KubernetesState() = default;

  std::string node_name_;
  const Clock* clock_ = RealClock::Get();
  k8s::SyncGate gate_;
  k8s::Store<k8s::Service> services_{&gate_};
  k8s::Store<k8s::EndpointSlice> slices_{&gate_};
  k8s::Store<k8s::Pod> pods_{&gate_};
  k8s::Store<k8s::Namespace> namespaces_{&gate_};
  k8s::Store<k8s::Node> nodes_{&gate_};
  k8s::Store<k8s::NetworkPolicy> policies_{&gate_};
  std::unique_ptr<k8s::HttpClient> http_;
  std::vector<std::unique_ptr<k8s::Reflector>> reflectors_;
};

}  // namespace sluice::agent
