// Packet-in/packet-out tests of service load balancing in sluice_from_pod: ClusterIP DNAT onto a
// backend, conntrack keeping flows on their backend, and reverse NAT of the backends' replies.
// Services are programmed through the production maps/ API in the agent's hitless order.
#include <arpa/inet.h>
#include <sched.h>
#include <time.h>

#include <cstdlib>
#include <map>
#include <vector>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "loader/backend_ports.h"
#include "support/fixture.h"

namespace sluice::testing {
namespace {

const Mac kClientMac = ParseMac("02:00:00:00:0a:01");
const Mac kClientHostMac = ParseMac("02:aa:00:00:0a:02");
constexpr const char* kClient = "10.244.0.10";
constexpr const char* kClusterIp = "10.96.0.10";
constexpr const char* kRejectIp = "10.96.0.20";
constexpr const char* kNoLocalIp = "10.96.0.30";  // backends exist, none usable from here
constexpr const char* kGateway = "10.244.0.1";
constexpr const char* kNodeIp = "192.168.50.10";
constexpr const char* kExternal = "198.51.100.7";
// test_run only receives on lo (ifindex 1), and a pod may only send from its own interface, so
// every pod that sends in these tests lives on ifindex 1.
constexpr int kIfindex = 1;

using BackendSpec = LbBackendSpec;
// 1-3: same-node pods serving TCP 8080; 4-5: pods on another node; 11-12: UDP 5353.
const std::vector<BackendSpec> kTcpBackends = {
    {1, "10.244.0.21", 8080, IPPROTO_TCP},
    {2, "10.244.0.22", 8080, IPPROTO_TCP},
    {3, "10.244.0.23", 8080, IPPROTO_TCP}};
const std::vector<BackendSpec> kOtherTcpBackends = {{4, "10.244.1.31", 8080, IPPROTO_TCP},
                                                    {5, "10.244.1.32", 8080, IPPROTO_TCP}};
const std::vector<BackendSpec> kUdpBackends = {{11, "10.244.0.21", 5353, IPPROTO_UDP},
                                               {12, "10.244.0.22", 5353, IPPROTO_UDP}};

Mac PodMac(int n) { return ParseMac(absl::StrFormat("02:00:00:00:%02x:01", n)); }
Mac HostMac(int n) { return ParseMac(absl::StrFormat("02:aa:00:00:%02x:02", n)); }

// A service through the production maps/ API; a ClusterIP in use also gets the agent's wildcard
// entry, which rejects the ports it does not define.
void SetService(loader::Datapath& dp, const std::string& addr, uint16_t port, uint8_t proto,
                uint32_t rev_nat_id, const std::vector<BackendSpec>& backends, uint16_t flags = 0,
                uint32_t affinity_timeout = 0) {
  ASSERT_TRUE(
      ProgramService(dp, addr, port, proto, rev_nat_id, backends, flags, affinity_timeout).ok());
  if (addr.rfind("10.96.", 0) == 0) {
    sluice_lb4_service wildcard{};
    wildcard.flags = SLUICE_SVC_F_REJECT;
    ASSERT_TRUE(dp.lb4_services().Update(LbKey(addr, 0, 0, 0), wildcard).ok());
  }
}

std::optional<sluice_ct4_entry> Ct(loader::Datapath& dp, const std::string& saddr,
                                   const std::string& daddr, uint16_t sport, uint16_t dport,
                                   uint8_t proto, uint8_t dir) {
  auto e = dp.ct4_of(proto).Lookup(CtKey(saddr, daddr, sport, dport, proto, dir));
  if (!e.ok()) return std::nullopt;
  return *e;
}

// The flow entry (SLUICE_CT_DIR_FLOW) of a client's address and port.
std::optional<sluice_ct4_entry> Flow(loader::Datapath& dp, const std::string& client,
                                     uint16_t cport, uint8_t proto) {
  return Ct(dp, client, "0.0.0.0", cport, 0, proto, SLUICE_CT_DIR_FLOW);
}

// The balanced flows' entries that name kClient's port cport: a flow entry, a forward entry from
// it, a reply entry to it.
size_t LbEntriesOfClientPort(loader::Datapath& dp, uint16_t cport, uint8_t proto) {
  size_t n = 0;
  const uint32_t client = Ip4(kClient);
  EXPECT_TRUE(dp.ct4_of(proto)
                  .ForEach([&](const sluice_ct4_key& k, const sluice_ct4_entry&) {
                    if (k.proto != proto) return;
                    const bool from = k.saddr == client && k.sport == htons(cport);
                    const bool to = k.daddr == client && k.dport == htons(cport);
                    if (((k.dir == SLUICE_CT_DIR_FLOW || k.dir == SLUICE_CT_DIR_FORWARD) && from) ||
                        (k.dir == SLUICE_CT_DIR_REPLY && to))
                      ++n;
                  })
                  .ok());
  return n;
}

// The TCP backend a decoded packet was sent to, 0 if none.
uint32_t TcpBackendOf(const Decoded& d) {
  for (const auto& b : kTcpBackends) {
    if (d.ip_dst == Ip4(b.addr) && d.dport == b.port) return b.id;
  }
  for (const auto& b : kOtherTcpBackends) {
    if (d.ip_dst == Ip4(b.addr) && d.dport == b.port) return b.id;
  }
  return 0;
}

// The client pod's packet to the ClusterIP's TCP port 80.
Packet ToService(uint16_t sport, uint8_t flags = kTcpSyn) {
  return Packet::Eth(kClientMac, kClientHostMac)
      .IPv4(kClient, kClusterIp)
      .TCP(sport, 80, flags)
      .Payload("GET /");
}

class LbTest : public DatapathTest {
 protected:
  void SetUp() override {
    DatapathTest::SetUp();
    if (HasFatalFailure()) return;
    AddEndpoint(kClient, kClientMac, kClientHostMac, 10);
    for (int n : {21, 22, 23}) {
      AddEndpoint(absl::StrFormat("10.244.0.%d", n), PodMac(n), HostMac(n), n);
    }
    SetService(kClusterIp, 80, IPPROTO_TCP, 1, kTcpBackends);
    SetService(kClusterIp, 53, IPPROTO_UDP, 2, kUdpBackends);
    SetService(kRejectIp, 80, IPPROTO_TCP, 3, {}, SLUICE_SVC_F_REJECT);
    SetService(kRejectIp, 53, IPPROTO_UDP, 4, {}, SLUICE_SVC_F_REJECT);
    SetService(kNoLocalIp, 80, IPPROTO_TCP, 5, {});
    sluice_node_config cfg{};
    cfg.node_ip4 = Ip4(kNodeIp);
    cfg.pod_cidr4 = Ip4("10.244.0.0");
    cfg.pod_cidr4_len = 24;
    cfg.gateway_ip4 = Ip4(kGateway);
    cfg.flags = SLUICE_NODE_F_MASQUERADE;
    cfg.nat_port_min = 61000;
    cfg.nat_port_max = 65535;
    cfg.service_cidr4 = Ip4("10.96.0.0");
    cfg.service_cidr4_len = 16;
    ASSERT_TRUE(dp_->node_config().Update(0, cfg).ok());
  }

  void AddEndpoint(const std::string& ip, const Mac& mac, const Mac& host_mac, uint32_t id) {
    ASSERT_TRUE(testing::AddEndpoint(*dp_, Ip4(ip), kIfindex, mac, host_mac, id).ok());
  }

  static sluice_lb4_key SvcKey(const std::string& addr, uint16_t port, uint8_t proto,
                               uint16_t slot) {
    return LbKey(addr, port, proto, slot);
  }

  void SetService(const std::string& addr, uint16_t port, uint8_t proto, uint32_t rev_nat_id,
                  const std::vector<BackendSpec>& backends, uint16_t flags = 0,
                  uint32_t affinity_timeout = 0) {
    testing::SetService(*dp_, addr, port, proto, rev_nat_id, backends, flags, affinity_timeout);
  }

  static uint64_t NowNs() {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return uint64_t(ts.tv_sec) * 1000000000ull + ts.tv_nsec;
  }

  RunResult FromPod(const Bytes& in) { return Run(dp_->from_pod_fd(), in, kIfindex); }

  Bytes TcpToService(uint16_t sport, uint8_t flags = kTcpSyn) {
    return ToService(sport, flags).Build();
  }

