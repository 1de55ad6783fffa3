// LinkReaper over the fake netlink: it deletes the veths handed to it, and only those (a link
// that took the name since, or lost the mark, stays), drains its queue when destroyed, and counts
// what it did.
#include "agent/endpoint/link_reaper.h"

#include <string>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "support/fake_netlink.h"

namespace sluice::agent {
namespace {

constexpr char kMark[] = "sluice:ctr1/eth0";

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

TEST(LinkReaperTest, DeletesTheQueuedVethAfterEnqueueReturns) {
  testing::FakeNetlink nl;
  LinkInfo veth = nl.AddHostLink("slc1", 1500, kMark);
  LinkReaper reaper(nl);
  ASSERT_TRUE(reaper.Enqueue(veth).ok());
  ASSERT_TRUE(reaper.AwaitGone("slc1", Soon()));
  EXPECT_FALSE(nl.HostLinkExists("slc1"));
  EXPECT_EQ(reaper.pending(), 0u);
  LinkReaperStats stats = reaper.stats();
  EXPECT_EQ(stats.queued, 1u);
  EXPECT_EQ(stats.deleted, 1u);
  EXPECT_EQ(stats.gone + stats.failed, 0u);
}

TEST(LinkReaperTest, ALinkThatTookTheNameSinceIsLeftAlone) {
  testing::FakeNetlink nl;
  LinkInfo queued = nl.AddHostLink("slc1", 1500, kMark);
  ASSERT_TRUE(nl.DeleteLink("slc1").ok());
  LinkInfo newer = nl.AddHostLink("slc1", 1500, kMark);  // same name and mark, another ifindex
  ASSERT_NE(newer.ifindex, queued.ifindex);
  LinkReaper reaper(nl);
  ASSERT_TRUE(reaper.Enqueue(queued).ok());
  ASSERT_TRUE(reaper.AwaitIdle(Soon()));
  EXPECT_TRUE(nl.HostLinkExists("slc1"));
  EXPECT_EQ(reaper.stats().gone, 1u);
  EXPECT_EQ(reaper.stats().deleted, 0u);
}

TEST(LinkReaperTest, ALinkWhoseMarkChangedIsLeftAlone) {
  testing::FakeNetlink nl;
  LinkInfo veth = nl.AddHostLink("slc1", 1500, kMark);
  ASSERT_TRUE(nl.SetLinkAlias(veth.ifindex, "another-plugin").ok());
  LinkReaper reaper(nl);
  ASSERT_TRUE(reaper.Enqueue(veth).ok());
  ASSERT_TRUE(reaper.AwaitIdle(Soon()));
  EXPECT_TRUE(nl.HostLinkExists("slc1"));
  EXPECT_EQ(reaper.stats().gone, 1u);
}

TEST(LinkReaperTest, AnAlreadyDeletedVethIsCountedAsGone) {
  testing::FakeNetlink nl;
  LinkInfo veth = nl.AddHostLink("slc1", 1500, kMark);
  ASSERT_TRUE(nl.DeleteLink("slc1").ok());  // the pod's netns went and took the pair with it
  LinkReaper reaper(nl);
  ASSERT_TRUE(reaper.Enqueue(veth).ok());
  ASSERT_TRUE(reaper.AwaitIdle(Soon()));
  EXPECT_EQ(reaper.stats().gone, 1u);
  EXPECT_EQ(reaper.stats().failed, 0u);
}

TEST(LinkReaperTest, AFailedDeleteIsCountedAndTheLinkLeftForRestore) {
  testing::FakeNetlink nl;
  LinkInfo veth = nl.AddHostLink("slc1", 1500, kMark);
  nl.script().FailNext("DeleteLinkByIndex", absl::InternalError("EBUSY"));
  LinkReaper reaper(nl);
  ASSERT_TRUE(reaper.Enqueue(veth).ok());
  ASSERT_TRUE(reaper.AwaitIdle(Soon()));
  EXPECT_TRUE(nl.HostLinkExists("slc1"));
  EXPECT_EQ(reaper.stats().failed, 1u);
  // Nothing stays queued: a later ADD of that name is not kept waiting for it.
  EXPECT_TRUE(reaper.AwaitGone("slc1", absl::Now()));
}

TEST(LinkReaperTest, DestroyingTheReaperDeletesEverythingStillQueued) {
  testing::FakeNetlink nl;
  {
    LinkReaper reaper(nl);
    for (int i = 0; i < 20; ++i) {
      const std::string name = "slc" + std::to_string(i);
      ASSERT_TRUE(reaper.Enqueue(nl.AddHostLink(name, 1500, kMark)).ok());
    }
  }
  for (const auto& name : nl.HostLinkNames()) EXPECT_EQ(name, "lo");
}

TEST(LinkReaperTest, AwaitGoneOfANameNeverQueuedReturnsAtOnce) {
  testing::FakeNetlink nl;
  LinkReaper reaper(nl);
  EXPECT_TRUE(reaper.AwaitGone("slc9", absl::Now()));
  EXPECT_TRUE(reaper.AwaitIdle(absl::Now()));
}

}  // namespace
}  // namespace sluice::agent
