// Packet-in/packet-out tests of service load balancing in sluice_from_pod: ClusterIP DNAT onto a
// backend, conntrack keeping flows on their backend, and reverse NAT of the backends' replies.
// Services are programmed through the production maps/ API in the agent's hitless order.
#include <arpa/inet.h>

#include <map>
#include <vector>

#include "absl/strings/str_format.h"

#include "support/fixture.h"
#include "gmock/gmock.h"

namespace sluice::testing {
namespace {

const Mac kClientMac = ParseMac("02:00:00:00:0a:01");
const Mac kClientHostMac = ParseMac("02:aa:00:00:0a:02");
constexpr const char* kClient = "10.244.0.10";
constexpr const char* kClusterIp = "10.96.0.10";
constexpr const char* kRejectIp = "10.96.0.20";
// test_run only receives on lo (ifindex 1), and a pod may only send from its own interface, so
// every pod that sends in these tests lives on ifindex 1.
constexpr int kIfindex = 1;

struct BackendSpec {
  uint32_t id;
  const char* addr;
  uint16_t port;
  uint8_t proto;
};
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
  }

  void AddEndpoint(const std::string& ip, const Mac& mac, const Mac& host_mac, uint32_t id) {
    sluice_ep4_key key{Ip4(ip)};
    sluice_endpoint ep{};
    ep.ifindex = kIfindex;
    std::memcpy(ep.mac, mac.data(), 6);
    std::memcpy(ep.host_mac, host_mac.data(), 6);
    ep.endpoint_id = id;
    ASSERT_TRUE(dp_->endpoints().Update(key, ep).ok());
  }

  static sluice_lb4_key SvcKey(const std::string& addr, uint16_t port, uint8_t proto,
                               uint16_t slot) {
    sluice_lb4_key k{};
    k.addr = Ip4(addr);
    k.dport = htons(port);
    k.proto = proto;
    k.scope = SLUICE_LB_SCOPE_EXTERNAL;
    k.backend_slot = slot;
    return k;
  }

  // Backends, then slots, then the master entry, as the agent writes them.
  void SetService(const std::string& addr, uint16_t port, uint8_t proto, uint32_t rev_nat_id,
                  const std::vector<BackendSpec>& backends, uint16_t flags = 0) {
    for (const auto& b : backends) {
      sluice_lb4_backend be{};
      be.addr = Ip4(b.addr);
      be.port = htons(b.port);
      be.proto = b.proto;
      ASSERT_TRUE(dp_->lb4_backends().Update(b.id, be).ok());
    }
    for (size_t i = 0; i < backends.size(); ++i) {
      sluice_lb4_service slot{};
      slot.backend_id = backends[i].id;
      ASSERT_TRUE(
          dp_->lb4_services().Update(SvcKey(addr, port, proto, i + 1), slot).ok());
    }
    sluice_lb4_revnat rnat{};
    rnat.addr = Ip4(addr);
    rnat.port = htons(port);
    ASSERT_TRUE(dp_->lb4_revnat().Update(rev_nat_id, rnat).ok());
    sluice_lb4_service master{};
    master.count = backends.size();
    master.flags = flags;
    master.rev_nat_id = rev_nat_id;
    ASSERT_TRUE(dp_->lb4_services().Update(SvcKey(addr, port, proto, 0), master).ok());
  }

  RunResult FromPod(const Bytes& in) { return Run(dp_->from_pod_fd(), in, kIfindex); }

  Bytes TcpToService(uint16_t sport, uint8_t flags = kTcpSyn) {
    return Packet::Eth(kClientMac, kClientHostMac)
        .IPv4(kClient, kClusterIp)
        .TCP(sport, 80, flags)
        .Payload("GET /")
        .Build();
  }

  std::optional<sluice_ct4_entry> Ct(const std::string& saddr, const std::string& daddr,
                                     uint16_t sport, uint16_t dport, uint8_t proto,
                                     uint8_t dir) {
    sluice_ct4_key k{};
    k.saddr = Ip4(saddr);
    k.daddr = Ip4(daddr);
    k.sport = htons(sport);
    k.dport = htons(dport);
    k.proto = proto;
    k.dir = dir;
    auto e = dp_->ct4().Lookup(k);
    if (!e.ok()) return std::nullopt;
    return *e;
  }

