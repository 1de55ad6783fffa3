// Packet-in/packet-out tests of sluice_xdp_net (XDP on the native device): NodePort flows to
// backends on other nodes translated and sent on at XDP, their replies translated back, refusals
// dropped there, and everything else passed to TC byte for byte. bpf_fib_lookup answers from the
// routes of the test's own network namespace: one veth pair for the node's network, another for
// a second network (a redirect out of another device), permanent neighbours for the next hops.
#include <arpa/inet.h>
#include <net/if.h>
#include <sched.h>

#include <cstdlib>

#include "gmock/gmock.h"
#include "support/fixture.h"

namespace sluice::testing {
namespace {

constexpr char kNodeIp[] = "192.168.50.2";
constexpr char kClient[] = "198.51.100.7";
constexpr char kLbIp[] = "203.0.113.10";
const Mac kNodeMac = ParseMac("02:fb:00:00:00:01");     // xdp0, the native device
const Mac kSecondMac = ParseMac("02:fb:00:00:00:02");   // xdp2, the second network's device
const Mac kRouterMac = ParseMac("02:fb:00:00:00:fe");   // the client's next hop
const Mac kPeerMac = ParseMac("02:fb:00:00:00:20");     // the node of 10.244.1.0/24
const Mac kFarPeerMac = ParseMac("02:fb:00:00:00:40");  // the node of 10.244.2.0/24, via xdp2
const Mac kPodMac = ParseMac("02:00:00:00:0a:15");
const Mac kHostMac = ParseMac("02:aa:00:00:0a:15");

// NodePorts of the fixture (host order).
constexpr uint16_t kToPeer = 30081;        // backend 10.244.1.31:8080, out of xdp0 again
constexpr uint16_t kToFarPeer = 30083;     // backend 10.244.2.41:8080, out of xdp2
constexpr uint16_t kToLocal = 30080;       // backend 10.244.0.21:8080, a pod on this node
constexpr uint16_t kToNowhere = 30084;     // backend 10.250.0.5:8080, no route
constexpr uint16_t kToNodeItself = 30085;  // backend the node's own address (hostNetwork)

int Ifindex(const char* name) { return static_cast<int>(if_nametoindex(name)); }

class XdpTest : public DatapathTest {
 protected:
  void SetUp() override {
    ASSERT_EQ(unshare(CLONE_NEWNET), 0) << "unshare: " << strerror(errno);
    for (const char* cmd : {
             "ip link set lo up",
             "sysctl -qw net.ipv4.ip_forward=1",
             "ip link add xdp0 address 02:fb:00:00:00:01 type veth peer name xdp1",
             "ip link add xdp2 address 02:fb:00:00:00:02 type veth peer name xdp3",
             "ip addr add 192.168.50.2/24 dev xdp0",
             "ip addr add 192.168.60.2/24 dev xdp2",
             "ip link set xdp0 up",
             "ip link set xdp1 up",
             "ip link set xdp2 up",
             "ip link set xdp3 up",
             "ip neigh replace 192.168.50.1 lladdr 02:fb:00:00:00:fe dev xdp0 nud permanent",
             "ip neigh replace 192.168.50.20 lladdr 02:fb:00:00:00:20 dev xdp0 nud permanent",
             "ip neigh replace 192.168.60.40 lladdr 02:fb:00:00:00:40 dev xdp2 nud permanent",
             "ip route add 198.51.100.0/24 via 192.168.50.1",
             "ip route add 10.244.1.0/24 via 192.168.50.20",
             "ip route add 10.244.2.0/24 via 192.168.60.40",
         }) {
      ASSERT_EQ(std::system(cmd), 0) << cmd;
    }
    DatapathTest::SetUp();
    if (HasFatalFailure()) return;
    native_ = Ifindex("xdp0");
    second_ = Ifindex("xdp2");
    ASSERT_GT(native_, 0);
    ASSERT_GT(second_, 0);

    sluice_node_config cfg{};
    cfg.node_ip4 = Ip4(kNodeIp);
    cfg.pod_cidr4 = Ip4("10.244.0.0");
    cfg.pod_cidr4_len = 24;
    cfg.gateway_ip4 = Ip4("10.244.0.1");
    cfg.flags = SLUICE_NODE_F_MASQUERADE;
    cfg.nat_port_min = 61000;
    cfg.nat_port_max = 65535;
    cfg.service_cidr4 = Ip4("10.96.0.0");
    cfg.service_cidr4_len = 16;
    ASSERT_TRUE(dp_->node_config().Update(0, cfg).ok());
    ASSERT_TRUE(AddEndpoint(*dp_, Ip4("10.244.0.21"), 4242, kPodMac, kHostMac, 21).ok());

    const uint16_t np = SLUICE_SVC_F_NODEPORT;
    for (const auto& [port, id, backend] : {std::tuple{kToPeer, 8u, "10.244.1.31"},
                                            {kToFarPeer, 9u, "10.244.2.41"},
                                            {kToLocal, 7u, "10.244.0.21"},
                                            {kToNowhere, 10u, "10.250.0.5"},
                                            {kToNodeItself, 11u, kNodeIp}}) {
      ASSERT_TRUE(ProgramService(*dp_, kNodeIp, port, IPPROTO_TCP, id,
                                 {{id, backend, 8080, IPPROTO_TCP}}, np)
                      .ok());
    }
    // A LoadBalancer IP admitting 192.0.2.0/24 only.
    ASSERT_TRUE(ProgramService(*dp_, kLbIp, 80, IPPROTO_TCP, 12,
                               {{12, "10.244.1.32", 8080, IPPROTO_TCP}},
                               SLUICE_SVC_F_LOADBALANCER | SLUICE_SVC_F_SOURCE_RANGES)
                    .ok());
    sluice_lb4_srcrange_key admitted{32 + 24, htonl(12), Ip4("192.0.2.0")};
    ASSERT_TRUE(dp_->lb4_source_ranges().Update(admitted, 1).ok());
  }

