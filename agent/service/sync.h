// Keeps the Service load balancer maps equal to the Services and EndpointSlices the agent watches:
// store listeners mark Services dirty (keys "namespace/name"), a controller (agent/controller/)
// translates and applies them in batches through the ServiceReconciler. Nothing is applied (so
// nothing is deleted) before every watch has synced; then everything is applied once and stale
// state restored from the maps is pruned. After each batch the Services' names go to
// <state_dir>/services.json (name_file.h), which sluicectl reads while the agent is down, and
// the frontends that do not fit in the maps to <state_dir>/services-unprogrammed.json, which
// `sluicectl services` lists; their counts are the gauges sluice_services_unprogrammed and
// sluice_services_truncated of the default metrics registry.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/base/clock.h"
#include "agent/controller/controller.h"
#include "agent/k8s/model.h"
#include "agent/k8s/store.h"
#include "agent/metrics/agent_endpoints.h"
#include "agent/service/health_check.h"
#include "agent/service/name_file.h"
#include "agent/service/reconciler.h"
#include "agent/service/refusals.h"
#include "agent/service/translator.h"

namespace sluice::agent {

class ServiceSync {
 public:
  // `synced` says whether every watch has completed its first list (KubernetesState::synced).
  // `health` may be null (no health-check listeners). `state_dir` "" keeps the Service names in
  // memory only.
  ServiceSync(k8s::Store<k8s::Service>& services, k8s::Store<k8s::EndpointSlice>& slices,
              std::function<bool()> synced, ServiceReconciler& reconciler,
              HealthCheckServers* health, NodeContext node, std::string state_dir = "",
              const Clock* clock = RealClock::Get());
  ServiceSync(const ServiceSync&) = delete;
  ServiceSync& operator=(const ServiceSync&) = delete;

  // Waits until every change seen so far has been applied and, once synced, stale state pruned.
  bool WaitIdle(absl::Duration timeout) { return controller_->WaitIdle(timeout); }
  bool pruned() const { return controller_->primed(); }
  uint64_t applies() const { return controller_->reconciled(); }  // Services applied so far
  // What the translator refused so far, per reason (each refusal counted once per object).
  RefusalCounts refusals() const { return refusals_.counts(); }
  // <state_dir>/services-unprogrammed.json as last written (also with no state_dir).
  std::string UnprogrammedJson() const {
    absl::MutexLock l(&unprogrammed_mu_);
    return unprogrammed_json_;
  }

 private:
  absl::Status Reconcile(const controller::Batch& batch);
  void PublishUnprogrammed();
  std::optional<ServiceTranslation> Translate(const std::string& service);

  const Clock* const clock_;
  k8s::Store<k8s::Service>& services_;
  k8s::Store<k8s::EndpointSlice>& slices_;
  ServiceReconciler& reconciler_;
  HealthCheckServers* const health_;
  const NodeContext node_;
  ServiceRefusals refusals_;
  ServiceNameFile names_;  // only the controller's thread (Reconcile) touches it
  const std::string state_dir_;
  mutable absl::Mutex unprogrammed_mu_;
  std::string unprogrammed_json_ ABSL_GUARDED_BY(unprogrammed_mu_);
  bool unprogrammed_written_ = false;  // only Reconcile's thread
  // Frontends refused / truncated per map, as of the last batch (read by scrapes).
  std::map<std::string, ServiceReconciler::UnprogrammedCount> unprogrammed_
      ABSL_GUARDED_BY(unprogrammed_mu_);
  // The reconciler's counters as of the last batch (the reconciler is the controller thread's).
  ServiceReconcilerStats reconciler_stats_ ABSL_GUARDED_BY(unprogrammed_mu_);

  // EndpointSlice keys by the Service ("namespace/name") they are labelled for. Kept by the
  // slice listener, which may outlive this object (stores have no RemoveListener): shared.
  struct SliceIndex {
    absl::Mutex mu;
    absl::flat_hash_map<std::string, std::set<std::string>> by_service ABSL_GUARDED_BY(mu);
  };
  const std::shared_ptr<SliceIndex> index_ = std::make_shared<SliceIndex>();
  // Last: its thread calls Reconcile, which uses everything above.
  std::unique_ptr<controller::Controller> controller_;
  std::unique_ptr<metrics::ScopedCollector> metrics_;  // reads unprogrammed_
};

}  // namespace sluice::agent
