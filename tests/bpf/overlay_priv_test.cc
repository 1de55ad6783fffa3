// Packet-in/packet-out tests of the overlay (docs/routing.md): the encapsulation metadata that
// sluice_from_pod, sluice_to_net and sluice_from_net set for other nodes' pods and addresses (read
// back by the companion tests/bpf/tunnel_probe.bpf.c, which runs the same paths and then
// bpf_skb_get_tunnel_key), and the decapsulated packet's delivery by sluice_from_overlay.
#include <arpa/inet.h>
#include <linux/in.h>
#include <sched.h>

#include "bpf/tunnel_probe.h"
#include "gmock/gmock.h"
#include "loader/skeleton.h"
#include "sluice_tunnel_probe.skel.h"
#include "support/fixture.h"

namespace sluice::loader {
SLUICE_SKELETON_OPS(sluice_tunnel_probe);
}  // namespace sluice::loader

namespace sluice::testing {
namespace {

const Mac kPodAMac = ParseMac("02:00:00:00:0a:01");
const Mac kPodBMac = ParseMac("02:00:00:00:0b:01");
const Mac kHostAMac = ParseMac("02:aa:00:00:0a:02");
const Mac kHostBMac = ParseMac("02:aa:00:00:0b:02");
const Mac kNodeMac = ParseMac("02:10:00:00:00:01");
const Mac kRouterMac = ParseMac("02:10:00:00:00:fe");
const Mac kRemoteMac = ParseMac("02:20:00:00:00:01");  // inner source MAC of a decapsulated frame
constexpr int kPodAIfindex = 1;                        // lo: test_run receives on it
constexpr int kPodBIfindex = 4242;
constexpr uint32_t kVxlanIfindex = 77;
constexpr uint16_t kTunnelMtu = 1450;
constexpr char kNodeIp[] = "10.50.0.1";
constexpr char kPeerIp[] = "10.50.0.2";  // node2, pod CIDR 10.244.1.0/24
constexpr char kRemotePod[] = "10.244.1.5";

uint32_t HostOrder(const char* ip) { return ntohl(Ip4(ip)); }

// A network namespace of the test's own, without routes: the FIB answers nothing.
class PrivateNetns : public ::testing::Environment {
 public:
  void SetUp() override { ASSERT_EQ(unshare(CLONE_NEWNET), 0) << strerror(errno); }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new PrivateNetns);

// The companion's record of its last run (tunnel_probe.bpf.c).
tunnel_probe_out* g_probe = nullptr;

void SetNodeConfig(loader::Datapath& dp, uint32_t tunnel_ifindex) {
  sluice_node_config cfg{};
  cfg.node_ip4 = Ip4(kNodeIp);
  cfg.pod_cidr4 = Ip4("10.244.0.0");
  cfg.pod_cidr4_len = 24;
  cfg.gateway_ip4 = Ip4("10.244.0.1");
  cfg.flags = SLUICE_NODE_F_MASQUERADE;
  cfg.nat_port_min = 61000;
  cfg.nat_port_max = 65535;
  cfg.tunnel_ifindex = tunnel_ifindex;
  cfg.tunnel_mtu = tunnel_ifindex != 0 ? kTunnelMtu : 0;
  ASSERT_TRUE(dp.node_config().Update(0, cfg).ok());
}

void AddPeer(loader::Datapath& dp, const char* prefix, uint32_t len, const char* node,
             uint8_t flags) {
  sluice_tunnel4_entry e{};
  e.node_ip4 = Ip4(node);
  e.flags = flags;
  ASSERT_TRUE(dp.tunnel4().Update(sluice_lpm4_key{len, Ip4(prefix)}, e).ok());
}

// The node's overlay on UDP `port`, and a masquerade mapping of that port on the node's address
// back to pod A's port 5000, as a reply from the peer to it would find.
void SetTunnelPortAndMapping(loader::Datapath& dp, uint16_t port) {
  auto cfg = dp.node_config().Lookup(0);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  cfg->tunnel_port = port;
  ASSERT_TRUE(dp.node_config().Update(0, *cfg).ok());
  sluice_nat4_key reply{Ip4(kPeerIp), Ip4(kNodeIp), htons(40001), htons(port), IPPROTO_UDP, {}};
  sluice_nat4_entry pod{Ip4("10.244.0.10"), htons(5000), 0, 0};
  ASSERT_TRUE(dp.rnat().Update(reply, pod).ok());
}

// The tunnel key the step left: remote node, VNI 1, outer TTL 64.
std::function<void(loader::Datapath&, const Trail&)> TunnelKeyTo(const char* node) {
  return [node](loader::Datapath&, const Trail&) {
    ASSERT_NE(g_probe, nullptr);
    EXPECT_EQ(g_probe->get_ret, 0) << "no tunnel key on the packet";
    EXPECT_EQ(g_probe->remote_ipv4, HostOrder(node));
    EXPECT_EQ(g_probe->tunnel_id, static_cast<uint32_t>(SLUICE_TUNNEL_VNI));
    EXPECT_EQ(g_probe->tunnel_ttl, 64u);
  };
}

void NoTunnelKey(loader::Datapath&, const Trail&) {
  ASSERT_NE(g_probe, nullptr);
  EXPECT_LT(g_probe->get_ret, 0) << "a tunnel key to " << FormatIp4(htonl(g_probe->remote_ipv4));
}

class OverlayTest : public DatapathTest {
 protected:
  void SetUp() override {
    DatapathTest::SetUp();
    if (HasFatalFailure()) return;
    auto probe = loader::Skeleton<sluice_tunnel_probe>::OpenAndLoad(bpffs_->path());
    ASSERT_TRUE(probe.ok()) << probe.status();
    probe_ = std::move(*probe);
    auto* progs = &(*probe_)->progs;
    companions_ = {{"probe_from_pod", bpf_program__fd(progs->probe_from_pod)},
                   {"probe_to_net", bpf_program__fd(progs->probe_to_net)},
                   {"probe_from_net", bpf_program__fd(progs->probe_from_net)}};
    g_probe = &(*probe_)->bss->probe_out;
    ASSERT_TRUE(AddEndpoint(*dp_, Ip4("10.244.0.10"), kPodAIfindex, kPodAMac, kHostAMac, 1).ok());
    ASSERT_TRUE(AddEndpoint(*dp_, Ip4("10.244.0.11"), kPodBIfindex, kPodBMac, kHostBMac, 2).ok());
    SetNodeConfig(*dp_, kVxlanIfindex);
    AddPeer(*dp_, "10.244.1.0", 24, kPeerIp, SLUICE_TUNNEL_F_POD_CIDR);
    AddPeer(*dp_, kPeerIp, 32, kPeerIp, 0);
  }
  void TearDown() override {
    g_probe = nullptr;
    probe_.reset();
    DatapathTest::TearDown();
  }

