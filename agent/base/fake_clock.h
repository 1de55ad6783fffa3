// A clock that moves only when a test says so. SleepFor blocks until the test has advanced time
// past the deadline (or the sleeper is stopped) and records every requested duration; observers
// run after every move (the lab's controllers re-evaluate their deadlines there).
#pragma once

#include <functional>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "agent/base/clock.h"

namespace sluice {

class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000)) : now_(start) {}

  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }

  bool SleepFor(absl::Duration d, absl::Notification& stop) const override {
    absl::Time deadline;
    {
      absl::MutexLock lock(&mu_);
      sleeps_.push_back(d);
      deadline = now_ + d;
      ++sleepers_;
    }
    bool stopped = false;
    // Fake time is checked between short real waits on `stop`, which wakes at once when stopped.
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
    std::vector<std::function<void()>> observers;
    {
      absl::MutexLock lock(&mu_);
      now_ += d;
      observers = observers_;
    }
    for (auto& f : observers) f();
  }

  void AddObserver(std::function<void()> f) {
    absl::MutexLock lock(&mu_);
    observers_.push_back(std::move(f));
  }

  // Waits until `n` sleeps have been requested and someone is sleeping now.
  bool WaitForSleeps(size_t n, absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto cond = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return sleeps_.size() >= n && sleepers_ > 0;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&cond), timeout);
  }

  std::vector<absl::Duration> sleeps() const {
    absl::MutexLock lock(&mu_);
    return sleeps_;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<absl::Duration> sleeps_ ABSL_GUARDED_BY(mu_);
  mutable int sleepers_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::function<void()>> observers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice
