// The typed store: the agent's cache of one kind, keyed by namespace/name, fed by a reflector
// (Replace at every (re)list, Upsert/Delete per watch event), telling listeners what changed, and
// the SyncGate that holds back garbage collection until every store has completed its first list.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/k8s/model.h"

namespace sluice::k8s {

// Reports when EVERY registered participant (one per store/reflector) has completed its first full
// list. The agent must delete nothing from its maps before AllSynced(): a partial view would look
// like mass deletion.
class SyncGate {
 public:
  using Id = size_t;
  Id Register(std::string name);
  void MarkSynced(Id id);
  // False while nothing is registered.
  bool AllSynced() const;
  bool WaitAllSynced(absl::Duration timeout) const;
  // Names of the participants still waiting for their first list.
  std::vector<std::string> Pending() const;

 private:
  mutable absl::Mutex mu_;
  std::vector<std::pair<std::string, bool>> parts_ ABSL_GUARDED_BY(mu_);
};

enum class ChangeType { kAdded, kUpdated, kDeleted };

template <typename T>
struct Change {
  ChangeType type;
  std::shared_ptr<const T> old_obj;  // kUpdated, kDeleted
  std::shared_ptr<const T> new_obj;  // kAdded, kUpdated
};

template <typename T>
class Store {
 public:
  using Ptr = std::shared_ptr<const T>;
  // Called on the reflector's thread, in order, after the store is updated (so a listener may
  // read the store). Keep it short: hand the change to the reconciler's queue.
  using Listener = std::function<void(const Change<T>&)>;

  explicit Store(SyncGate* gate = nullptr, std::string name = std::string(KindInfo<T>::kKind))
      : name_(std::move(name)), gate_(gate) {
    if (gate_ != nullptr) gate_id_ = gate_->Register(name_);
  }

  // Register before the reflector starts.
  void AddListener(Listener l) {
    absl::MutexLock lock(&mu_);
    listeners_.push_back(std::move(l));
  }

  // The result of a complete (re)list: objects that vanished (deleted while the watch was down)
  // are emitted as deletions; a changed UID is a deletion plus an addition.
  void Replace(std::vector<T> items, std::string resource_version);
  // ADDED / MODIFIED.
  void Upsert(T obj);
  // DELETED (the object's last state); a miss is ignored.
  void Delete(const T& obj);

  Ptr Get(std::string_view key) const {
    absl::MutexLock lock(&mu_);
    // Debian's abseil keys take absl::string_view, not std::string_view.
    auto it = items_.find(absl::string_view(key.data(), key.size()));
    return it == items_.end() ? nullptr : it->second;
  }
  std::vector<Ptr> List() const {
    absl::MutexLock lock(&mu_);
    std::vector<Ptr> out;
    out.reserve(items_.size());
    for (const auto& [k, v] : items_) out.push_back(v);
    return out;
  }
  size_t size() const {
    absl::MutexLock lock(&mu_);
    return items_.size();
  }
  bool HasSynced() const {
    absl::MutexLock lock(&mu_);
    return synced_;
  }
  bool WaitSynced(absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&synced_), timeout);
  }
  // Of the last list or applied event.
  std::string resource_version() const {
    absl::MutexLock lock(&mu_);
    return resource_version_;
  }
  const std::string& name() const { return name_; }

 private:
  void Notify(const std::vector<Change<T>>& changes) {
    std::vector<Listener> listeners;
    {
      absl::MutexLock lock(&mu_);
      listeners = listeners_;
    }
    for (const Change<T>& c : changes) {
      for (const Listener& l : listeners) l(c);
    }
  }

  const std::string name_;
  SyncGate* const gate_;
  SyncGate::Id gate_id_ = 0;
  // Serialises writers so listeners see changes in the order they were applied.
  absl::Mutex write_mu_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Ptr> items_ ABSL_GUARDED_BY(mu_);
  std::vector<Listener> listeners_ ABSL_GUARDED_BY(mu_);
  std::string resource_version_ ABSL_GUARDED_BY(mu_);
  bool synced_ ABSL_GUARDED_BY(mu_) = false;
};

template <typename T>
void Store<T>::Replace(std::vector<T> items, std::string resource_version) {
  absl::MutexLock wlock(&write_mu_);
  std::vector<Change<T>> changes;
  bool first_sync = false;
  {
    absl::MutexLock lock(&mu_);
    absl::flat_hash_map<std::string, Ptr> next;
    next.reserve(items.size());
    for (T& obj : items) {
      std::string key = obj.meta.Key();
      auto old = items_.find(key);
      if (old == items_.end()) {
        auto p = std::make_shared<const T>(std::move(obj));
        changes.push_back({ChangeType::kAdded, nullptr, p});
        next[std::move(key)] = std::move(p);
      } else if (old->second->meta.uid != obj.meta.uid) {
        auto p = std::make_shared<const T>(std::move(obj));
        changes.push_back({ChangeType::kDeleted, old->second, nullptr});
        changes.push_back({ChangeType::kAdded, nullptr, p});
        next[std::move(key)] = std::move(p);
      } else if (!(*old->second == obj)) {
        auto p = std::make_shared<const T>(std::move(obj));
        changes.push_back({ChangeType::kUpdated, old->second, p});
        next[std::move(key)] = std::move(p);
      } else {
        next[std::move(key)] = old->second;
      }
    }
    for (const auto& [key, old] : items_) {
      if (!next.contains(key)) changes.push_back({ChangeType::kDeleted, old, nullptr});
    }
    items_ = std::move(next);
    resource_version_ = std::move(resource_version);
    first_sync = !synced_;
  }
  // Listeners see the initial objects before anyone is told the store (and the gate) synced.
  Notify(changes);
  if (first_sync) {
    absl::MutexLock lock(&mu_);
    synced_ = true;
    if (gate_ != nullptr) gate_->MarkSynced(gate_id_);
  }
}

template <typename T>
void Store<T>::Upsert(T obj) {
  absl::MutexLock wlock(&write_mu_);
  std::vector<Change<T>> changes;
  {
    absl::MutexLock lock(&mu_);
    resource_version_ = obj.meta.resource_version;
    std::string key = obj.meta.Key();
    auto p = std::make_shared<const T>(std::move(obj));
    auto [it, inserted] = items_.try_emplace(std::move(key), p);
    if (inserted) {
      changes.push_back({ChangeType::kAdded, nullptr, p});
    } else if (it->second->meta.uid != p->meta.uid) {
      changes.push_back({ChangeType::kDeleted, it->second, nullptr});
      changes.push_back({ChangeType::kAdded, nullptr, p});
      it->second = p;
    } else {
      changes.push_back({ChangeType::kUpdated, it->second, p});
      it->second = p;
    }
  }
  Notify(changes);
}

template <typename T>
void Store<T>::Delete(const T& obj) {
  absl::MutexLock wlock(&write_mu_);
  std::vector<Change<T>> changes;
  {
    absl::MutexLock lock(&mu_);
    if (!obj.meta.resource_version.empty()) resource_version_ = obj.meta.resource_version;
    auto it = items_.find(obj.meta.Key());
    if (it == items_.end()) return;
    changes.push_back({ChangeType::kDeleted, it->second, nullptr});
    items_.erase(it);
  }
  Notify(changes);
}

}  // namespace sluice::k8s
