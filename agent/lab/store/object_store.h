// The lab apiserver's storage: every object as JSON, one global resourceVersion counter (like
// etcd's revision), a bounded event history for watches, and snapshot-consistent paginated lists.
#ifndef SLUICE_AGENT_LAB_STORE_OBJECT_STORE_H_
#define SLUICE_AGENT_LAB_STORE_OBJECT_STORE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/base/clock.h"
#include "agent/lab/store/selectors.h"
#include "nlohmann/json.hpp"

namespace sluice::lab {

struct ResourceType {
  std::string group;  // "" for the core group
  std::string version;
  std::string plural;
  std::string singular;
  std::string kind;
  bool namespaced = false;
  std::vector<std::string> short_names;
  bool has_status = false;  // has a /status subresource; main-resource writes keep status

  // "v1" or "discovery.k8s.io/v1".
  std::string ApiVersion() const { return group.empty() ? version : group + "/" + version; }
};

// The kinds the lab serves (the table is in object_store.cc): namespaces, nodes, pods, services,
// events, configmaps, serviceaccounts (v1), endpointslices (discovery.k8s.io/v1), networkpolicies
// (networking.k8s.io/v1), leases (coordination.k8s.io/v1), daemonsets, deployments (apps/v1) and
// the RBAC kinds (rbac.authorization.k8s.io/v1).
const std::vector<ResourceType>& BuiltinResources();
const ResourceType* FindResource(std::string_view group, std::string_view version,
                                 std::string_view plural);
// A built-in resource by plural name ("pods"); aborts on an unknown name.
const ResourceType& Resource(std::string_view plural);

enum class EventType { kAdded, kModified, kDeleted };
const char* EventTypeName(EventType type);

using ObjectPtr = std::shared_ptr<const nlohmann::json>;

struct Event {
  EventType type;
  uint64_t resource_version;
  const ResourceType* resource;
  ObjectPtr object;    // state after the write; for DELETED the last state with the deletion RV
  ObjectPtr previous;  // state before the write; null for ADDED
};

// Called with the store lock held, before a write is committed (kube-apiserver's defaulting,
// validation and allocation). Must not call back into the store.
class Admission {
 public:
  virtual ~Admission() = default;
  // `old` is null on create. May mutate `object`; an error rejects the write.
  virtual absl::Status Admit(const ResourceType& type, nlohmann::json& object,
                             const nlohmann::json* old) = 0;
  // After an object has been removed (release what Admit allocated).
  virtual void Deleted(const ResourceType& type, const nlohmann::json& object) = 0;
};

struct ListOptions {
  std::string namespace_name;  // empty: all namespaces
  LabelSelector labels;
  FieldSelector fields;
  int64_t limit = 0;  // 0: everything
  std::string continue_token;
};

struct ListResult {
  std::vector<ObjectPtr> items;
  uint64_t resource_version = 0;  // the snapshot every page of one list is served from
  std::string continue_token;     // empty on the last page
};

struct WatchOptions {
  std::string namespace_name;
  LabelSelector labels;
  FieldSelector fields;
  // nullopt: start with a synthetic ADDED for every current object (RV unset or "0").
  // N: every change after N (410 if N is older than the retained history).
  std::optional<uint64_t> since;
  size_t max_queue = 100'000;  // a slower consumer is expired like a lagging watch-cache client
};

class ObjectStore;

// One running watch. Must not outlive its store.
class WatchStream {
 public:
  enum class Result { kEvent, kTimeout, kInterrupted, kExpired };
  ~WatchStream();
  WatchStream(const WatchStream&) = delete;
  WatchStream& operator=(const WatchStream&) = delete;

  // Blocks until an event is queued (kEvent, *out set), `deadline` passes, Interrupt() is called,
  // or the history was compacted under this watch / it fell too far behind (kExpired, sticky).
  Result Next(absl::Time deadline, Event* out);
  // Wakes a blocked Next() (once) with kInterrupted.
  void Interrupt();
  size_t queued() const;

 private:
  friend class ObjectStore;
  struct State;
  WatchStream(ObjectStore* store, std::shared_ptr<State> state)
      : store_(store), state_(std::move(state)) {}
  ObjectStore* store_;
  std::shared_ptr<State> state_;
};

class ObjectStore {
 public:
  struct Options {
    size_t history_limit = 100'000;  // events retained for watches / continue tokens
    const Clock* clock = RealClock::Get();
    bool require_namespace = true;  // namespaced creates need an existing Namespace (404)
  };
  enum class Subresource { kMain, kStatus };
  struct DeleteOptions {
    std::optional<int64_t> grace_period_seconds;
    std::string precondition_uid;
    std::string precondition_resource_version;
  };
  struct DeleteResult {
    nlohmann::json object;  // the deleted object, or the pod now terminating
    bool deleted = false;   // false: graceful pod deletion started (or was shortened)
  };

