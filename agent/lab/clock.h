// Time source for the lab's control plane: graceful pod deletion deadlines and timestamps read the
// clock through this interface so tests can move time by hand.
#ifndef SLUICE_AGENT_LAB_CLOCK_H_
#define SLUICE_AGENT_LAB_CLOCK_H_

#include <functional>
#include <mutex>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace sluice::lab {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

class RealClock : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  static const Clock* Get() {
    static const RealClock clock;
    return &clock;
  }
};

// A clock that only moves when told to; observers are called after every move (controllers use
// this to re-evaluate deadlines immediately).
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000)) : now_(start) {}
  absl::Time Now() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    std::vector<std::function<void()>> observers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      now_ += d;
      observers = observers_;
    }
    for (auto& f : observers) f();
  }
  void AddObserver(std::function<void()> f) {
    std::lock_guard<std::mutex> lock(mu_);
    observers_.push_back(std::move(f));
  }

 private:
  mutable std::mutex mu_;
  absl::Time now_;
  std::vector<std::function<void()>> observers_;
};

}  // namespace sluice::lab

#endif  // SLUICE_AGENT_LAB_CLOCK_H_
