// Node set-up against the real datapath (scratch bpffs, programs attached to lo of a private
// network namespace) with the kernel's addressing and sysctls answered by FakeNetlink.
#include "agent/routing/node_setup.h"

#include <arpa/inet.h>
#include <sched.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "loader/tc.h"
#include "support/fake_netlink.h"
#include "support/fixture.h"

namespace sluice::agent {
namespace {

using ::sluice::testing::FakeNetlink;
using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

IpPrefix Cidr(const char* s) { return *IpPrefix::Parse(s); }
IpAddress Ip(const char* s) { return *IpAddress::Parse(s); }
uint32_t Be(const char* s) { return htonl(Ip(s).v4_host_order()); }

class NodeSetupTest : public ::testing::Test {
 protected:
  // The programs go onto lo (ifindex 1) of a network namespace of this test process's own.
  static void SetUpTestSuite() { ASSERT_EQ(unshare(CLONE_NEWNET), 0) << "unshare(CLONE_NEWNET)"; }

  void SetUp() override {
    bpffs_ = std::make_unique<testing::ScratchBpffs>();
    auto dp = loader::Datapath::Load(bpffs_->path());
    ASSERT_TRUE(dp.ok()) << dp.status();
    dp_ = *std::move(dp);
    options_.pod_cidr = Cidr("10.244.1.0/24");
  }

  std::set<std::pair<uint32_t, uint32_t>> NoMasq() {
    std::set<std::pair<uint32_t, uint32_t>> out;
    EXPECT_TRUE(dp_->nomasq()
                    .ForEach([&](const sluice_lpm4_key& k, const uint8_t&) {
                      out.insert({k.prefixlen, k.addr});
                    })
                    .ok());
    return out;
  }

  FakeNetlink netlink_;
  std::unique_ptr<testing::ScratchBpffs> bpffs_;
  std::unique_ptr<loader::Datapath> dp_;
  NodeOptions options_;
};

TEST_F(NodeSetupTest, FindsTheNativeDeviceByTheDefaultRouteAndWritesTheNodeConfig) {
  netlink_.SetDefaultRoute("lo", Ip("192.168.50.2"));
  options_.service_cidr = Cidr("10.96.0.0/16");
  options_.nat_port_min = 40000;
  options_.nat_port_max = 40999;
  auto node = SetUpNode(netlink_, *dp_, options_, Ip("10.244.1.1"), /*prune_nomasq=*/true);
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ(node->native_device, "lo");
  EXPECT_EQ(node->native_ifindex, 1);
  EXPECT_EQ(node->node_ip, Ip("192.168.50.2"));

  auto cfg = dp_->node_config().Lookup(0);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->node_ip4, Be("192.168.50.2"));
  EXPECT_EQ(cfg->pod_cidr4, Be("10.244.1.0"));
  EXPECT_EQ(cfg->pod_cidr4_len, 24);
  EXPECT_EQ(cfg->gateway_ip4, Be("10.244.1.1"));
  EXPECT_EQ(cfg->flags & SLUICE_NODE_F_MASQUERADE, SLUICE_NODE_F_MASQUERADE);
  EXPECT_EQ(cfg->nat_port_min, 40000);
  EXPECT_EQ(cfg->nat_port_max, 40999);
  EXPECT_EQ(cfg->service_cidr4, Be("10.96.0.0"));
  EXPECT_EQ(cfg->service_cidr4_len, 16);

