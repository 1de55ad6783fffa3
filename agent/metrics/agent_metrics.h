// The agent's own metrics, recorded where things happen: reconcile latency per subsystem (the
// controller loops), CNI requests through the endpoint API, and collectors for the Kubernetes
// watches and the endpoint count. All on metrics::Default() unless a registry is given.
#pragma once

#include <functional>
#include <string>

#include "absl/time/time.h"
#include "agent/base/clock.h"
#include "agent/metrics/registry.h"
#include "cni/protocol/messages.h"

namespace sluice::agent {
class KubernetesState;
}

namespace sluice::metrics {

// How long a loop may go without finishing an iteration before /healthz calls it wedged.
inline constexpr absl::Duration kLoopWedgedAfter = absl::Minutes(3);

// One reconcile of `subsystem` ("services", "policy", "routing"): the latency histogram
// sluice_reconcile_duration_seconds and, when it failed, sluice_reconcile_errors_total.
void ObserveReconcile(const std::string& subsystem, absl::Duration took, bool ok,
                      Registry& registry = Default());

// Wraps the endpoint API's handler (agent/endpoint/api_server.h):
// sluice_cni_request_duration_seconds{command} and sluice_cni_request_errors_total{command} (a
// failure reply), timed on `clock`. `fd` is the descriptor the request carried, passed through.
using EndpointHandler =
    std::function<cni::EndpointReply(const cni::EndpointRequest& request, int fd)>;
EndpointHandler InstrumentEndpointApi(EndpointHandler handler, Registry& registry = Default(),
                                      const Clock* clock = RealClock::Get());

// Watch events, relists and errors per resource from the reflectors, and whether each watch
// has completed its first list. `k8s` must outlive the registry's scrapes (RemoveCollector).
int AddKubernetesCollector(Registry& registry, const agent::KubernetesState* k8s);

// sluice_endpoints: the local endpoints (pod interfaces) the agent holds.
int AddEndpointCountCollector(Registry& registry, std::function<size_t()> count);

}  // namespace sluice::metrics
