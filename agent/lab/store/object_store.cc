#include "agent/lab/store/object_store.h"

#include <algorithm>
#include <cstdlib>

#include "absl/random/random.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace sluice::lab {

using nlohmann::json;

const std::vector<ResourceType>& BuiltinResources() {
  static const std::vector<ResourceType> kResources = {
      {"", "v1", "namespaces", "namespace", "Namespace", false, {"ns"}, true},
      {"", "v1", "nodes", "node", "Node", false, {"no"}, true},
      {"", "v1", "pods", "pod", "Pod", true, {"po"}, true},
      {"", "v1", "services", "service", "Service", true, {"svc"}, true},
      {"discovery.k8s.io",
       "v1",
       "endpointslices",
       "endpointslice",
       "EndpointSlice",
       true,
       {},
       false},
      {"networking.k8s.io",
       "v1",
       "networkpolicies",
       "networkpolicy",
       "NetworkPolicy",
       true,
       {"netpol"},
       false},
      {"coordination.k8s.io", "v1", "leases", "lease", "Lease", true, {}, false},
      {"", "v1", "events", "event", "Event", true, {"ev"}, false},
      // What a chart installs (helm/sluice): stored and served; the lab's workload runtime
      // (workloads/) acts on the DaemonSets and Deployments that run the Sluice image.
      {"", "v1", "configmaps", "configmap", "ConfigMap", true, {"cm"}, false},
      {"", "v1", "serviceaccounts", "serviceaccount", "ServiceAccount", true, {"sa"}, false},
      {"apps", "v1", "daemonsets", "daemonset", "DaemonSet", true, {"ds"}, true},
      {"apps", "v1", "deployments", "deployment", "Deployment", true, {"deploy"}, true},
      {"rbac.authorization.k8s.io",
       "v1",
       "clusterroles",
       "clusterrole",
       "ClusterRole",
       false,
       {},
       false},
      {"rbac.authorization.k8s.io",
       "v1",
       "clusterrolebindings",
       "clusterrolebinding",
       "ClusterRoleBinding",
       false,
       {},
       false},
      {"rbac.authorization.k8s.io", "v1", "roles", "role", "Role", true, {}, false},
      {"rbac.authorization.k8s.io",
       "v1",
       "rolebindings",
       "rolebinding",
       "RoleBinding",
       true,
       {},
       false},
  };
  return kResources;
}

const ResourceType* FindResource(std::string_view group, std::string_view version,
                                 std::string_view plural) {
  for (const ResourceType& r : BuiltinResources()) {
    if (r.group == group && r.version == version && r.plural == plural) return &r;
  }
  return nullptr;
}

const ResourceType& Resource(std::string_view plural) {
  for (const ResourceType& r : BuiltinResources()) {
    if (r.plural == plural) return r;
  }
  spdlog::critical("unknown resource {}", std::string(plural));
  std::abort();
}

const char* EventTypeName(EventType type) {
  switch (type) {
    case EventType::kAdded:
      return "ADDED";
    case EventType::kModified:
      return "MODIFIED";
    case EventType::kDeleted:
      return "DELETED";
  }
  return "UNKNOWN";
}

std::string QualifiedResource(const ResourceType& type) {
  return type.group.empty() ? type.plural : type.plural + "." + type.group;
}

