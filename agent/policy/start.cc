#include "agent/policy/start.h"

#include <set>
#include <string>
#include <utility>

#include "agent/k8s/watches.h"
#include "loader/datapath.h"

namespace sluice::agent {

namespace {

int AddPolicyCollector(metrics::Registry& registry, const PolicySync* sync,
                       const PolicyReconciler* reconciler, const k8s::EventPoster* events) {
  return registry.AddCollector([s = sync, r = reconciler, ev = events](metrics::ScrapeSink& out) {
    PolicySyncStats st = s->stats();
    PolicyApplyStats ap = r->stats();
    PolicyHealth health = s->health();
    const uint64_t degraded = health.degraded.size();
    out.Gauge("sluice_policy_endpoints",
              "This node's endpoints by policy state: healthy (the maps hold their policy whole) "
              "or degraded (they keep their last complete policy: the new one did not fit "
              "sluice_policy4 or a write failed)",
              {{"state", "healthy"}},
              static_cast<double>(health.endpoints > degraded ? health.endpoints - degraded : 0));
    out.Gauge("sluice_policy_endpoints", "", {{"state", "degraded"}},
              static_cast<double>(degraded));
    for (const auto& [id, d] : health.degraded) {
      out.Gauge("sluice_policy_endpoint_degraded",
                "1 for each endpoint that keeps its last complete policy, by pod and reason "
                "(map_full, write_failed)",
                {{"pod", d.pod}, {"reason", d.reason}}, 1);
    }
    std::set<std::string> invalid;
    for (const PolicyProblem& p : health.problems) {
      if (!p.policy.empty()) invalid.insert(p.policy);
    }
    for (const std::string& p : invalid) {
      out.Gauge("sluice_policy_invalid",
                "1 for each NetworkPolicy with parts the agent cannot translate (they allow "
                "nothing)",
                {{"policy", p}}, 1);
    }
    out.Gauge("sluice_policy_map_entries",
              "Entries of sluice_policy4 as the agent wrote them (all endpoints' allows)", {},
              static_cast<double>(ap.allow_entries));
    out.Gauge("sluice_policy_map_capacity", "max_entries of sluice_policy4 (--bpf_policy_max)", {},
              static_cast<double>(ap.allow_capacity));
    out.Counter("sluice_policy_rollbacks_total",
                "Allows deleted again because a later write of their endpoint's policy failed", {},
                static_cast<double>(ap.rollbacks));
    if (ev != nullptr) {
      k8s::EventPosterStats es = ev->stats();
      const std::pair<const char*, uint64_t> results[] = {
          {"posted", es.posted}, {"failed", es.failed}, {"dropped", es.dropped}};
      for (const auto& [result, n] : results) {
        out.Counter("sluice_agent_events_total", "Kubernetes Events the agent posted, by result",
                    {{"result", result}}, static_cast<double>(n));
      }
    }
    out.Counter("sluice_policy_applies_total",
                "NetworkPolicy translations written to the policy maps", {},
                static_cast<double>(st.applies));
    out.Counter("sluice_policy_problems_total",
                "Rejected NetworkPolicy parts (they allow nothing), counted once each "
                "time they appear",
                {}, static_cast<double>(st.problems));
    out.Counter("sluice_policy_skipped_updates_total",
                "Pod, Namespace and Node updates that change nothing policy reads (no "
                "translation run)",
                {}, static_cast<double>(st.skipped_updates));
    out.Counter("sluice_policy_identity_saves_total", "Writes of identities.json",
                {{"result", "ok"}}, static_cast<double>(st.identity_saves));
    out.Counter("sluice_policy_identity_saves_total", "Writes of identities.json",
                {{"result", "error"}}, static_cast<double>(st.identity_save_failures));
    out.Gauge("sluice_policy_identities", "Label-set identities numbered on this node", {},
              static_cast<double>(s->identity_count()));
    const std::pair<const char*, uint64_t> writes[] = {
        {"ipcache_upsert", ap.ipcache_writes},   {"ipcache_delete", ap.ipcache_deletes},
        {"allow_upsert", ap.allow_writes},       {"allow_delete", ap.allow_deletes},
        {"endpoint_upsert", ap.endpoint_writes}, {"endpoint_delete", ap.endpoint_deletes}};
    for (const auto& [op, n] : writes) {
      out.Counter("sluice_policy_map_writes_total",
                  "Policy map entries written or deleted by the agent", {{"op", op}},
                  static_cast<double>(n));
    }
  });
}

}  // namespace

std::unique_ptr<RunningPolicy> StartPolicy(const StartPieces& pieces, EndpointStore& store,
                                           EndpointService& service) {
  loader::Datapath& dp = *pieces.datapath;
  KubernetesState* kube = pieces.k8s;
  auto running = std::make_unique<RunningPolicy>();
  running->maps = std::make_unique<BpfPolicyMaps>(dp.ipcache4(), dp.policy4(), dp.policy_ep());
  running->reconciler = std::make_unique<PolicyReconciler>(*running->maps);
  running->events =
      std::make_unique<k8s::EventPoster>(kube->http(), kube->node_name(), pieces.clock);
  running->sync = std::make_unique<PolicySync>(
      PolicySources{kube->pods(), kube->namespaces(), kube->network_policies(), kube->nodes(),
                    store},
      [kube] {
        return kube->pods().HasSynced() && kube->namespaces().HasSynced() &&
               kube->network_policies().HasSynced() && kube->nodes().HasSynced();
      },
      *running->reconciler, kube->node_name(), pieces.state_dir, running->events.get());
  service.SetPolicyHook(running->sync.get());
  running->policy_metrics.emplace(
      *pieces.registry, AddPolicyCollector(*pieces.registry, running->sync.get(),
                                           running->reconciler.get(), running->events.get()));
  return running;
}

}  // namespace sluice::agent
