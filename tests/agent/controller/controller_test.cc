#include "agent/controller/controller.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "support/eventually.h"

namespace sluice::controller {
namespace {

using ::sluice::testing::Eventually;
using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

// Records every batch the controller hands over and answers with a scripted status.
class Recorder {
 public:
  absl::Status Reconcile(const Batch& batch) {
    absl::MutexLock l(&mu_);
    std::set<std::string> keys(batch.keys.begin(), batch.keys.end());
    batches_.push_back({keys, batch.full});
    if (!fail_next_.ok()) {
      absl::Status st = fail_next_;
      fail_next_ = absl::OkStatus();
      return st;
    }
    return absl::OkStatus();
  }
  void FailNext(absl::Status st) {
    absl::MutexLock l(&mu_);
    fail_next_ = std::move(st);
  }
  struct Seen {
    std::set<std::string> keys;
    bool full;
  };
  std::vector<Seen> batches() {
    absl::MutexLock l(&mu_);
    return batches_;
  }
  size_t count() {
    absl::MutexLock l(&mu_);
    return batches_.size();
  }

 private:
  absl::Mutex mu_;
  std::vector<Seen> batches_;
  absl::Status fail_next_;
};

class ControllerTest : public ::testing::Test {
 protected:
  std::unique_ptr<Controller> Start(std::vector<std::string> all = {}) {
    ControllerOptions options;
    options.name = "test";
    options.synced = [this] { return synced_.load(); };
    options.all_keys = [all] { return all; };
    options.retry_delay = absl::Milliseconds(20);
    options.gate_poll = absl::Milliseconds(1);
    return std::make_unique<Controller>(std::move(options),
                                        [this](const Batch& b) { return rec_.Reconcile(b); });
  }

  std::atomic<bool> synced_{false};
  Recorder rec_;
};

TEST_F(ControllerTest, NothingIsReconciledBeforeTheGateOpens) {
  auto c = Start({"restored"});
  c->Mark("a");
  EXPECT_FALSE(c->WaitIdle(absl::Milliseconds(50)));
  EXPECT_EQ(rec_.count(), 0u);
  EXPECT_FALSE(c->primed());
}

TEST_F(ControllerTest, FirstBatchAfterTheGateIsFullAndCoversEveryKnownKey) {
  auto c = Start({"restored", "listed"});
  c->Mark("a");
  c->Mark("listed");
  synced_ = true;
  ASSERT_TRUE(c->WaitIdle(absl::Seconds(10)));
  auto b = rec_.batches();
  ASSERT_EQ(b.size(), 1u);
  EXPECT_TRUE(b[0].full);
  EXPECT_THAT(b[0].keys, UnorderedElementsAre("a", "listed", "restored"));
  EXPECT_TRUE(c->primed());
  EXPECT_EQ(c->reconciled(), 3u);
}

TEST_F(ControllerTest, FullBatchRunsEvenWithNothingToDoSoStaleStateIsPruned) {
  auto c = Start();
  synced_ = true;
  ASSERT_TRUE(c->WaitIdle(absl::Seconds(10)));
  auto b = rec_.batches();
  ASSERT_EQ(b.size(), 1u);
  EXPECT_TRUE(b[0].full);
  EXPECT_TRUE(b[0].keys.empty());
}

TEST_F(ControllerTest, LaterChangesComeAsIncrementalBatches) {
  auto c = Start();
  synced_ = true;
  ASSERT_TRUE(c->WaitIdle(absl::Seconds(10)));
  c->Mark("x");
  ASSERT_TRUE(c->WaitIdle(absl::Seconds(10)));
  auto b = rec_.batches();
  ASSERT_EQ(b.size(), 2u);
  EXPECT_FALSE(b[1].full);
  EXPECT_THAT(b[1].keys, ElementsAre("x"));
}

TEST_F(ControllerTest, FailedBatchIsRetriedWithItsKeysAndNewOnes) {
  auto c = Start();
  synced_ = true;
  ASSERT_TRUE(c->WaitIdle(absl::Seconds(10)));
  rec_.FailNext(absl::ResourceExhaustedError("map full"));
  c->Mark("x");
  ASSERT_TRUE(Eventually([&] { return rec_.count() == 2; }));
  c->Mark("y");
  ASSERT_TRUE(c->WaitIdle(absl::Seconds(10)));
  auto b = rec_.batches();
  ASSERT_EQ(b.size(), 3u);
  EXPECT_THAT(b[1].keys, ElementsAre("x"));
  EXPECT_THAT(b[2].keys, UnorderedElementsAre("x", "y"));
  EXPECT_FALSE(b[2].full);
}

TEST_F(ControllerTest, FailedFullBatchIsRetriedAsAFullOne) {
  rec_.FailNext(absl::UnavailableError("apply failed"));
  auto c = Start({"restored"});
  synced_ = true;
  ASSERT_TRUE(c->WaitIdle(absl::Seconds(10)));
  auto b = rec_.batches();
  ASSERT_EQ(b.size(), 2u);
  EXPECT_TRUE(b[0].full);
  EXPECT_TRUE(b[1].full);
  EXPECT_THAT(b[1].keys, ElementsAre("restored"));
}

TEST_F(ControllerTest, MarksOfOneKeyCoalesce) {
  auto c = Start();
  for (int i = 0; i < 100; ++i) c->Mark("same");
  synced_ = true;
  ASSERT_TRUE(c->WaitIdle(absl::Seconds(10)));
  auto b = rec_.batches();
  ASSERT_EQ(b.size(), 1u);
  EXPECT_THAT(b[0].keys, ElementsAre("same"));
}

TEST_F(ControllerTest, ListenerMayMarkAfterTheControllerIsGone) {
  std::shared_ptr<DirtyKeys> keys;
  {
    auto c = Start();
    keys = c->keys();
  }
  keys->Mark("late");  // must not touch freed memory (ASan/valgrind would tell)
  EXPECT_EQ(rec_.count(), 0u);
}

}  // namespace
}  // namespace sluice::controller
