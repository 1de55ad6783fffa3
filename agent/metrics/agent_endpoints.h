// What sluice-agent serves over HTTP, from two flags: --health_address (default
// 127.0.0.1:9879: /healthz, /readyz, /config) and --metrics_address (default off: /metrics).
// The same address for both serves all four routes from one listener.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "agent/metrics/health.h"
#include "agent/metrics/http_server.h"
#include "agent/metrics/registry.h"

namespace sluice::agent {
class KubernetesState;
}

namespace sluice::metrics {

class DropWindow;

// The agent's readiness, filled in as start-up proceeds: the datapath loaded, (with Kubernetes)
// every watch listed, the endpoint API serving and the CNI configuration installed.
class AgentReadiness {
 public:
  explicit AgentReadiness(bool with_kubernetes);
  Milestone datapath_loaded, cni_installed;
  // Requires that the agent's state (IPAM reservations, endpoint records), which every CNI ADD
  // writes, can be written in `state_dir`: a write probe at every check (agent/base/files.h).
  void RequireWritableStateDir(const std::string& state_dir);
  void SetKubernetes(agent::KubernetesState* k8s) { k8s_.store(k8s); }
  agent::KubernetesState* kubernetes() const { return k8s_.load(); }
  const Readiness& readiness() const { return readiness_; }

 private:
  Readiness readiness_;
  std::atomic<agent::KubernetesState*> k8s_{nullptr};
  absl::Mutex probe_mu_;  // one probe at a time: they write the same file
};

struct AgentEndpointOptions {
  std::string health_address;   // "" = no health server
  std::string metrics_address;  // "" = no metrics
  // The running configuration, JSON (`sluicectl config`): version and every flag's value.
  std::function<std::string()> config_json;
  // /v1/drops (drops of the last minute) when set.
  DropWindow* recent_drops = nullptr;
  // More GET routes on the health server (the agent's /v1/services).
  std::vector<Route> extra_routes;
};

// {"version": "0.1.0 (git ...)", "flags": {"bpffs_root": "/sys/fs/bpf/sluice", ...}}: every
// flag of the binary (not abseil's) with its current value.
std::string RunningConfigJson();

class AgentEndpoints {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<AgentEndpoints>> Start(
      const AgentEndpointOptions& options, const Readiness& readiness,
      const Heartbeats& beats = DefaultHeartbeats(), const Registry& registry = Default());
  int health_port() const { return health_ ? health_->port() : 0; }
  int metrics_port() const;

 private:
  std::unique_ptr<HttpServer> health_;
  std::unique_ptr<HttpServer> metrics_;
  bool shared_ = false;
};

// A collector that is removed from its registry when this goes out of scope: declare it after
// whatever the collector reads, so no scrape outlives it.
class ScopedCollector {
 public:
  ScopedCollector(Registry& registry, int id) : registry_(&registry), id_(id) {}
  ~ScopedCollector() { registry_->RemoveCollector(id_); }
  ScopedCollector(const ScopedCollector&) = delete;
  ScopedCollector& operator=(const ScopedCollector&) = delete;

 private:
  Registry* registry_;
  int id_;
};

}  // namespace sluice::metrics
