#include "agent/lab/workloads/supervisor.h"

#include <gtest/gtest.h>

namespace sluice::lab {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);

TEST(RestartBackoff, AnAgentDyingYoungWaitsLongerEachTimeUpToTheCap) {
  RestartBackoff b({.initial = absl::Milliseconds(200),
                    .cap = absl::Seconds(1),
                    .stable_after = absl::Seconds(3)});
  absl::Time now = kT0;
  b.Started(now);
  std::vector<absl::Duration> waits;
  for (int i = 0; i < 5; ++i) {
    now += absl::Milliseconds(100);  // dies 100 ms after each start
    absl::Time due = b.Exited(now);
    waits.push_back(due - now);
    now = due;
    b.Started(now);
  }
  EXPECT_EQ(waits, (std::vector<absl::Duration>{absl::Milliseconds(200), absl::Milliseconds(400),
                                                absl::Milliseconds(800), absl::Seconds(1),
                                                absl::Seconds(1)}));
  EXPECT_EQ(b.restarts(), 5);
}

TEST(RestartBackoff, AnAgentThatStayedUpRestartsAfterTheInitialWaitAgain) {
  RestartBackoff b({.initial = absl::Milliseconds(200),
                    .cap = absl::Seconds(5),
                    .stable_after = absl::Seconds(3)});
  b.Started(kT0);
  absl::Time due = b.Exited(kT0 + absl::Milliseconds(10));
  b.Started(due);
  due = b.Exited(due + absl::Milliseconds(10));
  b.Started(due);
  absl::Time exit = due + absl::Seconds(3);  // up for stable_after
  EXPECT_EQ(b.Exited(exit) - exit, absl::Milliseconds(200));
}

TEST(RestartBackoff, TheFirstExitWaitsTheInitialBackoff) {
  RestartBackoff b;
  b.Started(kT0);
  EXPECT_EQ(b.Exited(kT0) - kT0, absl::Milliseconds(200));
}

}  // namespace
}  // namespace sluice::lab
