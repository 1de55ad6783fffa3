// Packet-in/packet-out tests of sluice_from_pod (TC ingress of a pod's host-side veth) on the
// real program, with maps programmed through the production maps/ API.
#include <arpa/inet.h>

#include <cstring>

#include "gmock/gmock.h"
#include "support/fixture.h"

namespace sluice::testing {
namespace {

const Mac kPodAMac = ParseMac("02:00:00:00:0a:01");
const Mac kPodBMac = ParseMac("02:00:00:00:0b:01");
const Mac kHostAMac = ParseMac("02:aa:00:00:0a:02");
const Mac kHostBMac = ParseMac("02:aa:00:00:0b:02");
const Mac kBroadcast = ParseMac("ff:ff:ff:ff:ff:ff");
constexpr int kPodAIfindex = 1;  // lo: test_run receives on it
constexpr int kPodBIfindex = 4242;
const Mac kPodCMac = ParseMac("02:00:00:00:0c:01");
const Mac kHostCMac = ParseMac("02:aa:00:00:0c:02");
constexpr int kPodCIfindex = 4343;  // pod C has an ingress bandwidth limit

class PodEgressTest : public DatapathTest {
 protected:
  void SetUp() override {
    DatapathTest::SetUp();
    if (HasFatalFailure()) return;
    AddEndpoint("10.244.0.10", kPodAIfindex, kPodAMac, kHostAMac, 1);
    AddEndpoint("10.244.0.11", kPodBIfindex, kPodBMac, kHostBMac, 2);
    AddEndpoint("10.244.0.12", kPodCIfindex, kPodCMac, kHostCMac, 3, SLUICE_EP_F_INGRESS_SHAPED);
  }
  void AddEndpoint(const std::string& ip, int ifindex, const Mac& mac, const Mac& host_mac,
                   uint32_t id, uint32_t flags = 0) {
    ASSERT_TRUE(testing::AddEndpoint(*dp_, Ip4(ip), ifindex, mac, host_mac, id, flags).ok());
  }
  RunResult FromPod(const Bytes& in) { return Run(dp_->from_pod_fd(), in, kPodAIfindex); }
};

// Pod A (10.244.0.10, on lo) sends; pod B (10.244.0.11) is on the same node.
Packet FromA() { return Packet::Eth(kPodAMac, kHostAMac); }

std::vector<PacketCase> PodEgressCases() {
  return {
      {"ArpRequestForGatewayIsAnsweredWithHostMac",
       {{.in =
             Packet::Eth(kPodAMac, kBroadcast).Arp(1, kPodAMac, "10.244.0.10", Mac{}, "10.244.0.1"),
         .verdict = kTcRedirect,
         .out = {Packet::Eth(kHostAMac, kPodAMac)
                     .Arp(2, kHostAMac, "10.244.0.1", kPodAMac, "10.244.0.10")}}}},
      {"ArpReplyFromPodGoesToTheStackUnchanged",
       {{.in = FromA().Arp(2, kPodAMac, "10.244.0.10", kHostAMac, "10.244.0.1"),
         .verdict = kTcOk,
         .unchanged = true}}},
      {"GratuitousArpIsNotAnswered",
       {{.in = Packet::Eth(kPodAMac, kBroadcast)
                   .Arp(1, kPodAMac, "10.244.0.10", Mac{}, "10.244.0.10"),
         .verdict = kTcOk,
         .unchanged = true}}},
      {"ArpRequestFromForeignSenderIsDroppedAsSpoofed",
       {{.in =
             Packet::Eth(kPodAMac, kBroadcast).Arp(1, kPodAMac, "10.244.0.99", Mac{}, "10.244.0.1"),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_SPOOFED_SOURCE}}},
      {"SameNodePodIsReachedByRedirectPeerWithRewrittenL2AndTtl",
       {{.in = FromA().IPv4("10.244.0.10", "10.244.0.11", 64).TCP(40000, 8080).Payload("hello"),
         .verdict = kTcRedirect,
         .out = {Packet::Eth(kHostBMac, kPodBMac)
                     .IPv4("10.244.0.10", "10.244.0.11", 63)
                     .TCP(40000, 8080)
                     .Payload("hello")}}}},
      // bpf_redirect (to the veth's egress and qdisc), told apart from bpf_redirect_peer by the
      // mark that lets the veth's sluice_to_pod pass it (test_run cannot show the target).
      {"SameNodePodWithAnIngressLimitIsSentThroughItsHostVethMarkedAsJudged",
       {{.in = FromA().IPv4("10.244.0.10", "10.244.0.12", 64).TCP(40000, 8080).Payload("hello"),
         .verdict = kTcRedirect,
         .out = {Packet::Eth(kHostCMac, kPodCMac)
                     .IPv4("10.244.0.10", "10.244.0.12", 63)
                     .TCP(40000, 8080)
                     .Payload("hello")},
         .mark_out = SLUICE_SKB_MARK_TO_SHAPED_POD}}},
      {"SameNodePodWithoutALimitIsNotMarked",
       {{.in = FromA().IPv4("10.244.0.10", "10.244.0.11", 64).TCP(40000, 8080),
         .verdict = kTcRedirect,
         .out = {Packet::Eth(kHostBMac, kPodBMac)
                     .IPv4("10.244.0.10", "10.244.0.11", 63)
                     .TCP(40000, 8080)},
         .mark_out = 0}}},
      {"UdpToSameNodePodIsRedirected",
       {{.in = FromA().IPv4("10.244.0.10", "10.244.0.11").UDP(5353, 53).Payload("q"),
         .verdict = kTcRedirect,
         .out = {Packet::Eth(kHostBMac, kPodBMac)
                     .IPv4("10.244.0.10", "10.244.0.11", 63)
                     .UDP(5353, 53)
                     .Payload("q")}}}},
      {"TrafficToTheNodeContinuesIntoTheStackUnchanged",
       {{.in = FromA().IPv4("10.244.0.10", "192.168.1.1").TCP(40000, 80),
         .verdict = kTcOk,
         .unchanged = true}}},
      {"TrafficToTheOutsideContinuesIntoTheStackUnchanged",
       {{.in = FromA().IPv4("10.244.0.10", "198.51.100.7").TCP(40000, 80),
         .verdict = kTcOk,
         .unchanged = true}}},
      {"TrafficToAnotherNodesPodContinuesIntoTheStackUnchanged",
       {{.in = FromA().IPv4("10.244.0.10", "10.244.1.5").TCP(40000, 80),
         .verdict = kTcOk,
         .unchanged = true}}},
      {"SourceAddressNotOwnedByAnyPodIsDroppedAsSpoofed",
       {{.in = FromA().IPv4("10.244.0.77", "10.244.0.11").TCP(1, 2),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_SPOOFED_SOURCE}}},
      // 10.244.0.11 belongs to the pod on kPodBIfindex, not to the sending interface.
      {"AnotherPodsAddressSentFromThisInterfaceIsDroppedAsSpoofed",
       {{.in = FromA().IPv4("10.244.0.11", "10.244.0.10").UDP(1, 2),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_SPOOFED_SOURCE}}},
      {"ExpiringTtlToLocalPodIsDroppedWithReason",
       {{.in = FromA().IPv4("10.244.0.10", "10.244.0.11", 1).TCP(40000, 8080),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_TTL_EXCEEDED}}},
      {"Ipv6IsDroppedAsUnsupportedL3",
       {{.in = FromA().Ether(0x86dd).Payload(std::string(40, '\0')),
         .verdict = kTcShot,
         .drop = SLUICE_DROP_UNSUPPORTED_L3}}},
      // (test_run itself refuses frames too short for an IPv4 header, so the header length lies.)
      {"Ipv4HeaderShorterThanMinimumIsDroppedAsInvalid",
       {{.in =
             [](const Trail&) {
               Bytes b = FromA().IPv4("10.244.0.10", "10.244.0.11").UDP(1, 2).Build();
               b[14] = 0x44;
               return b;
             },
         .verdict = kTcShot,
         .drop = SLUICE_DROP_INVALID_PACKET}}},
  };
}

class PodEgressTable : public PodEgressTest, public ::testing::WithParamInterface<PacketCase> {};

TEST_P(PodEgressTable, Packet) { RunCase(GetParam()); }

INSTANTIATE_TEST_SUITE_P(SluiceFromPod, PodEgressTable, ::testing::ValuesIn(PodEgressCases()),
                         CaseName);

// Endpoints are read through their index (sluice_ep4_slot + sluice_ep4_rec) first, through
// sluice_ep4 when the index does not name them: a record that differs from the hash shows which
// one the program read.
TEST_F(PodEgressTest, EndpointsAreReadThroughTheirIndexAndElseThroughTheHash) {
  auto to = [](const std::string& dst) {
    return FromA().IPv4("10.244.0.10", dst, 64).TCP(40000, 8080).Payload("x").Build();
  };
  auto macs_of = [](const RunResult& r) {
    return r.out.size() >= 12 ? Bytes(r.out.begin(), r.out.begin() + 12) : Bytes{};
  };
  const Bytes b_macs = macs_of(FromPod(to("10.244.0.11")));
  ASSERT_EQ(Bytes(b_macs.begin(), b_macs.begin() + 6), Bytes(kPodBMac.begin(), kPodBMac.end()));

  // B's slot names its record: rewriting the record alone changes where the program sends.
  const uint32_t b = Ip4("10.244.0.11");
  auto ref = dp_->ep4_slots().Lookup(loader::EndpointTable::SlotOf(b));
  ASSERT_TRUE(ref.ok()) << ref.status();
  ASSERT_EQ(ref->addr, b);
  auto rec = dp_->ep4_records().Lookup(ref->rec);
  ASSERT_TRUE(rec.ok()) << rec.status();
  sluice_endpoint other = *rec;
  const Mac kOther = ParseMac("02:00:00:00:0c:01");
  std::memcpy(other.mac, kOther.data(), 6);
  ASSERT_TRUE(dp_->ep4_records().Update(ref->rec, other).ok());
  RunResult via_index = FromPod(to("10.244.0.11"));
  ASSERT_EQ(via_index.verdict, kTcRedirect);
  EXPECT_EQ(Bytes(via_index.out.begin(), via_index.out.begin() + 6),
            Bytes(kOther.begin(), kOther.end()));

  // With the slot free, sluice_ep4 answers (its entry still has B's MAC).
  ASSERT_TRUE(dp_->ep4_slots().Delete(loader::EndpointTable::SlotOf(b)).ok());
  EXPECT_EQ(macs_of(FromPod(to("10.244.0.11"))), b_macs);

  // The sender is checked through the index too: A's slot naming a record of another
  // interface makes A's packets spoofed, though sluice_ep4 has A on this one.
  const uint32_t a = Ip4("10.244.0.10");
  auto a_ref = dp_->ep4_slots().Lookup(loader::EndpointTable::SlotOf(a));
  ASSERT_TRUE(a_ref.ok()) << a_ref.status();
  auto a_rec = dp_->ep4_records().Lookup(a_ref->rec);
  ASSERT_TRUE(a_rec.ok());
  sluice_endpoint moved = *a_rec;
  moved.ifindex = kPodBIfindex;
  ASSERT_TRUE(dp_->ep4_records().Update(a_ref->rec, moved).ok());
  RunResult spoofed = FromPod(to("10.244.0.11"));
  EXPECT_EQ(spoofed.verdict, kTcShot);
  EXPECT_EQ(Drops(SLUICE_DROP_SPOOFED_SOURCE, SLUICE_DROP_DIR_EGRESS), 1u);
}

// An address whose slot names another endpoint (a pod CIDR wider than the index) is reached
// through sluice_ep4, with its own MACs.
// sluice_to_pod on the limited pod's veth: a packet the datapath sent there, judged already,
// passes untouched with its mark cleared.
TEST_F(PodEgressTest, ToPodPassesAPacketMarkedJudgedAndClearsTheMark) {
  const Bytes in = Packet::Eth(kHostCMac, kPodCMac)
                       .IPv4("10.244.0.10", "10.244.0.12", 63)
                       .TCP(40000, 8080)
                       .Build();
  RunResult marked = Run(dp_->to_pod_fd(), in, kPodAIfindex, SLUICE_SKB_MARK_TO_SHAPED_POD);
  EXPECT_EQ(marked.verdict, kTcOk);
  EXPECT_EQ(marked.mark, 0u);
  EXPECT_EQ(marked.out, in);
}

TEST_F(PodEgressTest, AnEndpointWhoseSlotIsTakenIsReachedThroughTheHash) {
  const Mac kCMac = ParseMac("02:00:00:00:0c:01");
  const Mac kHostCMac = ParseMac("02:aa:00:00:0c:02");
  // 10.244.16.11 shares its slot with 10.244.0.11 (the low 12 bits).
  ASSERT_EQ(loader::EndpointTable::SlotOf(Ip4("10.244.16.11")),
            loader::EndpointTable::SlotOf(Ip4("10.244.0.11")));
  AddEndpoint("10.244.16.11", 4343, kCMac, kHostCMac, 3);
  EXPECT_EQ(dp_->endpoint_table().stats().unindexed, 1u);
  for (const auto& [dst, mac] : {std::pair{"10.244.16.11", kCMac}, {"10.244.0.11", kPodBMac}}) {
    RunResult r = FromPod(FromA().IPv4("10.244.0.10", dst, 64).UDP(5353, 53).Build());
    ASSERT_EQ(r.verdict, kTcRedirect) << dst;
    EXPECT_EQ(Bytes(r.out.begin(), r.out.begin() + 6), Bytes(mac.begin(), mac.end())) << dst;
  }
}

// Not a packet case: the counters' read-out by name, packets and bytes over two drops.
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

// sluice_forward: one count per packet a program passes or redirects, under its direction, with
// the length it hands on; a drop counts only as a drop, under the program's direction.
TEST_F(PodEgressTest, ForwardedAndDroppedPacketsAreCountedPerDirection) {
  auto to_b = FromA().IPv4("10.244.0.10", "10.244.0.11", 64).TCP(40000, 8080).Payload("hi").Build();
  auto spoofed = FromA().IPv4("10.244.0.99", "10.244.0.11").TCP(40000, 8080).Build();
  // Into pod A through its host-side veth's egress: the node's stack delivering to the pod.
  auto to_a =
      Packet::Eth(kHostAMac, kPodAMac).IPv4("10.0.0.1", "10.244.0.10").UDP(53, 4000).Build();
  for (int i = 0; i < 3; ++i) ASSERT_EQ(FromPod(to_b).verdict, kTcRedirect);
  ASSERT_EQ(FromPod(spoofed).verdict, kTcShot);
  ASSERT_EQ(Run(dp_->to_pod_fd(), to_a, kPodAIfindex).verdict, kTcOk);
  ASSERT_EQ(Run(dp_->to_pod_fd(), to_a, kPodAIfindex).verdict, kTcOk);

  sluice_fwd_count egress = Forwarded(SLUICE_FWD_POD_EGRESS);
  EXPECT_EQ(egress.packets, 3u);
  EXPECT_EQ(egress.bytes, 3 * to_b.size());  // redirect_peer keeps the length
  sluice_fwd_count ingress = Forwarded(SLUICE_FWD_POD_INGRESS);
  EXPECT_EQ(ingress.packets, 2u);
  EXPECT_EQ(ingress.bytes, 2 * to_a.size());
  EXPECT_EQ(Forwarded(SLUICE_FWD_NET_INGRESS).packets, 0u);
  EXPECT_EQ(Forwarded(SLUICE_FWD_NET_EGRESS).packets, 0u);
  EXPECT_EQ(Drops(SLUICE_DROP_SPOOFED_SOURCE, SLUICE_DROP_DIR_EGRESS), 1u);
  EXPECT_EQ(Drops(SLUICE_DROP_SPOOFED_SOURCE, SLUICE_DROP_DIR_INGRESS), 0u);

  // The totals readers (sluicectl status and drops, the metrics) see the same numbers.
  auto drops = dp_->DropTotals();
  ASSERT_TRUE(drops.ok()) << drops.status();
  for (const auto& t : *drops) {
    if (t.reason != SLUICE_DROP_SPOOFED_SOURCE) continue;
    EXPECT_EQ(t.packets, 1u);
    EXPECT_EQ(t.dir_packets[SLUICE_DROP_DIR_EGRESS], 1u);
    EXPECT_EQ(t.dir_bytes[SLUICE_DROP_DIR_EGRESS], spoofed.size());
  }
  auto fwd = dp_->ForwardTotals();
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  ASSERT_EQ(fwd->size(), static_cast<size_t>(SLUICE_FWD_DIR_MAX));
  EXPECT_STREQ((*fwd)[SLUICE_FWD_POD_EGRESS].name, "pod_egress");
  EXPECT_EQ((*fwd)[SLUICE_FWD_POD_EGRESS].packets, 3u);
  EXPECT_EQ((*fwd)[SLUICE_FWD_POD_INGRESS].bytes, 2 * to_a.size());
}

}  // namespace
}  // namespace sluice::testing