  std::optional<sluice_ct4_entry> Ct(const std::string& saddr, const std::string& daddr,
                                     uint16_t sport, uint16_t dport, uint8_t proto,
                                     uint8_t dir) {
    return testing::Ct(*dp_, saddr, daddr, sport, dport, proto, dir);
  }
  std::optional<sluice_ct4_entry> Flow(uint16_t cport, uint8_t proto = IPPROTO_TCP) {
    return testing::Flow(*dp_, kClient, cport, proto);
  }
};

// ---- sluice_from_pod: ClusterIP translation, its replies and its rejections -------------------

// The same-node TCP backends' pod on its veth: `Eth(host, pod)` with the client's packet DNATed
// onto it, one TTL less. The three are the alternatives a random backend choice can produce.
std::vector<Frame> AtEachTcpBackend(const std::string& src, uint16_t sport, uint8_t flags,
                                    const std::string& payload) {
  std::vector<Frame> out;
  for (int n : {21, 22, 23}) {
    out.push_back(Packet::Eth(HostMac(n), PodMac(n))
                      .IPv4(src, absl::StrFormat("10.244.0.%d", n), 63)
                      .TCP(sport, 8080, flags)
                      .Payload(payload));
  }
  return out;
}

// The pod number (last octet) of the address a decoded packet went to.
int PodOf(const Decoded& d) { return ntohl(d.ip_dst) & 0xff; }

// What the client pod receives from the node: `Eth(host, client)`.
Packet ToClient(const std::string& src, uint8_t ttl = 63) {
  return Packet::Eth(kClientHostMac, kClientMac).IPv4(src, kClient, ttl);
}

// A RST|ACK written by the datapath (bpf/lib/reject.h): a fresh IPv4 header (id 0, TTL 64),
// seq 0, no window, acknowledging everything the refused segment occupied.
Packet RstAck(Packet eth, const std::string& src, const std::string& dst, uint16_t sport,
              uint16_t dport, uint32_t ack) {
  return eth.IPv4(src, dst, 64).Id(0).TCP(sport, dport, 0x14).Seq(0).AckSeq(ack).Window(0);
}

// An ICMP port unreachable written by the datapath: quotes the IPv4 header and 8 bytes of `in`.
Packet PortUnreachable(const std::string& src, const Bytes& in) {
  return ToClient(src, 64).Id(0).Icmp(3, 3).Payload(Bytes(in.begin() + 14, in.begin() + 42));
}

void ExpectNoConntrack(loader::Datapath& dp, const Trail&) {
  for (auto* ct : {&dp.ct4(), &dp.ct4_any()}) {
    auto n = ct->Count();
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(*n, 0u);
  }
}

// kClient's flow from sport to the ClusterIP's port dport is one flow entry, naming the frontend
// and the backend, and no other entry.
void ExpectFlowEntry(loader::Datapath& dp, uint16_t sport, uint16_t dport, uint8_t proto,
                     uint32_t backend_id, uint32_t rev_nat_id) {
  auto flow = Flow(dp, kClient, sport, proto);
  ASSERT_TRUE(flow);
  EXPECT_EQ(flow->backend_id, backend_id);
  EXPECT_EQ(flow->rev_nat_id, rev_nat_id);
  EXPECT_EQ(flow->frontend_addr, Ip4(kClusterIp));
  EXPECT_EQ(flow->frontend_port, htons(dport));
  EXPECT_EQ(LbEntriesOfClientPort(dp, sport, proto), 1u) << "one entry for the flow";
}

// The UDP exchange with the ClusterIP's port 53, with a checksum or with none (zero).
std::vector<Step> UdpExchange(uint16_t sport, bool zero_csum) {
  std::vector<Frame> at_backends;
  for (int n : {21, 22}) {
    at_backends.push_back(Packet::Eth(HostMac(n), PodMac(n))
                              .IPv4(kClient, absl::StrFormat("10.244.0.%d", n), 63)
                              .UDP(sport, 5353, zero_csum)
                              .Payload("query"));
  }
  return {
      {.in = Packet::Eth(kClientMac, kClientHostMac)
                 .IPv4(kClient, kClusterIp)
                 .UDP(sport, 53, zero_csum)
                 .Payload("query"),
       .verdict = kTcRedirect,
       .out = at_backends,
       .effects =
           [sport, zero_csum](loader::Datapath& dp, const Trail& t) {
             if (zero_csum) {
               EXPECT_EQ(t.last().l4_csum, 0) << "a zero UDP checksum stays 'none'";
             }
             ExpectFlowEntry(dp, sport, 53, IPPROTO_UDP, PodOf(t.last()) == 21 ? 11 : 12, 2);
           }},
      {.in =
           [sport, zero_csum](const Trail& t) {
             return Packet::Eth(kClientMac, kClientHostMac)
                 .IPv4(FormatIp4(t.last().ip_dst), kClient)
                 .UDP(5353, sport, zero_csum)
                 .Payload("answer");
           },
       .verdict = kTcRedirect,
       .out = {ToClient(kClusterIp).UDP(53, sport, zero_csum).Payload("answer")}},
  };
}

// A backend's segment (a SYN-ACK unless told) to the client of the flow the trail's first step
// balanced.
Frame ReplyOf(uint16_t client_port, uint8_t flags = kTcpSyn | kTcpAck) {
  return [client_port, flags](const Trail& t) {
    int n = PodOf(t.out[0]);
    return Packet::Eth(PodMac(n), HostMac(n))
        .IPv4(FormatIp4(t.out[0].ip_dst), kClient)
        .TCP(8080, client_port, flags);
  };
}

// The client's flow from client_port to the ClusterIP's port 80 (one flow entry) rewritten as the
// programs before flow entries wrote it (a hitless upgrade's live flows): a forward entry naming
// the backend, and a reply entry naming the frontend (SLUICE_CT_F_FRONTEND), or, older still
// (!frontend_flag), the backend again and no flag.
void AsOlderPrograms(loader::Datapath& dp, uint16_t client_port, bool frontend_flag) {
  const sluice_ct4_key flow_key =
      CtKey(kClient, "0.0.0.0", client_port, 0, IPPROTO_TCP, SLUICE_CT_DIR_FLOW);
  auto flow = dp.ct4().Lookup(flow_key);
  ASSERT_TRUE(flow.ok()) << flow.status();
  ASSERT_EQ(flow->frontend_addr, Ip4(kClusterIp));
  ASSERT_EQ(flow->frontend_port, htons(80));
  sluice_ct4_entry fwd = *flow;
  fwd.created_ns = flow->last_seen_ns;
  sluice_ct4_entry rev = fwd;
  if (frontend_flag) {
    rev.flags |= SLUICE_CT_F_FRONTEND;
    rev.backend_addr = Ip4(kClusterIp);
    rev.backend_port = htons(80);
  }
  ASSERT_TRUE(dp.ct4()
                  .Update(CtKey(FormatIp4(flow->backend_addr), kClient, ntohs(flow->backend_port),
                                client_port, IPPROTO_TCP, SLUICE_CT_DIR_REPLY),
                          rev)
                  .ok());
  ASSERT_TRUE(
      dp.ct4()
          .Update(CtKey(kClient, kClusterIp, client_port, 80, IPPROTO_TCP, SLUICE_CT_DIR_FORWARD),
                  fwd)
          .ok());
  ASSERT_TRUE(dp.ct4().Delete(flow_key).ok());
}

// Vouches (sluice_lb4_nbport) for `port` alone: bit port & 31 of word port >> 5.
void VouchOnly(loader::Datapath& dp, uint16_t port) {
  ASSERT_TRUE(dp.lb4_non_backend_ports().Update(port >> 5, 1u << (port & 31)).ok());
}

std::vector<PacketCase> ClusterIpCases() {
  const Bytes udp_to_rejecting = Packet::Eth(kClientMac, kClientHostMac)
                                     .IPv4(kClient, kRejectIp)
                                     .UDP(5300, 53)
                                     .Payload("query-bytes")
                                     .Build();
  const Bytes udp_to_undefined_port = Packet::Eth(kClientMac, kClientHostMac)
                                          .IPv4(kClient, kClusterIp)
                                          .UDP(40010, 80)  // TCP-only port
                                          .Build();
  const char* lb_ip = "203.0.113.50";
  const Packet to_lb_ip = Packet::Eth(kClientMac, kClientHostMac).IPv4(kClient, lb_ip);
  return {
      {"TcpSynToClusterIpIsDnatedToABackendAndTrackedBothWays",
       {{.in = ToService(40000),
         .verdict = kTcRedirect,
         .out = AtEachTcpBackend(kClient, 40000, kTcpSyn, "GET /"),
         .effects =
             [](loader::Datapath& dp, const Trail& t) {
               uint32_t id = TcpBackendOf(t.last());
               ASSERT_THAT(id, ::testing::AnyOf(1u, 2u, 3u));
               ExpectFlowEntry(dp, 40000, 80, IPPROTO_TCP, id, 1);
               auto flow = Flow(dp, kClient, 40000, IPPROTO_TCP);
               ASSERT_TRUE(flow);
               EXPECT_EQ(flow->backend_addr, Ip4(kTcpBackends[id - 1].addr));
               EXPECT_EQ(flow->backend_port, htons(8080));
               EXPECT_EQ(flow->flags, 0) << "not established before a reply";
             }}}},
      {"ReplyFromBackendIsReverseTranslatedToTheClusterIp",
       {{.in = ToService(40003),
         .verdict = kTcRedirect,
         .out = AtEachTcpBackend(kClient, 40003, kTcpSyn, "GET /")},
        {.in =
             [](const Trail& t) {
               int n = PodOf(t.last());
               return Packet::Eth(PodMac(n), HostMac(n))
                   .IPv4(FormatIp4(t.last().ip_dst), kClient)
                   .TCP(8080, 40003, kTcpSyn | kTcpAck)
                   .Payload("200 OK");
             },
         .verdict = kTcRedirect,
         .out = {ToClient(kClusterIp).TCP(80, 40003, kTcpSyn | kTcpAck).Payload("200 OK")}}}},
      // sluice_lb4_nbport: a port vouched free of backends skips the reverse NAT lookup, so a
      // (wrong) vouch for the backend port leaves even a tracked flow's reply untranslated ...
      {"ReplyFromAPortVouchedFreeOfBackendsSkipsTheReverseNat",
       {{.in = ToService(40004),
         .verdict = kTcRedirect,
         .out = AtEachTcpBackend(kClient, 40004, kTcpSyn, "GET /")},
        {.in = ReplyOf(40004),
         .verdict = kTcRedirect,
         .out = {[](const Trail& t) {
           return ToClient(FormatIp4(t.out[0].ip_dst)).TCP(8080, 40004, kTcpSyn | kTcpAck);
         }},
         .setup = [](loader::Datapath& dp) { VouchOnly(dp, 8080); }},
        // A plain ACK takes the pod -> pod shortcut (no conntrack tuple): untranslated too.
        {.in = ReplyOf(40004, kTcpAck),
         .verdict = kTcRedirect,
         .out = {[](const Trail& t) {
           return ToClient(FormatIp4(t.out[0].ip_dst)).TCP(8080, 40004, kTcpAck);
         }}}}},
      // ... while vouching for every other port leaves it translated (bit order and byte order).
      {"ReplyFromTheOnePortNotVouchedIsReverseTranslated",
       {{.in = ToService(40005),
         .verdict = kTcRedirect,
         .out = AtEachTcpBackend(kClient, 40005, kTcpSyn, "GET /")},
        {.in = ReplyOf(40005),
         .verdict = kTcRedirect,
         .out = {ToClient(kClusterIp).TCP(80, 40005, kTcpSyn | kTcpAck)},
         .setup =
             [](loader::Datapath& dp) {
               loader::NonBackendPorts ports(dp.lb4_non_backend_ports());
               auto n = ports.Vouch({htons(8080)}, {});
               ASSERT_TRUE(n.ok()) << n.status();
               EXPECT_EQ(*n, 65535u);
             }},
        // A plain ACK from it is no pod -> pod shortcut either.
        {.in = ReplyOf(40005, kTcpAck),
         .verdict = kTcRedirect,
         .out = {ToClient(kClusterIp).TCP(80, 40005, kTcpAck)}}}},
      // A flow the programs before flow entries recorded, in a forward entry and a reply entry
      // naming its frontend (SLUICE_CT_F_FRONTEND): the reply is translated without
      // sluice_lb4_rnat, here emptied, and the client's next segment follows the forward entry
      // ...
      {"ReplyFindsItsFrontendInItsReplyEntry",
       {{.in = ToService(40006),
         .verdict = kTcRedirect,
         .out = AtEachTcpBackend(kClient, 40006, kTcpSyn, "GET /")},
        {.in = ReplyOf(40006),
         .verdict = kTcRedirect,
         .out = {ToClient(kClusterIp).TCP(80, 40006, kTcpSyn | kTcpAck)},
         .setup =
             [](loader::Datapath& dp) {
               ASSERT_TRUE(dp.lb4_revnat().Delete(1).ok());
               AsOlderPrograms(dp, 40006, /*frontend_flag=*/true);
             }},
        {.in = ToService(40006, kTcpAck),
         .verdict = kTcRedirect,
         .out = {[](const Trail& t) {
           int n = PodOf(t.out[0]);
           return Packet::Eth(HostMac(n), PodMac(n))
               .IPv4(kClient, FormatIp4(t.out[0].ip_dst), 63)
               .TCP(40006, 8080, kTcpAck)
               .Payload("GET /");
         }},
         .effects =
             [](loader::Datapath& dp, const Trail&) {
               EXPECT_FALSE(Flow(dp, kClient, 40006, IPPROTO_TCP)) << "no flow entry made";
               auto fwd =
                   Ct(dp, kClient, kClusterIp, 40006, 80, IPPROTO_TCP, SLUICE_CT_DIR_FORWARD);
               ASSERT_TRUE(fwd);
               EXPECT_TRUE(fwd->flags & SLUICE_CT_F_ESTABLISHED) << "the reply marked it";
             }}}},
      // ... while a reply entry as the programs before that flag wrote them (the backend in its
      // value) goes through sluice_lb4_rnat, here moved to :81.
      {"ReplyOfAnOlderEntryFindsItsFrontendThroughRevNat",
       {{.in = ToService(40007),
         .verdict = kTcRedirect,
         .out = AtEachTcpBackend(kClient, 40007, kTcpSyn, "GET /")},
        {.in = ReplyOf(40007),
         .verdict = kTcRedirect,
         .out = {ToClient(kClusterIp).TCP(81, 40007, kTcpSyn | kTcpAck)},
         .setup =
             [](loader::Datapath& dp) {
               sluice_lb4_revnat moved{Ip4(kClusterIp), htons(81), 0};
               ASSERT_TRUE(dp.lb4_revnat().Update(1, moved).ok());
               AsOlderPrograms(dp, 40007, /*frontend_flag=*/false);
             }}}},
      {"PacketsFromABackendOutsideATrackedFlowAreNotTranslated",
       {{.in = Packet::Eth(PodMac(21), HostMac(21))
                   .IPv4("10.244.0.21", kClient)
                   .TCP(8080, 40999, kTcpSyn | kTcpAck),
         .verdict = kTcRedirect,
         .out = {ToClient("10.244.0.21").TCP(8080, 40999, kTcpSyn | kTcpAck)}}}},
      {"UdpWithChecksumToClusterIpIsDnatedAndItsReplyReverseTranslated",
       UdpExchange(5000, /*zero_csum=*/false)},
      {"UdpWithoutChecksumToClusterIpIsDnatedAndItsReplyReverseTranslated",
       UdpExchange(5001, /*zero_csum=*/true)},
      // kube-proxy: a port a ClusterIP does not define is rejected like a service without
      // endpoints.
      {"TcpToAPortNotDefinedOnTheClusterIpIsAnsweredWithRst",
       {{.in = Packet::Eth(kClientMac, kClientHostMac).IPv4(kClient, kClusterIp).TCP(40010, 443),
         .verdict = kTcRedirect,
         .out = {RstAck(Packet::Eth(kClientHostMac, kClientMac), kClusterIp, kClient, 443, 40010,
                        1000 + 1)},
         .drop = SLUICE_DROP_SERVICE_REJECTED,
         .effects = ExpectNoConntrack}}},
      {"UdpToAPortNotDefinedOnTheClusterIpIsAnsweredWithPortUnreachable",
       {{.in = udp_to_undefined_port,
         .verdict = kTcRedirect,
         .out = {PortUnreachable(kClusterIp, udp_to_undefined_port)},
         .drop = SLUICE_DROP_SERVICE_REJECTED,
         .effects = ExpectNoConntrack}}},
      {"ServiceWithoutEndpointsRejectsTcpWithRstAckAndNeverAnswersARst",
       {{.in = Packet::Eth(kClientMac, kClientHostMac)
                   .IPv4(kClient, kRejectIp)
                   .TCP(40020, 80)
                   .Payload("GET /"),
         .verdict = kTcRedirect,
         // Acknowledges the SYN and its payload.
         .out = {RstAck(Packet::Eth(kClientHostMac, kClientMac), kRejectIp, kClient, 80, 40020,
                        1000 + 5 + 1)},
         .drop = SLUICE_DROP_SERVICE_REJECTED,
         .effects =
             [](loader::Datapath&, const Trail& t) {
               EXPECT_EQ(t.last().tcp_flags, 0x14) << "RST|ACK";
               EXPECT_EQ(t.raw.back().size(), 14u + 20 + 20);
               EXPECT_STREQ(sluice_drop_reason_name(SLUICE_DROP_SERVICE_REJECTED),
                            "service_rejected");
             }},
        // A RST is never answered.
        {.in =
             Packet::Eth(kClientMac, kClientHostMac).IPv4(kClient, kRejectIp).TCP(40021, 80, 0x04),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_SERVICE_REJECTED}}},
      // The ICMP body quotes the original IP header and the UDP header (RFC 792).
      {"ServiceWithoutEndpointsRejectsUdpWithPortUnreachable",
       {{.in = udp_to_rejecting,
         .verdict = kTcRedirect,
         .out = {PortUnreachable(kRejectIp, udp_to_rejecting)},
         .drop = SLUICE_DROP_SERVICE_REJECTED,
         .effects =
             [](loader::Datapath&, const Trail& t) {
               EXPECT_EQ(t.raw.back().size(), 14u + 20 + 8 + 20 + 8);
             }}}},
      {"ServiceWithBackendsNoneUsableHereIsDropped",
       {{.in = Packet::Eth(kClientMac, kClientHostMac).IPv4(kClient, kNoLocalIp).TCP(40020, 80),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_SERVICE_NO_BACKEND,
         .effects =
             [](loader::Datapath&, const Trail&) {
               EXPECT_STREQ(sluice_drop_reason_name(SLUICE_DROP_SERVICE_NO_BACKEND),
                            "service_no_backend");
             }}}},
      {"UnallocatedServiceAddressIsDropped",
       {{.in = Packet::Eth(kClientMac, kClientHostMac).IPv4(kClient, "10.96.7.7").TCP(40030, 80),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_SERVICE_UNKNOWN_IP}}},
      {"AddressOutsideTheServiceRangeIsLeftToTheStack",
       {{.in = Packet::Eth(kClientMac, kClientHostMac).IPv4(kClient, "10.97.7.7").TCP(40030, 80),
         .verdict = kTcOk,
         .unchanged = true}}},
      // Source ranges are keyed by {rev_nat_id, client prefix}; the LB IP's frontend is id 6.
      {"LoadBalancerSourceRangesAdmitOnlyListedClients",
       {{.in = Packet(to_lb_ip).TCP(45000, 80),
         .verdict = kTcShot,  // no range admits the client
         .drop = SLUICE_DROP_SOURCE_RANGE,
         .setup =
             [lb_ip](loader::Datapath& dp) {
               SetService(dp, lb_ip, 80, IPPROTO_TCP, 6, kTcpBackends,
                          SLUICE_SVC_F_LOADBALANCER | SLUICE_SVC_F_SOURCE_RANGES);
             }},
        {.in = Packet(to_lb_ip).TCP(45000, 80),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_SOURCE_RANGE,
         .setup =
             [](loader::Datapath& dp) {
               sluice_lb4_srcrange_key other{32 + 12, htonl(6), Ip4("172.16.0.0")};
               ASSERT_TRUE(dp.lb4_source_ranges().Update(other, 1).ok());
             }},
        {.in = Packet(to_lb_ip).TCP(45000, 80),
         .verdict = kTcRedirect,
         .out = AtEachTcpBackend(kClient, 45000, kTcpSyn, ""),
         .setup =
             [](loader::Datapath& dp) {
               sluice_lb4_srcrange_key mine{32 + 24, htonl(6), Ip4("10.244.0.0")};
               ASSERT_TRUE(dp.lb4_source_ranges().Update(mine, 1).ok());
             },
         .effects = [](loader::Datapath&,
                       const Trail& t) { EXPECT_NE(TcpBackendOf(t.last()), 0u); }},
        // A range of another frontend (rev_nat_id 1) admits nobody here.
        {.in = Packet(to_lb_ip).TCP(45001, 80),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_SOURCE_RANGE,
         .setup =
             [](loader::Datapath& dp) {
               sluice_lb4_srcrange_key mine{32 + 24, htonl(6), Ip4("10.244.0.0")};
               ASSERT_TRUE(dp.lb4_source_ranges().Delete(mine).ok());
               sluice_lb4_srcrange_key wrong_svc{32 + 24, htonl(1), Ip4("10.244.0.0")};
               ASSERT_TRUE(dp.lb4_source_ranges().Update(wrong_svc, 1).ok());
             }}}},
  };
}

class ClusterIpTable : public LbTest, public ::testing::WithParamInterface<PacketCase> {};

TEST_P(ClusterIpTable, Packet) { RunCase(GetParam()); }

INSTANTIATE_TEST_SUITE_P(SluiceFromPod, ClusterIpTable, ::testing::ValuesIn(ClusterIpCases()),
                         CaseName);

// A table run on the programs' build without bpf_cast_to_kern_ctx (lib/ctx/skb.h), which the
// loader takes on a kernel that lacks the kfunc: its L4 checksums go through the helper.
template <typename Table>
class WithoutKernCtx : public Table {
 protected:
  void SetUp() override {
    loader::ForceNoKernCtxForTesting(true);
    Table::SetUp();
  }
  void TearDown() override {
    Table::TearDown();
    loader::ForceNoKernCtxForTesting(false);
  }
};

class ClusterIpCompatTable : public WithoutKernCtx<ClusterIpTable> {};

TEST_P(ClusterIpCompatTable, Packet) { RunCase(GetParam()); }

INSTANTIATE_TEST_SUITE_P(SluiceFromPodWithoutKernCtx, ClusterIpCompatTable,
                         ::testing::ValuesIn(ClusterIpCases()), CaseName);

// ---- Multi-step flows whose map changes, loops or statistics a table would obscure -------------

TEST_F(LbTest, LaterPacketsOfAFlowKeepTheirBackendAfterTheSlotsChange) {
  auto first = FromPod(TcpToService(40001));
  ASSERT_EQ(first.verdict, kTcRedirect);
  auto d1 = Decode(first.out);
  ASSERT_TRUE(d1);
  uint32_t id = TcpBackendOf(*d1);
  ASSERT_NE(id, 0u);

  // The service now has only backends on another node (slots rewritten, count changed); the old
  // backends still exist.
  SetService(kClusterIp, 80, IPPROTO_TCP, 1, kOtherTcpBackends);
  ASSERT_TRUE(dp_->lb4_services().Delete(SvcKey(kClusterIp, 80, IPPROTO_TCP, 3)).ok());

  for (int i = 0; i < 5; ++i) {
    auto r = FromPod(TcpToService(40001, kTcpAck));
    ASSERT_EQ(r.verdict, kTcRedirect) << Describe(r.out);
    auto d = Decode(r.out);
    ASSERT_TRUE(d);
    EXPECT_EQ(TcpBackendOf(*d), id) << Describe(r.out);
    EXPECT_TRUE(d->ip_csum_ok);
    EXPECT_TRUE(d->l4_csum_ok);
  }

  // A new flow only sees the new slots: off-node backends, so it continues into the stack.
  auto r = FromPod(TcpToService(40002));
  ASSERT_EQ(r.verdict, kTcOk) << Describe(r.out);
  auto d = Decode(r.out);
  ASSERT_TRUE(d);
  EXPECT_THAT(TcpBackendOf(*d), ::testing::AnyOf(4u, 5u)) << Describe(r.out);
  EXPECT_TRUE(d->ip_csum_ok);
  EXPECT_TRUE(d->l4_csum_ok);
}

TEST_F(LbTest, EstablishedFlowKeepsItsBackendAfterTheBackendLeavesTheService) {
  auto first = FromPod(TcpToService(40040));
  ASSERT_EQ(first.verdict, kTcRedirect);
  auto d1 = Decode(first.out);
  ASSERT_TRUE(d1);
  uint32_t id = TcpBackendOf(*d1);
  ASSERT_NE(id, 0u);
  // The backend is terminating: gone from the slots and from the backend map.
  std::vector<BackendSpec> rest;
  for (const auto& b : kTcpBackends) {
    if (b.id != id) rest.push_back(b);
  }
  SetService(kClusterIp, 80, IPPROTO_TCP, 1, rest);
  ASSERT_TRUE(dp_->lb4_services().Delete(SvcKey(kClusterIp, 80, IPPROTO_TCP, 3)).ok());
  ASSERT_TRUE(dp_->lb4_backends().Delete(id).ok());
  auto r = FromPod(TcpToService(40040, kTcpAck));
  ASSERT_EQ(r.verdict, kTcRedirect);
  auto d = Decode(r.out);
  ASSERT_TRUE(d);
  EXPECT_EQ(TcpBackendOf(*d), id) << Describe(r.out);
  for (int i = 0; i < 30; ++i) {
    auto n = Decode(FromPod(TcpToService(41000 + i)).out);
    ASSERT_TRUE(n);
    EXPECT_NE(TcpBackendOf(*n), id) << "a new flow never picks the removed backend";
  }
}

// A TCP connection through a ClusterIP keeps its backend after the Service is deleted, as with
// kube-proxy's conntrack (sluice_from_pod follows it without the frontend lookup); a new
// connection to the address, and any UDP datagram (whose Service is looked up every time), is
// dropped as for an address no Service has.
TEST_F(LbTest, TcpConnectionToAClusterIpOutlivesItsServiceAndUdpFlowsDoNot) {
  auto first = FromPod(TcpToService(40060));
  ASSERT_EQ(first.verdict, kTcRedirect) << Describe(first.out);
  auto d1 = Decode(first.out);
  ASSERT_TRUE(d1);
  const uint32_t id = TcpBackendOf(*d1);
  ASSERT_NE(id, 0u);
  const Bytes udp = Packet::Eth(kClientMac, kClientHostMac)
                        .IPv4(kClient, kClusterIp)
                        .UDP(5060, 53)
                        .Payload("q")
                        .Build();
  ASSERT_EQ(FromPod(udp).verdict, kTcRedirect);

  // The Service goes: every entry of its frontends, the address's wildcard, its reverse NAT.
  for (uint16_t slot = 0; slot <= kTcpBackends.size(); ++slot)
    ASSERT_TRUE(dp_->lb4_services().Delete(SvcKey(kClusterIp, 80, IPPROTO_TCP, slot)).ok());
  for (uint16_t slot = 0; slot <= kUdpBackends.size(); ++slot)
    ASSERT_TRUE(dp_->lb4_services().Delete(SvcKey(kClusterIp, 53, IPPROTO_UDP, slot)).ok());
  ASSERT_TRUE(dp_->lb4_services().Delete(SvcKey(kClusterIp, 0, 0, 0)).ok());
  ASSERT_TRUE(dp_->lb4_revnat().Delete(1).ok());

  // The backend's reply still comes from the ClusterIP: its reply entry names the frontend.
  const int pod = 20 + static_cast<int>(id);
  auto reply = FromPod(Packet::Eth(PodMac(pod), HostMac(pod))
                           .IPv4(kTcpBackends[id - 1].addr, kClient)
                           .TCP(8080, 40060, kTcpAck)
                           .Build());
  ASSERT_EQ(reply.verdict, kTcRedirect) << Describe(reply.out);
  auto back = Decode(reply.out);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->ip_src, Ip4(kClusterIp)) << Describe(reply.out);
  EXPECT_EQ(back->sport, 80);
  EXPECT_TRUE(back->l4_csum_ok);

