// Health of the agent as the DaemonSet probes ask for it. Liveness (/healthz): the process
// answers and no loop of it is wedged (every registered loop has beaten within its limit).
// Readiness (/readyz): every required condition holds (watches synced, datapath loaded, CNI
// installed); otherwise which does not and why.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/base/clock.h"

namespace sluice::metrics {

struct HealthVerdict {
  bool ok = false;
  std::string text;  // one line per condition: "ok NAME" or "fail NAME: REASON"
};

class Readiness {
 public:
  // `check` returns "" while the condition holds, else why not ("services not listed yet").
  void Require(std::string name, std::function<std::string()> check);
  HealthVerdict Check() const;

 private:
  mutable absl::Mutex mu_;
  std::vector<std::pair<std::string, std::function<std::string()>>> checks_ ABSL_GUARDED_BY(mu_);
};

// A flag a readiness check reads: set once the step it names is done.
class Milestone {
 public:
  void Reach() { done_.store(true); }
  bool reached() const { return done_.load(); }

 private:
  std::atomic<bool> done_{false};
};

class Heartbeats;

// One loop's heartbeat; unregisters itself when destroyed.
class Heartbeat {
 public:
  ~Heartbeat();
  void Beat();

 private:
  friend class Heartbeats;
  Heartbeat(Heartbeats* owner, std::string name, absl::Duration limit);
  Heartbeats* const owner_;
  const std::string name_;
  const absl::Duration limit_;
  std::atomic<int64_t> last_ns_{0};
};

class Heartbeats {
 public:
  explicit Heartbeats(const Clock* clock = RealClock::Get()) : clock_(clock) {}
  // A loop that must beat at least every `limit` (its longest legitimate pause).
  std::unique_ptr<Heartbeat> Register(std::string name, absl::Duration limit);
  HealthVerdict Check() const;

 private:
  friend class Heartbeat;
  void Remove(Heartbeat* h);
  const Clock* const clock_;
  mutable absl::Mutex mu_;
  std::vector<Heartbeat*> beats_ ABSL_GUARDED_BY(mu_);
};

// The process's loops (the controllers register theirs); what /healthz asks.
Heartbeats& DefaultHeartbeats();

}  // namespace sluice::metrics
