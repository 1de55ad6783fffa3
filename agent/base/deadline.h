// Deadlines for the waits the kernel or absl::Mutex times: one conversion for the calls that take
// a timeout in milliseconds (poll(2), epoll_wait(2)), so that every wait ends at its deadline, not
// before and not a tick late; and the one place that reads the real clock for such a wait.
#pragma once

#include <algorithm>
#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace sluice {

// The timeout that waits from `now` until `deadline`: 0 once the deadline has passed (a poll
// then only looks), -1 (no timeout) for absl::InfiniteFuture(), otherwise the time left rounded
// up to a whole millisecond, so that a wait that times out is past the deadline (a caller that
// checks "now >= deadline" after it sees a timeout never spins), and at most 2^30 ms.
inline int PollTimeoutMs(absl::Time deadline, absl::Time now) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const absl::Duration left = deadline - now;
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(
      absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), int64_t{1} << 30));
}

// A wait that the kernel times (poll(2) on a socket) or that absl::Mutex times
// (AwaitWithDeadline) runs on the real clock, whatever sluice::Clock its component was given: a
// fake clock cannot end it. Its deadline is read here; everything else that reads the time goes
// through sluice::Clock (agent/base/clock.h). tests/repo/clock_reads_test.py keeps it so.
inline absl::Time WaitDeadline(absl::Duration timeout) { return absl::Now() + timeout; }
inline bool WaitDeadlinePassed(absl::Time deadline) { return absl::Now() >= deadline; }
inline int PollTimeoutMs(absl::Time deadline) { return PollTimeoutMs(deadline, absl::Now()); }

}  // namespace sluice
