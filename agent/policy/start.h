// NetworkPolicy as the agent runs it: the policy maps written from Pods, Namespaces, Nodes and
// NetworkPolicies, and hooked into the endpoint service so that CNI ADD writes a new pod's policy
// state before it answers.
#pragma once

#include <memory>
#include <optional>

#include "agent/endpoint/endpoint_service.h"
#include "agent/endpoint/endpoint_store.h"
#include "agent/k8s/event_poster.h"
#include "agent/metrics/agent_endpoints.h"
#include "agent/policy/reconciler.h"
#include "agent/policy/sync.h"
#include "agent/start/pieces.h"

namespace sluice::agent {

struct RunningPolicy {
  std::unique_ptr<BpfPolicyMaps> maps;
  std::unique_ptr<PolicyReconciler> reconciler;            // writes maps: declared after them
  std::unique_ptr<k8s::EventPoster> events;                // sync posts: declared before it
  std::unique_ptr<PolicySync> sync;                        // drives reconciler: declared after it
  std::optional<metrics::ScopedCollector> policy_metrics;  // reads sync: declared after it
};

// Needs the pieces' Kubernetes state. The endpoint service calls into the result from now on: it
// must outlive the service's requests (main stops the endpoint API first).
[[nodiscard]] std::unique_ptr<RunningPolicy> StartPolicy(const StartPieces& pieces,
                                                         EndpointStore& store,
                                                         EndpointService& service);

}  // namespace sluice::agent