  const uint64_t unknown = Drops(SLUICE_DROP_SERVICE_UNKNOWN_IP);
  constexpr uint8_t kPsh = 0x08, kFin = 0x01;
  for (uint8_t flags : {kTcpAck, uint8_t(kTcpAck | kPsh), uint8_t(kTcpAck | kFin)}) {
    auto r = FromPod(TcpToService(40060, flags));
    ASSERT_EQ(r.verdict, kTcRedirect) << Describe(r.out);
    auto d = Decode(r.out);
    ASSERT_TRUE(d);
    EXPECT_EQ(TcpBackendOf(*d), id) << Describe(r.out);
    EXPECT_TRUE(d->l4_csum_ok);
  }
  EXPECT_EQ(FromPod(TcpToService(40061)).verdict, kTcShot) << "a new connection";
  EXPECT_EQ(FromPod(udp).verdict, kTcShot) << "a datagram of the UDP flow";
  EXPECT_EQ(Drops(SLUICE_DROP_SERVICE_UNKNOWN_IP), unknown + 2);
  // The connection closed (FIN above): a new SYN on its tuple is a new connection, dropped too.
  EXPECT_EQ(FromPod(TcpToService(40060)).verdict, kTcShot);
}

// Conntrack's time is the coarse clock (CLOCK_MONOTONIC_COARSE), which the datapath reads once
// per tick and CPU and caches (sluice_ct_now): a new flow is stamped with the clock's value, and
// a later packet, once the clock has moved on, with the new one. A cache that stopped refreshing
// would keep the first stamp, and the GC would expire a busy flow.
TEST_F(LbTest, ConntrackStampsFlowsWithTheCoarseClockAsItMoves) {
  auto coarse = [] {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
  };
  timespec res{};
  ASSERT_EQ(clock_getres(CLOCK_MONOTONIC_COARSE, &res), 0);
  const uint64_t tick = static_cast<uint64_t>(res.tv_sec) * 1000000000ull + res.tv_nsec;
  ASSERT_GT(tick, 0u);

  uint64_t before = coarse();
  ASSERT_EQ(FromPod(TcpToService(40070)).verdict, kTcRedirect);
  uint64_t after = coarse();
  auto first = Flow(40070);
  ASSERT_TRUE(first);
  // The cache may lag the clock by a tick, never lead it.
  EXPECT_GE(first->last_seen_ns + 2 * tick, before);
  EXPECT_LE(first->last_seen_ns, after);

  // The clock moves on by three ticks (a wait on the clock itself, bounded).
  const uint64_t deadline = coarse() + 1000000000ull;
  while (coarse() < first->last_seen_ns + 3 * tick && coarse() < deadline) sched_yield();
  ASSERT_GE(coarse(), first->last_seen_ns + 3 * tick);

  before = coarse();
  ASSERT_EQ(FromPod(TcpToService(40070, kTcpAck)).verdict, kTcRedirect);
  after = coarse();
  auto later = Flow(40070);
  ASSERT_TRUE(later);
  EXPECT_EQ(later->frontend_addr, Ip4(kClusterIp)) << "the frontend, not a creation time";
  EXPECT_GT(later->last_seen_ns, first->last_seen_ns) << "the stamp moved with the clock";
  EXPECT_GE(later->last_seen_ns + 2 * tick, before);
  EXPECT_LE(later->last_seen_ns, after);
}

// A client reusing a port (a new connection on the tuple of one that ended) is balanced again;
// a retransmitted SYN of a live attempt is not.
TEST_F(LbTest, NewConnectionOnAReusedTupleIsBalancedAgain) {
  auto first = Decode(FromPod(TcpToService(40050)).out);
  ASSERT_TRUE(first);
  uint32_t id = TcpBackendOf(*first);
  ASSERT_NE(id, 0u);
  for (int i = 0; i < 10; ++i) {
    auto again = Decode(FromPod(TcpToService(40050)).out);  // SYN retransmitted
    ASSERT_TRUE(again);
    EXPECT_EQ(TcpBackendOf(*again), id);
  }

  // The backend is deleted (scaled away) while the entry lingers: a new SYN goes elsewhere.
  std::vector<BackendSpec> rest;
  for (const auto& b : kTcpBackends) {
    if (b.id != id) rest.push_back(b);
  }
  SetService(kClusterIp, 80, IPPROTO_TCP, 1, rest);
  ASSERT_TRUE(dp_->lb4_services().Delete(SvcKey(kClusterIp, 80, IPPROTO_TCP, 3)).ok());
  ASSERT_TRUE(dp_->lb4_backends().Delete(id).ok());
  auto moved = Decode(FromPod(TcpToService(40050)).out);
  ASSERT_TRUE(moved);
  uint32_t now_id = TcpBackendOf(*moved);
  EXPECT_NE(now_id, id);
  EXPECT_NE(now_id, 0u);
  auto fwd = Flow(40050);
  ASSERT_TRUE(fwd);
  EXPECT_EQ(fwd->backend_id, now_id);

  // The connection ends (the backend's FIN): the next SYN on the tuple is balanced again, and
  // with one backend left it lands there.
  const auto& be = kTcpBackends[now_id - 1];
  auto fin = Packet::Eth(PodMac(20 + now_id), HostMac(20 + now_id))
                 .IPv4(be.addr, kClient)
                 .TCP(8080, 40050, 0x11)  // FIN|ACK
                 .Build();
  auto rf = FromPod(fin);
  ASSERT_EQ(rf.verdict, kTcRedirect);
  fwd = Flow(40050);
  ASSERT_TRUE(fwd);
  EXPECT_TRUE(fwd->flags & SLUICE_CT_F_CLOSING);
  // Only the other remaining backend is left in the service now.
  std::vector<BackendSpec> last;
  for (const auto& b : rest) {
    if (b.id != now_id) last.push_back(b);
  }
  ASSERT_EQ(last.size(), 1u);
  SetService(kClusterIp, 80, IPPROTO_TCP, 1, last);
  ASSERT_TRUE(dp_->lb4_services().Delete(SvcKey(kClusterIp, 80, IPPROTO_TCP, 2)).ok());
  // Later packets of the closing connection still reach its backend...
  auto ack = Decode(FromPod(TcpToService(40050, kTcpAck)).out);
  ASSERT_TRUE(ack);
  EXPECT_EQ(TcpBackendOf(*ack), now_id);
  // ...but a new SYN is a new connection.
  auto fresh = Decode(FromPod(TcpToService(40050)).out);
  ASSERT_TRUE(fresh);
  EXPECT_EQ(TcpBackendOf(*fresh), last[0].id);
}

// A socket may share its local port with sockets connected elsewhere: the client's port is in one
// flow's entry already when its second flow, to another frontend, comes. That flow gets a forward
// and a reply entry; each flow's replies come from its own frontend, and each flow's packets go to
// its own backend.
TEST_F(LbTest, ASecondFlowFromAClientPortInUseIsTrackedByItsWholeTuple) {
  constexpr const char* kSecondIp = "10.96.0.40";
  SetService(kSecondIp, 80, IPPROTO_TCP, 6, {{6, "10.244.0.21", 9090, IPPROTO_TCP}});
  auto first = Decode(FromPod(TcpToService(40200)).out);
  ASSERT_TRUE(first);
  const uint32_t id = TcpBackendOf(*first);
  ASSERT_NE(id, 0u);
  const auto& be = kTcpBackends[id - 1];
  auto to_second = [&](uint8_t flags) {
    return Packet::Eth(kClientMac, kClientHostMac)
        .IPv4(kClient, kSecondIp)
        .TCP(40200, 80, flags)
        .Payload("GET /")
        .Build();
  };
  auto second = Decode(FromPod(to_second(kTcpSyn)).out);
  ASSERT_TRUE(second);
  EXPECT_EQ(second->ip_dst, Ip4("10.244.0.21"));
  EXPECT_EQ(second->dport, 9090);

  auto flow = Flow(40200);
  ASSERT_TRUE(flow);
  EXPECT_EQ(flow->frontend_addr, Ip4(kClusterIp)) << "the first flow keeps its entry";
  EXPECT_EQ(flow->backend_id, id);
  auto fwd = Ct(kClient, kSecondIp, 40200, 80, IPPROTO_TCP, SLUICE_CT_DIR_FORWARD);
  ASSERT_TRUE(fwd);
  EXPECT_EQ(fwd->backend_id, 6u);
  auto rev = Ct("10.244.0.21", kClient, 9090, 40200, IPPROTO_TCP, SLUICE_CT_DIR_REPLY);
  ASSERT_TRUE(rev);
  EXPECT_TRUE(rev->flags & SLUICE_CT_F_FRONTEND);
  EXPECT_EQ(rev->backend_addr, Ip4(kSecondIp));
  EXPECT_EQ(LbEntriesOfClientPort(*dp_, 40200, IPPROTO_TCP), 3u);

  // Each backend's reply comes from its own flow's frontend.
  auto reply_from = [&](const std::string& addr, uint16_t port, int pod) {
    return Decode(FromPod(Packet::Eth(PodMac(pod), HostMac(pod))
                              .IPv4(addr, kClient)
                              .TCP(port, 40200, kTcpSyn | kTcpAck)
                              .Build())
                      .out);
  };
  auto r1 = reply_from(be.addr, 8080, 20 + static_cast<int>(id));
  ASSERT_TRUE(r1);
  EXPECT_EQ(r1->ip_src, Ip4(kClusterIp));
  auto r2 = reply_from("10.244.0.21", 9090, 21);
  ASSERT_TRUE(r2);
  EXPECT_EQ(r2->ip_src, Ip4(kSecondIp));
  EXPECT_EQ(r2->sport, 80);
  // And each flow's next segment reaches its own backend.
  auto again = Decode(FromPod(TcpToService(40200, kTcpAck)).out);
  ASSERT_TRUE(again);
  EXPECT_EQ(TcpBackendOf(*again), id);
  auto again2 = Decode(FromPod(to_second(kTcpAck)).out);
  ASSERT_TRUE(again2);
  EXPECT_EQ(again2->dport, 9090);
  EXPECT_TRUE(Flow(40200)->flags & SLUICE_CT_F_ESTABLISHED);
  EXPECT_TRUE(Ct(kClient, kSecondIp, 40200, 80, IPPROTO_TCP, SLUICE_CT_DIR_FORWARD)->flags &
              SLUICE_CT_F_ESTABLISHED);
}

// The forward and reply entry lookups are skipped once the GC has seen none left
// (sluice_ct_pairs, maps/conntrack.h), and done again from the moment the datapath writes such a
// flow: its replies are translated even when the flow entry that made it need two entries is gone.
TEST_F(LbTest, TwoEntryLookupsStopWhenTheGcSawNoneAndResumeWithTheNextSuchFlow) {
  auto created = dp_->ct_pairs().Lookup(SLUICE_CT_PAIRS_CREATED);
  ASSERT_TRUE(created.ok());
  EXPECT_EQ(*created, 0u);
  // What the GC writes after a pass that left no forward or reply entry.
  ASSERT_TRUE(dp_->ct_pairs().Update(SLUICE_CT_PAIRS_CLEAR, *created + 1).ok());

  // A flow as older programs recorded it is now not looked up: its reply passes as sent.
  ASSERT_EQ(FromPod(TcpToService(40300)).verdict, kTcRedirect);
  AsOlderPrograms(*dp_, 40300, /*frontend_flag=*/true);
  auto older = Ct(kClient, kClusterIp, 40300, 80, IPPROTO_TCP, SLUICE_CT_DIR_FORWARD);
  ASSERT_TRUE(older);
  const auto& older_be = kTcpBackends[older->backend_id - 1];
  auto reply = [&](const std::string& addr, uint16_t port, uint16_t cport, int pod) {
    return Decode(FromPod(Packet::Eth(PodMac(pod), HostMac(pod))
                              .IPv4(addr, kClient)
                              .TCP(port, cport, kTcpAck)
                              .Build())
                      .out);
  };
  auto r = reply(older_be.addr, 8080, 40300, 20 + static_cast<int>(older->backend_id));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->ip_src, Ip4(older_be.addr)) << "not translated: its entries were not looked up";

