// NetworkPolicy in the datapath: the egress policy point of sluice_from_pod (after service
// translation), the ingress points of the redirect into a same-node pod and of sluice_to_pod
// (what the node's stack delivers), and conntrack letting replies of allowed flows pass. Real
// programs, maps programmed through the production maps/ API.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>

#include "gmock/gmock.h"
#include "support/fixture.h"

namespace sluice::testing {
namespace {

const Mac kPodAMac = ParseMac("02:00:00:00:0a:01");
const Mac kPodBMac = ParseMac("02:00:00:00:0b:01");
const Mac kHostAMac = ParseMac("02:aa:00:00:0a:02");
const Mac kHostBMac = ParseMac("02:aa:00:00:0b:02");
// test_run receives on lo only, so the pod that sends (and the one sluice_to_pod delivers to)
// is A, on ifindex 1.
constexpr int kPodAIfindex = 1;
constexpr int kPodBIfindex = 4242;
constexpr uint32_t kEpA = 1, kEpB = 2;
constexpr const char* kA = "10.244.0.10";
constexpr const char* kB = "10.244.0.11";
constexpr const char* kRemotePod = "10.244.1.5";  // a pod on another node
constexpr const char* kNode = "192.168.1.1";
constexpr const char* kOutside = "198.51.100.7";
constexpr uint32_t kIdA = 300, kIdB = 301, kIdRemote = 302;
constexpr uint8_t kIngress = SLUICE_POLICY_INGRESS, kEgress = SLUICE_POLICY_EGRESS;

void Enforce(loader::Datapath& dp, uint32_t ep, uint32_t identity, uint8_t flags) {
  sluice_policy_ep_entry e{};
  e.identity = identity;
  e.flags = flags;
  ASSERT_TRUE(dp.policy_ep().Update(ep, e).ok());
}

// proto_port_bits as maps::MakePolicy4Key: 0 every protocol, 8 every port, 8 + n a port prefix.
void Allow(loader::Datapath& dp, uint32_t ep, uint32_t identity, uint8_t dir, uint8_t proto,
           uint16_t port, int proto_port_bits) {
  sluice_policy4_entry v{};
  v.verdict = SLUICE_POLICY_ALLOW;
  auto key = maps::MakePolicy4Key(ep, identity, dir, proto, port, proto_port_bits);
  ASSERT_TRUE(dp.policy4().Update(key, v).ok());
}

uint64_t PolicyDrops(loader::Datapath& dp, uint32_t ep, uint8_t dir) {
  sluice_policy_drop_key k{};
  k.endpoint_id = ep;
  k.direction = dir;
  auto per_cpu = dp.policy_drops().Lookup(k);
  if (!per_cpu.ok()) return 0;
  uint64_t n = 0;
  for (const auto& c : *per_cpu) n += c.packets;
  return n;
}

// The conntrack key of a policy-tracked TCP flow as `from` sent it.
sluice_ct4_key PolicyKey(const char* from, uint16_t sport, const char* to, uint16_t dport) {
  return CtKey(from, to, sport, dport, IPPROTO_TCP, SLUICE_CT_DIR_POLICY);
}

class PolicyTest : public DatapathTest {
 protected:
  void SetUp() override {
    DatapathTest::SetUp();
    if (HasFatalFailure()) return;
    AddEndpoint(kA, kPodAIfindex, kPodAMac, kHostAMac, kEpA);
    AddEndpoint(kB, kPodBIfindex, kPodBMac, kHostBMac, kEpB);
    SetIdentity("0.0.0.0", 0, SLUICE_IDENTITY_WORLD);
    SetIdentity(kA, 32, kIdA);
    SetIdentity(kB, 32, kIdB);
    SetIdentity(kRemotePod, 32, kIdRemote);
    SetIdentity(kNode, 32, SLUICE_IDENTITY_HOST);
  }
  void AddEndpoint(const std::string& ip, int ifindex, const Mac& mac, const Mac& host_mac,
                   uint32_t id) {
    sluice_ep4_key key{Ip4(ip)};
    sluice_endpoint ep{};
    ep.ifindex = ifindex;
    std::memcpy(ep.mac, mac.data(), 6);
    std::memcpy(ep.host_mac, host_mac.data(), 6);
    ep.endpoint_id = id;
    ASSERT_TRUE(dp_->endpoints().Update(key, ep).ok());
  }
  void SetIdentity(const std::string& addr, uint32_t prefixlen, uint32_t identity) {
    sluice_lpm4_key k{prefixlen, Ip4(addr)};
    sluice_ipcache4_entry e{};
    e.identity = identity;
    ASSERT_TRUE(dp_->ipcache4().Update(k, e).ok());
  }
};

Packet FromA() { return Packet::Eth(kPodAMac, kHostAMac); }
// What the node's stack hands to pod A's veth.
Packet ToA() { return Packet::Eth(kHostAMac, kPodAMac); }
Packet ARedirectedToB(uint8_t ttl = 63) {
  return Packet::Eth(kHostBMac, kPodBMac).IPv4(kA, kB, ttl);
}
Packet Sctp(Packet p, uint16_t sport, uint16_t dport) {
  // SCTP's common header: ports, verification tag, checksum (not checked on this path).
  Bytes h = {static_cast<uint8_t>(sport >> 8),
             static_cast<uint8_t>(sport),
             static_cast<uint8_t>(dport >> 8),
             static_cast<uint8_t>(dport),
             0,
             0,
             0,
             1,
             0,
             0,
             0,
             0};
  return p.Protocol(IPPROTO_SCTP).Payload(h);
}

std::vector<PacketCase> PolicyCases() {
  return {
      {"EndpointWithoutPolicyEntryIsOpen",
       {{.in = FromA().IPv4(kA, kB).TCP(40000, 8080),
         .verdict = kTcRedirect,
         .out = {ARedirectedToB().TCP(40000, 8080)}}}},
      {"EndpointWithEntryButNoEnforcedDirectionIsOpen",
       {{.in = FromA().IPv4(kA, kB).TCP(40000, 8080),
         .verdict = kTcRedirect,
         .out = {ARedirectedToB().TCP(40000, 8080)},
         .setup =
             [](loader::Datapath& dp) {
               Enforce(dp, kEpA, kIdA, 0);
               Enforce(dp, kEpB, kIdB, 0);
             }}}},
      {"IngressAllowedForPeerIdentityAndPortIsRedirected",
       {{.in = FromA().IPv4(kA, kB).TCP(40000, 8080),
         .verdict = kTcRedirect,
         .out = {ARedirectedToB().TCP(40000, 8080)},
         .setup =
             [](loader::Datapath& dp) {
               Enforce(dp, kEpB, kIdB, SLUICE_POLICY_EP_F_INGRESS);
               Allow(dp, kEpB, kIdA, kIngress, IPPROTO_TCP, 8080, 24);
             }}}},
      {"IngressOnAnotherPortIsDroppedAsPolicyDeniedAndCountedForTheEndpoint",
       {{.in = FromA().IPv4(kA, kB).TCP(40000, 8081),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_POLICY_DENIED,
         .setup =
             [](loader::Datapath& dp) {
               Enforce(dp, kEpB, kIdB, SLUICE_POLICY_EP_F_INGRESS);
               Allow(dp, kEpB, kIdA, kIngress, IPPROTO_TCP, 8080, 24);
             },
         .effects =
             [](loader::Datapath& dp, const Trail&) {
               EXPECT_EQ(PolicyDrops(dp, kEpB, kIngress), 1u);
               EXPECT_EQ(PolicyDrops(dp, kEpB, kEgress), 0u);
               EXPECT_EQ(PolicyDrops(dp, kEpA, kEgress), 0u);
             }}}},
      {"IngressAllowedForAnotherIdentityOnlyIsDenied",
       {{.in = FromA().IPv4(kA, kB).TCP(40000, 8080),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_POLICY_DENIED,
         .setup =
             [](loader::Datapath& dp) {
               Enforce(dp, kEpB, kIdB, SLUICE_POLICY_EP_F_INGRESS);
               Allow(dp, kEpB, kIdRemote, kIngress, IPPROTO_TCP, 8080, 24);
             }}}},
      {"EgressEnforcedWithoutAllowsIsDenied",
       {{.in = FromA().IPv4(kA, kRemotePod).TCP(40000, 80),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_POLICY_DENIED,
         .setup = [](loader::Datapath& dp) { Enforce(dp, kEpA, kIdA, SLUICE_POLICY_EP_F_EGRESS); },
         .effects = [](loader::Datapath& dp,
                       const Trail&) { EXPECT_EQ(PolicyDrops(dp, kEpA, kEgress), 1u); }}}},
      // endPort 80..83 is the one prefix 80/14.
      {"PortRangePrefixAdmitsItsLastPortAndNotTheNext",
       {{.in = FromA().IPv4(kA, kB).UDP(5000, 83),
         .verdict = kTcRedirect,
         .out = {ARedirectedToB().UDP(5000, 83)},
         .setup =
             [](loader::Datapath& dp) {
               Enforce(dp, kEpB, kIdB, SLUICE_POLICY_EP_F_INGRESS);
               Allow(dp, kEpB, kIdA, kIngress, IPPROTO_UDP, 80, 8 + 14);
             }},
        {.in = FromA().IPv4(kA, kB).UDP(5000, 84),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_POLICY_DENIED},
        {.in = FromA().IPv4(kA, kB).UDP(5000, 79),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_POLICY_DENIED},
        {.in = FromA().IPv4(kA, kB).TCP(5000, 80),  // another protocol
         .verdict = kTcShot,
         .drop = SLUICE_DROP_POLICY_DENIED}}},
      {"AnyPeerRuleWithoutPortsAdmitsEveryPeerAndProtocol",
       {{.in = FromA().IPv4(kA, kRemotePod).UDP(5000, 53),
         .verdict = kTcOk,
         .unchanged = true,
         .setup =
             [](loader::Datapath& dp) {
               Enforce(dp, kEpA, kIdA, SLUICE_POLICY_EP_F_EGRESS);
               Allow(dp, kEpA, SLUICE_IDENTITY_ANY, kEgress, 0, 0, 0);
             }},
        {.in = FromA().IPv4(kA, kOutside).IcmpEcho(7, 1), .verdict = kTcOk, .unchanged = true},
        {.in = FromA().IPv4(kA, kNode).TCP(40000, 10250), .verdict = kTcOk, .unchanged = true}}},
      {"SctpRuleAdmitsSctpAndNeverTcpOrUdp",
       {{.in = Sctp(FromA().IPv4(kA, kRemotePod), 5000, 80),
         .verdict = kTcOk,
         .unchanged = true,
         .setup =
             [](loader::Datapath& dp) {
               Enforce(dp, kEpA, kIdA, SLUICE_POLICY_EP_F_EGRESS);
               Allow(dp, kEpA, kIdRemote, kEgress, IPPROTO_SCTP, 80, 24);
             }},
        {.in = FromA().IPv4(kA, kRemotePod).TCP(5000, 80),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_POLICY_DENIED},
        {.in = FromA().IPv4(kA, kRemotePod).UDP(5000, 80),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_POLICY_DENIED}}},
      // A's connection out is allowed; the reply comes back through the node's stack into A,
      // whose ingress admits nothing: it passes as a reply, an unsolicited packet does not.
      {"ReplyOfAnAllowedFlowPassesAnEnforcedIngress",
       {{.in = FromA().IPv4(kA, kRemotePod).TCP(40000, 80),
         .verdict = kTcOk,
         .unchanged = true,
         .setup =
             [](loader::Datapath& dp) {
               Enforce(dp, kEpA, kIdA, SLUICE_POLICY_EP_F_EGRESS | SLUICE_POLICY_EP_F_INGRESS);
               Allow(dp, kEpA, kIdRemote, kEgress, IPPROTO_TCP, 80, 24);
             },
         .effects =
             [](loader::Datapath& dp, const Trail&) {
               EXPECT_TRUE(dp.ct4().Lookup(PolicyKey(kA, 40000, kRemotePod, 80)).ok())
                   << "the allowed flow is tracked";
             }},
        {.prog = Prog::kToPod,
         .in = ToA().IPv4(kRemotePod, kA).TCP(80, 40000, kTcpSyn | kTcpAck),
         .verdict = kTcOk,
         .unchanged = true},
        {.prog = Prog::kToPod,
         .in = ToA().IPv4(kRemotePod, kA).TCP(80, 40001, kTcpSyn),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_POLICY_DENIED}}},
      {"NodeStackTrafficToAPodIsJudgedAtItsIngress",
       {{.prog = Prog::kToPod,
         .in = ToA().IPv4(kNode, kA).TCP(33000, 8080),
         .verdict = kTcOk,
         .unchanged = true,
         .setup =
             [](loader::Datapath& dp) {
               Enforce(dp, kEpA, kIdA, SLUICE_POLICY_EP_F_INGRESS);
               Allow(dp, kEpA, SLUICE_IDENTITY_HOST, kIngress, 0, 0, 0);
             }},
        {.prog = Prog::kToPod,
         .in = ToA().IPv4(kOutside, kA).TCP(33000, 8080),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_POLICY_DENIED},
        {.prog = Prog::kToPod,  // not for a pod of this interface: not this hook's business
         .in = ToA().IPv4(kOutside, kB).TCP(33000, 8080),
         .verdict = kTcOk,
         .unchanged = true}}},
      // A point that judges nothing (A's egress) looks a packet's own entry up first when its
      // ports suggest it opened the flow (higher to lower), else the reply's: either way both of
      // A's flows are tracked and their replies pass A's enforced ingress.
      {"AnOpenPointTracksFlowsWhicheverWayTheirPortsGo",
       {{.in = FromA().IPv4(kA, kRemotePod).TCP(40000, 80),
         .verdict = kTcOk,
         .unchanged = true,
         .setup =
             [](loader::Datapath& dp) { Enforce(dp, kEpA, kIdA, SLUICE_POLICY_EP_F_INGRESS); }},
        {.in = FromA().IPv4(kA, kRemotePod).TCP(80, 40001),
         .verdict = kTcOk,
         .unchanged = true,
         .effects =
             [](loader::Datapath& dp, const Trail&) {
               EXPECT_TRUE(dp.ct4().Lookup(PolicyKey(kA, 40000, kRemotePod, 80)).ok());
               EXPECT_TRUE(dp.ct4().Lookup(PolicyKey(kA, 80, kRemotePod, 40001)).ok());
             }},
        {.in = FromA().IPv4(kA, kRemotePod).TCP(40000, 80, kTcpAck),
         .verdict = kTcOk,
         .unchanged = true},
        {.prog = Prog::kToPod,
         .in = ToA().IPv4(kRemotePod, kA).TCP(80, 40000, kTcpSyn | kTcpAck),
         .verdict = kTcOk,
         .unchanged = true},
        {.prog = Prog::kToPod,
         .in = ToA().IPv4(kRemotePod, kA).TCP(40001, 80, kTcpAck),
         .verdict = kTcOk,
         .unchanged = true},
        {.prog = Prog::kToPod,
         .in = ToA().IPv4(kRemotePod, kA).TCP(80, 40005, kTcpSyn),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_POLICY_DENIED}}},
      // Pod A sends to pod B on this node: one program judges A's egress, then B's ingress, and
      // the second point takes what the first found in conntrack from the flow. B's ingress still
      // judges the flow A's point tracked, and still lets a reply of B's own flow pass.
      {"BothPointsOnOneNodeJudgeAFlowTheFirstTracked",
       {{.in = FromA().IPv4(kA, kB).TCP(40000, 8080),
         .verdict = kTcRedirect,
         .out = {ARedirectedToB().TCP(40000, 8080)},
         .setup =
             [](loader::Datapath& dp) {
               Enforce(dp, kEpA, kIdA, 0);
               Enforce(dp, kEpB, kIdB, SLUICE_POLICY_EP_F_INGRESS);
               Allow(dp, kEpB, kIdA, kIngress, IPPROTO_TCP, 8080, 24);
             },
         .effects =
             [](loader::Datapath& dp, const Trail&) {
               int tracked = 0;
               ASSERT_TRUE(dp.ct4()
                               .ForEach([&](const sluice_ct4_key& k, const sluice_ct4_entry&) {
                                 tracked += k.dir == SLUICE_CT_DIR_POLICY;
                               })
                               .ok());
               EXPECT_EQ(tracked, 1) << "one entry for the flow, written at A's egress";
             }},
        {.in = FromA().IPv4(kA, kB).TCP(40000, 8080, kTcpAck),
         .verdict = kTcRedirect,
         .out = {ARedirectedToB().TCP(40000, 8080, kTcpAck)}},
        // Tracked at A's egress (open), then denied at B's ingress: no allow for 8081.
        {.in = FromA().IPv4(kA, kB).TCP(40001, 8081),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_POLICY_DENIED},
        {.in = FromA().IPv4(kA, kB).TCP(40001, 8081, kTcpAck),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_POLICY_DENIED,
         .effects = [](loader::Datapath& dp,
                       const Trail&) { EXPECT_EQ(PolicyDrops(dp, kEpB, kIngress), 2u); }},
        // B opened a flow to A (tracked as B sent it): A's answer passes B's enforced ingress,
        // which admits nothing on B's port 9000.
        {.in = FromA().IPv4(kA, kB).TCP(40002, 9000, kTcpSyn | kTcpAck),
         .verdict = kTcRedirect,
         .out = {ARedirectedToB().TCP(40002, 9000, kTcpSyn | kTcpAck)},
         .setup =
             [](loader::Datapath& dp) {
               ASSERT_TRUE(
                   dp.ct4().Update(PolicyKey(kB, 9000, kA, 40002), sluice_ct4_entry{}).ok());
             },
         .effects =
             [](loader::Datapath& dp, const Trail&) {
               auto v = dp.ct4().Lookup(PolicyKey(kB, 9000, kA, 40002));
               ASSERT_TRUE(v.ok());
               EXPECT_TRUE(v->flags & SLUICE_CT_F_ESTABLISHED) << "the reply marked it";
               EXPECT_EQ(PolicyDrops(dp, kEpB, kIngress), 2u);
             }},
        // Tracked both ways (each side's packets once taken for an opening): A's egress, which
        // judges nothing, finds A's own entry first; B's ingress still finds the reply entry
        // before it judges, so the packet passes as the reply it also is.
        {.in = FromA().IPv4(kA, kB).TCP(40003, 9000, kTcpAck),
         .verdict = kTcRedirect,
         .out = {ARedirectedToB().TCP(40003, 9000, kTcpAck)},
         .setup =
             [](loader::Datapath& dp) {
               ASSERT_TRUE(
                   dp.ct4().Update(PolicyKey(kA, 40003, kB, 9000), sluice_ct4_entry{}).ok());
               ASSERT_TRUE(
                   dp.ct4().Update(PolicyKey(kB, 9000, kA, 40003), sluice_ct4_entry{}).ok());
             },
         .effects = [](loader::Datapath& dp,
                       const Trail&) { EXPECT_EQ(PolicyDrops(dp, kEpB, kIngress), 2u); }}}},
      // Egress is judged on the backend the service picked, not on the ClusterIP.
      {"EgressIsJudgedAfterServiceTranslation",
       {{.in = FromA().IPv4(kA, "10.96.0.10").TCP(40000, 80),
         .verdict = kTcOk,
         .out = {FromA().IPv4(kA, kRemotePod).TCP(40000, 8080)},
         .setup =
             [](loader::Datapath& dp) {
               ASSERT_TRUE(ProgramService(dp, "10.96.0.10", 80, IPPROTO_TCP, 1,
                                          {{7, kRemotePod, 8080, IPPROTO_TCP}})
                               .ok());
               Enforce(dp, kEpA, kIdA, SLUICE_POLICY_EP_F_EGRESS);
               Allow(dp, kEpA, kIdRemote, kEgress, IPPROTO_TCP, 8080, 24);
             }},
        {.in = FromA().IPv4(kA, "10.96.0.10").TCP(40001, 80),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_POLICY_DENIED,
         .setup =
             [](loader::Datapath& dp) {
               // Only the frontend's port allowed: the backend's 8080 is not.
               ASSERT_TRUE(dp.policy4()
                               .Delete(maps::MakePolicy4Key(kEpA, kIdRemote, kEgress, IPPROTO_TCP,
                                                            8080, 24))
                               .ok());
               Allow(dp, kEpA, kIdRemote, kEgress, IPPROTO_TCP, 80, 24);
             }}}},
      // A NodePort to a local backend: the backend's ingress judges the client's own address
      // after DNAT; the backend's reply (reverse NAT back to the NodePort) passes its enforced
      // egress as the reply of that flow.
      {"NodePortToALocalBackendIsJudgedOnTheClientAddressAndItsReplyPasses",
       {{.prog = Prog::kFromNet,
         .in = Packet::Eth(kHostBMac, kHostAMac).IPv4(kOutside, kNode).TCP(50000, 30080),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_POLICY_DENIED,
         .setup =
             [](loader::Datapath& dp) {
               ASSERT_TRUE(ProgramService(dp, kNode, 30080, IPPROTO_TCP, 3,
                                          {{9, kA, 8080, IPPROTO_TCP}}, SLUICE_SVC_F_NODEPORT)
                               .ok());
               Enforce(dp, kEpA, kIdA, SLUICE_POLICY_EP_F_INGRESS | SLUICE_POLICY_EP_F_EGRESS);
               Allow(dp, kEpA, SLUICE_IDENTITY_HOST, kIngress, 0, 0, 0);
             }},
        {.prog = Prog::kFromNet,
         .in = Packet::Eth(kHostBMac, kHostAMac).IPv4(kOutside, kNode).TCP(50001, 30080),
         .verdict = kTcRedirect,
         .out = {Packet::Eth(kHostAMac, kPodAMac).IPv4(kOutside, kA, 63).TCP(50001, 8080)},
         .setup =
             [](loader::Datapath& dp) {
               Allow(dp, kEpA, SLUICE_IDENTITY_WORLD, kIngress, IPPROTO_TCP, 8080, 24);
             }},
        {.in = FromA().IPv4(kA, kOutside).TCP(8080, 50001, kTcpSyn | kTcpAck),
         .verdict = kTcOk,
         .out = {FromA().IPv4(kNode, kOutside).TCP(30080, 50001, kTcpSyn | kTcpAck)}}}},
  };
}

class PolicyTable : public PolicyTest, public ::testing::WithParamInterface<PacketCase> {};

TEST_P(PolicyTable, Packet) { RunCase(GetParam()); }

INSTANTIATE_TEST_SUITE_P(SluicePolicy, PolicyTable, ::testing::ValuesIn(PolicyCases()), CaseName);

}  // namespace
}  // namespace sluice::testing
