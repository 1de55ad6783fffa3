// Direct routes to other nodes' pod CIDRs, against the kernel in a private network namespace.
#include <sched.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "agent/kernel/netlink.h"
#include "agent/routing/peer_routes.h"
#include "gtest/gtest.h"

namespace sluice::agent {
namespace {

class PrivateNode : public ::testing::Environment {
 public:
  void SetUp() override {
    ASSERT_EQ(unshare(CLONE_NEWNET), 0);
    ASSERT_EQ(std::system("ip link add under0 type veth peer name under1 && "
                          "ip addr add 10.50.0.1/24 dev under0 && ip link set under0 up && "
                          "ip link set under1 up && "
                          "ip route add 192.0.2.0/24 via 10.50.0.9 proto static"),
              0);
  }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new PrivateNode);

std::string Routes() {
  std::string out;
  FILE* p = popen("ip -4 route show proto 181", "r");
  char line[256];
  while (fgets(line, sizeof(line), p)) out += line;
  pclose(p);
  return out;
}

PeerNode Peer(const char* name, const char* cidr, const char* ip) {
  return PeerNode{name, *IpPrefix::Parse(cidr), *IpAddress::Parse(ip)};
}

class PeerRoutesTest : public ::testing::Test {
 protected:
  void TearDown() override { (void)ReconcilePeerRoutes(nl_, {}, true); }
  LibnlNetlink nl_;
};

TEST_F(PeerRoutesTest, EveryPeerPodCidrIsRoutedViaItsNodeAddress) {
  auto ch = ReconcilePeerRoutes(
      nl_, {Peer("n2", "10.244.2.0/24", "10.50.0.2"), Peer("n3", "10.244.3.0/24", "10.50.0.3")},
      true);
  ASSERT_TRUE(ch.ok()) << ch.status();
  EXPECT_EQ(ch->replaced, 2);
  std::string r = Routes();
  EXPECT_NE(r.find("10.244.2.0/24 via 10.50.0.2 dev under0"), std::string::npos) << r;
  EXPECT_NE(r.find("10.244.3.0/24 via 10.50.0.3 dev under0"), std::string::npos) << r;
  // Level-triggered: the same input changes nothing.
  auto again = ReconcilePeerRoutes(
      nl_, {Peer("n2", "10.244.2.0/24", "10.50.0.2"), Peer("n3", "10.244.3.0/24", "10.50.0.3")},
      true);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->replaced, 0);
  EXPECT_EQ(again->deleted, 0);
}

TEST_F(PeerRoutesTest, ANodeThatMovedGetsItsRouteReplaced) {
  ASSERT_TRUE(ReconcilePeerRoutes(nl_, {Peer("n2", "10.244.2.0/24", "10.50.0.2")}, true).ok());
  ASSERT_TRUE(ReconcilePeerRoutes(nl_, {Peer("n2", "10.244.2.0/24", "10.50.0.7")}, true).ok());
  std::string r = Routes();
  EXPECT_NE(r.find("10.244.2.0/24 via 10.50.0.7"), std::string::npos) << r;
  EXPECT_EQ(r.find("10.50.0.2"), std::string::npos) << r;
}

TEST_F(PeerRoutesTest, RoutesOfVanishedNodesStayUntilDeletesAreAllowed) {
  ASSERT_TRUE(ReconcilePeerRoutes(
                  nl_, {Peer("n2", "10.244.2.0/24", "10.50.0.2"),
                        Peer("n3", "10.244.3.0/24", "10.50.0.3")},
                  true)
                  .ok());
  auto early = ReconcilePeerRoutes(nl_, {Peer("n2", "10.244.2.0/24", "10.50.0.2")}, false);
  ASSERT_TRUE(early.ok());
  EXPECT_EQ(early->kept_stale, 1);
  EXPECT_NE(Routes().find("10.244.3.0/24"), std::string::npos);
  auto synced = ReconcilePeerRoutes(nl_, {Peer("n2", "10.244.2.0/24", "10.50.0.2")}, true);
  ASSERT_TRUE(synced.ok());
  EXPECT_EQ(synced->deleted, 1);
  EXPECT_EQ(Routes().find("10.244.3.0/24"), std::string::npos);
}

TEST_F(PeerRoutesTest, RoutesSluiceDidNotMakeAreNeverTouched) {
  ASSERT_TRUE(ReconcilePeerRoutes(nl_, {}, true).ok());
  FILE* p = popen("ip -4 route show 192.0.2.0/24", "r");
  char line[256] = {};
  fgets(line, sizeof(line), p);
  pclose(p);
  EXPECT_NE(std::string(line).find("via 10.50.0.9"), std::string::npos) << line;
}

TEST_F(PeerRoutesTest, AGatewayOffTheNodesNetworksIsRefused) {
  auto ch = ReconcilePeerRoutes(nl_, {Peer("far", "10.244.9.0/24", "172.16.99.1")}, true);
  EXPECT_FALSE(ch.ok());
}

}  // namespace
}  // namespace sluice::agent