  // A client port in a flow entry, then a second flow from it: two entries, counted.
  constexpr const char* kSecondIp = "10.96.0.40";
  SetService(kSecondIp, 80, IPPROTO_TCP, 6, {{6, "10.244.0.21", 9090, IPPROTO_TCP}});
  ASSERT_EQ(FromPod(TcpToService(40301)).verdict, kTcRedirect);
  ASSERT_EQ(FromPod(Packet::Eth(kClientMac, kClientHostMac)
                        .IPv4(kClient, kSecondIp)
                        .TCP(40301, 80, kTcpSyn)
                        .Build())
                .verdict,
            kTcRedirect);
  created = dp_->ct_pairs().Lookup(SLUICE_CT_PAIRS_CREATED);
  ASSERT_TRUE(created.ok());
  EXPECT_EQ(*created, 1u);
  // The first flow's entry goes (its flow ended and the GC took it): the second flow's reply
  // still finds its reply entry.
  ASSERT_TRUE(
      dp_->ct4().Delete(CtKey(kClient, "0.0.0.0", 40301, 0, IPPROTO_TCP, SLUICE_CT_DIR_FLOW)).ok());
  r = reply("10.244.0.21", 9090, 40301, 21);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->ip_src, Ip4(kSecondIp));
  EXPECT_EQ(r->sport, 80);
  // And so does the older flow's, looked up again.
  r = reply(older_be.addr, 8080, 40300, 20 + static_cast<int>(older->backend_id));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->ip_src, Ip4(kClusterIp));
}

