// Keeps the Service load balancer maps equal to the Services and EndpointSlices the agent watches:
// store listeners mark Services dirty (coalesced per namespace/name), a thread of its own
// translates and applies them through the ServiceReconciler. Nothing is applied (so nothing is
// deleted) before every watch has synced; then everything is applied once and stale state
// restored from the maps is pruned.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/health_check_server.h"
#include "agent/k8s/model.h"
#include "agent/k8s/store.h"
#include "agent/service_reconciler.h"
#include "agent/service_translator.h"

namespace sluice::agent {

class ServiceSync {
 public:
  // `synced` says whether every watch has completed its first list (KubernetesState::synced).
  // `health` may be null (no health-check listeners).
  ServiceSync(k8s::Store<k8s::Service>& services, k8s::Store<k8s::EndpointSlice>& slices,
              std::function<bool()> synced, ServiceReconciler& reconciler,
              HealthCheckServers* health, NodeContext node);
  ~ServiceSync();
  ServiceSync(const ServiceSync&) = delete;
  ServiceSync& operator=(const ServiceSync&) = delete;

  // Waits until every change seen so far has been applied and, once synced, stale state pruned.
  bool WaitIdle(absl::Duration timeout);
  bool pruned() const;
  uint64_t applies() const;  // Services applied so far

 private:
  void Run();
  std::optional<ServiceTranslation> Translate(const std::string& service);

  k8s::Store<k8s::Service>& services_;
  k8s::Store<k8s::EndpointSlice>& slices_;
  const std::function<bool()> synced_;
  ServiceReconciler& reconciler_;
  HealthCheckServers* const health_;
  const NodeContext node_;

  // What the store listeners touch: shared with them, so a listener called after this object is
  // gone (the stores have no RemoveListener and outlive it) touches live memory.
  struct Shared {
    absl::Mutex mu;
    absl::flat_hash_set<std::string> dirty ABSL_GUARDED_BY(mu);
    // EndpointSlice keys by the Service ("namespace/name") they are labelled for.
    absl::flat_hash_map<std::string, std::set<std::string>> slices_by_service ABSL_GUARDED_BY(mu);
    uint64_t seen ABSL_GUARDED_BY(mu) = 0;     // changes noticed
    uint64_t applied ABSL_GUARDED_BY(mu) = 0;  // changes applied (seen at the batch's start)
    uint64_t applies ABSL_GUARDED_BY(mu) = 0;
    bool pruned ABSL_GUARDED_BY(mu) = false;
    bool retry ABSL_GUARDED_BY(mu) = false;
    bool stop ABSL_GUARDED_BY(mu) = false;

    void MarkDirty(const std::string& service) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      dirty.insert(service);
      ++seen;
    }
  };
  const std::shared_ptr<Shared> sh_ = std::make_shared<Shared>();
  std::thread thread_;
};

}  // namespace sluice::agent