  ObjectStore() : ObjectStore(Options()) {}
  explicit ObjectStore(Options options);
  ~ObjectStore();

  // Both must be set before the store is shared between threads.
  void SetAdmission(Admission* admission) { admission_ = admission; }
  // Called with the store lock held after every committed write; must not call into the store.
  void AddListener(std::function<void(const Event&)> listener);

  // Errors: NotFound (404), AlreadyExists (409), Aborted (409 Conflict), InvalidArgument (422),
  // FailedPrecondition (400 BadRequest), OutOfRange (410 Expired).
  absl::StatusOr<nlohmann::json> Create(const ResourceType& type, nlohmann::json object);
  absl::StatusOr<nlohmann::json> Get(const ResourceType& type, std::string_view namespace_name,
                                     std::string_view name) const;
  // Atomic read-modify-write: `mutate` gets a copy of the current object. No-op writes are not
  // committed (no new RV, no event), as in kube-apiserver.
  absl::StatusOr<nlohmann::json> Update(const ResourceType& type, std::string_view namespace_name,
                                        std::string_view name,
                                        const std::function<absl::Status(nlohmann::json&)>& mutate,
                                        Subresource subresource = Subresource::kMain);
  // PUT: replaces the object; a non-empty metadata.resourceVersion must match (409 Conflict).
  absl::StatusOr<nlohmann::json> Replace(const ResourceType& type, nlohmann::json object,
                                         Subresource subresource = Subresource::kMain);
  // Pods are deleted gracefully (deletionTimestamp now + grace, removed later by
  // RemoveExpiredTerminatingPods) unless the grace period is 0 or the pod is unscheduled or
  // finished. Deleting a Namespace deletes everything in it.
  absl::StatusOr<DeleteResult> Delete(const ResourceType& type, std::string_view namespace_name,
                                      std::string_view name, const DeleteOptions& options);
  absl::StatusOr<ListResult> List(const ResourceType& type, const ListOptions& options) const;
  absl::StatusOr<std::unique_ptr<WatchStream>> Watch(const ResourceType& type,
                                                     WatchOptions options);

  uint64_t CurrentResourceVersion() const;
  // Watches (and continue tokens) from an RV below this get 410 Expired.
  uint64_t OldestWatchableResourceVersion() const;
  // Drops the whole history now: watches from any earlier RV get 410 and every running watch
  // ends with kExpired.
  void Compact();
  void SetHistoryLimit(size_t limit);

  int RemoveExpiredTerminatingPods();
  std::optional<absl::Time> NextTerminationDeadline() const;

  const Clock* clock() const { return options_.clock; }
  static std::string FormatTimestamp(absl::Time t);

 private:
  friend class WatchStream;
  struct Table {
    std::map<std::string, ObjectPtr> objects;  // "ns/name" or "name"
  };

  Table& TableFor(const ResourceType& type) const;
  absl::StatusOr<nlohmann::json> UpdateLocked(
      const ResourceType& type, const std::string& key,
      const std::function<absl::Status(nlohmann::json&)>& mutate, Subresource subresource);
  void RemoveLocked(const ResourceType& type, const std::string& key, nlohmann::json* removed);
  void CommitLocked(const ResourceType& type, EventType event_type, ObjectPtr object,
                    ObjectPtr previous);
  void TrimHistoryLocked();
  void Unregister(const std::shared_ptr<WatchStream::State>& state);

  Options options_;
  Admission* admission_ = nullptr;
  std::vector<std::function<void(const Event&)>> listeners_;

  mutable std::mutex mu_;
  mutable std::map<const ResourceType*, Table> tables_;
  std::deque<Event> history_;
  uint64_t rv_ = 0;
  uint64_t compacted_rv_ = 0;  // every event with RV > this is in history_
  std::vector<std::shared_ptr<WatchStream::State>> watchers_;
  std::map<std::pair<const ResourceType*, std::string>, absl::Time> termination_deadlines_;
};

// "pods \"x\" not found"-style errors shared with the apiserver.
std::string QualifiedResource(
    const ResourceType& type);  // "pods" or "endpointslices.discovery.k8s.io"

}  // namespace sluice::lab

#endif  // SLUICE_AGENT_LAB_STORE_OBJECT_STORE_H_
