#include "agent/metrics/start.h"

#include "agent/metrics/agent_metrics.h"

namespace sluice::metrics {

RunningMetrics::RunningMetrics(bool with_kubernetes, const std::string& bpffs_root)
    : ready(with_kubernetes), recent_drops({.bpffs_root = bpffs_root}) {}

void RunningMetrics::WatchKubernetes(agent::KubernetesState* k8s, Registry& registry) {
  ready.SetKubernetes(k8s);
  watch_metrics.emplace(registry, AddKubernetesCollector(registry, k8s));
}

absl::StatusOr<std::unique_ptr<RunningMetrics>> StartMetrics(const agent::StartPieces& pieces,
                                                             const MetricsStartOptions& options) {
  auto running = std::make_unique<RunningMetrics>(options.with_kubernetes, options.bpffs_root);
  AgentReadiness* ready = &running->ready;
  std::vector<Route> routes;
  if (options.services_route) {
    routes.push_back({"/v1/services", [ready, route = options.services_route] {
                        return route(ready->kubernetes());
                      }});
  }
  auto endpoints = AgentEndpoints::Start({.health_address = options.health_address,
                                          .metrics_address = options.metrics_address,
                                          .config_json = RunningConfigJson,
                                          .recent_drops = &running->recent_drops,
                                          .extra_routes = std::move(routes)},
                                         ready->readiness(), DefaultHeartbeats(), *pieces.registry);
  if (!endpoints.ok()) return agent::StartError(endpoints.status(), "serve health and metrics");
  running->endpoints = std::move(*endpoints);
  return running;
}

}  // namespace sluice::metrics
