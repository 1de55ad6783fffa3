// Tunnel mode's node side against the kernel, in a private network namespace: the VXLAN device
// (agent/routing/overlay) with the real receive program, and the peer map sluice_tunnel4
// (agent/routing/tunnel_map) on a scratch bpffs.
#include <arpa/inet.h>
#include <sched.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "agent/routing/overlay.h"
#include "agent/routing/tunnel_map.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "loader/tc.h"
#include "support/fixture.h"

namespace sluice::agent {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class PrivateNode : public ::testing::Environment {
 public:
  void SetUp() override { ASSERT_EQ(unshare(CLONE_NEWNET), 0); }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new PrivateNode);

std::string Shell(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  char line[512];
  while (fgets(line, sizeof(line), p)) out += line;
  pclose(p);
  return out;
}

uint32_t Be(const char* ip) { return htonl(IpAddress::Parse(ip)->v4_host_order()); }

PeerNode Peer(const char* name, const char* cidr, const char* ip) {
  return PeerNode{name, *IpPrefix::Parse(cidr), *IpAddress::Parse(ip)};
}

class OverlayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    bpffs_ = std::make_unique<testing::ScratchBpffs>();
    auto dp = loader::Datapath::Load(bpffs_->path());
    ASSERT_TRUE(dp.ok()) << dp.status();
    dp_ = *std::move(dp);
  }
  void TearDown() override { (void)std::system("ip link del sluice_vxlan 2>/dev/null"); }

  // prefix/len -> (node address, flags)
  std::map<std::string, std::pair<uint32_t, int>> TunnelMap() {
    std::map<std::string, std::pair<uint32_t, int>> out;
    EXPECT_TRUE(
        dp_->tunnel4()
            .ForEach([&](const sluice_lpm4_key& k, const sluice_tunnel4_entry& v) {
              char buf[INET_ADDRSTRLEN];
              inet_ntop(AF_INET, &k.addr, buf, sizeof(buf));
              out[std::string(buf) + "/" + std::to_string(k.prefixlen)] = {v.node_ip4, v.flags};
            })
            .ok());
    return out;
  }

  LibnlNetlink nl_;
  std::unique_ptr<testing::ScratchBpffs> bpffs_;
  std::unique_ptr<loader::Datapath> dp_;
};

TEST_F(OverlayTest, SetUpCreatesAMarkedCollectMdVxlanDeviceWithTheReceiveProgram) {
  auto ifindex = SetUpOverlay(nl_, *dp_, 8472, 1500);
  ASSERT_TRUE(ifindex.ok()) << ifindex.status();
  auto link = nl_.LinkByName(kOverlayDevice);
  ASSERT_TRUE(link.ok()) << link.status();
  EXPECT_EQ(link->ifindex, *ifindex);
  EXPECT_EQ(link->mtu, 1450u);
  EXPECT_TRUE(link->up);
  EXPECT_EQ(link->alias, kOverlayDeviceMark);
  std::string details = Shell("ip -d link show sluice_vxlan");
  EXPECT_THAT(details, HasSubstr("vxlan external"));
  EXPECT_THAT(details, HasSubstr("dstport 8472"));
  EXPECT_THAT(details, HasSubstr("nolearning"));
  EXPECT_EQ(Shell("cat /proc/sys/net/ipv4/conf/sluice_vxlan/rp_filter"), "0\n");
  auto attached = loader::AttachedTcProgram(*ifindex, loader::TcDirection::kIngress);
  ASSERT_TRUE(attached.ok()) << attached.status();
  EXPECT_EQ(*attached, *loader::ProgramId(dp_->from_overlay_fd()));
}

TEST_F(OverlayTest, SetUpAgainKeepsTheDeviceAndAnotherPortReplacesIt) {
  auto first = SetUpOverlay(nl_, *dp_, 8472, 1500);
  ASSERT_TRUE(first.ok()) << first.status();
  auto again = SetUpOverlay(nl_, *dp_, 8472, 1500);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *first);
  auto moved = SetUpOverlay(nl_, *dp_, 4789, 9000);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_THAT(Shell("ip -d link show sluice_vxlan"), HasSubstr("dstport 4789"));
  EXPECT_EQ(nl_.LinkByName(kOverlayDevice)->mtu, 8950u);
}

TEST_F(OverlayTest, ALinkOfThatNameThatIsNotSluicesIsRefusedAndLeftAlone) {
  // (A veth: the test kernel may lack dummy devices.)
  ASSERT_EQ(std::system("ip link add sluice_vxlan type veth peer name sluice_vxpeer"), 0);
  auto ifindex = SetUpOverlay(nl_, *dp_, 8472, 1500);
  EXPECT_EQ(ifindex.status().code(), absl::StatusCode::kFailedPrecondition) << ifindex.status();
  EXPECT_THAT(Shell("ip -d link show sluice_vxlan"), HasSubstr("veth"));
  // Native mode does not delete it either.
  EXPECT_TRUE(RemoveOverlay(nl_).ok());
  EXPECT_TRUE(nl_.LinkByName(kOverlayDevice).ok());
}

