// Time, injected: everything that waits, times out, backs off or stamps objects reads the clock
// through this interface, so tests move time by hand (agent/base/fake_clock.h) instead of
// sleeping.
#pragma once

#include <functional>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace sluice {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // Waits `d` or until `stop` is notified; false when stopped.
  virtual bool SleepFor(absl::Duration d, absl::Notification& stop) const = 0;
};

class RealClock : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  bool SleepFor(absl::Duration d, absl::Notification& stop) const override {
    return !stop.WaitForNotificationWithTimeout(d);
  }
  static const Clock* Get() {
    static const RealClock clock;
    return &clock;
  }
};

// Randomness, injected likewise: uniform in [0, 1).
using RandomFn = std::function<double()>;
RandomFn DefaultRandom();

}  // namespace sluice
