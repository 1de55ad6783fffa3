// Packet-in/packet-out tests of the native-device programs: masquerade of pod traffic leaving
// the node (sluice_to_net) and the reverse translation of replies (sluice_from_net).
#include <arpa/inet.h>

#include <set>

#include "support/fixture.h"
#include "gmock/gmock.h"

namespace sluice::testing {
namespace {

const Mac kNodeMac = ParseMac("02:10:00:00:00:01");
const Mac kRouterMac = ParseMac("02:10:00:00:00:fe");
const Mac kPodMac = ParseMac("02:00:00:00:0a:01");
const Mac kHostMac = ParseMac("02:aa:00:00:0a:02");
constexpr char kNodeIp[] = "192.168.50.2";
constexpr char kPodIp[] = "10.244.0.10";
constexpr char kRemote[] = "198.51.100.7";
constexpr uint16_t kPortMin = 61000;
constexpr uint16_t kPortMax = 65535;

class NetdevTest : public DatapathTest {
 protected:
  void SetUp() override {
    DatapathTest::SetUp();
    if (HasFatalFailure()) return;
    SetNodeConfig(kPortMin, kPortMax, SLUICE_NODE_F_MASQUERADE);
    sluice_lpm4_key pod_cidr{24, Ip4("10.244.0.0")};
    ASSERT_TRUE(dp_->nomasq().Update(pod_cidr, 1).ok());
    sluice_ep4_key key{Ip4(kPodIp)};
    sluice_endpoint ep{};
    ep.ifindex = 4242;
    std::memcpy(ep.mac, kPodMac.data(), 6);
    std::memcpy(ep.host_mac, kHostMac.data(), 6);
    ASSERT_TRUE(dp_->endpoints().Update(key, ep).ok());
  }
  void SetNodeConfig(uint16_t min, uint16_t max, uint8_t flags) {
    sluice_node_config cfg{};
    cfg.node_ip4 = Ip4(kNodeIp);
    cfg.pod_cidr4 = Ip4("10.244.0.0");
    cfg.pod_cidr4_len = 24;
    cfg.gateway_ip4 = Ip4("10.244.0.1");
    cfg.flags = flags;
    cfg.nat_port_min = min;
    cfg.nat_port_max = max;
    ASSERT_TRUE(dp_->node_config().Update(0, cfg).ok());
  }
  RunResult ToNet(const Bytes& in) { return Run(dp_->to_net_fd(), in); }
  RunResult FromNet(const Bytes& in) { return Run(dp_->from_net_fd(), in); }
  Packet FromPodTo(const std::string& dst) {
    return Packet::Eth(kNodeMac, kRouterMac).IPv4(kPodIp, dst, 63);
  }
  size_t Count(maps::NatMap& m) {
    auto n = m.Count();
    EXPECT_TRUE(n.ok());
    return n.ok() ? *n : 0;
  }
};

TEST_F(NetdevTest, PodTcpLeavingTheNodeIsMasqueradedToNodeAddressWithAllocatedPort) {
  auto in = FromPodTo(kRemote).TCP(40000, 443).Payload("GET").Build();
  auto r = ToNet(in);
  ASSERT_EQ(r.verdict, kTcOk) << Describe(r.out);
  auto d = Decode(r.out);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->ip_src, Ip4(kNodeIp)) << Describe(r.out);
  EXPECT_EQ(d->ip_dst, Ip4(kRemote));
  EXPECT_GE(d->sport, kPortMin);
  EXPECT_LE(d->sport, kPortMax);
  EXPECT_EQ(d->dport, 443);
  EXPECT_TRUE(d->ip_csum_ok) << Describe(r.out);
  EXPECT_TRUE(d->l4_csum_ok) << Describe(r.out);
  EXPECT_EQ(d->payload, "GET");