namespace {

std::string NameNotFound(const ResourceType& type, std::string_view name) {
  return absl::StrCat(QualifiedResource(type), " \"", std::string(name), "\" not found");
}

std::string Key(const ResourceType& type, std::string_view ns, std::string_view name) {
  return type.namespaced ? absl::StrCat(std::string(ns), "/", std::string(name))
                         : std::string(name);
}

std::string StrField(const json& obj, const char* a, const char* b) {
  auto ia = obj.find(a);
  if (ia == obj.end() || !ia->is_object()) return "";
  auto ib = ia->find(b);
  if (ib == ia->end() || !ib->is_string()) return "";
  return ib->get<std::string>();
}

std::string RandomSuffix(absl::BitGen& gen, int n) {
  static constexpr char kAlphabet[] = "bcdfghjklmnpqrstvwxz2456789";
  std::string s;
  for (int i = 0; i < n; ++i) s.push_back(kAlphabet[absl::Uniform(gen, 0u, 27u)]);
  return s;
}

std::string RandomUid(absl::BitGen& gen) {
  uint64_t hi = absl::Uniform<uint64_t>(gen), lo = absl::Uniform<uint64_t>(gen);
  hi = (hi & 0xffffffffffff0fffULL) | 0x0000000000004000ULL;
  lo = (lo & 0x3fffffffffffffffULL) | 0x8000000000000000ULL;
  return absl::StrFormat("%08x-%04x-%04x-%04x-%012x", hi >> 32, (hi >> 16) & 0xffff, hi & 0xffff,
                         lo >> 48, lo & 0xffffffffffffULL);
}

// True when everything except resourceVersion and generation is equal.
bool SameContent(const json& a, const json& b) {
  json x = a, y = b;
  for (json* j : {&x, &y}) {
    if (j->contains("metadata")) {
      (*j)["metadata"].erase("resourceVersion");
      (*j)["metadata"].erase("generation");
    }
  }
  return x == y;
}

bool SameSpec(const json& a, const json& b) {
  json x = a, y = b;
  for (json* j : {&x, &y}) {
    j->erase("metadata");
    j->erase("status");
  }
  return x == y;
}

absl::Status ValidateName(const ResourceType& type, const std::string& name) {
  bool ok = !name.empty() && name.size() <= 253;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.')) ok = false;
  }
  if (ok && (name.front() == '-' || name.back() == '-' || name.front() == '.')) ok = false;
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        type.kind, " \"", name, "\" is invalid: metadata.name: Invalid value: \"", name,
        "\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
        "'-' or '.', and must start and end with an alphanumeric character"));
  }
  return absl::OkStatus();
}

struct ContinueToken {
  uint64_t rv;
  std::string start;  // last key returned
};

std::string EncodeContinue(const ContinueToken& t) {
  json j = {{"rv", t.rv}, {"start", t.start}};
  return absl::WebSafeBase64Escape(j.dump());
}

std::optional<ContinueToken> DecodeContinue(const std::string& s) {
  std::string raw;
  if (!absl::WebSafeBase64Unescape(s, &raw)) return std::nullopt;
  json j = json::parse(raw, nullptr, false);
  if (!j.is_object() || !j["rv"].is_number_unsigned() || !j["start"].is_string()) {
    return std::nullopt;
  }
  return ContinueToken{j["rv"].get<uint64_t>(), j["start"].get<std::string>()};
}

absl::BitGen& Gen() {
  thread_local absl::BitGen gen;
  return gen;
}

}  // namespace

// ---- WatchStream ---------------------------------------------------------------------------

struct WatchStream::State {
  const ResourceType* resource;
  WatchOptions options;
  mutable std::mutex mu;
  std::condition_variable cv;
  std::deque<Event> queue;
  bool interrupted = false;
  bool expired = false;

  bool Matches(const json& obj) const {
    if (resource->namespaced && !options.namespace_name.empty() &&
        StrField(obj, "metadata", "namespace") != options.namespace_name) {
      return false;
    }
    const json& md = obj["metadata"];
    static const json kNull;
    auto it = md.find("labels");
    if (!options.labels.Matches(it == md.end() ? kNull : *it)) return false;
    return options.fields.Matches(obj);
  }

  // Turns a store event into what this watch sees: selector transitions become ADDED/DELETED.
  std::optional<Event> Filter(const Event& e) const {
    bool now = Matches(*e.object);
    bool before = e.previous != nullptr && Matches(*e.previous);
    Event out = e;
    switch (e.type) {
      case EventType::kAdded:
        if (!now) return std::nullopt;
        return out;
      case EventType::kModified:
        if (now && before) return out;
        if (now) {
          out.type = EventType::kAdded;
          return out;
        }
        if (before) {
          out.type = EventType::kDeleted;
          return out;
        }
        return std::nullopt;
      case EventType::kDeleted:
        if (!now && !before) return std::nullopt;
        return out;
    }
    return std::nullopt;
  }