// A client port whose flow entry names an ended flow to the same backend through another
// frontend: the new flow takes the entry over (at the backend both are one tuple), so its replies
// come from its own frontend.
TEST_F(LbTest, ANewFlowToTheSameBackendThroughAnotherFrontendTakesThePortsEntryOver) {
  constexpr const char* kSecondIp = "10.96.0.40";
  auto first = Decode(FromPod(TcpToService(40400)).out);
  ASSERT_TRUE(first);
  const uint32_t id = TcpBackendOf(*first);
  ASSERT_NE(id, 0u);
  const auto& be = kTcpBackends[id - 1];
  SetService(kSecondIp, 80, IPPROTO_TCP, 6, {{6, be.addr, 8080, IPPROTO_TCP}});
  ASSERT_EQ(FromPod(TcpToService(40400, kTcpAck | 0x01)).verdict, kTcRedirect);  // FIN
  ASSERT_EQ(FromPod(Packet::Eth(kClientMac, kClientHostMac)
                        .IPv4(kClient, kSecondIp)
                        .TCP(40400, 80, kTcpSyn)
                        .Build())
                .verdict,
            kTcRedirect);
  auto flow = Flow(40400);
  ASSERT_TRUE(flow);
  EXPECT_EQ(flow->frontend_addr, Ip4(kSecondIp));
  EXPECT_EQ(LbEntriesOfClientPort(*dp_, 40400, IPPROTO_TCP), 1u);
  auto r = Decode(
      FromPod(Packet::Eth(PodMac(20 + static_cast<int>(id)), HostMac(20 + static_cast<int>(id)))
                  .IPv4(be.addr, kClient)
                  .TCP(8080, 40400, kTcpSyn | kTcpAck)
                  .Build())
          .out);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->ip_src, Ip4(kSecondIp)) << "the reply comes from the new flow's frontend";
}

TEST_F(LbTest, SessionAffinityPinsNewFlowsOfAClientUntilItExpires) {
  SetService(kClusterIp, 80, IPPROTO_TCP, 1, kTcpBackends, SLUICE_SVC_F_AFFINITY, 100);
  sluice_lb4_affinity_key akey{Ip4(kClient), 1};
  sluice_lb4_affinity aff{};
  aff.last_used_ns = NowNs();
  aff.backend_id = 2;
  ASSERT_TRUE(dp_->lb4_affinity().Update(akey, aff).ok());
  for (int i = 0; i < 30; ++i) {
    auto d = Decode(FromPod(TcpToService(42000 + i)).out);
    ASSERT_TRUE(d);
    EXPECT_EQ(TcpBackendOf(*d), 2u);
  }
  auto live = dp_->lb4_affinity().Lookup(akey);
  ASSERT_TRUE(live.ok());
  EXPECT_GE(live->last_used_ns, aff.last_used_ns) << "use refreshes the affinity";

  // Expired (last used longer than the timeout ago): a fresh choice, which then sticks.
  aff.last_used_ns = NowNs() - 101ull * 1000000000ull;
  aff.backend_id = 99;  // would not even exist
  ASSERT_TRUE(dp_->lb4_affinity().Update(akey, aff).ok());
  auto d = Decode(FromPod(TcpToService(42100)).out);
  ASSERT_TRUE(d);
  uint32_t chosen = TcpBackendOf(*d);
  ASSERT_NE(chosen, 0u);
  auto fresh = dp_->lb4_affinity().Lookup(akey);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(fresh->backend_id, chosen);
  for (int i = 1; i < 20; ++i) {
    auto n = Decode(FromPod(TcpToService(42100 + i)).out);
    ASSERT_TRUE(n);
    EXPECT_EQ(TcpBackendOf(*n), chosen);
  }
  // Without the flag the entry is ignored: flows spread again.
  SetService(kClusterIp, 80, IPPROTO_TCP, 1, kTcpBackends);
  std::map<uint32_t, int> hits;
  for (int i = 0; i < 60; ++i) {
    auto n = Decode(FromPod(TcpToService(43000 + i)).out);
    ASSERT_TRUE(n);
    hits[TcpBackendOf(*n)]++;
  }
  EXPECT_GT(hits.size(), 1u);
}

TEST_F(LbTest, PodReachingItselfThroughItsServiceIsHairpinnedViaTheGateway) {
  // 10.244.0.21 is backend 1 of the ClusterIP; it connects until it is given itself.
  const std::string self = "10.244.0.21";
  int sport = 0;
  for (int i = 0; i < 200 && sport == 0; ++i) {
    auto in = Packet::Eth(PodMac(21), HostMac(21))
                  .IPv4(self, kClusterIp)
                  .TCP(44000 + i, 80)
                  .Build();
    auto r = FromPod(in);
    ASSERT_EQ(r.verdict, kTcRedirect) << Describe(r.out);
    auto d = Decode(r.out);
    ASSERT_TRUE(d);
    if (d->ip_dst != Ip4(self)) continue;
    sport = 44000 + i;
    EXPECT_EQ(d->ip_src, Ip4(kGateway)) << "the pod must not see its own address as source";
    EXPECT_EQ(d->dport, 8080);
    EXPECT_EQ(d->sport, sport);
    EXPECT_EQ(d->eth_dst, PodMac(21));
    EXPECT_TRUE(d->ip_csum_ok);
    EXPECT_TRUE(d->l4_csum_ok);
  }
  ASSERT_NE(sport, 0) << "never chose itself in 200 flows";
  auto reply = Packet::Eth(PodMac(21), HostMac(21))
                   .IPv4(self, kGateway)
                   .TCP(8080, sport, kTcpSyn | kTcpAck)
                   .Build();
  auto r = FromPod(reply);
  ASSERT_EQ(r.verdict, kTcRedirect) << Describe(r.out);
  auto d = Decode(r.out);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->ip_src, Ip4(kClusterIp));
  EXPECT_EQ(d->sport, 80);
  EXPECT_EQ(d->ip_dst, Ip4(self));
  EXPECT_EQ(d->dport, sport);
  EXPECT_EQ(d->eth_dst, PodMac(21));
  EXPECT_TRUE(d->ip_csum_ok);
  EXPECT_TRUE(d->l4_csum_ok);
}

// NodePorts and other external frontends arrive on the native device (sluice_from_net).
class NodePortTest : public LbTest {
 protected:
  void SetUp() override {
    LbTest::SetUp();
    if (HasFatalFailure()) return;
    SetService(kNodeIp, 30080, IPPROTO_TCP, 7, {kTcpBackends[0]}, SLUICE_SVC_F_NODEPORT);
    SetService(kNodeIp, 30081, IPPROTO_TCP, 8, {kOtherTcpBackends[0]}, SLUICE_SVC_F_NODEPORT);
    SetService(kNodeIp, 30082, IPPROTO_TCP, 9, {}, SLUICE_SVC_F_NODEPORT | SLUICE_SVC_F_REJECT);
  }
  RunResult FromNet(const Bytes& in) { return Run(dp_->from_net_fd(), in, kIfindex); }

 public:
  static Bytes External(uint16_t sport, uint16_t dport, uint8_t flags = kTcpSyn) {
    return Packet::Eth(ParseMac("02:ee:00:00:00:01"), ParseMac("02:ee:00:00:00:02"))
        .IPv4(kExternal, kNodeIp)
        .TCP(sport, dport, flags)
        .Payload("hi")
        .Build();
  }
};

// ---- sluice_from_net: NodePorts, and replies from other nodes ---------------------------------

const Mac kExternalMac = ParseMac("02:ee:00:00:00:01");
const Mac kNodeMac = ParseMac("02:ee:00:00:00:02");
const Mac kPeerNodeMac = ParseMac("02:ee:00:00:00:03");