  std::unique_ptr<loader::Skeleton<sluice_tunnel_probe>> probe_;
};

Packet FromA() { return Packet::Eth(kPodAMac, kHostAMac); }

// A UDP datagram from pod A to another node's pod whose IPv4 packet is `tot_len` bytes.
Packet BigUdpFromA(size_t tot_len, uint16_t frag = 0x4000) {
  return FromA()
      .IPv4("10.244.0.10", kRemotePod)
      .Fragment(frag)
      .UDP(5000, 9000)
      .Payload(std::string(tot_len - 28, 'x'));
}

std::vector<PacketCase> OverlayCases() {
  return {
      {"PodToAnotherNodesPodIsSentThroughTheTunnelToThatNode",
       {{.in = FromA().IPv4("10.244.0.10", kRemotePod).TCP(40000, 8080).Payload("hi"),
         .verdict = kTcRedirect,
         .out = {FromA().IPv4("10.244.0.10", kRemotePod, 63).TCP(40000, 8080).Payload("hi")},
         .effects = TunnelKeyTo(kPeerIp),
         // The encapsulated packet leaves the native device without its lookups.
         .mark_out = SLUICE_SKB_MARK_ROUTED,
         .companion = "probe_from_pod"}}},
      {"UdpToAnotherNodesPodIsSentThroughTheTunnel",
       {{.in = FromA().IPv4("10.244.0.10", kRemotePod).UDP(5353, 53).Payload("q"),
         .verdict = kTcRedirect,
         .out = {FromA().IPv4("10.244.0.10", kRemotePod, 63).UDP(5353, 53).Payload("q")},
         .effects = TunnelKeyTo(kPeerIp),
         .companion = "probe_from_pod"}}},
      {"PodToAnotherNodesAddressIsSentThroughTheTunnel",
       {{.in = FromA().IPv4("10.244.0.10", kPeerIp).TCP(40000, 10250),
         .verdict = kTcRedirect,
         .out = {FromA().IPv4("10.244.0.10", kPeerIp, 63).TCP(40000, 10250)},
         .effects = TunnelKeyTo(kPeerIp),
         .companion = "probe_from_pod"}}},
      {"PodToUnknownDestinationContinuesIntoTheStackWithoutTunnelKey",
       {{.in = FromA().IPv4("10.244.0.10", "198.51.100.7").TCP(40000, 80),
         .verdict = kTcOk,
         .unchanged = true,
         .effects = NoTunnelKey,
         .companion = "probe_from_pod"}}},
      {"PodToSameNodePodIsNotEncapsulated",
       {{.in = FromA().IPv4("10.244.0.10", "10.244.0.11").TCP(40000, 8080),
         .verdict = kTcRedirect,
         .out = {Packet::Eth(kHostBMac, kPodBMac)
                     .IPv4("10.244.0.10", "10.244.0.11", 63)
                     .TCP(40000, 8080)},
         .effects = NoTunnelKey,
         .companion = "probe_from_pod"}}},
      {"ExpiringTtlToAnotherNodeIsDroppedNotEncapsulated",
       {{.in = FromA().IPv4("10.244.0.10", kRemotePod, 1).TCP(40000, 8080),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_TTL_EXCEEDED,
         .companion = "probe_from_pod"}}},
      {"NativeRoutingSetsNoTunnelKey",
       {{.in = FromA().IPv4("10.244.0.10", kRemotePod).TCP(40000, 8080),
         .verdict = kTcOk,
         .unchanged = true,
         .setup = [](loader::Datapath& dp) { SetNodeConfig(dp, 0); },
         .effects = NoTunnelKey,
         // No route in the test's namespace: the FIB has no answer, so the stack decides.
         .companion = "probe_from_pod"}}},
      // Path MTU: a DF packet that does not fit the tunnel is answered, one that fits (or may be
      // fragmented) is sent.
      {"OversizedDfPacketToAnotherNodeIsAnsweredWithFragmentationNeeded",
       {{.in = BigUdpFromA(1451),
         .verdict = kTcRedirect,
         .out = {[](const Trail&) {
           Bytes in = BigUdpFromA(1451).Build();
           return Packet::Eth(kHostAMac, kPodAMac)
               .IPv4("10.244.0.1", "10.244.0.10", 64)
               .Id(0)
               .Icmp(3, 4, kTunnelMtu)
               .Payload(Bytes(in.begin() + 14, in.begin() + 42));
         }},
         .drop = SLUICE_DROP_FRAG_NEEDED,
         .effects = NoTunnelKey,
         .companion = "probe_from_pod"}}},
      {"DfPacketOfExactlyTheTunnelMtuIsSent",
       {{.in = BigUdpFromA(kTunnelMtu),
         .verdict = kTcRedirect,
         .out = {FromA()
                     .IPv4("10.244.0.10", kRemotePod, 63)
                     .UDP(5000, 9000)
                     .Payload(std::string(kTunnelMtu - 28, 'x'))},
         .effects = TunnelKeyTo(kPeerIp),
         .companion = "probe_from_pod"}}},
      {"OversizedPacketWithoutDfIsSentForTheNodeToFragment",
       {{.in = BigUdpFromA(1480, 0),
         .verdict = kTcRedirect,
         .out = {FromA()
                     .IPv4("10.244.0.10", kRemotePod, 63)
                     .Fragment(0)
                     .UDP(5000, 9000)
                     .Payload(std::string(1480 - 28, 'x'))},
         .effects = TunnelKeyTo(kPeerIp),
         .companion = "probe_from_pod"}}},
      // The node's own traffic (routed out of the native device) to another node's pod.
      {"NodeToAnotherNodesPodIsSentThroughTheTunnelFromTheNativeDevice",
       {{.in = Packet::Eth(kNodeMac, kRouterMac).IPv4(kNodeIp, kRemotePod).TCP(50000, 8080),
         .verdict = kTcRedirect,
         .unchanged = true,
         .effects = TunnelKeyTo(kPeerIp),
         .companion = "probe_to_net"}}},
      // The encapsulated packet itself passes the same hook: node addresses are never tunnelled
      // from there.
      {"EncapsulatedPacketToAPeerNodeLeavesTheNativeDevice",
       {{.in = Packet::Eth(kNodeMac, kRouterMac).IPv4(kNodeIp, kPeerIp).UDP(40001, 8472),
         .verdict = kTcOk,
         .unchanged = true,
         .effects = NoTunnelKey,
         .companion = "probe_to_net"}}},
      {"NodeToOutsideIsNeitherEncapsulatedNorMasqueraded",
       {{.in = Packet::Eth(kNodeMac, kRouterMac).IPv4(kNodeIp, "198.51.100.7").TCP(50000, 80),
         .verdict = kTcOk,
         .unchanged = true,
         .effects = NoTunnelKey,
         .companion = "probe_to_net"}}},
      // A NodePort whose backend is on another node: DNATed, masqueraded to this node, and
      // sent through the tunnel (not routed with the FIB).
      {"NodePortToAnotherNodesBackendIsSentThroughTheTunnel",
       {{.in = Packet::Eth(kRouterMac, kNodeMac).IPv4("198.51.100.7", kNodeIp).TCP(40000, 30080),
         .verdict = kTcRedirect,
         .setup =
             [](loader::Datapath& dp) {
               ASSERT_TRUE(ProgramService(dp, kNodeIp, 30080, IPPROTO_TCP, 7,
                                          {{71, kRemotePod, 8080, IPPROTO_TCP}},
                                          SLUICE_SVC_F_NODEPORT)
                               .ok());
             },
         .effects =
             [](loader::Datapath& dp, const Trail& t) {
               TunnelKeyTo(kPeerIp)(dp, t);
               EXPECT_EQ(t.last().ip_src, Ip4(kNodeIp));
               EXPECT_EQ(t.last().ip_dst, Ip4(kRemotePod));
               EXPECT_EQ(t.last().dport, 8080);
             },
         .companion = "probe_from_net"}}},
      // Receiving: the decapsulated inner frame on the VXLAN device.
      {"DecapsulatedPacketForALocalPodIsDeliveredWithRedirectPeer",
       {{.prog = Prog::kFromOverlay,
         .in = Packet::Eth(kRemoteMac, kHostAMac)
                   .IPv4(kRemotePod, "10.244.0.11", 63)
                   .TCP(40000, 8080)
                   .Payload("hi"),
         .verdict = kTcRedirect,
         .out = {Packet::Eth(kHostBMac, kPodBMac)
                     .IPv4(kRemotePod, "10.244.0.11", 62)
                     .TCP(40000, 8080)
                     .Payload("hi")}}}},
      {"DecapsulatedUdpForALocalPodIsDelivered",
       {{.prog = Prog::kFromOverlay,
         .in = Packet::Eth(kRemoteMac, kHostAMac).IPv4(kRemotePod, "10.244.0.11", 63).UDP(5353, 53),
         .verdict = kTcRedirect,
         .out = {Packet::Eth(kHostBMac, kPodBMac)
                     .IPv4(kRemotePod, "10.244.0.11", 62)
                     .UDP(5353, 53)}}}},
      {"DecapsulatedPingForALocalPodIsDelivered",
       {{.prog = Prog::kFromOverlay,
         .in = Packet::Eth(kRemoteMac, kHostAMac)
                   .IPv4(kRemotePod, "10.244.0.11", 63)
                   .IcmpEcho(7, 1)
                   .Payload("ping"),
         .verdict = kTcRedirect,
         .out = {Packet::Eth(kHostBMac, kPodBMac)
                     .IPv4(kRemotePod, "10.244.0.11", 62)
                     .IcmpEcho(7, 1)
                     .Payload("ping")}}}},
      // The overlay's own packets for this node (UDP to the tunnel port) skip the native device's
      // lookups: even a masquerade mapping of that port is not looked at...
      {"OverlayPacketForTheNodeTakesNoNativeDeviceLookup",
       {{.prog = Prog::kFromNet,
         .in = Packet::Eth(kRouterMac, kNodeMac)
                   .IPv4(kPeerIp, kNodeIp)
                   .UDP(40001, 8472)
                   .Payload("vx"),
         .verdict = kTcOk,
         .unchanged = true,
         .setup = [](loader::Datapath& dp) { SetTunnelPortAndMapping(dp, 8472); }}}},
      // ...unless the port is inside the masquerade range: then it may be a masqueraded flow's.
      {"TunnelPortInsideTheMasqueradeRangeIsStillUnmasqueraded",
       {{.prog = Prog::kFromNet,
         .in = Packet::Eth(kRouterMac, kNodeMac)
                   .IPv4(kPeerIp, kNodeIp)
                   .UDP(40001, 62000)
                   .Payload("vx"),
         .verdict = kTcRedirect,
         .out = {Packet::Eth(kHostAMac, kPodAMac)
                     .IPv4(kPeerIp, "10.244.0.10", 63)
                     .UDP(40001, 5000)
                     .Payload("vx")},
         .setup = [](loader::Datapath& dp) { SetTunnelPortAndMapping(dp, 62000); }}}},
      {"DecapsulatedPacketForTheNodeEntersTheStack",
       {{.prog = Prog::kFromOverlay,
         .in = Packet::Eth(kRemoteMac, kHostAMac).IPv4(kRemotePod, kNodeIp, 63).TCP(40000, 10250),
         .verdict = kTcOk,
         .unchanged = true}}},
      {"DecapsulatedPacketForAnUnknownAddressEntersTheStack",
       {{.prog = Prog::kFromOverlay,
         .in = Packet::Eth(kRemoteMac, kHostAMac)
                   .IPv4(kRemotePod, "10.244.0.99", 63)
                   .TCP(40000, 8080),
         .verdict = kTcOk,
         .unchanged = true}}},
  };
}

class OverlayTable : public OverlayTest, public ::testing::WithParamInterface<PacketCase> {};

TEST_P(OverlayTable, Packet) { RunCase(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Overlay, OverlayTable, ::testing::ValuesIn(OverlayCases()), CaseName);

}  // namespace
}  // namespace sluice::testing