  // Store lock held.
  void Push(Event e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (expired) return;
      if (queue.size() >= options.max_queue) {
        queue.clear();
        expired = true;
      } else {
        queue.push_back(std::move(e));
      }
    }
    cv.notify_all();
  }

  void Expire() {
    {
      std::lock_guard<std::mutex> lock(mu);
      queue.clear();
      expired = true;
    }
    cv.notify_all();
  }
};

WatchStream::~WatchStream() { store_->Unregister(state_); }

WatchStream::Result WatchStream::Next(absl::Time deadline, Event* out) {
  std::unique_lock<std::mutex> lock(state_->mu);
  while (true) {
    if (!state_->queue.empty()) {
      *out = std::move(state_->queue.front());
      state_->queue.pop_front();
      return Result::kEvent;
    }
    if (state_->expired) return Result::kExpired;
    if (state_->interrupted) {
      state_->interrupted = false;
      return Result::kInterrupted;
    }
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return Result::kTimeout;
    state_->cv.wait_for(lock, absl::ToChronoNanoseconds(std::min(left, absl::Hours(1))));
  }
}

void WatchStream::Interrupt() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->interrupted = true;
  }
  state_->cv.notify_all();
}

size_t WatchStream::queued() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->queue.size();
}

// ---- ObjectStore ---------------------------------------------------------------------------

ObjectStore::ObjectStore(Options options) : options_(options) {}
ObjectStore::~ObjectStore() = default;

void ObjectStore::AddListener(std::function<void(const Event&)> listener) {
  std::lock_guard<std::mutex> lock(mu_);
  listeners_.push_back(std::move(listener));
}

std::string ObjectStore::FormatTimestamp(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone());
}

ObjectStore::Table& ObjectStore::TableFor(const ResourceType& type) const { return tables_[&type]; }

uint64_t ObjectStore::CurrentResourceVersion() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rv_;
}

uint64_t ObjectStore::OldestWatchableResourceVersion() const {
  std::lock_guard<std::mutex> lock(mu_);
  return compacted_rv_;
}

void ObjectStore::CommitLocked(const ResourceType& type, EventType event_type, ObjectPtr object,
                               ObjectPtr previous) {
  Event e{event_type, rv_, &type, std::move(object), std::move(previous)};
  for (auto& w : watchers_) {
    if (w->resource != &type) continue;
    if (auto filtered = w->Filter(e)) w->Push(std::move(*filtered));
  }
  for (auto& l : listeners_) l(e);
  history_.push_back(std::move(e));
  TrimHistoryLocked();
}

void ObjectStore::TrimHistoryLocked() {
  while (history_.size() > options_.history_limit) {
    compacted_rv_ = history_.front().resource_version;
    history_.pop_front();
  }
}

void ObjectStore::SetHistoryLimit(size_t limit) {
  std::lock_guard<std::mutex> lock(mu_);
  options_.history_limit = limit;
  TrimHistoryLocked();
}

void ObjectStore::Compact() {
  std::lock_guard<std::mutex> lock(mu_);
  history_.clear();
  compacted_rv_ = rv_;
  for (auto& w : watchers_) w->Expire();
  spdlog::info("lab store: history compacted at resourceVersion {}", rv_);
}

