// The lab kubelet's CNI DEL retry schedule (the retries themselves run the real plugin in the
// e2e tests): doubling delays up to the cap, every sandbox on its own schedule, a bounded end.
#include "agent/lab/node/kubelet.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::lab {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(CniDelRetriesTest, DelaysDoubleToTheCapUntilGivingUp) {
  CniDelRetries r(absl::Seconds(1), absl::Seconds(4), absl::Seconds(20));
  absl::Time t = absl::FromUnixSeconds(1'000);
  EXPECT_TRUE(r.Failed("uid-a", t));
  EXPECT_THAT(r.Due(t), IsEmpty());
  EXPECT_THAT(r.Due(t + absl::Milliseconds(999)), IsEmpty());
  std::vector<int64_t> delays;
  absl::Time last = t;
  for (int i = 0; i < 6; ++i) {
    // Step until due, then fail again.
    absl::Time at = last;
    while (r.Due(at).empty()) at += absl::Milliseconds(250);
    delays.push_back(absl::ToInt64Milliseconds(at - last));
    last = at;
    const bool again = r.Failed("uid-a", at);
    EXPECT_EQ(again, at - t < absl::Seconds(20)) << i;
    if (!again) break;
  }
  EXPECT_THAT(delays, ElementsAre(1000, 2000, 4000, 4000, 4000, 4000));
  EXPECT_EQ(r.attempts("uid-a"), 7);
}

TEST(CniDelRetriesTest, SandboxesAreIndependentAndDoneForgets) {
  CniDelRetries r(absl::Seconds(1), absl::Seconds(30), absl::Minutes(5));
  absl::Time t = absl::FromUnixSeconds(1'000);
  EXPECT_TRUE(r.Failed("a", t));
  EXPECT_TRUE(r.Failed("b", t + absl::Milliseconds(500)));
  EXPECT_THAT(r.Due(t + absl::Seconds(1)), ElementsAre("a"));
  EXPECT_THAT(r.Due(t + absl::Milliseconds(1500)), ElementsAre("a", "b"));
  r.Done("a");
  EXPECT_EQ(r.size(), 1u);
  EXPECT_EQ(r.attempts("a"), 0);
  // A new failure of a finished sandbox starts from the initial delay again.
  EXPECT_TRUE(r.Failed("a", t + absl::Seconds(10)));
  EXPECT_THAT(r.Due(t + absl::Seconds(11)), ElementsAre("a", "b"));
}

TEST(CniDelRetriesTest, GivesUpAfterTheBound) {
  CniDelRetries r(absl::Seconds(1), absl::Seconds(1), absl::Seconds(3));
  absl::Time t = absl::FromUnixSeconds(1'000);
  EXPECT_TRUE(r.Failed("a", t));
  EXPECT_TRUE(r.Failed("a", t + absl::Seconds(1)));
  EXPECT_TRUE(r.Failed("a", t + absl::Seconds(2)));
  EXPECT_FALSE(r.Failed("a", t + absl::Seconds(3)));
}

}  // namespace
}  // namespace sluice::lab