  // Both directions are recorded: the flow's tuple and the reply's tuple.
  sluice_nat4_key fwd{Ip4(kPodIp), Ip4(kRemote), htons(40000), htons(443), IPPROTO_TCP, {}};
  auto snat = dp_->snat().Lookup(fwd);
  ASSERT_TRUE(snat.ok()) << snat.status();
  EXPECT_EQ(snat->addr, Ip4(kNodeIp));
  EXPECT_EQ(ntohs(snat->port), d->sport);
  sluice_nat4_key rev{Ip4(kRemote), Ip4(kNodeIp), htons(443), htons(d->sport), IPPROTO_TCP, {}};
  auto rnat = dp_->rnat().Lookup(rev);
  ASSERT_TRUE(rnat.ok()) << rnat.status();
  EXPECT_EQ(rnat->addr, Ip4(kPodIp));
  EXPECT_EQ(ntohs(rnat->port), 40000);
}

TEST_F(NetdevTest, EveryPacketOfAFlowKeepsItsTranslation) {
  auto first = Decode(ToNet(FromPodTo(kRemote).TCP(40000, 443).Build()).out);
  auto second = Decode(ToNet(FromPodTo(kRemote).TCP(40000, 443, kTcpAck).Build()).out);
  ASSERT_TRUE(first && second);
  EXPECT_EQ(first->sport, second->sport);
  EXPECT_EQ(Count(dp_->snat()), 1u);
  EXPECT_EQ(Count(dp_->rnat()), 1u);
}

TEST_F(NetdevTest, ReplyIsTranslatedBackAndDeliveredToThePod) {
  auto out = Decode(ToNet(FromPodTo(kRemote).TCP(40000, 443).Build()).out);
  ASSERT_TRUE(out);
  auto reply = Packet::Eth(kRouterMac, kNodeMac)
                   .IPv4(kRemote, kNodeIp, 60)
                   .TCP(443, out->sport, kTcpSyn | kTcpAck)
                   .Payload("200 OK")
                   .Build();
  auto r = FromNet(reply);
  ASSERT_EQ(r.verdict, kTcRedirect) << Describe(r.out);
  auto d = Decode(r.out);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->ip_src, Ip4(kRemote));
  EXPECT_EQ(d->ip_dst, Ip4(kPodIp));
  EXPECT_EQ(d->sport, 443);
  EXPECT_EQ(d->dport, 40000);
  EXPECT_EQ(d->ttl, 59);
  EXPECT_EQ(d->eth_dst, kPodMac);
  EXPECT_EQ(d->eth_src, kHostMac);
  EXPECT_TRUE(d->ip_csum_ok) << Describe(r.out);
  EXPECT_TRUE(d->l4_csum_ok) << Describe(r.out);
  EXPECT_EQ(d->payload, "200 OK");
}

TEST_F(NetdevTest, UdpWithChecksumAndWithoutChecksumAreBothTranslatedCorrectly) {
  auto with = Decode(ToNet(FromPodTo(kRemote).UDP(5000, 53).Payload("q1").Build()).out);
  ASSERT_TRUE(with);
  EXPECT_NE(with->l4_csum, 0);
  EXPECT_TRUE(with->l4_csum_ok);
  EXPECT_EQ(with->ip_src, Ip4(kNodeIp));

  auto without =
      Decode(ToNet(FromPodTo(kRemote).UDP(5001, 53, /*zero_checksum=*/true).Payload("q2").Build())
                 .out);
  ASSERT_TRUE(without);
  EXPECT_EQ(without->l4_csum, 0) << "a zero UDP checksum means none and must stay zero";
  EXPECT_EQ(without->ip_src, Ip4(kNodeIp));
  EXPECT_TRUE(without->ip_csum_ok);
}

TEST_F(NetdevTest, IcmpEchoIsMasqueradedByIdentifierAndTheReplyReturns) {
  auto r = ToNet(FromPodTo(kRemote).IcmpEcho(77, 1).Payload("ping").Build());
  ASSERT_EQ(r.verdict, kTcOk);
  auto out = Decode(r.out);
  ASSERT_TRUE(out);
  EXPECT_EQ(out->ip_src, Ip4(kNodeIp));
  EXPECT_GE(out->sport, kPortMin) << "the echo id is the allocated port";
  EXPECT_TRUE(out->l4_csum_ok) << Describe(r.out);

  auto back = FromNet(Packet::Eth(kRouterMac, kNodeMac)
                          .IPv4(kRemote, kNodeIp)
                          .IcmpEcho(out->sport, 1, /*reply=*/true)
                          .Payload("ping")
                          .Build());
  ASSERT_EQ(back.verdict, kTcRedirect) << Describe(back.out);
  auto d = Decode(back.out);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->ip_dst, Ip4(kPodIp));
  EXPECT_EQ(d->sport, 77);
  EXPECT_TRUE(d->l4_csum_ok) << Describe(back.out);
  EXPECT_TRUE(d->ip_csum_ok);
}