absl::StatusOr<json> ObjectStore::Create(const ResourceType& type, json object) {
  if (!object.is_object()) return absl::FailedPreconditionError("the body must be a JSON object");
  json& md = object["metadata"];
  if (!md.is_object()) md = json::object();
  std::string ns = type.namespaced ? StrField(object, "metadata", "namespace") : "";
  if (type.namespaced && ns.empty()) {
    return absl::FailedPreconditionError("an empty namespace may not be set during creation");
  }
  if (!type.namespaced) md.erase("namespace");

  std::lock_guard<std::mutex> lock(mu_);
  if (type.namespaced && options_.require_namespace &&
      !TableFor(Resource("namespaces")).objects.contains(ns)) {
    return absl::NotFoundError(absl::StrCat("namespaces \"", ns, "\" not found"));
  }
  Table& table = TableFor(type);
  std::string name = md.value("name", "");
  if (name.empty()) {
    std::string prefix = md.value("generateName", "");
    if (prefix.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(type.kind,
                       " \"\" is invalid: metadata.name: Required value: name or generateName is "
                       "required"));
    }
    do {
      name = prefix + RandomSuffix(Gen(), 5);
    } while (table.objects.contains(Key(type, ns, name)));
    md["name"] = name;
  }
  if (absl::Status s = ValidateName(type, name); !s.ok()) return s;
  std::string key = Key(type, ns, name);
  if (table.objects.contains(key)) {
    return absl::AlreadyExistsError(
        absl::StrCat(QualifiedResource(type), " \"", name, "\" already exists"));
  }
  object["kind"] = type.kind;
  object["apiVersion"] = type.ApiVersion();
  md["uid"] = RandomUid(Gen());
  md["creationTimestamp"] = FormatTimestamp(options_.clock->Now());
  md["generation"] = 1;
  md.erase("deletionTimestamp");
  md.erase("deletionGracePeriodSeconds");
  if (type.plural == "pods" && !object["status"].contains("phase")) {
    object["status"]["phase"] = "Pending";
  }
  if (type.plural == "namespaces" && !object["status"].contains("phase")) {
    object["status"]["phase"] = "Active";
  }
  // As kube-apiserver does (NamespaceDefaultLabelName): namespaceSelectors can name it.
  if (type.plural == "namespaces") md["labels"]["kubernetes.io/metadata.name"] = name;
  if (admission_ != nullptr) {
    if (absl::Status s = admission_->Admit(type, object, nullptr); !s.ok()) return s;
  }
  ++rv_;
  object["metadata"]["resourceVersion"] = std::to_string(rv_);
  auto ptr = std::make_shared<const json>(object);
  table.objects[key] = ptr;
  CommitLocked(type, EventType::kAdded, ptr, nullptr);
  return object;
}

absl::StatusOr<json> ObjectStore::Get(const ResourceType& type, std::string_view ns,
                                      std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  Table& table = TableFor(type);
  auto it = table.objects.find(Key(type, ns, name));
  if (it == table.objects.end()) return absl::NotFoundError(NameNotFound(type, name));
  return *it->second;
}

