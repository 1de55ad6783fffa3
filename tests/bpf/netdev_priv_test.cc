// Packet-in/packet-out tests of the native-device programs: masquerade of pod traffic leaving
// the node (sluice_to_net) and the reverse translation of replies (sluice_from_net).
#include <arpa/inet.h>

#include <set>

#include "gmock/gmock.h"
#include "support/fixture.h"

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

void SetNodeConfig(loader::Datapath& dp, uint16_t min, uint16_t max, uint8_t flags) {
  sluice_node_config cfg{};
  cfg.node_ip4 = Ip4(kNodeIp);
  cfg.pod_cidr4 = Ip4("10.244.0.0");
  cfg.pod_cidr4_len = 24;
  cfg.gateway_ip4 = Ip4("10.244.0.1");
  cfg.flags = flags;
  cfg.nat_port_min = min;
  cfg.nat_port_max = max;
  ASSERT_TRUE(dp.node_config().Update(0, cfg).ok());
}

size_t Count(maps::NatMap& m) {
  auto n = m.Count();
  EXPECT_TRUE(n.ok());
  return n.ok() ? *n : 0;
}

// The pod's packets as sluice_to_net sees them: routed by the node (TTL 63) towards the router.
Packet FromPodTo(const std::string& dst) {
  return Packet::Eth(kNodeMac, kRouterMac).IPv4(kPodIp, dst, 63);
}
// The same after masquerade: from the node's address.
Packet MasqueradedTo(const std::string& dst) {
  return Packet::Eth(kNodeMac, kRouterMac).IPv4(kNodeIp, dst, 63);
}
// A packet from the outside to the node.
Packet ToNode(uint8_t ttl = 64) {
  return Packet::Eth(kRouterMac, kNodeMac).IPv4(kRemote, kNodeIp, ttl);
}
// What the pod receives, redirected to its veth.
Packet ToPod(uint8_t ttl) { return Packet::Eth(kHostMac, kPodMac).IPv4(kRemote, kPodIp, ttl); }

class NetdevTest : public DatapathTest {
 protected:
  void SetUp() override {
    DatapathTest::SetUp();
    if (HasFatalFailure()) return;
    SetNodeConfig(*dp_, kPortMin, kPortMax, SLUICE_NODE_F_MASQUERADE);
    sluice_lpm4_key pod_cidr{24, Ip4("10.244.0.0")};
    ASSERT_TRUE(dp_->nomasq().Update(pod_cidr, 1).ok());
    ASSERT_TRUE(testing::AddEndpoint(*dp_, Ip4(kPodIp), 4242, kPodMac, kHostMac, 0).ok());
  }
  RunResult ToNet(const Bytes& in) { return Run(dp_->to_net_fd(), in); }
};

// Checks that the port a step's output was given is one of the configured range.
void ExpectAllocatedPort(loader::Datapath&, const Trail& t) {
  EXPECT_GE(t.last().sport, kPortMin);
  EXPECT_LE(t.last().sport, kPortMax);
}

