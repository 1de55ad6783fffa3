#include "agent/policy/start.h"

#include <utility>

#include "agent/k8s/watches.h"
#include "loader/datapath.h"

namespace sluice::agent {

namespace {

int AddPolicyCollector(metrics::Registry& registry, const PolicySync* sync,
                       const PolicyReconciler* reconciler) {
  return registry.AddCollector([s = sync, r = reconciler](metrics::ScrapeSink& out) {
    PolicySyncStats st = s->stats();
    PolicyApplyStats ap = r->stats();
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
  running->sync = std::make_unique<PolicySync>(
      PolicySources{kube->pods(), kube->namespaces(), kube->network_policies(), kube->nodes(),
                    store},
      [kube] {
        return kube->pods().HasSynced() && kube->namespaces().HasSynced() &&
               kube->network_policies().HasSynced() && kube->nodes().HasSynced();
      },
      *running->reconciler, kube->node_name(), pieces.state_dir);
  service.SetPolicyHook(running->sync.get());
  running->policy_metrics.emplace(
      *pieces.registry,
      AddPolicyCollector(*pieces.registry, running->sync.get(), running->reconciler.get()));
  return running;
}

}  // namespace sluice::agent
