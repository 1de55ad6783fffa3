#include "agent/operator/cluster_pool.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

IpPrefix P(const char* s) { return *IpPrefix::Parse(s); }
ClusterPool Pool(std::vector<IpPrefix> pools, int mask) {
  auto p = ClusterPool::Make(std::move(pools), mask);
  EXPECT_TRUE(p.ok()) << p.status();
  return *p;
}

TEST(ClusterPoolTest, TheIssuesInstallLineGivesEachNodeItsOwnSlash24) {
  ClusterPool pool = Pool({P("10.11.0.0/16")}, 24);
  auto a = AllocateNodeCidrs(pool, {{"node-b", ""}, {"node-a", ""}, {"node-c", ""}});
  EXPECT_EQ(a.assign.at("node-a"), P("10.11.0.0/24"));  // name order, lowest first
  EXPECT_EQ(a.assign.at("node-b"), P("10.11.1.0/24"));
  EXPECT_EQ(a.assign.at("node-c"), P("10.11.2.0/24"));
  EXPECT_THAT(a.exhausted, IsEmpty());
  EXPECT_EQ(a.free_after, 253u);
}

TEST(ClusterPoolTest, ExistingAllocationsAreKeptAndNeverHandedOutAgain) {
  // An operator restart or failover: the API's spec.podCIDRs are the state.
  ClusterPool pool = Pool({P("10.11.0.0/16")}, 24);
  auto a = AllocateNodeCidrs(
      pool, {{"old-1", "10.11.0.0/24"}, {"old-2", "10.11.2.0/24"}, {"new-1", ""}, {"new-2", ""}});
  EXPECT_EQ(a.assign.size(), 2u);
  EXPECT_EQ(a.assign.at("new-1"), P("10.11.1.0/24"));
  EXPECT_EQ(a.assign.at("new-2"), P("10.11.3.0/24"));
  EXPECT_FALSE(a.assign.contains("old-1"));
}

TEST(ClusterPoolTest, ADeletedNodesCidrIsFreeAgain) {
  ClusterPool pool = Pool({P("10.11.0.0/30")}, 30);  // one node's worth
  auto full = AllocateNodeCidrs(pool, {{"a", "10.11.0.0/30"}, {"b", ""}});
  EXPECT_THAT(full.exhausted, ElementsAre("b"));
  auto after_delete = AllocateNodeCidrs(pool, {{"b", ""}});  // node a is gone
  EXPECT_EQ(after_delete.assign.at("b"), P("10.11.0.0/30"));
}

TEST(ClusterPoolTest, ExhaustionIsReportedNotACrash) {
  ClusterPool pool = Pool({P("10.11.0.0/23")}, 24);
  auto a = AllocateNodeCidrs(pool, {{"a", ""}, {"b", ""}, {"c", ""}, {"d", ""}});
  EXPECT_EQ(a.assign.size(), 2u);
  EXPECT_THAT(a.exhausted, ElementsAre("c", "d"));
  EXPECT_EQ(a.free_after, 0u);
}

TEST(ClusterPoolTest, SeveralPoolsAreUsedInOrder) {
  ClusterPool pool = Pool({P("10.12.0.0/24"), P("10.11.0.0/25")}, 25);
  auto a = AllocateNodeCidrs(pool, {{"a", ""}, {"b", ""}, {"c", ""}});
  EXPECT_EQ(a.assign.at("a"), P("10.11.0.0/25"));
  EXPECT_EQ(a.assign.at("b"), P("10.12.0.0/25"));
  EXPECT_EQ(a.assign.at("c"), P("10.12.0.128/25"));
}

TEST(ClusterPoolTest, ForeignAndDuplicateCidrsAreReportedAndTheirSpaceAvoided) {
  ClusterPool pool = Pool({P("10.11.0.0/16")}, 24);
  auto a = AllocateNodeCidrs(pool, {{"outside", "192.168.0.0/24"},
                                    {"wider", "10.11.0.0/23"},  // kube-controller-manager's?
                                    {"dup-1", "10.11.5.0/24"},
                                    {"dup-2", "10.11.5.0/24"},
                                    {"new", ""}});
  EXPECT_THAT(a.foreign, ElementsAre("dup-2", "outside", "wider"));
  EXPECT_EQ(a.assign.at("new"), P("10.11.2.0/24")) << "the /23 took .0 and .1";
}

TEST(ClusterPoolTest, NoTwoNodesEverShareACidr) {
  ClusterPool pool = Pool({P("10.11.0.0/20")}, 26);
  std::map<std::string, std::string> nodes;
  for (int i = 0; i < 300; ++i) nodes[absl::StrCat("n", i)] = "";
  // Allocate in rounds, writing each result back, as the operator's loop does.
  for (int round = 0; round < 3; ++round) {
    auto a = AllocateNodeCidrs(pool, nodes);
    for (const auto& [n, c] : a.assign) nodes[n] = c.ToString();
    if (round == 1) {
      for (int i = 0; i < 300; i += 7) nodes.erase(absl::StrCat("n", i));
      for (int i = 300; i < 330; ++i) nodes[absl::StrCat("n", i)] = "";
    }
  }
  std::set<std::string> seen;
  int without = 0;
  for (const auto& [n, c] : nodes) {
    if (c.empty()) {
      ++without;
      continue;
    }
    EXPECT_TRUE(seen.insert(c).second) << c << " twice";
  }
  EXPECT_EQ(seen.size(), 64u) << "a /20 holds 64 /26s, all in use";
  EXPECT_GT(without, 0);
}

TEST(ClusterPoolTest, BadPoolsAreRefused) {
  EXPECT_THAT(ClusterPool::Make({}, 24).status().message(), HasSubstr("no pool"));
  EXPECT_THAT(ClusterPool::Make({P("10.0.0.0/8")}, 31).status().message(), HasSubstr("/8 to /30"));
  EXPECT_THAT(ClusterPool::Make({P("10.11.0.0/25")}, 24).status().message(),
              HasSubstr("smaller than one node's /24"));
  EXPECT_THAT(ClusterPool::Make({P("10.0.0.0/8"), P("10.11.0.0/16")}, 24).status().message(),
              HasSubstr("overlap"));
}

}  // namespace
}  // namespace sluice::agent