TEST_F(OverlayTest, NativeModeRemovesTheMarkedDevice) {
  ASSERT_TRUE(SetUpOverlay(nl_, *dp_, 8472, 1500).ok());
  EXPECT_TRUE(RemoveOverlay(nl_).ok());
  EXPECT_TRUE(absl::IsNotFound(nl_.LinkByName(kOverlayDevice).status()));
  EXPECT_TRUE(RemoveOverlay(nl_).ok());  // absent: nothing to do
}

TEST(PodMtuTest, TunnelModeLeavesRoomForVxlanUnlessConfigured) {
  EXPECT_EQ(PodMtu(RoutingMode::kTunnel, 1500, 0), 1450u);
  EXPECT_EQ(PodMtu(RoutingMode::kNative, 1500, 0), 1500u);
  EXPECT_EQ(PodMtu(RoutingMode::kTunnel, 1500, 1400), 1400u);
  EXPECT_EQ(PodMtu(RoutingMode::kTunnel, 9001, 0), 8951u);
}

TEST(RoutingModeTest, ParsesCiliumsNames) {
  EXPECT_EQ(*ParseRoutingMode("tunnel"), RoutingMode::kTunnel);
  EXPECT_EQ(*ParseRoutingMode("native"), RoutingMode::kNative);
  EXPECT_FALSE(ParseRoutingMode("vxlan").ok());
}

TEST_F(OverlayTest, TunnelMapHoldsEveryPeersPodCidrAndAddress) {
  auto ch = ReconcileTunnelMap(
      dp_->tunnel4(),
      {Peer("n2", "10.244.2.0/24", "10.50.0.2"), Peer("n3", "10.244.3.0/24", "10.50.0.3")}, false);
  ASSERT_TRUE(ch.ok()) << ch.status();
  EXPECT_EQ(ch->updated, 4);
  using Entry = std::pair<uint32_t, int>;
  EXPECT_EQ(TunnelMap(), (std::map<std::string, Entry>{
                             {"10.244.2.0/24", {Be("10.50.0.2"), SLUICE_TUNNEL_F_POD_CIDR}},
                             {"10.244.3.0/24", {Be("10.50.0.3"), SLUICE_TUNNEL_F_POD_CIDR}},
                             {"10.50.0.2/32", {Be("10.50.0.2"), 0}},
                             {"10.50.0.3/32", {Be("10.50.0.3"), 0}},
                         }));
  // Nothing changed: nothing written.
  ch = ReconcileTunnelMap(
      dp_->tunnel4(),
      {Peer("n2", "10.244.2.0/24", "10.50.0.2"), Peer("n3", "10.244.3.0/24", "10.50.0.3")}, true);
  ASSERT_TRUE(ch.ok());
  EXPECT_EQ(ch->updated, 0);
  EXPECT_EQ(ch->deleted, 0);
}

TEST_F(OverlayTest, TunnelMapKeepsUnknownPeersUntilDeletesAreAllowed) {
  ASSERT_TRUE(ReconcileTunnelMap(dp_->tunnel4(),
                                 {Peer("n2", "10.244.2.0/24", "10.50.0.2"),
                                  Peer("n3", "10.244.3.0/24", "10.50.0.3")},
                                 true)
                  .ok());
  // A restarted agent that has not listed the Nodes yet knows only n2 (and n3 moved address).
  auto ch = ReconcileTunnelMap(dp_->tunnel4(), {Peer("n2", "10.244.2.0/24", "10.50.0.12")}, false);
  ASSERT_TRUE(ch.ok());
  EXPECT_EQ(ch->updated, 2);
  EXPECT_EQ(ch->kept_stale, 3);  // n3's two and n2's old address
  EXPECT_EQ(TunnelMap().at("10.244.2.0/24").first, Be("10.50.0.12"));
  EXPECT_TRUE(TunnelMap().contains("10.244.3.0/24"));
  ch = ReconcileTunnelMap(dp_->tunnel4(), {Peer("n2", "10.244.2.0/24", "10.50.0.12")}, true);
  ASSERT_TRUE(ch.ok());
  EXPECT_EQ(ch->deleted, 3);
  EXPECT_THAT(TunnelMap(), Not(::testing::Contains(::testing::Key("10.244.3.0/24"))));
  EXPECT_EQ(TunnelMap().size(), 2u);
}

}  // namespace
}  // namespace sluice::agent
