// The endpoint service's locks: every wait ends at its deadline, so one stuck request turns the
// next ones into "try again later" instead of hanging them (and a waiting GC cannot starve).
#include <atomic>
#include <thread>

#include "agent/endpoint/endpoint_service.h"
#include "gtest/gtest.h"

namespace sluice::agent {
namespace {

TEST(DeadlineSharedMutex, ReadersShareAndAWriterWaitsForThem) {
  DeadlineSharedMutex mu;
  ASSERT_TRUE(mu.LockShared(absl::Now() + absl::Seconds(1)));
  ASSERT_TRUE(mu.LockShared(absl::Now() + absl::Seconds(1)));
  const absl::Time start = absl::Now();
  EXPECT_FALSE(mu.Lock(absl::Now() + absl::Milliseconds(200)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(150));
  // The writer gave up: readers are let in again.
  EXPECT_TRUE(mu.LockShared(absl::Now() + absl::Milliseconds(200)));
  mu.UnlockShared();
  mu.UnlockShared();
  mu.UnlockShared();
  EXPECT_TRUE(mu.Lock(absl::Now() + absl::Seconds(1)));
  mu.Unlock();
}

TEST(DeadlineSharedMutex, AStuckWriterTimesReadersOutInsteadOfHangingThem) {
  DeadlineSharedMutex mu;
  ASSERT_TRUE(mu.Lock(absl::Now() + absl::Seconds(1)));
  const absl::Time start = absl::Now();
  EXPECT_FALSE(mu.LockShared(absl::Now() + absl::Milliseconds(200)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  std::atomic<bool> got{false};
  std::thread reader([&] {
    got = mu.LockShared(absl::Now() + absl::Seconds(10));
    if (got) mu.UnlockShared();
  });
  mu.Unlock();
  reader.join();
  EXPECT_TRUE(got);
}

TEST(DeadlineSharedMutex, AWaitingWriterHoldsNewReadersBack) {
  DeadlineSharedMutex mu;
  ASSERT_TRUE(mu.LockShared(absl::Now() + absl::Seconds(1)));
  std::atomic<bool> writer_got{false};
  std::thread writer([&] {
    writer_got = mu.Lock(absl::Now() + absl::Seconds(10));
    if (writer_got) mu.Unlock();
  });
  // Once the writer waits (it starts at some point), a new reader cannot slip in ahead of it.
  bool reader_got = true;
  for (absl::Time give_up = absl::Now() + absl::Seconds(5); reader_got && absl::Now() < give_up;) {
    reader_got = mu.LockShared(absl::Now() + absl::Milliseconds(20));
    if (reader_got) mu.UnlockShared();
  }
  EXPECT_FALSE(reader_got);
  mu.UnlockShared();
  writer.join();
  EXPECT_TRUE(writer_got);
}

TEST(AttachmentLocks, SameAttachmentWaitsUntilItsDeadlineOthersProceed) {
  AttachmentLocks locks;
  auto held = locks.Lock("c1", "eth0", absl::Now() + absl::Seconds(1));
  ASSERT_NE(held, nullptr);
  EXPECT_NE(locks.Lock("c1", "net1", absl::Now() + absl::Milliseconds(100)), nullptr);
  EXPECT_NE(locks.Lock("c2", "eth0", absl::Now() + absl::Milliseconds(100)), nullptr);
  EXPECT_EQ(locks.Lock("c1", "eth0", absl::Now() + absl::Milliseconds(100)), nullptr);
  held.reset();
  EXPECT_NE(locks.Lock("c1", "eth0", absl::Now() + absl::Milliseconds(100)), nullptr);
}

}  // namespace
}  // namespace sluice::agent
