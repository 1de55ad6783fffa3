// Back-off between retries: a delay that grows by a factor up to a cap, with jitter, and starts
// over after a quiet period. Time and randomness are injected (agent/base/clock.h), so tests
// step through a sequence without sleeping.
#pragma once

#include <algorithm>
#include <utility>

#include "absl/time/time.h"
#include "agent/base/clock.h"

namespace sluice {

struct BackoffOptions {
  absl::Duration initial = absl::Milliseconds(800);
  double factor = 2.0;
  absl::Duration cap = absl::Seconds(30);
  // Each delay is base * (1 + jitter * U[0,1)), then capped at `cap`.
  double jitter = 1.0;
  // The sequence restarts from `initial` after this long without a back-off (and whenever the
  // owner calls Reset: what it retries has been seen to work). absl::InfiniteDuration(): only
  // Reset restarts it, and the back-off needs no clock.
  absl::Duration reset_after = absl::Minutes(2);
};

class Backoff {
 public:
  // `random` may be empty: no jitter. `clock` may be null when opts.reset_after is infinite.
  Backoff(BackoffOptions opts, const Clock* clock, RandomFn random)
      : opts_(opts), clock_(clock), random_(std::move(random)), base_(opts.initial) {}

  // The next delay, at most `cap` (clamped to opts.cap); the sequence grows from there.
  absl::Duration Next(absl::Duration cap) {
    cap = std::min(cap, opts_.cap);
    if (opts_.reset_after != absl::InfiniteDuration()) {
      const absl::Time now = clock_->Now();
      if (last_ != absl::InfinitePast() && now - last_ > opts_.reset_after) base_ = opts_.initial;
      last_ = now;
    }
    const absl::Duration base = std::min(base_, cap);
    base_ = std::min(base * opts_.factor, opts_.cap);
    const double r = random_ ? random_() : 0.0;
    return std::min(base * (1.0 + opts_.jitter * r), cap);
  }
  absl::Duration Next() { return Next(opts_.cap); }
  void Reset() { base_ = opts_.initial; }

 private:
  const BackoffOptions opts_;
  const Clock* const clock_;
  const RandomFn random_;
  absl::Duration base_;
  absl::Time last_ = absl::InfinitePast();
};

}  // namespace sluice