std::vector<PacketCase> NodePortCases() {
  return {
      {"NodePortToALocalBackendKeepsTheClientAddressAndTheReplyLeavesFromTheNodePort",
       {{.prog = Prog::kFromNet,
         .in = NodePortTest::External(50000, 30080),
         .verdict = kTcRedirect,
         .out = {Packet::Eth(HostMac(21), PodMac(21))
                     .IPv4(kExternal, "10.244.0.21", 63)
                     .TCP(50000, 8080)
                     .Payload("hi")}},
        // The pod's reply leaves from the node address and NodePort.
        {.in = Packet::Eth(PodMac(21), HostMac(21))
                   .IPv4("10.244.0.21", kExternal)
                   .TCP(8080, 50000, kTcpSyn | kTcpAck),
         .verdict = kTcOk,
         .out = {Packet::Eth(PodMac(21), HostMac(21))
                     .IPv4(kNodeIp, kExternal)
                     .TCP(30080, 50000, kTcpSyn | kTcpAck)}}}},
      {"NodePortWithoutEndpointsAnswersRst",
       {{.prog = Prog::kFromNet,
         .in = NodePortTest::External(50002, 30082),
         .verdict = kTcRedirect,
         .out = {RstAck(Packet::Eth(kNodeMac, kExternalMac), kNodeIp, kExternal, 30082, 50002,
                        1000 + 2 + 1)},
         .drop = SLUICE_DROP_SERVICE_REJECTED}}},
      {"OtherTrafficToTheNodeIsUntouched",
       {{.prog = Prog::kFromNet,
         .in = NodePortTest::External(50003, 22),
         .verdict = kTcOk,
         .unchanged = true}}},
      // The client pod's flow went to a backend on another node (no masquerade between pods).
      {"ReplyFromABackendOnAnotherNodeIsRestoredBeforeReachingTheClientPod",
       {{.in = ToService(46000),
         .verdict = kTcOk,  // off-node: into the stack, to be routed
         .out = {Packet::Eth(kClientMac, kClientHostMac)
                     .IPv4(kClient, "10.244.1.31")
                     .TCP(46000, 8080)
                     .Payload("GET /"),
                 Packet::Eth(kClientMac, kClientHostMac)
                     .IPv4(kClient, "10.244.1.32")
                     .TCP(46000, 8080)
                     .Payload("GET /")},
         .setup =
             [](loader::Datapath& dp) {
               SetService(dp, kClusterIp, 80, IPPROTO_TCP, 1, kOtherTcpBackends);
               ASSERT_TRUE(
                   dp.lb4_services().Delete(LbKey(kClusterIp, 80, IPPROTO_TCP, 3)).ok());
             },
         .effects =
             [](loader::Datapath&, const Trail& t) {
               EXPECT_THAT(TcpBackendOf(t.last()), ::testing::AnyOf(4u, 5u));
             }},
        {.prog = Prog::kFromNet,
         .in =
             [](const Trail& t) {
               return Packet::Eth(kPeerNodeMac, kNodeMac)
                   .IPv4(FormatIp4(t.last().ip_dst), kClient)
                   .TCP(8080, 46000, kTcpSyn | kTcpAck);
             },
         .verdict = kTcRedirect,
         .out = {ToClient(kClusterIp).TCP(80, 46000, kTcpSyn | kTcpAck)}}}},
  };
}

class NodePortTable : public NodePortTest, public ::testing::WithParamInterface<PacketCase> {};

TEST_P(NodePortTable, Packet) { RunCase(GetParam()); }

INSTANTIATE_TEST_SUITE_P(SluiceFromNet, NodePortTable, ::testing::ValuesIn(NodePortCases()),
                         CaseName);

class NodePortCompatTable : public WithoutKernCtx<NodePortTable> {};

TEST_P(NodePortCompatTable, Packet) { RunCase(GetParam()); }

INSTANTIATE_TEST_SUITE_P(SluiceFromNetWithoutKernCtx, NodePortCompatTable,
                         ::testing::ValuesIn(NodePortCases()), CaseName);

// ---- Fragmented datagrams: later fragments follow their first (lib/parse.h, maps/frag.h) ------

// A first fragment (MF, offset 0) carries the UDP header; a later one (here at offset 72 = 8 + 64
// bytes, the last: MF clear) has none, only the datagram's bytes: it is rewritten in its IPv4
// header alone.
constexpr uint16_t kFirstFragment = 0x2000;
constexpr uint16_t kLastFragment = 72 / 8;
const std::string kFirstBytes(64, 'a');
const std::string kLaterBytes(40, 'b');

Packet LaterFragment(Packet ip) {
  return ip.Fragment(kLastFragment).Protocol(IPPROTO_UDP).Payload(kLaterBytes);
}

std::vector<PacketCase> FragmentCases() {
  const Packet to_svc = Packet::Eth(kClientMac, kClientHostMac).IPv4(kClient, kClusterIp);
  auto first_at_backends = [](uint16_t ip_id) {
    std::vector<Frame> out;
    for (int n : {21, 22}) {
      out.push_back(Packet::Eth(HostMac(n), PodMac(n))
                        .IPv4(kClient, absl::StrFormat("10.244.0.%d", n), 63)
                        .Id(ip_id)
                        .Fragment(kFirstFragment)
                        .UDP(5100, 5353)
                        .Payload(kFirstBytes));
    }
    return out;
  };
  // Step 0's backend (pod number) and its address.
  auto pod = [](const Trail& t) { return PodOf(t.out[0]); };
  auto backend = [](const Trail& t) { return FormatIp4(t.out[0].ip_dst); };
  return {
      {"FragmentedUdpToClusterIpAndItsFragmentedReplyFollowTheirFirstFragments",
       {{.in = Packet(to_svc).Fragment(kFirstFragment).UDP(5100, 53).Payload(kFirstBytes),
         .verdict = kTcRedirect,
         .out = first_at_backends(0x1234),
         .effects =
             [](loader::Datapath& dp, const Trail& t) {
               ExpectFlowEntry(dp, 5100, 53, IPPROTO_UDP, PodOf(t.last()) == 21 ? 11 : 12, 2);
               sluice_frag4_key k{Ip4(kClient), Ip4(kClusterIp), htons(0x1234), IPPROTO_UDP, 0};
               auto e = dp.frag4().Lookup(k);
               ASSERT_TRUE(e.ok()) << "the first fragment's ports are remembered";
               EXPECT_EQ(ntohs(e->sport), 5100);
               EXPECT_EQ(ntohs(e->dport), 53);
             }},
        // The later fragment goes to the same backend, its bytes untouched.
        {.in = LaterFragment(to_svc),
         .verdict = kTcRedirect,
         .out = {[pod, backend](const Trail& t) {
           return LaterFragment(
               Packet::Eth(HostMac(pod(t)), PodMac(pod(t))).IPv4(kClient, backend(t), 63));
         }}},
        // The backend's answer is fragmented too: both pieces come from the ClusterIP.
        {.in =
             [pod, backend](const Trail& t) {
               return Packet::Eth(PodMac(pod(t)), HostMac(pod(t)))
                   .IPv4(backend(t), kClient)
                   .Id(0x5678)
                   .Fragment(kFirstFragment)
                   .UDP(5353, 5100)
                   .Payload(kFirstBytes);
             },
         .verdict = kTcRedirect,
         .out = {ToClient(kClusterIp)
                     .Id(0x5678)
                     .Fragment(kFirstFragment)
                     .UDP(53, 5100)
                     .Payload(kFirstBytes)}},
        {.in =
             [pod, backend](const Trail& t) {
               return LaterFragment(Packet::Eth(PodMac(pod(t)), HostMac(pod(t)))
                                        .IPv4(backend(t), kClient)
                                        .Id(0x5678));
             },
         .verdict = kTcRedirect,
         .out = {LaterFragment(ToClient(kClusterIp).Id(0x5678))}}}},
      // Out of order: with no first fragment seen there is no backend to follow. Once the first
      // came, a later fragment follows it.
      {"LaterFragmentBeforeItsFirstIsDroppedAsFragment",
       {{.in = LaterFragment(Packet(to_svc).Id(0x4321)),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_FRAGMENT,
         .effects = ExpectNoConntrack},
        {.in =
             Packet(to_svc).Id(0x4321).Fragment(kFirstFragment).UDP(5100, 53).Payload(kFirstBytes),
         .verdict = kTcRedirect,
         .out = first_at_backends(0x4321)},
        {.in = LaterFragment(Packet(to_svc).Id(0x4321)),
         .verdict = kTcRedirect,
         .out = {[](const Trail& t) {
           const Decoded& first = t.out[1];
           return LaterFragment(Packet::Eth(HostMac(PodOf(first)), PodMac(PodOf(first)))
                                    .IPv4(kClient, FormatIp4(first.ip_dst), 63)
                                    .Id(0x4321));
         }}}}},
  };
}

class FragmentTable : public LbTest, public ::testing::WithParamInterface<PacketCase> {};

