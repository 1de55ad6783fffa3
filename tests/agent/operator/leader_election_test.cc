// The Lease election state machine on a fake clock against an in-memory Lease with
// resourceVersion preconditions: who acquires when, renewals, stepping down after renew_deadline,
// conflicting writes, release.
#include "agent/operator/leader_election.h"

#include <functional>
#include <optional>

#include "absl/strings/str_cat.h"
#include "agent/base/fake_clock.h"
#include "gtest/gtest.h"

namespace sluice::agent {
namespace {

using State = LeaderElector::State;

// One Lease; writes must carry the current resourceVersion (409 -> Aborted) like the apiserver.
class MemoryLease : public LeaseClient {
 public:
  absl::StatusOr<std::optional<LeaseRecord>> Get() override {
    if (fail) return absl::UnavailableError("apiserver down");
    return lease;
  }
  absl::StatusOr<LeaseRecord> Create(const LeaseRecord& r) override {
    if (fail) return absl::UnavailableError("apiserver down");
    if (lease) return absl::AlreadyExistsError("leases \"l\" already exists");
    lease = r;
    lease->resource_version = absl::StrCat(++rv);
    return *lease;
  }
  absl::StatusOr<LeaseRecord> Update(const LeaseRecord& r) override {
    if (auto hook = std::exchange(before_update, nullptr)) hook();
    if (fail) return absl::UnavailableError("apiserver down");
    if (!lease) return absl::NotFoundError("no lease");
    if (r.resource_version != lease->resource_version) {
      ++conflicts;
      return absl::AbortedError("the object has been modified");
    }
    lease = r;
    lease->resource_version = absl::StrCat(++rv);
    return *lease;
  }