  EXPECT_THAT(netlink_.sysctls(), UnorderedElementsAre(Pair("net.ipv4.ip_forward", "1")));
  auto ingress = loader::AttachedTcProgram(1, loader::TcDirection::kIngress);
  auto egress = loader::AttachedTcProgram(1, loader::TcDirection::kEgress);
  ASSERT_TRUE(ingress.ok()) << ingress.status();
  ASSERT_TRUE(egress.ok()) << egress.status();
  EXPECT_EQ(*ingress, *loader::ProgramId(dp_->from_net_fd()));
  EXPECT_EQ(*egress, *loader::ProgramId(dp_->to_net_fd()));
}

TEST_F(NodeSetupTest, ExplicitDeviceAndAddressWinOverTheDefaultRoute) {
  netlink_.SetDefaultRoute("eth9", Ip("192.168.50.2"));
  options_.native_device = "lo";
  options_.node_ip = "172.16.0.7";
  options_.masquerade = false;
  auto node = SetUpNode(netlink_, *dp_, options_, Ip("10.244.1.1"), true);
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ(node->native_device, "lo");
  EXPECT_EQ(node->node_ip, Ip("172.16.0.7"));
  auto cfg = dp_->node_config().Lookup(0);
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ(cfg->node_ip4, Be("172.16.0.7"));
  EXPECT_EQ(cfg->flags & SLUICE_NODE_F_MASQUERADE, 0);
}

TEST_F(NodeSetupTest, WithoutADefaultRouteTheNativeDeviceFlagIsNamed) {
  auto node = SetUpNode(netlink_, *dp_, options_, Ip("10.244.1.1"), true);
  ASSERT_FALSE(node.ok());
  EXPECT_EQ(node.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(node.status().message(), HasSubstr("--native_device"));
}

TEST_F(NodeSetupTest, NativeDeviceWithoutAnAddressNeedsTheNodeIpFlag) {
  options_.native_device = "lo";  // FakeNetlink knows lo but no IPv4 address on it
  auto node = SetUpNode(netlink_, *dp_, options_, Ip("10.244.1.1"), true);
  ASSERT_FALSE(node.ok());
  EXPECT_EQ(node.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(node.status().message(), HasSubstr("--node_ip"));
}

TEST_F(NodeSetupTest, AnInvalidNodeIpIsRefused) {
  options_.native_device = "lo";
  options_.node_ip = "10.0.0.300";
  auto node = SetUpNode(netlink_, *dp_, options_, Ip("10.244.1.1"), true);
  ASSERT_FALSE(node.ok());
  EXPECT_EQ(node.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(NodeSetupTest, AMissingNativeDeviceIsNotFound) {
  options_.native_device = "nosuchdev0";
  auto node = SetUpNode(netlink_, *dp_, options_, Ip("10.244.1.1"), true);
  ASSERT_FALSE(node.ok());
  EXPECT_EQ(node.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(NodeSetupTest, NeverMasqueradedSetPrunesOnlyWhenAllowed) {
  netlink_.SetDefaultRoute("lo", Ip("192.168.50.2"));
  ASSERT_TRUE(dp_->nomasq().Update(sluice_lpm4_key{16, Be("10.99.0.0")}, 1).ok());
  options_.non_masquerade_cidrs = {Cidr("10.0.0.0/8")};
  ASSERT_TRUE(SetUpNode(netlink_, *dp_, options_, Ip("10.244.1.1"), false).ok());
  EXPECT_THAT(NoMasq(), UnorderedElementsAre(Pair(16u, Be("10.99.0.0")), Pair(8u, Be("10.0.0.0")),
                                             Pair(24u, Be("10.244.1.0"))));
  ASSERT_TRUE(SetUpNode(netlink_, *dp_, options_, Ip("10.244.1.1"), true).ok());
  EXPECT_THAT(NoMasq(),
              UnorderedElementsAre(Pair(8u, Be("10.0.0.0")), Pair(24u, Be("10.244.1.0"))));
}

TEST(ParsePortRange, AcceptsOnlyMinMaxWithinUnprivilegedPorts) {
  struct Case {
    const char* text;
    bool ok;
    uint16_t min, max;
  };
  const Case cases[] = {
      {"61000-65535", true, 61000, 65535}, {"1024-1024", true, 1024, 1024},
      {"1000-2000", false, 0, 0},          {"2000-1999", false, 0, 0},
      {"1024-65536", false, 0, 0},         {"abc", false, 0, 0},
      {"1024-", false, 0, 0},              {"1024-2000-3000", false, 0, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    uint16_t min = 0, max = 0;
    absl::Status st = ParsePortRange(c.text, &min, &max);
    EXPECT_EQ(st.ok(), c.ok) << st;
    if (c.ok) {
      EXPECT_EQ(min, c.min);
      EXPECT_EQ(max, c.max);
    }
  }
}

}  // namespace
}  // namespace sluice::agent