TEST_F(NetdevTest, PodCidrDestinationsAreNeverMasqueraded) {
  auto in = FromPodTo("10.244.0.99").TCP(40000, 80).Build();
  auto r = ToNet(in);
  EXPECT_EQ(r.verdict, kTcOk);
  EXPECT_EQ(r.out, in);
  EXPECT_EQ(Count(dp_->snat()), 0u);
}

TEST_F(NetdevTest, NodeOwnTrafficPassesUntouched) {
  auto in = Packet::Eth(kNodeMac, kRouterMac).IPv4(kNodeIp, kRemote).TCP(50000, 22).Build();
  auto r = ToNet(in);
  EXPECT_EQ(r.verdict, kTcOk);
  EXPECT_EQ(r.out, in);
  auto to_node = Packet::Eth(kRouterMac, kNodeMac).IPv4(kRemote, kNodeIp).TCP(22, 50000).Build();
  auto back = FromNet(to_node);
  EXPECT_EQ(back.verdict, kTcOk);
  EXPECT_EQ(back.out, to_node);
}

TEST_F(NetdevTest, MasqueradeOffLeavesPodSourceAddress) {
  SetNodeConfig(kPortMin, kPortMax, 0);
  auto in = FromPodTo(kRemote).TCP(40000, 443).Build();
  auto r = ToNet(in);
  EXPECT_EQ(r.verdict, kTcOk);
  EXPECT_EQ(r.out, in);
}

TEST_F(NetdevTest, FragmentNeedingMasqueradeIsDroppedWithReason) {
  auto in = FromPodTo(kRemote).UDP(5000, 53).Fragment(0x2000).Build();
  auto before = Drops(SLUICE_DROP_FRAGMENT);
  EXPECT_EQ(ToNet(in).verdict, kTcShot);
  EXPECT_EQ(Drops(SLUICE_DROP_FRAGMENT), before + 1);
}

TEST_F(NetdevTest, ProtocolWithoutPortsIsDroppedWithReason) {
  auto in = FromPodTo(kRemote).Protocol(47 /* GRE */).Payload("gre").Build();
  auto before = Drops(SLUICE_DROP_NAT_UNSUPPORTED_L4);
  EXPECT_EQ(ToNet(in).verdict, kTcShot);
  EXPECT_EQ(Drops(SLUICE_DROP_NAT_UNSUPPORTED_L4), before + 1);
}

TEST_F(NetdevTest, ExhaustedPortRangeDropsOnlyTheNewFlowAndCountsIt) {
  SetNodeConfig(62000, 62000, SLUICE_NODE_F_MASQUERADE);
  auto first = ToNet(FromPodTo(kRemote).TCP(40000, 443).Build());
  ASSERT_EQ(first.verdict, kTcOk);
  EXPECT_EQ(Decode(first.out)->sport, 62000);
  auto before = Drops(SLUICE_DROP_NAT_NO_PORT);
  EXPECT_EQ(ToNet(FromPodTo(kRemote).TCP(40001, 443).Build()).verdict, kTcShot);
  EXPECT_EQ(Drops(SLUICE_DROP_NAT_NO_PORT), before + 1);
  // The established flow is unaffected, and another destination can reuse the port.
  EXPECT_EQ(ToNet(FromPodTo(kRemote).TCP(40000, 443, kTcpAck).Build()).verdict, kTcOk);
  auto other = ToNet(FromPodTo("198.51.100.8").TCP(40001, 443).Build());
  ASSERT_EQ(other.verdict, kTcOk);
  EXPECT_EQ(Decode(other.out)->sport, 62000);
}

TEST_F(NetdevTest, ManyFlowsGetDistinctPorts) {
  std::set<uint16_t> ports;
  for (uint16_t sport = 30000; sport < 30200; ++sport) {
    auto r = ToNet(FromPodTo(kRemote).UDP(sport, 53).Build());
    ASSERT_EQ(r.verdict, kTcOk);
    ports.insert(Decode(r.out)->sport);
  }
  EXPECT_EQ(ports.size(), 200u);
}

}  // namespace
}  // namespace sluice::testing