  // The TCP backend a decoded packet was sent to, 0 if none.
  static uint32_t TcpBackendOf(const Decoded& d) {
    for (const auto& b : kTcpBackends) {
      if (d.ip_dst == Ip4(b.addr) && d.dport == b.port) return b.id;
    }
    for (const auto& b : kOtherTcpBackends) {
      if (d.ip_dst == Ip4(b.addr) && d.dport == b.port) return b.id;
    }
    return 0;
  }
};

TEST_F(LbTest, TcpSynToClusterIpIsDnatedToABackendWithValidChecksumsAndTracked) {
  auto r = FromPod(TcpToService(40000));
  ASSERT_EQ(r.verdict, kTcRedirect) << Describe(r.out);
  auto d = Decode(r.out);
  ASSERT_TRUE(d) << Describe(r.out);
  uint32_t id = TcpBackendOf(*d);
  ASSERT_THAT(id, ::testing::AnyOf(1u, 2u, 3u)) << Describe(r.out);
  EXPECT_TRUE(d->ip_csum_ok) << Describe(r.out);
  EXPECT_TRUE(d->l4_csum_ok) << Describe(r.out);
  EXPECT_EQ(d->ip_src, Ip4(kClient));
  EXPECT_EQ(d->sport, 40000);
  EXPECT_EQ(d->ttl, 63);
  EXPECT_EQ(d->payload, "GET /");
  // Same-node backend: redirected to its pod with the pod's L2.
  EXPECT_EQ(d->eth_dst, PodMac(20 + id));
  EXPECT_EQ(d->eth_src, HostMac(20 + id));

  auto fwd = Ct(kClient, kClusterIp, 40000, 80, IPPROTO_TCP, SLUICE_CT_DIR_FORWARD);
  ASSERT_TRUE(fwd);
  EXPECT_EQ(fwd->backend_id, id);
  EXPECT_EQ(fwd->rev_nat_id, 1u);
  auto rev = Ct(kTcpBackends[id - 1].addr, kClient, 8080, 40000, IPPROTO_TCP,
                SLUICE_CT_DIR_REPLY);
  ASSERT_TRUE(rev);
  EXPECT_EQ(rev->backend_id, id);
  EXPECT_EQ(rev->rev_nat_id, 1u);
}

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

TEST_F(LbTest, ReplyFromBackendIsReverseTranslatedToTheClusterIp) {
  auto fwd = FromPod(TcpToService(40003));
  ASSERT_EQ(fwd.verdict, kTcRedirect);
  auto df = Decode(fwd.out);
  ASSERT_TRUE(df);
  uint32_t id = TcpBackendOf(*df);
  ASSERT_NE(id, 0u);
  const auto& be = kTcpBackends[id - 1];

  auto reply = Packet::Eth(PodMac(20 + id), HostMac(20 + id))
                   .IPv4(be.addr, kClient)
                   .TCP(8080, 40003, kTcpSyn | kTcpAck)
                   .Payload("200 OK")
                   .Build();
  auto r = FromPod(reply);
  ASSERT_EQ(r.verdict, kTcRedirect) << Describe(r.out);
  auto d = Decode(r.out);
  ASSERT_TRUE(d) << Describe(r.out);
  EXPECT_EQ(d->ip_src, Ip4(kClusterIp));
  EXPECT_EQ(d->sport, 80);
  EXPECT_EQ(d->ip_dst, Ip4(kClient));
  EXPECT_EQ(d->dport, 40003);
  EXPECT_TRUE(d->ip_csum_ok) << Describe(r.out);
  EXPECT_TRUE(d->l4_csum_ok) << Describe(r.out);
  EXPECT_EQ(d->eth_dst, kClientMac);
  EXPECT_EQ(d->payload, "200 OK");
}

TEST_F(LbTest, PacketsFromABackendOutsideATrackedFlowAreNotTranslated) {
  auto in = Packet::Eth(PodMac(21), HostMac(21))
                .IPv4("10.244.0.21", kClient)
                .TCP(8080, 40999, kTcpSyn | kTcpAck)
                .Build();
  auto r = FromPod(in);
  ASSERT_EQ(r.verdict, kTcRedirect);
  auto d = Decode(r.out);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->ip_src, Ip4("10.244.0.21"));
  EXPECT_EQ(d->sport, 8080);
}

