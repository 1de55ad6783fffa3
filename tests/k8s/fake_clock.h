// A manual clock for the k8s client tests: SleepFor blocks until the test advances time (or the
// sleeper is stopped) and records every requested duration.
#pragma once

#include <vector>

#include "absl/synchronization/mutex.h"
#include "agent/k8s/clock.h"

namespace sluice::k8s::testing {

class FakeClock : public Clock {
 public:
  absl::Time Now() override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  bool SleepFor(absl::Duration d, absl::Notification& stop) override {
    absl::Time deadline;
    {
      absl::MutexLock lock(&mu_);
      sleeps_.push_back(d);
      deadline = now_ + d;
      ++sleepers_;
    }
    bool stopped = false;
    // Poll the fake time between short real waits on `stop` (which wakes at once on Stop()).
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (now_ >= deadline) break;
      }
      if (stop.WaitForNotificationWithTimeout(absl::Milliseconds(2))) {
        stopped = true;
        break;
      }
    }
    absl::MutexLock lock(&mu_);
    --sleepers_;
    return !stopped;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  // Waits until `n` sleeps have been requested and someone is sleeping now.
  bool WaitForSleeps(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto cond = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return sleeps_.size() >= n && sleepers_ > 0;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&cond), timeout);
  }
  std::vector<absl::Duration> sleeps() {
    absl::MutexLock lock(&mu_);
    return sleeps_;
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ = absl::FromUnixSeconds(1700000000);
  std::vector<absl::Duration> sleeps_;
  int sleepers_ = 0;
};

}  // namespace sluice::k8s::testing
