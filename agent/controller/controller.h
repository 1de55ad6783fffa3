// The one loop every feature of the agent runs on to keep kernel state equal to Kubernetes
// state, level-triggered: store listeners mark keys dirty (coalesced: a key changed ten times is
// reconciled once), one thread hands the dirty keys to the feature's reconcile function in
// batches. Nothing is reconciled before the sync gate opens (every watch has completed its first
// list: a restarted agent must not delete what it simply has not heard of yet); the first batch
// after that is a full one (every key the feature knows of, so it can prune what is stale); a
// failed batch is retried after a delay, with the keys that changed meanwhile.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/base/clock.h"

namespace sluice::controller {

// The dirty keys. Shared by the controller and the listeners that feed it: stores have no
// RemoveListener and outlive the features, so a listener may still mark a key after its
// controller is gone; it then touches this, never freed memory.
class DirtyKeys {
 public:
  void Mark(std::string key) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class Controller;

  absl::Mutex mu_;
  absl::flat_hash_set<std::string> dirty_ ABSL_GUARDED_BY(mu_);
  uint64_t seen_ ABSL_GUARDED_BY(mu_) = 0;     // marks so far
  uint64_t applied_ ABSL_GUARDED_BY(mu_) = 0;  // marks reconciled (counted at a batch's start)
  uint64_t reconciled_ ABSL_GUARDED_BY(mu_) = 0;  // keys handed to the reconcile function
  bool primed_ ABSL_GUARDED_BY(mu_) = false;   // a full batch has succeeded
  bool retry_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

struct Batch {
  absl::flat_hash_set<std::string> keys;
  // The first batch after the gate opened (or after a failed full one): `keys` holds every key
  // the feature knows of, and the reconcile function may delete state no key accounts for.
  bool full = false;
};

struct ControllerOptions {
  std::string name;  // in log lines: "services: ..."
  // The sync gate; asked without the controller's lock held.
  std::function<bool()> synced;
  // Every key a full batch must cover (e.g. the objects in the store plus those the maps
  // still hold from before a restart).
  std::function<std::vector<std::string>()> all_keys;
  absl::Duration retry_delay = absl::Seconds(1);
  // How often a closed gate is asked again.
  absl::Duration gate_poll = absl::Milliseconds(10);
  // Times each reconcile (sluice_reconcile_duration_seconds and the log); borrowed.
  const Clock* clock = RealClock::Get();
};

class Controller {
 public:
  using ReconcileFn = std::function<absl::Status(const Batch&)>;

  // Starts the loop's thread.
  Controller(ControllerOptions options, ReconcileFn reconcile);
  ~Controller();
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  // For listeners: capture this pointer, not the controller.
  const std::shared_ptr<DirtyKeys>& keys() const { return keys_; }
  void Mark(std::string key) { keys_->Mark(std::move(key)); }

  // Waits until every key marked so far has been reconciled, no retry is pending and the full
  // batch has succeeded.
  bool WaitIdle(absl::Duration timeout);
  bool primed() const;
  uint64_t reconciled() const;  // keys handed to the reconcile function so far

 private:
  void Run();

  const ControllerOptions options_;
  const ReconcileFn reconcile_;
  const std::shared_ptr<DirtyKeys> keys_ = std::make_shared<DirtyKeys>();
  std::thread thread_;
};

}  // namespace sluice::controller