TEST_P(FragmentTable, Packet) { RunCase(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Fragments, FragmentTable, ::testing::ValuesIn(FragmentCases()), CaseName);

std::vector<PacketCase> NodePortFragmentCases() {
  const Packet from_outside = Packet::Eth(kExternalMac, kNodeMac).IPv4(kExternal, kNodeIp);
  const Packet from_backend = Packet::Eth(PodMac(21), HostMac(21)).IPv4("10.244.0.21", kExternal);
  // The reply leaves from the NodePort (into the stack, as in NodePortCases).
  const Packet at_client = Packet::Eth(PodMac(21), HostMac(21)).IPv4(kNodeIp, kExternal);
  return {
      {"FragmentedUdpToANodePortAndItsFragmentedReplyFollowTheirFirstFragments",
       {{.prog = Prog::kFromNet,
         .in = Packet(from_outside).Fragment(kFirstFragment).UDP(50100, 30053).Payload(kFirstBytes),
         .verdict = kTcRedirect,
         .out = {Packet::Eth(HostMac(21), PodMac(21))
                     .IPv4(kExternal, "10.244.0.21", 63)
                     .Fragment(kFirstFragment)
                     .UDP(50100, 5353)
                     .Payload(kFirstBytes)},
         .setup =
             [](loader::Datapath& dp) {
               SetService(dp, kNodeIp, 30053, IPPROTO_UDP, 10, {kUdpBackends[0]},
                          SLUICE_SVC_F_NODEPORT);
             }},
        {.prog = Prog::kFromNet,
         .in = LaterFragment(from_outside),
         .verdict = kTcRedirect,
         .out = {LaterFragment(
             Packet::Eth(HostMac(21), PodMac(21)).IPv4(kExternal, "10.244.0.21", 63))}},
        {.in = Packet(from_backend)
                   .Id(0x5678)
                   .Fragment(kFirstFragment)
                   .UDP(5353, 50100)
                   .Payload(kFirstBytes),
         .verdict = kTcOk,
         .out = {Packet(at_client)
                     .Id(0x5678)
                     .Fragment(kFirstFragment)
                     .UDP(30053, 50100)
                     .Payload(kFirstBytes)}},
        {.in = LaterFragment(Packet(from_backend).Id(0x5678)),
         .verdict = kTcOk,
         .out = {LaterFragment(Packet(at_client).Id(0x5678))}}}},
  };
}

// ---- A direct flow crossing a translated flow's leftover entries (lib/lb.h) -------------------

// A client's flow through the ClusterIP to backend B from port P has ended, its entries are still
// there; then the client connects to B's pod address itself from the same port. B's answers
// must come from B: the translated flow's reply entry may not capture them.
std::vector<PacketCase> CrossedFlowCases() {
  auto pod = [](const Trail& t) { return PodOf(t.out[0]); };
  auto backend = [](const Trail& t) { return FormatIp4(t.out[0].ip_dst); };
  auto expect_gone = [backend](uint16_t sport, uint16_t fport, uint16_t bport, uint8_t proto) {
    return [=](loader::Datapath& dp, const Trail& t) {
      EXPECT_FALSE(Ct(dp, backend(t), kClient, bport, sport, proto, SLUICE_CT_DIR_REPLY))
          << "the translated flow's reply entry is gone";
      EXPECT_FALSE(Ct(dp, kClient, kClusterIp, sport, fport, proto, SLUICE_CT_DIR_FORWARD))
          << "and its forward entry, which named this backend";
      EXPECT_FALSE(Flow(dp, kClient, sport, proto)) << "or its flow entry";
    };
  };
  // The client's TCP flow from `port` through the ClusterIP, recorded as a flow entry, or, older,
  // as the programs before flow entries recorded it (a forward and a reply entry).
  auto direct_tcp = [=](std::string name, uint16_t port, bool older) {
    return PacketCase{name,
                      {{.in = ToService(port),
                        .verdict = kTcRedirect,
                        .out = AtEachTcpBackend(kClient, port, kTcpSyn, "GET /")},
                       // The client closes the flow (its entries stay until the GC).
                       {.in = Packet::Eth(kClientMac, kClientHostMac)
                                  .IPv4(kClient, kClusterIp)
                                  .TCP(port, 80, 0x01 | kTcpAck),
                        .verdict = kTcRedirect,
                        .out = AtEachTcpBackend(kClient, port, 0x01 | kTcpAck, ""),
                        .setup =
                            [port, older](loader::Datapath& dp) {
                              if (older) AsOlderPrograms(dp, port, /*frontend_flag=*/true);
                            }},
                       {.in =
                            [port](const Trail& t) {
                              return Packet::Eth(kClientMac, kClientHostMac)
                                  .IPv4(kClient, FormatIp4(t.out[0].ip_dst))
                                  .TCP(port, 8080, kTcpSyn);
                            },
                        .verdict = kTcRedirect,
                        .out = {[pod, backend, port](const Trail& t) {
                          return Packet::Eth(HostMac(pod(t)), PodMac(pod(t)))
                              .IPv4(kClient, backend(t), 63)
                              .TCP(port, 8080, kTcpSyn);
                        }},
                        .effects = expect_gone(port, 80, 8080, IPPROTO_TCP)},
                       {.in =
                            [pod, backend, port](const Trail& t) {
                              return Packet::Eth(PodMac(pod(t)), HostMac(pod(t)))
                                  .IPv4(backend(t), kClient)
                                  .TCP(8080, port, kTcpSyn | kTcpAck);
                            },
                        .verdict = kTcRedirect,
                        .out = {[backend, port](const Trail& t) {
                          return ToClient(backend(t)).TCP(8080, port, kTcpSyn | kTcpAck);
                        }}}}};
  };
  // The client's TCP connection from `port` through the ClusterIP is still open when it sends a
  // SYN straight to that backend from the same port (another socket; the same tuple at the
  // backend): the open connection's entry stays, so it keeps its backend and the backend's
  // answer on that tuple still reaches it from the ClusterIP. (Deleting it, as for an ended flow,
  // sent the open connection's next segment to a backend chosen afresh, which answered RST: the
  // resets e2e_steady_state_test saw, reproduced with a Service of two backends.)
  auto direct_while_open = [=](std::string name, uint16_t port) {
    return PacketCase{
        name,
        {{.in = ToService(port),
          .verdict = kTcRedirect,
          .out = AtEachTcpBackend(kClient, port, kTcpSyn, "GET /")},
         {.in =
              [port](const Trail& t) {
                return Packet::Eth(kClientMac, kClientHostMac)
                    .IPv4(kClient, FormatIp4(t.out[0].ip_dst))
                    .TCP(port, 8080, kTcpSyn);
              },
          .verdict = kTcRedirect,
          .out = {[pod, backend, port](const Trail& t) {
            return Packet::Eth(HostMac(pod(t)), PodMac(pod(t)))
                .IPv4(kClient, backend(t), 63)
                .TCP(port, 8080, kTcpSyn);
          }},
          .effects =
              [port](loader::Datapath& dp, const Trail&) {
                EXPECT_TRUE(Flow(dp, kClient, port, IPPROTO_TCP))
                    << "the open connection's flow entry stays";
              }},
         // The open connection's next segment goes to the backend it was given.
         {.in = ToService(port, kTcpAck),
          .verdict = kTcRedirect,
          .out = {[pod, backend, port](const Trail& t) {
            return Packet::Eth(HostMac(pod(t)), PodMac(pod(t)))
                .IPv4(kClient, backend(t), 63)
                .TCP(port, 8080, kTcpAck)
                .Payload("GET /");
          }}},
         // The backend's answer on the shared tuple reaches it from the ClusterIP.
         {.in =
              [pod, backend, port](const Trail& t) {
                return Packet::Eth(PodMac(pod(t)), HostMac(pod(t)))
                    .IPv4(backend(t), kClient)
                    .TCP(8080, port, kTcpAck);
              },
          .verdict = kTcRedirect,
          .out = {[port](const Trail&) { return ToClient(kClusterIp).TCP(80, port, kTcpAck); }}}}};
  };
  return {
      direct_while_open("DirectTcpSynFromTheSamePortLeavesAnOpenServiceConnectionOnItsBackend",
                        47002),
      direct_tcp("DirectTcpConnectionFromTheSamePortIsNotReverseTranslatedByAnEndedServiceFlow",
                 47000, /*older=*/false),
      direct_tcp("DirectTcpConnectionClearsAnEndedServiceFlowOfTheProgramsBeforeFlowEntries", 47001,
                 /*older=*/true),
      {"DirectUdpFromTheSamePortIsNotReverseTranslatedByAnEarlierServiceFlow",
       {{.in = Packet::Eth(kClientMac, kClientHostMac)
                   .IPv4(kClient, kClusterIp)
                   .UDP(5200, 53)
                   .Payload("query"),
         .verdict = kTcRedirect,
         .effects = [](loader::Datapath&,
                       const Trail& t) { EXPECT_THAT(PodOf(t.last()), ::testing::AnyOf(21, 22)); }},
        {.in =
             [](const Trail& t) {
               return Packet::Eth(kClientMac, kClientHostMac)
                   .IPv4(kClient, FormatIp4(t.out[0].ip_dst))
                   .UDP(5200, 5353)
                   .Payload("direct");
             },
         .verdict = kTcRedirect,
         .effects = expect_gone(5200, 53, 5353, IPPROTO_UDP)},
        {.in =
             [pod, backend](const Trail& t) {
               return Packet::Eth(PodMac(pod(t)), HostMac(pod(t)))
                   .IPv4(backend(t), kClient)
                   .UDP(5353, 5200)
                   .Payload("answer");
             },
         .verdict = kTcRedirect,
         .out = {[backend](const Trail& t) {
           return ToClient(backend(t)).UDP(5353, 5200).Payload("answer");
         }}}}},
  };
}

class CrossedFlowTable : public LbTest, public ::testing::WithParamInterface<PacketCase> {};

TEST_P(CrossedFlowTable, Packet) { RunCase(GetParam()); }

INSTANTIATE_TEST_SUITE_P(CrossedFlows, CrossedFlowTable, ::testing::ValuesIn(CrossedFlowCases()),
                         CaseName);

class NodePortFragmentTable : public NodePortTest,
                              public ::testing::WithParamInterface<PacketCase> {};

TEST_P(NodePortFragmentTable, Packet) { RunCase(GetParam()); }

INSTANTIATE_TEST_SUITE_P(NodePortFragments, NodePortFragmentTable,
                         ::testing::ValuesIn(NodePortFragmentCases()), CaseName);

// ---- A backend in the node's own stack (a hostNetwork pod: the node's address) ----------------

constexpr const char* kHostBackendIp = "10.96.0.40";  // a ClusterIP whose endpoint is the node

std::vector<PacketCase> HostBackendCases() {
  auto host_backend = [](loader::Datapath& dp) {
    SetService(dp, kHostBackendIp, 80, IPPROTO_TCP, 20, {{20, kNodeIp, 8081, IPPROTO_TCP}});
    SetService(dp, kHostBackendIp, 53, IPPROTO_UDP, 21, {{21, kNodeIp, 8081, IPPROTO_UDP}});
    SetService(dp, kNodeIp, 30090, IPPROTO_TCP, 22, {{20, kNodeIp, 8081, IPPROTO_TCP}},
               SLUICE_SVC_F_NODEPORT);
  };
  const Packet from_stack = Packet::Eth(kClientHostMac, kClientMac).IPv4(kNodeIp, kClient);
  return {
      // The DNATed packet enters the stack (the node is no endpoint, no peer); the stack's reply
      // reaches the pod through sluice_to_pod, which gives it its frontend back.
      {"PodToAServiceWhoseBackendIsTheNodeGetsTheReplyFromTheFrontend",
       {{.in = Packet::Eth(kClientMac, kClientHostMac)
                   .IPv4(kClient, kHostBackendIp)
                   .TCP(40100, 80)
                   .Payload("GET /"),
         .verdict = kTcOk,
         .out = {Packet::Eth(kClientMac, kClientHostMac)
                     .IPv4(kClient, kNodeIp)
                     .TCP(40100, 8081)
                     .Payload("GET /")},
         .setup = host_backend},
        {.prog = Prog::kToPod,
         .in = Packet(from_stack).TCP(8081, 40100, kTcpSyn | kTcpAck),
         .verdict = kTcOk,
         .out = {Packet::Eth(kClientHostMac, kClientMac)
                     .IPv4(kHostBackendIp, kClient)
                     .TCP(80, 40100, kTcpSyn | kTcpAck)}}}},
      {"PodToAServiceWhoseBackendIsTheNodeOverUdp",
       {{.in = Packet::Eth(kClientMac, kClientHostMac)
                   .IPv4(kClient, kHostBackendIp)
                   .UDP(40101, 53)
                   .Payload("query"),
         .verdict = kTcOk,
         .out = {Packet::Eth(kClientMac, kClientHostMac)
                     .IPv4(kClient, kNodeIp)
                     .UDP(40101, 8081)
                     .Payload("query")},
         .setup = host_backend},
        {.prog = Prog::kToPod,
         .in = Packet(from_stack).UDP(8081, 40101).Payload("answer"),
         .verdict = kTcOk,
         .out = {Packet::Eth(kClientHostMac, kClientMac)
                     .IPv4(kHostBackendIp, kClient)
                     .UDP(53, 40101)
                     .Payload("answer")}}}},
      // What the node itself sends a pod is untouched (no balanced flow of that tuple).
      {"NodeTrafficToAPodIsUntouchedBySluiceToPod",
       {{.prog = Prog::kToPod,
         .in = Packet(from_stack).TCP(8081, 40102, kTcpSyn | kTcpAck),
         .verdict = kTcOk,
         .unchanged = true,
         .setup = host_backend}}},
      // From outside: the node's own address as the backend goes to the stack with the client's
      // address; the stack's reply leaves through sluice_to_net from the NodePort.
      {"NodePortToABackendOnTheNodeItselfEntersTheStackAndTheReplyLeavesFromTheNodePort",
       {{.prog = Prog::kFromNet,
         .in = NodePortTest::External(50020, 30090),
         .verdict = kTcOk,
         .out = {Packet::Eth(kExternalMac, kNodeMac)
                     .IPv4(kExternal, kNodeIp)
                     .TCP(50020, 8081)
                     .Payload("hi")},
         .setup = host_backend},
        {.prog = Prog::kToNet,
         .in = Packet::Eth(kNodeMac, kExternalMac)
                   .IPv4(kNodeIp, kExternal)
                   .TCP(8081, 50020, kTcpSyn | kTcpAck),
         .verdict = kTcOk,
         .out = {Packet::Eth(kNodeMac, kExternalMac)
                     .IPv4(kNodeIp, kExternal)
                     .TCP(30090, 50020, kTcpSyn | kTcpAck)}}}},
      {"NodeTrafficLeavingTheNodeIsUntouchedBySluiceToNet",
       {{.prog = Prog::kToNet,
         .in = Packet::Eth(kNodeMac, kExternalMac)
                   .IPv4(kNodeIp, kExternal)
                   .TCP(8081, 50021, kTcpSyn | kTcpAck),
         .verdict = kTcOk,
         .unchanged = true,
         .setup = host_backend}}},
  };
}

// externalTrafficPolicy: Local without a local endpoint: the external frontend has no slots, its
// internal-scope twin (written by the agent for in-cluster clients) has every endpoint.
void EtpLocalNodePort(loader::Datapath& dp) {
  SetService(dp, kNodeIp, 30095, IPPROTO_TCP, 30, {},
             SLUICE_SVC_F_NODEPORT | SLUICE_SVC_F_ETP_LOCAL);
  ASSERT_TRUE(ProgramService(dp, kNodeIp, 30095, IPPROTO_TCP, 31, kOtherTcpBackends,
                             SLUICE_SVC_F_NODEPORT, 0, SLUICE_LB_SCOPE_INTERNAL)
                  .ok());
}

std::vector<PacketCase> EtpLocalCases() {
  return {
      {"PodToAnEtpLocalNodePortGoesToEveryEndpointAsKubeProxySendsInClusterTraffic",
       {{.in = Packet::Eth(kClientMac, kClientHostMac)
                   .IPv4(kClient, kNodeIp)
                   .TCP(40300, 30095)
                   .Payload("GET /"),
         .verdict = kTcOk,  // the endpoints are on another node: into the stack, to be routed
         .out = {Packet::Eth(kClientMac, kClientHostMac)
                     .IPv4(kClient, "10.244.1.31")
                     .TCP(40300, 8080)
                     .Payload("GET /"),
                 Packet::Eth(kClientMac, kClientHostMac)
                     .IPv4(kClient, "10.244.1.32")
                     .TCP(40300, 8080)
                     .Payload("GET /")},
         .setup = EtpLocalNodePort}}},
      {"OutsideToAnEtpLocalNodePortWithoutALocalEndpointStillDrops",
       {{.prog = Prog::kFromNet,
         .in = NodePortTest::External(50030, 30095),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_SERVICE_NO_BACKEND,
         .setup = EtpLocalNodePort}}},
  };
}

class EtpLocalTable : public NodePortTest, public ::testing::WithParamInterface<PacketCase> {};

TEST_P(EtpLocalTable, Packet) { RunCase(GetParam()); }

INSTANTIATE_TEST_SUITE_P(EtpLocalInCluster, EtpLocalTable, ::testing::ValuesIn(EtpLocalCases()),
                         CaseName);

class HostBackendTable : public NodePortTest, public ::testing::WithParamInterface<PacketCase> {};

TEST_P(HostBackendTable, Packet) { RunCase(GetParam()); }

INSTANTIATE_TEST_SUITE_P(HostNetworkBackend, HostBackendTable,
                         ::testing::ValuesIn(HostBackendCases()), CaseName);

// ---- The pods' gateway address (bpf/lib/gateway.h) -------------------------------------------

std::vector<PacketCase> GatewayCases() {
  const Packet to_gateway = Packet::Eth(kClientMac, kClientHostMac).IPv4(kClient, kGateway);
  return {
      {"EchoRequestToTheGatewayIsAnsweredBackIntoThePod",
       {{.in = Packet(to_gateway).Icmp(8, 0, 0x12340001).Payload("ping-data"),
         .verdict = kTcRedirect,
         .out = {Packet::Eth(kClientHostMac, kClientMac)
                     .IPv4(kGateway, kClient)
                     .Icmp(0, 0, 0x12340001)
                     .Payload("ping-data")}}}},
      {"UdpToTheGatewayIsDroppedAndCounted",
       {{.in = Packet(to_gateway).UDP(40200, 53).Payload("query"),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_TO_GATEWAY}}},
      {"TcpToTheGatewayIsDroppedAndCounted",
       {{.in = Packet(to_gateway).TCP(40201, 80),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_TO_GATEWAY}}},
      {"OtherIcmpToTheGatewayIsDroppedAndCounted",
       {{.in = Packet(to_gateway).Icmp(13, 0),  // timestamp request
         .verdict = kTcShot,
         .drop = SLUICE_DROP_TO_GATEWAY}}},
  };
}

class GatewayTable : public LbTest, public ::testing::WithParamInterface<PacketCase> {};

TEST_P(GatewayTable, Packet) { RunCase(GetParam()); }

INSTANTIATE_TEST_SUITE_P(PodGateway, GatewayTable, ::testing::ValuesIn(GatewayCases()), CaseName);

// Its first packet's verdict depends on the routes of the namespace the test runs in (the FIB
// lookup for the masqueraded packet), so it stays a TEST checking what does not.
TEST_F(NodePortTest, NodePortToARemoteBackendIsMasqueradedAndItsReplyRestored) {
  auto r = FromNet(External(50001, 30081));
  auto d = Decode(r.out);
  ASSERT_TRUE(d) << Describe(r.out);
  EXPECT_EQ(d->ip_src, Ip4(kNodeIp)) << "masqueraded so the reply returns through this node";
  EXPECT_GE(d->sport, 61000);
  EXPECT_EQ(d->ip_dst, Ip4("10.244.1.31"));
  EXPECT_EQ(d->dport, 8080);
  EXPECT_TRUE(d->ip_csum_ok);
  EXPECT_TRUE(d->l4_csum_ok);
  uint16_t nat_port = d->sport;

  // The backend answers the node; the answer goes back to the client from the NodePort.
  auto reply = Packet::Eth(ParseMac("02:ee:00:00:00:03"), ParseMac("02:ee:00:00:00:02"))
                   .IPv4("10.244.1.31", kNodeIp)
                   .TCP(8080, nat_port, kTcpSyn | kTcpAck)
                   .Build();
  auto rr = FromNet(reply);
  auto dr = Decode(rr.out);
  ASSERT_TRUE(dr);
  EXPECT_EQ(dr->ip_src, Ip4(kNodeIp)) << Describe(rr.out);
  EXPECT_EQ(dr->sport, 30081);
  EXPECT_EQ(dr->ip_dst, Ip4(kExternal));
  EXPECT_EQ(dr->dport, 50001);
  EXPECT_TRUE(dr->ip_csum_ok);
  EXPECT_TRUE(dr->l4_csum_ok);

  // Later packets of the flow reuse the same translation.
  auto again = Decode(FromNet(External(50001, 30081, kTcpAck)).out);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->sport, nat_port);
  EXPECT_EQ(again->ip_dst, Ip4("10.244.1.31"));
}

