#include "agent/policy/sync.h"

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agent/base/files.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace sluice::agent {
namespace {

constexpr char kClusterKey[] = "cluster";

std::string EndpointKey(uint32_t id) { return absl::StrCat("ep/", id); }

// Marks the cluster dirty on every change of `store` that alters what the translator reads of
// its objects (SameForPolicy): status churn (readiness, conditions, a new resourceVersion) costs
// no batch, and a policy change does not queue behind such batches. Additions and deletions
// always count; the others are counted in `skipped`.
template <typename T>
void MarkRelevantChanges(k8s::Store<T>& store, std::shared_ptr<controller::DirtyKeys> keys,
                         std::shared_ptr<std::atomic<uint64_t>> skipped) {
  store.AddListener([keys, skipped](const k8s::Change<T>& c) {
    if (c.type == k8s::ChangeType::kUpdated && c.old_obj && c.new_obj &&
        SameForPolicy(*c.old_obj, *c.new_obj)) {
      skipped->fetch_add(1, std::memory_order_relaxed);
      return;
    }
    keys->Mark(kClusterKey);
  });
}

}  // namespace

PolicySync::PolicySync(PolicySources sources, std::function<bool()> synced,
                       PolicyReconciler& reconciler, std::string node_name, std::string state_dir,
                       k8s::EventPoster* events)
    : src_(sources),
      synced_(std::move(synced)),
      reconciler_(reconciler),
      node_name_(std::move(node_name)),
      state_dir_(std::move(state_dir)),
      events_(events) {
  if (!state_dir_.empty()) {
    // Numbers of the previous run, so that nothing in the pinned maps changes across a restart.
    auto records = LoadIdentities(state_dir_);
    absl::MutexLock l(&mu_);
    if (!records.ok()) {
      spdlog::warn("policy: identity state in {} unreadable, numbering afresh: {}", state_dir_,
                   records.status().ToString());
    } else if (auto st = ids_.Restore(*records); !st.ok()) {
      spdlog::warn("policy: identity state in {} rejected, numbering afresh: {}", state_dir_,
                   st.ToString());
    } else {
      saved_generation_ = ids_.generation();
      spdlog::info("policy: restored {} identities", records->size());
    }
  }
  controller::ControllerOptions options;
  options.name = "policy";
  options.synced = synced_;
  options.all_keys = [] { return std::vector<std::string>{kClusterKey}; };
  controller_ = std::make_unique<controller::Controller>(
      std::move(options), [this](const controller::Batch& b) { return Reconcile(b); });
  auto keys = controller_->keys();
  src_.pods.AddListener([this, keys, skipped = skipped_](const k8s::Change<k8s::Pod>& c) {
    if (c.type == k8s::ChangeType::kDeleted && c.old_obj) {
      auto last = std::make_shared<k8s::Pod>(*c.old_obj);
      last->meta.deleting = true;
      absl::MutexLock l(&departed_mu_);
      departed_[last->meta.Key()] = std::move(last);
    }
    if (c.type == k8s::ChangeType::kUpdated && c.old_obj && c.new_obj &&
        SameForPolicy(*c.old_obj, *c.new_obj)) {
      skipped->fetch_add(1, std::memory_order_relaxed);
      return;
    }
    keys->Mark(kClusterKey);
  });
  MarkRelevantChanges(src_.namespaces, keys, skipped_);
  MarkRelevantChanges(src_.nodes, keys, skipped_);
  src_.policies.AddListener(
      [keys](const k8s::Change<k8s::NetworkPolicy>&) { keys->Mark(kClusterKey); });
}

PolicyInput PolicySync::Snapshot() {
  PolicyInput in;
  in.node_name = node_name_;
  in.pods = src_.pods.List();
  in.namespaces = src_.namespaces.List();
  in.policies = src_.policies.List();
  in.nodes = src_.nodes.List();
  std::set<std::string> endpoint_pods;
  for (const Endpoint& ep : src_.endpoints.List()) {
    endpoint_pods.insert(absl::StrCat(ep.pod_namespace, "/", ep.pod_name));
    auto addr = IpAddress::Parse(ep.ipv4);
    if (!addr.ok()) continue;
    in.endpoints.push_back({ep.endpoint_id, ep.pod_namespace, ep.pod_name, *addr});
  }
  // A departed Pod stands in for itself while its endpoint is here and no Pod of its name is
  // back in the API; then it is forgotten.
  std::set<std::string> listed;
  for (const auto& p : in.pods) {
    if (p) listed.insert(p->meta.Key());
  }
  absl::MutexLock l(&departed_mu_);
  for (auto it = departed_.begin(); it != departed_.end();) {
    if (!endpoint_pods.contains(it->first) || listed.contains(it->first)) {
      it = departed_.erase(it);
      continue;
    }
    in.pods.push_back(it->second);
    ++it;
  }
  return in;
}

absl::Status PolicySync::Reconcile(const controller::Batch&) {
  // The whole view each time: identities and peers span the cluster; the cache makes what did
  // not change cheap. Batches coalesce changes.
  PolicyInput in = Snapshot();
  PolicyTranslation t;
  std::vector<IdentityRecord> records;
  uint64_t generation = 0;
  bool save = false;
  {
    absl::MutexLock l(&mu_);
    t = TranslatePolicy(in, &ids_, cache_.get());
    generation = ids_.generation();
    // The numbers changed since the file was written (or the last write failed): write again.
    save = !state_dir_.empty() && generation != saved_generation_;
    if (save) records = ids_.Records();
    std::set<std::tuple<std::string, std::string, std::string>> now;
    for (const PolicyProblem& p : t.problems) {
      auto key = std::make_tuple(p.policy, p.where, p.reason);
      if (!problems_.contains(key)) {
        spdlog::warn("policy: {} {}: {} (this part allows nothing)", p.policy, p.where, p.reason);
        ++stats_.problems;
      }
      now.insert(std::move(key));
    }
    problems_ = std::move(now);
  }
  // Identities are written before the maps use them: a crash in between restores numbers that
  // the maps may not hold yet, never maps holding numbers the file lacks.
  if (save) {
    absl::Status st = SaveIdentities(state_dir_, records);
    absl::MutexLock l(&mu_);
    if (st.ok()) {
      saved_generation_ = generation;
      ++stats_.identity_saves;
    } else {
      ++stats_.identity_save_failures;
      spdlog::warn("policy: save identities: {}", st.ToString());
    }
  }
  // Which pod holds an id, read from the endpoint store under the reconciler's lock (the first
  // call), so that an endpoint added or removed meanwhile is seen as it is now.
  std::optional<std::map<uint32_t, std::string>> owners;
  auto owner = [&](uint32_t id) -> std::optional<std::string> {
    if (!owners) {
      owners.emplace();
      for (const Endpoint& ep : src_.endpoints.List()) {
        (*owners)[ep.endpoint_id] = absl::StrCat(ep.pod_namespace, "/", ep.pod_name);
      }
    }
    auto it = owners->find(id);
    if (it == owners->end()) return std::nullopt;
    return it->second;
  };
  absl::Status st = reconciler_.Apply(t, owner);
  PublishHealth(t);
  if (!st.ok()) return st;
  absl::MutexLock l(&mu_);
  ++stats_.applies;
  return absl::OkStatus();
}

namespace {

std::string Policies(const std::vector<std::string>& policies) {
  if (policies.empty()) return "no policy";
  return absl::StrCat(policies.size() == 1 ? "NetworkPolicy " : "NetworkPolicies ",
                      absl::StrJoin(policies, ", "));
}

// The line logged and the Event's message for an endpoint left with its last complete policy.
std::string DegradedMessage(const DegradedEndpoint& d) {
  if (d.reason == "map_full") {
    return absl::StrCat("the policy of ", Policies(d.policies), " does not fit sluice_policy4 (",
                        d.error, "): the pod keeps its last complete policy (", d.kept,
                        " entries); raise --bpf_policy_max (chart bpf.policyMapMax)");
  }
  return absl::StrCat("writing the policy of ", Policies(d.policies), " failed (", d.error,
                      "): the pod keeps its last complete policy (", d.kept, " entries); retried");
}

nlohmann::json HealthJson(const PolicyHealth& h) {
  nlohmann::json degraded = nlohmann::json::array();
  for (const auto& [id, d] : h.degraded) {
    degraded.push_back({{"endpoint", id},
                        {"pod", d.pod},
                        {"policies", d.policies},
                        {"reason", d.reason},
                        {"error", d.error},
                        {"wantedEntries", d.wanted},
                        {"keptEntries", d.kept},
                        {"missingEntries", d.missing},
                        {"freeEntries", d.free},
                        {"message", DegradedMessage(d)}});
  }
  nlohmann::json invalid = nlohmann::json::array();
  for (const PolicyProblem& p : h.problems) {
    invalid.push_back({{"policy", p.policy}, {"where", p.where}, {"reason", p.reason}});
  }
  return {{"endpoints", h.endpoints}, {"degraded", degraded}, {"invalid", invalid}};
}

}  // namespace

void PolicySync::PostEvent(const std::string& kind, const std::string& key, const std::string& type,
                           const std::string& reason, const std::string& message) {
  if (events_ == nullptr) return;
  std::vector<std::string> nn = absl::StrSplit(key, absl::MaxSplits('/', 1));
  if (nn.size() != 2) return;
  k8s::EventObject obj;
  obj.kind = kind;
  obj.namespace_ = nn[0];
  obj.name = nn[1];
  if (kind == "Pod") {
    obj.api_version = "v1";
    if (auto pod = src_.pods.Get(key)) obj.uid = pod->meta.uid;
  } else {
    obj.api_version = "networking.k8s.io/v1";
    if (auto np = src_.policies.Get(key)) obj.uid = np->meta.uid;
  }
  events_->Post(obj, type, reason, message);
}

void PolicySync::PublishHealth(const PolicyTranslation& t) {
  PolicyHealth now;
  now.endpoints = t.endpoints.size();
  now.degraded = reconciler_.Degraded();
  now.problems = t.problems;
  PolicyHealth before;
  {
    absl::MutexLock l(&mu_);
    before = health_;
  }
  for (const auto& [id, d] : now.degraded) {
    auto it = before.degraded.find(id);
    // Told again when what it is told changes (the reason, the policies), not for each retry.
    if (it != before.degraded.end() && it->second.pod == d.pod &&
        it->second.policies == d.policies && it->second.reason == d.reason) {
      continue;
    }
    const std::string message = DegradedMessage(d);
    spdlog::warn("policy: endpoint {} of pod {}: {}", id, d.pod, message);
    PostEvent("Pod", d.pod, "Warning", "PolicyNotApplied", message);
  }
  for (const auto& [id, d] : before.degraded) {
    if (now.degraded.contains(id)) continue;
    // Gone, or whole again: only a pod that is still here is told.
    bool here = false;
    for (const EndpointPolicy& ep : t.endpoints) here |= ep.endpoint_id == id && ep.pod == d.pod;
    if (!here) continue;
    spdlog::info("policy: endpoint {} of pod {} has its whole policy again ({})", id, d.pod,
                 Policies(d.policies));
    PostEvent(
        "Pod", d.pod, "Normal", "PolicyApplied",
        absl::StrCat("the policy of ", Policies(d.policies), " is in sluice_policy4 whole again"));
  }
  std::set<std::pair<std::string, std::string>> old_problems;
  for (const PolicyProblem& p : before.problems)
    old_problems.insert({p.policy, p.where + p.reason});
  for (const PolicyProblem& p : now.problems) {
    if (p.policy.empty() || old_problems.contains({p.policy, p.where + p.reason})) continue;
    PostEvent("NetworkPolicy", p.policy, "Warning", "PolicyInvalid",
              absl::StrCat(p.where, ": ", p.reason,
                           "; this part allows nothing (the pods it selects stay isolated)"));
  }
  const std::string json = HealthJson(now).dump(1) + "\n";
  bool write = false;
  {
    absl::MutexLock l(&mu_);
    write = !state_dir_.empty() && (json != health_json_ || !health_written_);
    health_ = std::move(now);
    health_json_ = json;
  }
  if (!write) return;
  absl::Status st = WriteFileAtomically(state_dir_, kPolicyStatusFile, json, 0600);
  if (!st.ok()) spdlog::warn("policy: status for sluicectl not saved: {}", st.ToString());
  absl::MutexLock l(&mu_);
  health_written_ = st.ok();
}

PolicyHealth PolicySync::health() const {
  absl::MutexLock l(&mu_);
  return health_;
}

absl::Status PolicySync::EndpointAdded(const Endpoint& ep) {
  bool open = synced_();
  if (open) {
    for (const auto& np : src_.policies.List()) {
      if (np->meta.namespace_ == ep.pod_namespace) {
        open = false;
        break;
      }
    }
  }
  absl::Status st = reconciler_.WriteNewEndpoint(ep.endpoint_id, open);
  controller_->Mark(EndpointKey(ep.endpoint_id));
  return st;
}

absl::Status PolicySync::EndpointRemoved(const Endpoint& ep) {
  absl::Status st = reconciler_.RemoveEndpoint(ep.endpoint_id);
  controller_->Mark(EndpointKey(ep.endpoint_id));
  return st;
}

PolicySyncStats PolicySync::stats() const {
  absl::MutexLock l(&mu_);
  PolicySyncStats s = stats_;
  s.skipped_updates = skipped_->load(std::memory_order_relaxed);
  return s;
}

void PolicySync::UseTranslationCache(bool on) {
  absl::MutexLock l(&mu_);
  if (!on) {
    cache_.reset();
  } else if (!cache_) {
    cache_ = std::make_unique<TranslationCache>();
  }
}

size_t PolicySync::identity_count() const {
  absl::MutexLock l(&mu_);
  return ids_.size();
}

std::vector<IdentityRecord> PolicySync::Identities() const {
  absl::MutexLock l(&mu_);
  return ids_.Records();
}

}  // namespace sluice::agent