absl::StatusOr<json> ObjectStore::UpdateLocked(const ResourceType& type, const std::string& key,
                                               const std::function<absl::Status(json&)>& mutate,
                                               Subresource subresource) {
  Table& table = TableFor(type);
  auto it = table.objects.find(key);
  if (it == table.objects.end()) {
    return absl::NotFoundError(NameNotFound(type, key.substr(key.find('/') + 1)));
  }
  const json& old = *it->second;
  json updated = old;
  if (absl::Status s = mutate(updated); !s.ok()) return s;
  if (!updated.is_object()) return absl::FailedPreconditionError("the body must be an object");
  json& md = updated["metadata"];
  if (!md.is_object()) md = json::object();
  const json& old_md = old["metadata"];
  if (md.value("name", "") != old_md.value("name", "")) {
    return absl::FailedPreconditionError(
        "the name of the object does not match the name on the URL");
  }
  if (type.namespaced && md.value("namespace", "") != old_md.value("namespace", "")) {
    return absl::FailedPreconditionError(
        "the namespace of the object does not match the namespace on the request");
  }
  if (type.plural == "namespaces") md["labels"]["kubernetes.io/metadata.name"] = md["name"];
  for (const char* f : {"uid", "creationTimestamp", "deletionTimestamp",
                        "deletionGracePeriodSeconds", "generation", "resourceVersion"}) {
    if (old_md.contains(f)) {
      md[f] = old_md[f];
    } else {
      md.erase(f);
    }
  }
  updated["kind"] = type.kind;
  updated["apiVersion"] = type.ApiVersion();
  if (subresource == Subresource::kStatus) {
    json status = updated.contains("status") ? updated["status"] : json();
    updated = old;
    if (status.is_null()) {
      updated.erase("status");
    } else {
      updated["status"] = status;
    }
  } else if (type.has_status) {
    if (old.contains("status")) {
      updated["status"] = old["status"];
    } else {
      updated.erase("status");
    }
  }
  if (subresource == Subresource::kMain && admission_ != nullptr) {
    if (absl::Status s = admission_->Admit(type, updated, &old); !s.ok()) return s;
  }
  if (SameContent(updated, old)) return old;
  if (!SameSpec(updated, old)) {
    updated["metadata"]["generation"] = old_md.value("generation", int64_t{1}) + 1;
  }
  ++rv_;
  updated["metadata"]["resourceVersion"] = std::to_string(rv_);
  ObjectPtr previous = it->second;
  auto ptr = std::make_shared<const json>(updated);
  it->second = ptr;
  CommitLocked(type, EventType::kModified, ptr, previous);
  return updated;
}

absl::StatusOr<json> ObjectStore::Update(const ResourceType& type, std::string_view ns,
                                         std::string_view name,
                                         const std::function<absl::Status(json&)>& mutate,
                                         Subresource subresource) {
  std::lock_guard<std::mutex> lock(mu_);
  return UpdateLocked(type, Key(type, ns, name), mutate, subresource);
}

absl::StatusOr<json> ObjectStore::Replace(const ResourceType& type, json object,
                                          Subresource subresource) {
  if (!object.is_object() || !object["metadata"].is_object()) {
    return absl::FailedPreconditionError("the body must be an object with metadata");
  }
  std::string ns = type.namespaced ? StrField(object, "metadata", "namespace") : "";
  std::string name = StrField(object, "metadata", "name");
  std::string want_rv = StrField(object, "metadata", "resourceVersion");
  std::lock_guard<std::mutex> lock(mu_);
  return UpdateLocked(
      type, Key(type, ns, name),
      [&](json& current) -> absl::Status {
        if (!want_rv.empty() && current["metadata"].value("resourceVersion", "") != want_rv) {
          return absl::AbortedError(absl::StrCat(
              "Operation cannot be fulfilled on ", QualifiedResource(type), " \"", name,
              "\": the object has been modified; please apply your changes to the latest "
              "version and try again"));
        }
        current = std::move(object);
        return absl::OkStatus();
      },
      subresource);
}

void ObjectStore::RemoveLocked(const ResourceType& type, const std::string& key, json* removed) {
  Table& table = TableFor(type);
  auto it = table.objects.find(key);
  ObjectPtr previous = it->second;
  table.objects.erase(it);
  termination_deadlines_.erase({&type, key});
  ++rv_;
  json last = *previous;
  last["metadata"]["resourceVersion"] = std::to_string(rv_);
  if (admission_ != nullptr) admission_->Deleted(type, last);
  if (removed != nullptr) *removed = last;
  CommitLocked(type, EventType::kDeleted, std::make_shared<const json>(std::move(last)), previous);
}

