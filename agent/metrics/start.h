// The agent's probes and metrics as it runs them: readiness, the drops of the last minute, and
// the health and metrics servers, started first so that the agent answers /healthz while it
// waits for the rest.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "agent/metrics/agent_endpoints.h"
#include "agent/metrics/drop_window.h"
#include "agent/metrics/http_server.h"
#include "agent/start/pieces.h"

namespace sluice::metrics {

struct MetricsStartOptions {
  bool with_kubernetes = false;  // readiness waits for the watches to sync
  std::string bpffs_root;        // where the drop window reads the datapath's counters
  std::string health_address;    // "" = no health server
  std::string metrics_address;   // "" = no metrics
  // /v1/services on the health server, given the agent's Kubernetes state (null: none yet).
  std::function<HttpReply(agent::KubernetesState*)> services_route;
};

struct RunningMetrics {
  RunningMetrics(bool with_kubernetes, const std::string& bpffs_root);

  // Readiness follows the watches of `k8s` from now on, and /metrics counts them.
  void WatchKubernetes(agent::KubernetesState* k8s, Registry& registry);

  AgentReadiness ready;
  DropWindow recent_drops;
  std::unique_ptr<AgentEndpoints> endpoints;  // reads ready and recent_drops: declared after them
  std::optional<ScopedCollector> watch_metrics;
};

// Serves the probes and metrics: alive from now on, ready once every step is.
[[nodiscard]] absl::StatusOr<std::unique_ptr<RunningMetrics>> StartMetrics(
    const agent::StartPieces& pieces, const MetricsStartOptions& options);

}  // namespace sluice::metrics