  std::optional<LeaseRecord> lease;
  bool fail = false;
  int rv = 0;
  int conflicts = 0;
  std::function<void()> before_update;
};

ElectionOptions Options(const std::string& id, const Clock* clock) {
  ElectionOptions o;
  o.identity = id;
  o.clock = clock;  // 15 s lease, 10 s renew deadline, 2 s retry: the defaults
  return o;
}

TEST(LeaderElectionTest, FirstCandidateCreatesTheLeaseAndLeads) {
  FakeClock clock;
  MemoryLease lease;
  LeaderElector a(&lease, Options("a", &clock));
  EXPECT_EQ(a.Tick(), State::kLeader);
  ASSERT_TRUE(lease.lease.has_value());
  EXPECT_EQ(lease.lease->holder, "a");
  EXPECT_EQ(lease.lease->lease_duration, absl::Seconds(15));
  EXPECT_EQ(lease.lease->renew_time, clock.Now());
  EXPECT_EQ(lease.lease->transitions, 0);
}

TEST(LeaderElectionTest, FollowerTakesOverOnlyOnceLeaseDurationPassedSinceItSawARenewal) {
  FakeClock clock;
  MemoryLease lease;
  LeaderElector a(&lease, Options("a", &clock));
  LeaderElector b(&lease, Options("b", &clock));
  ASSERT_EQ(a.Tick(), State::kLeader);
  EXPECT_EQ(b.Tick(), State::kFollower);  // b first sees the record now
  clock.Advance(absl::Seconds(14));       // a has stopped renewing (crashed)
  EXPECT_EQ(b.Tick(), State::kFollower);
  EXPECT_EQ(lease.lease->holder, "a");
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(b.Tick(), State::kLeader);
  EXPECT_EQ(lease.lease->holder, "b");
  EXPECT_EQ(lease.lease->transitions, 1);
  EXPECT_EQ(lease.lease->acquire_time, clock.Now());
}

TEST(LeaderElectionTest, RenewingLeaderKeepsFollowersOutAndKeepsItsAcquireTime) {
  FakeClock clock;
  MemoryLease lease;
  LeaderElector a(&lease, Options("a", &clock));
  LeaderElector b(&lease, Options("b", &clock));
  const absl::Time acquired = clock.Now();
  ASSERT_EQ(a.Tick(), State::kLeader);
  for (int i = 0; i < 60; ++i) {
    clock.Advance(absl::Seconds(2));
    ASSERT_EQ(a.Tick(), State::kLeader) << i;
    ASSERT_EQ(b.Tick(), State::kFollower) << i;
  }
  EXPECT_EQ(lease.lease->holder, "a");
  EXPECT_EQ(lease.lease->acquire_time, acquired);
  EXPECT_EQ(lease.lease->renew_time, clock.Now());
  EXPECT_EQ(a.counters().renewals, 60u);
  EXPECT_EQ(b.counters().acquisitions, 0u);
}

TEST(LeaderElectionTest, LeaderStepsDownOnceRenewalsFailedForRenewDeadlineAndStaysDown) {
  FakeClock clock;
  MemoryLease lease;
  LeaderElector a(&lease, Options("a", &clock));
  ASSERT_EQ(a.Tick(), State::kLeader);
  lease.fail = true;
  for (int i = 0; i < 4; ++i) {  // 2, 4, 6, 8 s without a renewal
    clock.Advance(absl::Seconds(2));
    ASSERT_EQ(a.Tick(), State::kLeader) << i;
  }
  clock.Advance(absl::Seconds(2));  // 10 s: the renew deadline
  EXPECT_EQ(a.Tick(), State::kLost);
  lease.fail = false;
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(a.Tick(), State::kLost);  // final: the binary exits and restarts as a follower
}

TEST(LeaderElectionTest, OneFailedRenewalWithinTheDeadlineIsNotALoss) {
  FakeClock clock;
  MemoryLease lease;
  LeaderElector a(&lease, Options("a", &clock));
  ASSERT_EQ(a.Tick(), State::kLeader);
  for (int round = 0; round < 5; ++round) {
    lease.fail = true;
    clock.Advance(absl::Seconds(8));
    ASSERT_EQ(a.Tick(), State::kLeader);
    lease.fail = false;
    clock.Advance(absl::Seconds(1));
    ASSERT_EQ(a.Tick(), State::kLeader);
  }
}

TEST(LeaderElectionTest, TwoCandidatesRacingForAnExpiredLeaseOnlyOneWins) {
  FakeClock clock;
  MemoryLease lease;
  LeaderElector old_leader(&lease, Options("old", &clock));
  LeaderElector a(&lease, Options("a", &clock));
  LeaderElector b(&lease, Options("b", &clock));
  ASSERT_EQ(old_leader.Tick(), State::kLeader);
  ASSERT_EQ(a.Tick(), State::kFollower);
  ASSERT_EQ(b.Tick(), State::kFollower);
  clock.Advance(absl::Seconds(16));
  // b has read the expired record and is about to write it; a writes first.
  lease.before_update = [&] { EXPECT_TRUE(a.TryAcquireOrRenew()); };
  EXPECT_EQ(b.Tick(), State::kFollower);
  EXPECT_EQ(lease.conflicts, 1);
  EXPECT_EQ(lease.lease->holder, "a");
  EXPECT_EQ(b.counters().failed_writes, 1u);
  EXPECT_EQ(a.Tick(), State::kLeader);
  EXPECT_EQ(b.Tick(), State::kFollower);  // a's write is a fresh observation: 15 s again
}

TEST(LeaderElectionTest, ReleasedLeaseIsTakenAtOnce) {
  FakeClock clock;
  MemoryLease lease;
  LeaderElector a(&lease, Options("a", &clock));
  LeaderElector b(&lease, Options("b", &clock));
  ASSERT_EQ(a.Tick(), State::kLeader);
  ASSERT_EQ(b.Tick(), State::kFollower);
  ASSERT_TRUE(a.Release().ok());
  EXPECT_EQ(lease.lease->holder, "");
  EXPECT_EQ(b.Tick(), State::kLeader);
  EXPECT_EQ(lease.lease->holder, "b");
}

TEST(LeaderElectionTest, OptionsAreChecked) {
  FakeClock clock;
  ElectionOptions o = Options("a", &clock);
  EXPECT_TRUE(o.Validate().ok());
  o.renew_deadline = o.lease_duration;
  EXPECT_FALSE(o.Validate().ok());
  o = Options("a", &clock);
  o.retry_period = o.renew_deadline;
  EXPECT_FALSE(o.Validate().ok());
  o = Options("", &clock);
  EXPECT_FALSE(o.Validate().ok());
}

}  // namespace
}  // namespace sluice::agent
