// Time and randomness for the Kubernetes client, injected so that back-off, watch timeouts and
// token refresh are testable without real waits.
#pragma once

#include <functional>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace sluice::k8s {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() = 0;
  // Waits `d` or until `stop` is notified; false when stopped.
  virtual bool SleepFor(absl::Duration d, absl::Notification& stop) = 0;
};

class RealClock : public Clock {
 public:
  absl::Time Now() override { return absl::Now(); }
  bool SleepFor(absl::Duration d, absl::Notification& stop) override {
    return !stop.WaitForNotificationWithTimeout(d);
  }
  static RealClock* Get() {
    static RealClock clock;
    return &clock;
  }
};

// Uniform in [0, 1).
using RandomFn = std::function<double()>;
RandomFn DefaultRandom();

}  // namespace sluice::k8s