absl::StatusOr<ObjectStore::DeleteResult> ObjectStore::Delete(const ResourceType& type,
                                                              std::string_view ns,
                                                              std::string_view name,
                                                              const DeleteOptions& options) {
  std::lock_guard<std::mutex> lock(mu_);
  Table& table = TableFor(type);
  std::string key = Key(type, ns, name);
  auto it = table.objects.find(key);
  if (it == table.objects.end()) return absl::NotFoundError(NameNotFound(type, name));
  const json& obj = *it->second;
  const json& md = obj["metadata"];
  if (!options.precondition_uid.empty() && md.value("uid", "") != options.precondition_uid) {
    return absl::AbortedError(
        absl::StrCat("Precondition failed: UID in precondition: ", options.precondition_uid,
                     ", UID in object meta: ", md.value("uid", "")));
  }
  if (!options.precondition_resource_version.empty() &&
      md.value("resourceVersion", "") != options.precondition_resource_version) {
    return absl::AbortedError(
        absl::StrCat("Precondition failed: ResourceVersion in precondition: ",
                     options.precondition_resource_version,
                     ", ResourceVersion in object meta: ", md.value("resourceVersion", "")));
  }

  if (type.plural == "pods") {
    int64_t grace = 30;
    if (auto spec = obj.find("spec"); spec != obj.end() && spec->is_object()) {
      auto g = spec->find("terminationGracePeriodSeconds");
      if (g != spec->end() && g->is_number_integer()) grace = g->get<int64_t>();
    }
    if (options.grace_period_seconds) grace = *options.grace_period_seconds;
    std::string phase = StrField(obj, "status", "phase");
    if (StrField(obj, "spec", "nodeName").empty() || phase == "Succeeded" || phase == "Failed") {
      grace = 0;
    }
    if (grace > 0) {
      absl::Time deadline = options_.clock->Now() + absl::Seconds(grace);
      auto existing = termination_deadlines_.find({&type, key});
      if (existing != termination_deadlines_.end() && existing->second <= deadline) {
        return DeleteResult{obj, false};
      }
      termination_deadlines_[{&type, key}] = deadline;
      // deletionTimestamp is system-owned (UpdateLocked preserves it), so it is set here.
      json marked = obj;
      marked["metadata"]["deletionTimestamp"] = FormatTimestamp(deadline);
      marked["metadata"]["deletionGracePeriodSeconds"] = grace;
      ++rv_;
      marked["metadata"]["resourceVersion"] = std::to_string(rv_);
      ObjectPtr previous = it->second;
      auto ptr = std::make_shared<const json>(marked);
      it->second = ptr;
      CommitLocked(type, EventType::kModified, ptr, previous);
      return DeleteResult{marked, false};
    }
  }

  if (type.plural == "namespaces") {
    for (const ResourceType& r : BuiltinResources()) {
      if (!r.namespaced) continue;
      Table& t = TableFor(r);
      std::string prefix = std::string(name) + "/";
      std::vector<std::string> keys;
      for (auto i = t.objects.lower_bound(prefix);
           i != t.objects.end() && i->first.compare(0, prefix.size(), prefix) == 0; ++i) {
        keys.push_back(i->first);
      }
      for (const std::string& k : keys) RemoveLocked(r, k, nullptr);
    }
  }
  DeleteResult result;
  result.deleted = true;
  RemoveLocked(type, key, &result.object);
  return result;
}

int ObjectStore::RemoveExpiredTerminatingPods() {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Time now = options_.clock->Now();
  std::vector<std::pair<const ResourceType*, std::string>> due;
  for (const auto& [k, deadline] : termination_deadlines_) {
    if (deadline <= now) due.push_back(k);
  }
  for (const auto& [type, key] : due) {
    if (TableFor(*type).objects.contains(key)) RemoveLocked(*type, key, nullptr);
    termination_deadlines_.erase({type, key});
  }
  return static_cast<int>(due.size());
}

std::optional<absl::Time> ObjectStore::NextTerminationDeadline() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<absl::Time> next;
  for (const auto& [k, deadline] : termination_deadlines_) {
    if (!next || deadline < *next) next = deadline;
  }
  return next;
}