TEST_F(LbTest, UdpToClusterIpIsDnatedAndItsReplyReverseTranslated) {
  for (bool zero_csum : {false, true}) {
    uint16_t sport = zero_csum ? 5001 : 5000;
    auto in = Packet::Eth(kClientMac, kClientHostMac)
                  .IPv4(kClient, kClusterIp)
                  .UDP(sport, 53, zero_csum)
                  .Payload("query")
                  .Build();
    auto r = FromPod(in);
    ASSERT_EQ(r.verdict, kTcRedirect) << Describe(r.out);
    auto d = Decode(r.out);
    ASSERT_TRUE(d);
    EXPECT_THAT(d->ip_dst, ::testing::AnyOf(Ip4("10.244.0.21"), Ip4("10.244.0.22")));
    EXPECT_EQ(d->dport, 5353);
    EXPECT_TRUE(d->ip_csum_ok) << Describe(r.out);
    EXPECT_TRUE(d->l4_csum_ok) << Describe(r.out);
    if (zero_csum) {
      EXPECT_EQ(d->l4_csum, 0) << "a zero UDP checksum stays 'none'";
    }
    uint32_t id = d->ip_dst == Ip4("10.244.0.21") ? 11 : 12;
    auto ct = Ct(kClient, kClusterIp, sport, 53, IPPROTO_UDP, SLUICE_CT_DIR_FORWARD);
    ASSERT_TRUE(ct);
    EXPECT_EQ(ct->backend_id, id);
    EXPECT_EQ(ct->rev_nat_id, 2u);

    auto reply = Packet::Eth(kClientMac, kClientHostMac)
                     .IPv4(FormatIp4(d->ip_dst), kClient)
                     .UDP(5353, sport, zero_csum)
                     .Payload("answer")
                     .Build();
    auto rr = FromPod(reply);
    ASSERT_EQ(rr.verdict, kTcRedirect) << Describe(rr.out);
    auto dr = Decode(rr.out);
    ASSERT_TRUE(dr);
    EXPECT_EQ(dr->ip_src, Ip4(kClusterIp));
    EXPECT_EQ(dr->sport, 53);
    EXPECT_EQ(dr->dport, sport);
    EXPECT_TRUE(dr->ip_csum_ok) << Describe(rr.out);
    EXPECT_TRUE(dr->l4_csum_ok) << Describe(rr.out);
    EXPECT_EQ(dr->payload, "answer");
  }
}

// Choice: a port the ClusterIP does not define is not a frontend; the packet continues into the
// stack unchanged (where the node's routing decides, as for any other address).
TEST_F(LbTest, PortNotDefinedOnTheClusterIpPassesUntouched) {
  for (auto in : {Packet::Eth(kClientMac, kClientHostMac)
                      .IPv4(kClient, kClusterIp)
                      .TCP(40010, 443)
                      .Build(),
                  Packet::Eth(kClientMac, kClientHostMac)
                      .IPv4(kClient, kClusterIp)
                      .UDP(40010, 80)  // TCP-only port
                      .Build()}) {
    auto r = FromPod(in);
    EXPECT_EQ(r.verdict, kTcOk);
    EXPECT_EQ(r.out, in) << Describe(r.out);
  }
  auto n = dp_->ct4().Count();
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0u);
}

TEST_F(LbTest, ServiceWithoutBackendsIsDroppedWithReason) {
  auto in = Packet::Eth(kClientMac, kClientHostMac).IPv4(kClient, kRejectIp).TCP(40020, 80).Build();
  auto before = Drops(SLUICE_DROP_SERVICE_NO_BACKEND);
  EXPECT_EQ(FromPod(in).verdict, kTcShot);
  EXPECT_EQ(Drops(SLUICE_DROP_SERVICE_NO_BACKEND), before + 1);
  EXPECT_STREQ(sluice_drop_reason_name(SLUICE_DROP_SERVICE_NO_BACKEND), "service_no_backend");
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

TEST(LbMapAbi, LayoutsArePinned) {
  EXPECT_EQ(sizeof(sluice_ct4_key), 16u);
  EXPECT_EQ(sizeof(sluice_ct4_entry), 32u);
}

}  // namespace
}  // namespace sluice::testing
