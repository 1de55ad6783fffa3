// sluice-operator's HTTP endpoints, for its Deployment's probes and Prometheus: /healthz (the
// process answers and its election runs), /readyz (a follower is ready; the leader once its last
// allocation round could list the Nodes) and /metrics (the Operator's counters at scrape time).
// docs/metrics.md lists the metrics.
#pragma once

#include <vector>

#include "agent/metrics/http_server.h"
#include "agent/metrics/registry.h"
#include "agent/operator/operator.h"

namespace sluice::agent {

// /healthz and /readyz over `op`, which must outlive the routes.
std::vector<metrics::Route> OperatorHealthRoutes(const Operator& op);

// Adds the collector of sluice_operator_* to `registry`; `op` must outlive it.
void AddOperatorCollector(const Operator& op, metrics::Registry& registry);

}  // namespace sluice::agent
