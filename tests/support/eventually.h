// The one way tests wait for threads, processes and the kernel: a condition polled until it
// holds or a deadline passes (never a bare sleep).
#pragma once

#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace sluice::testing {

inline constexpr absl::Duration kEventuallyTimeout = absl::Seconds(20);

// Polls `cond` every `poll` until it holds (true) or `timeout` has passed (false, after one last
// look).
inline bool Eventually(const std::function<bool()>& cond,
                       absl::Duration timeout = kEventuallyTimeout,
                       absl::Duration poll = absl::Milliseconds(5)) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    if (cond()) return true;
    absl::SleepFor(poll);
  }
  return cond();
}

}  // namespace sluice::testing