  int native_ = 0;
  int second_ = 0;
};

// From the client, arriving on xdp0 from its router.
Packet FromClient() { return Packet::Eth(kRouterMac, kNodeMac).IPv4(kClient, kNodeIp); }

// Steps received on xdp0, which exists only once a test's namespace is made: the table marks
// them with ifindex 0 and XdpTable puts xdp0's index in.
constexpr int kOnNative = 0;

// A step through sluice_xdp_net as received on xdp0.
Step Xdp(Step s) {
  s.prog = Prog::kXdpNet;
  s.ifindex = kOnNative;
  return s;
}

// The same through sluice_from_net (TC) on xdp0.
Step Tc(Step s) {
  s.prog = Prog::kFromNet;
  s.ifindex = kOnNative;
  return s;
}

// The NAT port a forwarded step's output leaves with.
uint16_t NatPort(const Trail& t) { return t.last().sport; }

void ExpectNatPortInRange(loader::Datapath&, const Trail& t) { EXPECT_GE(NatPort(t), 61000); }

std::vector<PacketCase> XdpCases() {
  return {
      {"NodePortToABackendOnAnotherNodeIsTranslatedAndSentBackOutOfTheSameDevice",
       {Xdp({.in = FromClient().TCP(50001, kToPeer).Payload("hi"),
             .verdict = kXdpTx,
             .out = {[](const Trail& t) {
               return Packet::Eth(kNodeMac, kPeerMac)
                   .IPv4(kNodeIp, "10.244.1.31", 63)
                   .TCP(NatPort(t), 8080)
                   .Payload("hi");
             }},
             .effects = ExpectNatPortInRange})}},
      {"TheBackendsReplyIsTranslatedBackAndSentToTheClient",
       {Xdp({.in = FromClient().TCP(50002, kToPeer),
             .verdict = kXdpTx,
             .out = {[](const Trail& t) {
               return Packet::Eth(kNodeMac, kPeerMac)
                   .IPv4(kNodeIp, "10.244.1.31", 63)
                   .TCP(NatPort(t), 8080);
             }}}),
        Xdp({.in =
                 [](const Trail& t) {
                   return Packet::Eth(kPeerMac, kNodeMac)
                       .IPv4("10.244.1.31", kNodeIp)
                       .TCP(8080, t.out[0].sport, kTcpSyn | kTcpAck)
                       .Payload("ok");
                 },
             .verdict = kXdpTx,
             .out = {Packet::Eth(kNodeMac, kRouterMac)
                         .IPv4(kNodeIp, kClient, 63)
                         .TCP(kToPeer, 50002, kTcpSyn | kTcpAck)
                         .Payload("ok")}}),
        // Later packets keep the flow's backend and port.
        Xdp({.in = FromClient().TCP(50002, kToPeer, kTcpAck),
             .verdict = kXdpTx,
             .out = {[](const Trail& t) {
               return Packet::Eth(kNodeMac, kPeerMac)
                   .IPv4(kNodeIp, "10.244.1.31", 63)
                   .TCP(t.out[0].sport, 8080, kTcpAck);
             }}})}},
      {"UdpNodePortToABackendOnAnotherNodeIsTranslatedWithItsChecksum",
       {Xdp({.in = FromClient().UDP(5353, kToPeer).Payload("q"),
             .verdict = kXdpTx,
             .out = {[](const Trail& t) {
               return Packet::Eth(kNodeMac, kPeerMac)
                   .IPv4(kNodeIp, "10.244.1.33", 63)
                   .UDP(NatPort(t), 53)
                   .Payload("q");
             }},
             .setup =
                 [](loader::Datapath& dp) {
                   ASSERT_TRUE(ProgramService(dp, kNodeIp, kToPeer, IPPROTO_UDP, 13,
                                              {{13, "10.244.1.33", 53, IPPROTO_UDP}},
                                              SLUICE_SVC_F_NODEPORT)
                                   .ok());
                 }})}},
      {"ABackendRoutedOutOfAnotherDeviceIsRedirectedThere",
       {Xdp({.in = FromClient().TCP(50003, kToFarPeer).Payload("hi"),
             .verdict = kXdpRedirect,
             .out = {[](const Trail& t) {
               return Packet::Eth(kSecondMac, kFarPeerMac)
                   .IPv4(kNodeIp, "10.244.2.41", 63)
                   .TCP(NatPort(t), 8080)
                   .Payload("hi");
             }}})}},
      {"ABackendOnThisNodeIsLeftToTcUnchanged",
       {Xdp({.in = FromClient().TCP(50004, kToLocal), .verdict = kXdpPass, .unchanged = true}),
        // TC then does it, with the conntrack entry XDP's choice made.
        Tc({.in = FromClient().TCP(50004, kToLocal),
            .verdict = kTcRedirect,
            .out = {Packet::Eth(kHostMac, kPodMac)
                        .IPv4(kClient, "10.244.0.21", 63)
                        .TCP(50004, 8080)}})}},
      {"AHostNetworkBackendIsLeftToTcUnchanged",
       {Xdp({.in = FromClient().TCP(50005, kToNodeItself),
             .verdict = kXdpPass,
             .unchanged = true})}},
      {"ABackendTheFibHasNoRouteForIsLeftToTcUnchanged",
       {Xdp({.in = FromClient().TCP(50006, kToNowhere),
             .verdict = kXdpPass,
             .unchanged = true,
             .effects =
                 [](loader::Datapath& dp, const Trail&) {
                   // Nothing was masqueraded: TC allocates when it forwards.
                   auto n = dp.snat().Count();
                   ASSERT_TRUE(n.ok());
                   EXPECT_EQ(*n, 0u);
                 }})}},
      {"AnExpiringTtlIsLeftToTc",
       {Xdp({.in = Packet::Eth(kRouterMac, kNodeMac).IPv4(kClient, kNodeIp, 1).TCP(50007, kToPeer),
             .verdict = kXdpPass,
             .unchanged = true})}},
      {"AClientOutsideTheSourceRangesIsDroppedAtXdp",
       {Xdp({.in = Packet::Eth(kRouterMac, kNodeMac).IPv4(kClient, kLbIp).TCP(50008, 80),
             .verdict = kXdpDrop,
             .drop = SLUICE_DROP_SOURCE_RANGE})}},
      {"AClientInsideTheSourceRangesIsForwarded",
       {Xdp({.in = Packet::Eth(kRouterMac, kNodeMac).IPv4("192.0.2.9", kLbIp).TCP(50009, 80),
             .verdict = kXdpTx,
             .out = {[](const Trail& t) {
               return Packet::Eth(kNodeMac, kPeerMac)
                   .IPv4(kNodeIp, "10.244.1.32", 63)
                   .TCP(NatPort(t), 8080);
             }}})}},
      {"AnAddressInTheServiceRangeNoServiceHasIsDroppedAtXdp",
       {Xdp({.in = Packet::Eth(kRouterMac, kNodeMac).IPv4(kClient, "10.96.0.99").TCP(50010, 80),
             .verdict = kXdpDrop,
             .drop = SLUICE_DROP_SERVICE_UNKNOWN_IP})}},
      {"TheNodesOwnTrafficIsLeftToTcUnchanged",
       {Xdp({.in = FromClient().TCP(50011, 22).Payload("ssh"),
             .verdict = kXdpPass,
             .unchanged = true}),
        Xdp({.in = FromClient().IcmpEcho(7, 1), .verdict = kXdpPass, .unchanged = true}),
        Xdp({.in = FromClient().UDP(5000, 53).Payload("dns"),
             .verdict = kXdpPass,
             .unchanged = true})}},
      {"APodsMasqueradedFlowsReplyIsLeftToTc",
       {Step{.prog = Prog::kToNet,
             .in =
                 Packet::Eth(kNodeMac, kRouterMac).IPv4("10.244.0.21", kClient, 63).TCP(40000, 443),
             .verdict = kTcOk},
        Xdp({.in =
                 [](const Trail& t) {
                   return FromClient().TCP(443, t.last().sport, kTcpSyn | kTcpAck);
                 },
             .verdict = kXdpPass,
             .unchanged = true})}},
      // Both paths share conntrack and NAT: a flow TC forwarded has its reply translated at XDP,
      // and one XDP forwarded has its reply translated by TC.
      {"AFlowTcForwardedHasItsReplyTranslatedAtXdp",
       {Tc({.in = FromClient().TCP(50012, kToPeer),
            .verdict = kTcRedirect,
            .out = {[](const Trail& t) {
              return Packet::Eth(kNodeMac, kPeerMac)
                  .IPv4(kNodeIp, "10.244.1.31", 63)
                  .TCP(NatPort(t), 8080);
            }}}),
        Xdp({.in =
                 [](const Trail& t) {
                   return Packet::Eth(kPeerMac, kNodeMac)
                       .IPv4("10.244.1.31", kNodeIp)
                       .TCP(8080, t.out[0].sport, kTcpSyn | kTcpAck);
                 },
             .verdict = kXdpTx,
             .out = {Packet::Eth(kNodeMac, kRouterMac)
                         .IPv4(kNodeIp, kClient, 63)
                         .TCP(kToPeer, 50012, kTcpSyn | kTcpAck)}})}},
      {"AFlowXdpForwardedHasItsReplyTranslatedByTc",
       {Xdp({.in = FromClient().TCP(50013, kToPeer),
             .verdict = kXdpTx,
             .out = {[](const Trail& t) {
               return Packet::Eth(kNodeMac, kPeerMac)
                   .IPv4(kNodeIp, "10.244.1.31", 63)
                   .TCP(NatPort(t), 8080);
             }}}),
        Tc({.in =
                [](const Trail& t) {
                  return Packet::Eth(kPeerMac, kNodeMac)
                      .IPv4("10.244.1.31", kNodeIp)
                      .TCP(8080, t.out[0].sport, kTcpSyn | kTcpAck);
                },
            .verdict = kTcRedirect,
            .out = {Packet::Eth(kNodeMac, kRouterMac)
                        .IPv4(kNodeIp, kClient, 63)
                        .TCP(kToPeer, 50013, kTcpSyn | kTcpAck)}})}},
  };
}

class XdpTable : public XdpTest, public ::testing::WithParamInterface<PacketCase> {};

TEST_P(XdpTable, Packet) {
  PacketCase c = GetParam();
  for (auto& step : c.steps) {
    if (step.ifindex == kOnNative) step.ifindex = native_;
  }
  RunCase(c);
}

INSTANTIATE_TEST_SUITE_P(NodePortAcceleration, XdpTable, ::testing::ValuesIn(XdpCases()), CaseName);

}  // namespace
}  // namespace sluice::testing