std::vector<PacketCase> NetdevCases() {
  return {
      {"PodTcpLeavingTheNodeIsMasqueradedToNodeAddressWithAllocatedPort",
       {{.prog = Prog::kToNet,
         .in = FromPodTo(kRemote).TCP(40000, 443).Payload("GET"),
         .verdict = kTcOk,
         .out = {[](const Trail& t) {
           return MasqueradedTo(kRemote).TCP(t.last().sport, 443).Payload("GET");
         }},
         .effects =
             [](loader::Datapath& dp, const Trail& t) {
               ExpectAllocatedPort(dp, t);
               uint16_t port = t.last().sport;
               // Both directions are recorded: the flow's tuple and the reply's tuple.
               sluice_nat4_key fwd{Ip4(kPodIp), Ip4(kRemote), htons(40000),
                                   htons(443),  IPPROTO_TCP,  {}};
               auto snat = dp.snat().Lookup(fwd);
               ASSERT_TRUE(snat.ok()) << snat.status();
               EXPECT_EQ(snat->addr, Ip4(kNodeIp));
               EXPECT_EQ(ntohs(snat->port), port);
               sluice_nat4_key rev{Ip4(kRemote), Ip4(kNodeIp), htons(443),
                                   htons(port),  IPPROTO_TCP,  {}};
               auto rnat = dp.rnat().Lookup(rev);
               ASSERT_TRUE(rnat.ok()) << rnat.status();
               EXPECT_EQ(rnat->addr, Ip4(kPodIp));
               EXPECT_EQ(ntohs(rnat->port), 40000);
             }}}},
      {"EveryPacketOfAFlowKeepsItsTranslation",
       {{.prog = Prog::kToNet,
         .in = FromPodTo(kRemote).TCP(40000, 443),
         .verdict = kTcOk,
         .out = {[](const Trail& t) { return MasqueradedTo(kRemote).TCP(t.last().sport, 443); }},
         .effects = ExpectAllocatedPort},
        {.prog = Prog::kToNet,
         .in = FromPodTo(kRemote).TCP(40000, 443, kTcpAck),
         .verdict = kTcOk,
         .out = {[](const Trail& t) {
           return MasqueradedTo(kRemote).TCP(t.out[0].sport, 443, kTcpAck);
         }},
         .effects =
             [](loader::Datapath& dp, const Trail&) {
               EXPECT_EQ(Count(dp.snat()), 1u);
               EXPECT_EQ(Count(dp.rnat()), 1u);
             }}}},
      {"ReplyIsTranslatedBackAndDeliveredToThePod",
       {{.prog = Prog::kToNet,
         .in = FromPodTo(kRemote).TCP(40000, 443),
         .verdict = kTcOk,
         .out = {[](const Trail& t) { return MasqueradedTo(kRemote).TCP(t.last().sport, 443); }}},
        {.prog = Prog::kFromNet,
         .in =
             [](const Trail& t) {
               return ToNode(60).TCP(443, t.last().sport, kTcpSyn | kTcpAck).Payload("200 OK");
             },
         .verdict = kTcRedirect,
         .out = {ToPod(59).TCP(443, 40000, kTcpSyn | kTcpAck).Payload("200 OK")}}}},
      {"UdpWithChecksumIsMasqueradedWithTheChecksumUpdated",
       {{.prog = Prog::kToNet,
         .in = FromPodTo(kRemote).UDP(5000, 53).Payload("q1"),
         .verdict = kTcOk,
         .out = {[](const Trail& t) {
           return MasqueradedTo(kRemote).UDP(t.last().sport, 53).Payload("q1");
         }},
         .effects = [](loader::Datapath&, const Trail& t) { EXPECT_NE(t.last().l4_csum, 0); }}}},
      {"UdpWithoutChecksumIsMasqueradedAndKeepsNoChecksum",
       {{.prog = Prog::kToNet,
         .in = FromPodTo(kRemote).UDP(5001, 53, /*zero_checksum=*/true).Payload("q2"),
         .verdict = kTcOk,
         .out = {[](const Trail& t) {
           return MasqueradedTo(kRemote)
               .UDP(t.last().sport, 53, /*zero_checksum=*/true)
               .Payload("q2");
         }},
         .effects =
             [](loader::Datapath&, const Trail& t) {
               EXPECT_EQ(t.last().l4_csum, 0)
                   << "a zero UDP checksum means none and must stay zero";
             }}}},
      // The echo identifier plays the port: the allocated one replaces it.
      {"IcmpEchoIsMasqueradedByIdentifierAndTheReplyReturns",
       {{.prog = Prog::kToNet,
         .in = FromPodTo(kRemote).IcmpEcho(77, 1).Payload("ping"),
         .verdict = kTcOk,
         .out = {[](const Trail& t) {
           return MasqueradedTo(kRemote).IcmpEcho(t.last().sport, 1).Payload("ping");
         }},
         .effects = ExpectAllocatedPort},
        {.prog = Prog::kFromNet,
         .in =
             [](const Trail& t) {
               return ToNode().IcmpEcho(t.last().sport, 1, /*reply=*/true).Payload("ping");
             },
         .verdict = kTcRedirect,
         .out = {ToPod(63).IcmpEcho(77, 1, /*reply=*/true).Payload("ping")}}}},
      {"PodCidrDestinationsAreNeverMasqueraded",
       {{.prog = Prog::kToNet,
         .in = FromPodTo("10.244.0.99").TCP(40000, 80),
         .verdict = kTcOk,
         .unchanged = true,
         .effects = [](loader::Datapath& dp, const Trail&) { EXPECT_EQ(Count(dp.snat()), 0u); }}}},
      // Another node's pod (native routing) or a client routed to pod addresses: delivered into
      // the pod through its ingress policy, not through the node's stack.
      {"TrafficFromTheNetworkToAPodHereIsDeliveredIntoIt",
       {{.prog = Prog::kFromNet,
         .in = Packet::Eth(kRouterMac, kNodeMac)
                   .IPv4(kRemote, kPodIp, 64)
                   .TCP(5555, 8080)
                   .Payload("x"),
         .verdict = kTcRedirect,
         .out = {ToPod(63).TCP(5555, 8080).Payload("x")}}}},
      // A packet Sluice routed out itself (maps/node.h) has nothing left to decide here: it
      // leaves as it is, without the mark; any other mark is not Sluice's to clear.
      {"PacketSluiceRoutedOutLeavesUntouchedAndUnmarked",
       {{.prog = Prog::kToNet,
         .in = FromPodTo(kRemote).TCP(40000, 443),
         .verdict = kTcOk,
         .unchanged = true,
         .effects = [](loader::Datapath& dp, const Trail&) { EXPECT_EQ(Count(dp.snat()), 0u); },
         .mark_in = SLUICE_SKB_MARK_ROUTED,
         .mark_out = 0}}},
      {"AnotherProgramsMarkIsKeptAndThePacketMasqueraded",
       {{.prog = Prog::kToNet,
         .in = FromPodTo(kRemote).TCP(40000, 443),
         .verdict = kTcOk,
         .out = {[](const Trail& t) { return MasqueradedTo(kRemote).TCP(t.last().sport, 443); }},
         .mark_in = 0x1234,
         .mark_out = 0x1234}}},
      {"NodeOwnTrafficPassesUntouched",
       {{.prog = Prog::kToNet,
         .in = Packet::Eth(kNodeMac, kRouterMac).IPv4(kNodeIp, kRemote).TCP(50000, 22),
         .verdict = kTcOk,
         .unchanged = true},
        {.prog = Prog::kFromNet,
         .in = Packet::Eth(kRouterMac, kNodeMac).IPv4(kRemote, kNodeIp).TCP(22, 50000),
         .verdict = kTcOk,
         .unchanged = true}}},
      {"MasqueradeOffLeavesPodSourceAddress",
       {{.prog = Prog::kToNet,
         .in = FromPodTo(kRemote).TCP(40000, 443),
         .verdict = kTcOk,
         .unchanged = true,
         .setup = [](loader::Datapath& dp) { SetNodeConfig(dp, kPortMin, kPortMax, 0); }}}},
      // A later fragment needs its first fragment's ports (lib/parse.h): without them it cannot
      // be masqueraded.
      {"FragmentNeedingMasqueradeIsDroppedWithReason",
       {{.prog = Prog::kToNet,
         .in = FromPodTo(kRemote).Fragment(9).Protocol(IPPROTO_UDP).Payload("later-bytes"),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_FRAGMENT}}},
      // The first fragment carries the ports and is masqueraded; the later one follows it.
      {"FragmentedDatagramIsMasqueradedOnItsFirstFragmentsPort",
       {{.prog = Prog::kToNet,
         .in = FromPodTo(kRemote).Fragment(0x2000).UDP(5000, 53).Payload("first-bytes"),
         .verdict = kTcOk,
         .out = {[](const Trail& t) {
           return MasqueradedTo(kRemote)
               .Fragment(0x2000)
               .UDP(t.last().sport, 53)
               .Payload("first-bytes");
         }},
         .effects = [](loader::Datapath&, const Trail& t) { EXPECT_GE(t.last().sport, kPortMin); }},
        {.prog = Prog::kToNet,
         .in = FromPodTo(kRemote).Fragment(9).Protocol(IPPROTO_UDP).Payload("later-bytes"),
         .verdict = kTcOk,
         .out =
             {MasqueradedTo(kRemote).Fragment(9).Protocol(IPPROTO_UDP).Payload("later-bytes")}}}},
      {"ProtocolWithoutPortsIsDroppedWithReason",
       {{.prog = Prog::kToNet,
         .in = FromPodTo(kRemote).Protocol(47 /* GRE */).Payload("gre"),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_NAT_UNSUPPORTED_L4}}},
      // One port in the range: the second flow to the same destination finds none.
      {"ExhaustedPortRangeDropsOnlyTheNewFlowAndCountsIt",
       {{.prog = Prog::kToNet,
         .in = FromPodTo(kRemote).TCP(40000, 443),
         .verdict = kTcOk,
         .out = {MasqueradedTo(kRemote).TCP(62000, 443)},
         .setup =
             [](loader::Datapath& dp) {
               SetNodeConfig(dp, 62000, 62000, SLUICE_NODE_F_MASQUERADE);
             }},
        {.prog = Prog::kToNet,
         .in = FromPodTo(kRemote).TCP(40001, 443),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_NAT_NO_PORT},
        // The established flow is unaffected, and another destination can reuse the port.
        {.prog = Prog::kToNet,
         .in = FromPodTo(kRemote).TCP(40000, 443, kTcpAck),
         .verdict = kTcOk,
         .out = {MasqueradedTo(kRemote).TCP(62000, 443, kTcpAck)}},
        {.prog = Prog::kToNet,
         .in = FromPodTo("198.51.100.8").TCP(40001, 443),
         .verdict = kTcOk,
         .out = {MasqueradedTo("198.51.100.8").TCP(62000, 443)}}}},
  };
}

class NetdevTable : public NetdevTest, public ::testing::WithParamInterface<PacketCase> {};

TEST_P(NetdevTable, Packet) { RunCase(GetParam()); }

INSTANTIATE_TEST_SUITE_P(NativeDevice, NetdevTable, ::testing::ValuesIn(NetdevCases()), CaseName);

// Not a table case: a property of 200 flows together.
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