// What the native device does with a packet whose source is now the node (masqueraded NodePort
// traffic to a remote backend): routed with the kernel's FIB and sent out with the next hop's
// MAC, never handed to the stack (which would drop it as a martian). Runs in a network namespace
// of its own with a route and a permanent neighbour for the backend's node.
TEST_F(NodePortTest, MasqueradedPacketIsRoutedOutWithTheNextHopsMac) {
  ASSERT_EQ(unshare(CLONE_NEWNET), 0) << "unshare: " << strerror(errno);
  for (const char* cmd : {
           "ip link set lo up",
           "sysctl -qw net.ipv4.ip_forward=1",
           "ip link add sl-fib0 address 02:fb:00:00:00:01 type veth peer name sl-fib1",
           "ip addr add 192.168.50.10/24 dev sl-fib0",
           "ip link set sl-fib0 up",
           "ip link set sl-fib1 up",
           "ip neigh replace 192.168.50.20 lladdr 02:fb:00:00:00:20 dev sl-fib0 nud permanent",
           "ip route add 10.244.1.0/24 via 192.168.50.20",
       }) {
    ASSERT_EQ(std::system(cmd), 0) << cmd;
  }
  auto r = FromNet(External(50010, 30081));
  ASSERT_EQ(r.verdict, kTcRedirect) << Describe(r.out);
  auto d = Decode(r.out);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->eth_dst, ParseMac("02:fb:00:00:00:20"));
  EXPECT_EQ(d->eth_src, ParseMac("02:fb:00:00:00:01"));
  EXPECT_EQ(d->ip_src, Ip4(kNodeIp));
  EXPECT_EQ(d->ip_dst, Ip4("10.244.1.31"));
  EXPECT_EQ(d->ttl, 63) << "forwarded like a router";
  EXPECT_TRUE(d->ip_csum_ok);
  EXPECT_TRUE(d->l4_csum_ok);
}

TEST_F(LbTest, ManyFlowsSpreadOverAllBackends) {
  std::map<uint32_t, int> hits;
  for (int i = 0; i < 300; ++i) {
    auto r = FromPod(TcpToService(20000 + i));
    ASSERT_EQ(r.verdict, kTcRedirect);
    auto d = Decode(r.out);
    ASSERT_TRUE(d);
    ASSERT_TRUE(d->l4_csum_ok);
    hits[TcpBackendOf(*d)]++;
  }
  EXPECT_EQ(hits.size(), 3u);
  for (uint32_t id : {1u, 2u, 3u}) EXPECT_GT(hits[id], 30) << "backend " << id;
}

// A master that names a slot record (sluice_lb4_rec, maps/lb.h) takes new flows' backends from
// the record, not from its slot entries; with record 0 the slot entries decide again. (The agent
// keeps both alike: tests/agent/service/reconciler_priv_test.cc.)
TEST_F(LbTest, NewFlowsTakeTheirBackendFromTheSlotRecordTheMasterNames) {
  sluice_lb4_slot_record rec{};
  for (uint32_t& id : rec.backend_id) id = 2;  // every slot: backend 2, whatever the entries say
  ASSERT_TRUE(dp_->lb4_slot_records().Update(7, rec).ok());
  auto master = dp_->lb4_services().Lookup(SvcKey(kClusterIp, 80, IPPROTO_TCP, 0));
  ASSERT_TRUE(master.ok()) << master.status();
  ASSERT_EQ(master->count, 3);
  master->backend_id = 7;
  ASSERT_TRUE(dp_->lb4_services().Update(SvcKey(kClusterIp, 80, IPPROTO_TCP, 0), *master).ok());

  std::map<uint32_t, int> hits;
  for (int i = 0; i < 60; ++i) {
    auto r = FromPod(TcpToService(21000 + i));
    ASSERT_EQ(r.verdict, kTcRedirect) << Describe(r.out);
    auto d = Decode(r.out);
    ASSERT_TRUE(d);
    ASSERT_TRUE(d->l4_csum_ok);
    hits[TcpBackendOf(*d)]++;
  }
  EXPECT_EQ(hits, (std::map<uint32_t, int>{{2u, 60}}));

  // A record without a backend in the chosen slot: no backend, as a missing slot entry.
  rec = {};
  ASSERT_TRUE(dp_->lb4_slot_records().Update(7, rec).ok());
  EXPECT_EQ(FromPod(TcpToService(21100)).verdict, kTcShot);

  master->backend_id = 0;
  ASSERT_TRUE(dp_->lb4_services().Update(SvcKey(kClusterIp, 80, IPPROTO_TCP, 0), *master).ok());
  hits.clear();
  for (int i = 0; i < 60; ++i) {
    auto r = FromPod(TcpToService(21200 + i));
    ASSERT_EQ(r.verdict, kTcRedirect) << Describe(r.out);
    auto d = Decode(r.out);
    ASSERT_TRUE(d);
    hits[TcpBackendOf(*d)]++;
  }
  EXPECT_EQ(hits.size(), 3u) << "the slot entries decide again";
}

}  // namespace
}  // namespace sluice::testing
