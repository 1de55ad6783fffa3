// Keeps the policy maps equal to the cluster's NetworkPolicies as they apply to this node's
// endpoints: Pod, Namespace, Node and NetworkPolicy listeners and the endpoint service mark keys
// dirty ("cluster" for a change of the cluster's objects that alters what the translator reads
// (status-only updates are skipped and counted), "ep/<id>" for an endpoint that came or went), a
// controller (agent/controller/) translates the whole view once per batch (TranslatePolicy,
// numbering identities, with a TranslationCache so that only what changed is computed again) and
// the PolicyReconciler writes the difference. The identities survive restarts in
// <state_dir>/identities.json. Nothing is applied before every watch has synced. Rejected rules
// (PolicyProblem) are logged once per change and counted.
// What is not as the policies say is told, on each change of it: an endpoint the reconciler left
// with its last complete policy (degraded: its new one did not fit sluice_policy4, or a write
// failed) and a policy with rejected parts are logged, posted as Events (Warning
// PolicyNotApplied on the Pod, Normal PolicyApplied when it is whole again; Warning PolicyInvalid
// on the NetworkPolicy), written to <state_dir>/policy-status.json for sluicectl, and exported as
// metrics (agent/policy/start.cc).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/controller/controller.h"
#include "agent/endpoint/endpoint_service.h"
#include "agent/endpoint/endpoint_store.h"
#include "agent/k8s/event_poster.h"
#include "agent/k8s/model.h"
#include "agent/k8s/store.h"
#include "agent/policy/identity.h"
#include "agent/policy/reconciler.h"
#include "agent/policy/translator.h"

namespace sluice::agent {

struct PolicySources {
  k8s::Store<k8s::Pod>& pods;
  k8s::Store<k8s::Namespace>& namespaces;
  k8s::Store<k8s::NetworkPolicy>& policies;
  k8s::Store<k8s::Node>& nodes;
  EndpointStore& endpoints;
};

// sluicectl status and policy get read it (agent/sluicectl/policy.cc).
inline constexpr char kPolicyStatusFile[] = "policy-status.json";

// What the last batch left not as the policies say.
struct PolicyHealth {
  uint64_t endpoints = 0;  // endpoints of the last translation
  std::map<uint32_t, DegradedEndpoint> degraded;
  std::vector<PolicyProblem> problems;  // rejected parts of policies
};

struct PolicySyncStats {
  uint64_t applies = 0;         // translations applied
  uint64_t problems = 0;        // rejected rules, counted once per appearance
  uint64_t identity_saves = 0;  // state file writes
  uint64_t identity_save_failures = 0;
  uint64_t skipped_updates = 0;  // Pod/Namespace/Node updates that change nothing policy reads
};

class PolicySync final : public EndpointPolicyHook {
 public:
  // `synced`: every watch policy reads (Pods, Namespaces, Nodes, NetworkPolicies) has listed.
  // `state_dir` "" keeps identities in memory only (tests).
  // `events` (may be null) posts the Events.
  PolicySync(PolicySources sources, std::function<bool()> synced, PolicyReconciler& reconciler,
             std::string node_name, std::string state_dir, k8s::EventPoster* events = nullptr);
  PolicySync(const PolicySync&) = delete;
  PolicySync& operator=(const PolicySync&) = delete;

  // EndpointPolicyHook: a new endpoint is closed but to its node until the controller has
  // written its state, unless no policy can select it yet (no NetworkPolicy in its namespace,
  // with the watches synced); a removed one loses its entries.
  absl::Status EndpointAdded(const Endpoint& ep) override;
  absl::Status EndpointRemoved(const Endpoint& ep) override;

  bool WaitIdle(absl::Duration timeout) { return controller_->WaitIdle(timeout); }
  // The watches have listed and a first full batch is in the maps.
  bool pruned() const { return controller_->primed(); }
  PolicySyncStats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  // The identities numbered so far (for sluicectl and tests).
  std::vector<IdentityRecord> Identities() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t identity_count() const ABSL_LOCKS_EXCLUDED(mu_);
  PolicyHealth health() const ABSL_LOCKS_EXCLUDED(mu_);
  // false: every batch translates without the TranslationCache (the result is the same; for
  // benchmarks comparing the two).
  void UseTranslationCache(bool on) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Status Reconcile(const controller::Batch& batch);
  PolicyInput Snapshot() ABSL_LOCKS_EXCLUDED(departed_mu_);
  // Logs, posts and saves what changed in the reconciler's degraded endpoints and in the
  // translation's problems since the last batch.
  void PublishHealth(const PolicyTranslation& t) ABSL_LOCKS_EXCLUDED(mu_);
  void PostEvent(const std::string& kind, const std::string& key, const std::string& type,
                 const std::string& reason, const std::string& message);

  PolicySources src_;
  const std::function<bool()> synced_;
  PolicyReconciler& reconciler_;
  const std::string node_name_;
  const std::string state_dir_;
  k8s::EventPoster* const events_;

  mutable absl::Mutex mu_;
  PolicyHealth health_ ABSL_GUARDED_BY(mu_);
  std::string health_json_ ABSL_GUARDED_BY(mu_);  // as last written to kPolicyStatusFile
  bool health_written_ ABSL_GUARDED_BY(mu_) = false;
  IdentityAllocator ids_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<TranslationCache> cache_ ABSL_GUARDED_BY(mu_) =
      std::make_unique<TranslationCache>();
  // ids_' generation when the state file was last written (or restored from).
  uint64_t saved_generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<std::tuple<std::string, std::string, std::string>> problems_ ABSL_GUARDED_BY(mu_);
  PolicySyncStats stats_ ABSL_GUARDED_BY(mu_);
  // Counted on the watch threads by listeners that may outlive this object.
  std::shared_ptr<std::atomic<uint64_t>> skipped_ = std::make_shared<std::atomic<uint64_t>>(0);
  // Pods of this node's endpoints that left the API while the endpoint still exists (a Pod
  // object may go before the runtime's CNI DEL: force deletion, a kubelet or lab that deletes
  // first). Kept as last seen (deleting) until the endpoint goes, so that a terminating pod keeps
  // its identity and its policy's allows while it still serves; an endpoint without a Pod ever
  // seen stays closed (translator.cc).
  absl::Mutex departed_mu_;
  std::map<std::string, std::shared_ptr<const k8s::Pod>> departed_ ABSL_GUARDED_BY(departed_mu_);

  // Last: its thread calls Reconcile, which uses everything above.
  std::unique_ptr<controller::Controller> controller_;
};

}  // namespace sluice::agent
