#include "agent/metrics/agent_metrics.h"

#include <chrono>

#include "agent/k8s/watches.h"
#include "nlohmann/json.hpp"

namespace sluice::metrics {

void ObserveReconcile(const std::string& subsystem, absl::Duration took, bool ok,
                      Registry& registry) {
  Labels l = {{"subsystem", subsystem}};
  registry
      .GetHistogram("sluice_reconcile_duration_seconds",
                    "Time one reconcile of a subsystem took (kernel state made equal to the "
                    "desired state), per subsystem",
                    l)
      .Observe(absl::ToDoubleSeconds(took));
  Counter& errors = registry.GetCounter("sluice_reconcile_errors_total",
                                        "Reconciles that failed (and are retried)", l);
  if (!ok) errors.Inc();
}

EndpointHandler InstrumentEndpointApi(EndpointHandler handler, Registry& registry,
                                      const Clock* clock) {
  return [handler = std::move(handler), &registry, clock](const cni::EndpointRequest& req,
                                                          int fd) {
    const absl::Time start = clock->Now();
    cni::EndpointReply reply = handler(req, fd);
    std::string command = req.command;
    if (command != "ADD" && command != "DEL" && command != "CHECK" && command != "GC" &&
        command != "STATUS") {
      command = "unknown";  // keeps the label set bounded whatever a client sends
    }
    Labels l = {{"command", command}};
    registry
        .GetHistogram("sluice_cni_request_duration_seconds",
                      "Time the agent took to answer a CNI request (ADD returns once the pod's "
                      "interface, maps, programs and policy are in place), per command",
                      l)
        .Observe(absl::ToDoubleSeconds(clock->Now() - start));
    Counter& errors = registry.GetCounter("sluice_cni_request_errors_total",
                                          "CNI requests answered with an error, per command", l);
    if (!reply.ok) errors.Inc();
    return reply;
  };
}

int AddKubernetesCollector(Registry& registry, const agent::KubernetesState* k8s) {
  return registry.AddCollector([k8s](ScrapeSink& out) {
    for (const auto& w : k8s->watch_states()) {
      Labels l = {{"resource", w.kind}};
      const k8s::ReflectorCounters& c = w.counters;
      out.Counter("sluice_k8s_watch_events_total",
                  "Watch events (ADDED, MODIFIED, DELETED) applied to the agent's store, per "
                  "resource",
                  l, static_cast<double>(c.events));
      out.Counter("sluice_k8s_relists_total",
                  "Lists after the first (410 Gone, expired continue tokens, restarts), per "
                  "resource",
                  l, static_cast<double>(c.relists));
      out.Counter("sluice_k8s_errors_total",
                  "Failed list/watch requests (transport failures, non-2xx answers, undecodable "
                  "items or events), per resource",
                  l, static_cast<double>(c.transport_errors + c.http_errors + c.decode_errors));
      out.Counter("sluice_k8s_decode_errors_total",
                  "Objects, list items and watch events of the resource the agent could not "
                  "decode (each refused, logged once; a DELETED one still acts on its identity)",
                  l, static_cast<double>(c.decode_errors));
      out.Gauge("sluice_k8s_watch_synced",
                "1 once the resource's first full list is in the store, else 0", l,
                w.synced ? 1 : 0);
    }
  });
}

int AddEndpointCountCollector(Registry& registry, std::function<size_t()> count) {
  return registry.AddCollector([count = std::move(count)](ScrapeSink& out) {
    out.Gauge("sluice_endpoints", "Local endpoints (pod interfaces) the agent holds", {},
              static_cast<double>(count()));
  });
}

}  // namespace sluice::metrics