absl::StatusOr<ListResult> ObjectStore::List(const ResourceType& type,
                                             const ListOptions& options) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Table& table = TableFor(type);
  ListResult result;
  result.resource_version = rv_;
  std::string start;
  bool has_start = false;
  // Keys whose state at the snapshot differs from now: the snapshot is rebuilt from history.
  std::map<std::string, ObjectPtr> overlay;
  if (!options.continue_token.empty()) {
    auto token = DecodeContinue(options.continue_token);
    if (!token) return absl::FailedPreconditionError("continue key is not valid");
    if (token->rv < compacted_rv_) {
      return absl::OutOfRangeError(
          "The provided continue parameter is too old to display a consistent list result. "
          "You can start a new list without the continue parameter.");
    }
    result.resource_version = token->rv;
    start = token->start;
    has_start = true;
    for (auto e = history_.rbegin(); e != history_.rend() && e->resource_version > token->rv; ++e) {
      if (e->resource != &type) continue;
      const json& md = (*e->object)["metadata"];
      overlay[Key(type, md.value("namespace", ""), md.value("name", ""))] = e->previous;
    }
  }
  std::string prefix =
      type.namespaced && !options.namespace_name.empty() ? options.namespace_name + "/" : "";
  auto in_range = [&](const std::string& k) {
    return prefix.empty() || k.compare(0, prefix.size(), prefix) == 0;
  };
  auto first = [&](const auto& m) {
    if (has_start) return m.upper_bound(std::max(start, prefix));
    return m.lower_bound(prefix);
  };
  auto cur = first(table.objects);
  auto ov = first(overlay);
  static const json kNull;
  auto matches = [&](const json& obj) {
    const json& md = obj["metadata"];
    auto it = md.find("labels");
    return options.labels.Matches(it == md.end() ? kNull : *it) && options.fields.Matches(obj);
  };
  std::string last_key;
  while (true) {
    bool cur_ok = cur != table.objects.end() && in_range(cur->first);
    bool ov_ok = ov != overlay.end() && in_range(ov->first);
    if (!cur_ok && !ov_ok) break;
    std::string key;
    ObjectPtr obj;
    if (ov_ok && (!cur_ok || ov->first <= cur->first)) {
      key = ov->first;
      obj = ov->second;
      if (cur_ok && cur->first == ov->first) ++cur;
      ++ov;
    } else {
      key = cur->first;
      obj = overlay.contains(key) ? overlay[key] : cur->second;
      ++cur;
    }
    if (obj == nullptr || !matches(*obj)) continue;
    if (options.limit > 0 && static_cast<int64_t>(result.items.size()) == options.limit) {
      result.continue_token = EncodeContinue({result.resource_version, last_key});
      break;
    }
    result.items.push_back(obj);
    last_key = key;
  }
  return result;
}

absl::StatusOr<std::unique_ptr<WatchStream>> ObjectStore::Watch(const ResourceType& type,
                                                                WatchOptions options) {
  auto state = std::make_shared<WatchStream::State>();
  state->resource = &type;
  state->options = std::move(options);
  std::lock_guard<std::mutex> lock(mu_);
  const WatchOptions& o = state->options;
  if (o.since) {
    if (*o.since < compacted_rv_) {
      return absl::OutOfRangeError(
          absl::StrCat("too old resource version: ", *o.since, " (", compacted_rv_ + 1, ")"));
    }
    for (const Event& e : history_) {
      if (e.resource_version <= *o.since || e.resource != &type) continue;
      if (auto f = state->Filter(e)) state->queue.push_back(std::move(*f));
    }
  } else {
    for (const auto& [key, obj] : TableFor(type).objects) {
      if (!state->Matches(*obj)) continue;
      uint64_t rv = 0;
      (void)absl::SimpleAtoi((*obj)["metadata"].value("resourceVersion", "0"), &rv);
      state->queue.push_back(Event{EventType::kAdded, rv, &type, obj, nullptr});
    }
  }
  watchers_.push_back(state);
  return std::unique_ptr<WatchStream>(new WatchStream(this, state));
}

void ObjectStore::Unregister(const std::shared_ptr<WatchStream::State>& state) {
  std::lock_guard<std::mutex> lock(mu_);
  watchers_.erase(std::remove(watchers_.begin(), watchers_.end(), state), watchers_.end());
}

}  // namespace sluice::lab
