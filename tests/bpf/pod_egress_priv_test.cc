// Packet-in/packet-out tests of sluice_from_pod (TC ingress of a pod's host-side veth) on the
// real program, with maps programmed through the production maps/ API.
#include <arpa/inet.h>

#include "support/fixture.h"
#include "gmock/gmock.h"

namespace sluice::testing {
namespace {

const Mac kPodAMac = ParseMac("02:00:00:00:0a:01");
const Mac kPodBMac = ParseMac("02:00:00:00:0b:01");
const Mac kHostAMac = ParseMac("02:aa:00:00:0a:02");
const Mac kHostBMac = ParseMac("02:aa:00:00:0b:02");
const Mac kBroadcast = ParseMac("ff:ff:ff:ff:ff:ff");
constexpr int kPodAIfindex = 1;  // lo: test_run receives on it
constexpr int kPodBIfindex = 4242;

class PodEgressTest : public DatapathTest {
 protected:
  void SetUp() override {
    DatapathTest::SetUp();
    if (HasFatalFailure()) return;
    AddEndpoint("10.244.0.10", kPodAIfindex, kPodAMac, kHostAMac, 1);
    AddEndpoint("10.244.0.11", kPodBIfindex, kPodBMac, kHostBMac, 2);
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
  RunResult FromPod(const Bytes& in) { return Run(dp_->from_pod_fd(), in, kPodAIfindex); }
};

TEST_F(PodEgressTest, ArpRequestForGatewayIsAnsweredWithHostMac) {
  auto in = Packet::Eth(kPodAMac, kBroadcast)
                .Arp(1, kPodAMac, "10.244.0.10", Mac{}, "10.244.0.1")
                .Build();
  auto r = FromPod(in);
  ASSERT_EQ(r.verdict, kTcRedirect) << Describe(r.out);
  auto d = Decode(r.out);
  ASSERT_TRUE(d) << Describe(r.out);
  EXPECT_EQ(d->ethertype, 0x0806);
  EXPECT_EQ(d->arp_op, 2);
  EXPECT_EQ(d->eth_dst, kPodAMac);
  EXPECT_EQ(d->eth_src, kHostAMac);
  EXPECT_EQ(d->arp_sha, kHostAMac);
  EXPECT_EQ(d->arp_sip, Ip4("10.244.0.1"));
  EXPECT_EQ(d->arp_tha, kPodAMac);
  EXPECT_EQ(d->arp_tip, Ip4("10.244.0.10"));
}

TEST_F(PodEgressTest, ArpReplyFromPodGoesToTheStackUnchanged) {
  auto in = Packet::Eth(kPodAMac, kHostAMac)
                .Arp(2, kPodAMac, "10.244.0.10", kHostAMac, "10.244.0.1")
                .Build();
  auto r = FromPod(in);
  EXPECT_EQ(r.verdict, kTcOk);
  EXPECT_EQ(r.out, in);
}

TEST_F(PodEgressTest, GratuitousArpIsNotAnswered) {
  auto in = Packet::Eth(kPodAMac, kBroadcast)
                .Arp(1, kPodAMac, "10.244.0.10", Mac{}, "10.244.0.10")
                .Build();
  auto r = FromPod(in);
  EXPECT_EQ(r.verdict, kTcOk);
  EXPECT_EQ(r.out, in);
}

TEST_F(PodEgressTest, ArpRequestFromForeignSenderIsDroppedAsSpoofed) {
  auto in = Packet::Eth(kPodAMac, kBroadcast)
                .Arp(1, kPodAMac, "10.244.0.99", Mac{}, "10.244.0.1")
                .Build();
  auto before = Drops(SLUICE_DROP_SPOOFED_SOURCE);
  EXPECT_EQ(FromPod(in).verdict, kTcShot);
  EXPECT_EQ(Drops(SLUICE_DROP_SPOOFED_SOURCE), before + 1);
}

TEST_F(PodEgressTest, SameNodePodIsReachedByRedirectPeerWithRewrittenL2AndTtl) {
  auto in = Packet::Eth(kPodAMac, kHostAMac)
                .IPv4("10.244.0.10", "10.244.0.11", 64)
                .TCP(40000, 8080)
                .Payload("hello")
                .Build();
  auto r = FromPod(in);
  ASSERT_EQ(r.verdict, kTcRedirect) << Describe(r.out);
  auto d = Decode(r.out);
  ASSERT_TRUE(d) << Describe(r.out);
  EXPECT_EQ(d->eth_dst, kPodBMac);
  EXPECT_EQ(d->eth_src, kHostBMac);
  EXPECT_EQ(d->ttl, 63);
  EXPECT_TRUE(d->ip_csum_ok) << Describe(r.out);
  EXPECT_TRUE(d->l4_csum_ok) << Describe(r.out);
  EXPECT_EQ(d->ip_src, Ip4("10.244.0.10"));
  EXPECT_EQ(d->ip_dst, Ip4("10.244.0.11"));
  EXPECT_EQ(d->sport, 40000);
  EXPECT_EQ(d->dport, 8080);
  EXPECT_EQ(d->payload, "hello");
}

TEST_F(PodEgressTest, UdpToSameNodePodIsRedirected) {
  auto in = Packet::Eth(kPodAMac, kHostAMac)
                .IPv4("10.244.0.10", "10.244.0.11")
                .UDP(5353, 53)
                .Payload("q")
                .Build();
  auto r = FromPod(in);
  ASSERT_EQ(r.verdict, kTcRedirect);
  auto d = Decode(r.out);
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->ip_csum_ok);
  EXPECT_TRUE(d->l4_csum_ok);
}

TEST_F(PodEgressTest, TrafficLeavingTheNodeContinuesIntoTheStackUnchanged) {
  for (const char* dst : {"192.168.1.1" /* the node */, "198.51.100.7" /* outside */,
                          "10.244.1.5" /* another node's pod */}) {
    auto in =
        Packet::Eth(kPodAMac, kHostAMac).IPv4("10.244.0.10", dst).TCP(40000, 80).Build();
    auto r = FromPod(in);
    EXPECT_EQ(r.verdict, kTcOk) << dst;
    EXPECT_EQ(r.out, in) << dst << ": " << Describe(r.out);
  }
}

TEST_F(PodEgressTest, SourceAddressNotOwnedByAnyPodIsDroppedAsSpoofed) {
  auto in =
      Packet::Eth(kPodAMac, kHostAMac).IPv4("10.244.0.77", "10.244.0.11").TCP(1, 2).Build();
  auto before = Drops(SLUICE_DROP_SPOOFED_SOURCE);
  EXPECT_EQ(FromPod(in).verdict, kTcShot);
  EXPECT_EQ(Drops(SLUICE_DROP_SPOOFED_SOURCE), before + 1);
}

TEST_F(PodEgressTest, AnotherPodsAddressSentFromThisInterfaceIsDroppedAsSpoofed) {
  // 10.244.0.11 belongs to the pod on kPodBIfindex, not to the sending interface.
  auto in =
      Packet::Eth(kPodAMac, kHostAMac).IPv4("10.244.0.11", "10.244.0.10").UDP(1, 2).Build();
  auto before = Drops(SLUICE_DROP_SPOOFED_SOURCE);
  EXPECT_EQ(FromPod(in).verdict, kTcShot);
  EXPECT_EQ(Drops(SLUICE_DROP_SPOOFED_SOURCE), before + 1);
}

TEST_F(PodEgressTest, ExpiringTtlToLocalPodIsDroppedWithReason) {
  auto in = Packet::Eth(kPodAMac, kHostAMac)
                .IPv4("10.244.0.10", "10.244.0.11", 1)
                .TCP(40000, 8080)
                .Build();
  auto before = Drops(SLUICE_DROP_TTL_EXCEEDED);
  EXPECT_EQ(FromPod(in).verdict, kTcShot);
  EXPECT_EQ(Drops(SLUICE_DROP_TTL_EXCEEDED), before + 1);
}

TEST_F(PodEgressTest, Ipv6IsDroppedAsUnsupportedL3) {
  auto in = Packet::Eth(kPodAMac, kHostAMac).Ether(0x86dd).Payload(std::string(40, '\0')).Build();
  auto before = Drops(SLUICE_DROP_UNSUPPORTED_L3);
  EXPECT_EQ(FromPod(in).verdict, kTcShot);
  EXPECT_EQ(Drops(SLUICE_DROP_UNSUPPORTED_L3), before + 1);
}

TEST_F(PodEgressTest, Ipv4HeaderShorterThanMinimumIsDroppedAsInvalid) {
  // (test_run itself refuses frames too short for an IPv4 header, so the header length lies.)
  auto in =
      Packet::Eth(kPodAMac, kHostAMac).IPv4("10.244.0.10", "10.244.0.11").UDP(1, 2).Build();
  in[14] = 0x44;
  auto before = Drops(SLUICE_DROP_INVALID_PACKET);
  EXPECT_EQ(FromPod(in).verdict, kTcShot);
  EXPECT_EQ(Drops(SLUICE_DROP_INVALID_PACKET), before + 1);
}

TEST_F(PodEgressTest, DropCountersAreReadableByReasonName) {
  auto in = Packet::Eth(kPodAMac, kHostAMac).Ether(0x86dd).Payload(std::string(40, '\0')).Build();
  FromPod(in);
  FromPod(in);
  auto totals = dp_->DropTotals();
  ASSERT_TRUE(totals.ok()) << totals.status();
  bool found = false;
  for (const auto& t : *totals) {
    if (std::string(t.name) == "unsupported_l3") {
      found = true;
      EXPECT_EQ(t.packets, 2u);
      EXPECT_EQ(t.bytes, 2 * in.size());
    }
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace sluice::testing
