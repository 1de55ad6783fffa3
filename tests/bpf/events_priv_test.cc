// The flow monitor in the datapath (bpf/lib/events.h): what the real programs put into the
// sluice_events ring buffer for drops, policy verdicts, service translations and closing TCP
// flows, nothing while sluice_monitor is off, and the per-CPU token bucket counting what it
// refuses. The ring buffer is drained with libbpf's ring_buffer, as the agent does.
#include <arpa/inet.h>
#include <bpf/libbpf.h>
#include <netinet/in.h>

#include <cstring>
#include <vector>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "support/fixture.h"

namespace sluice::testing {
namespace {

const Mac kPodMac = ParseMac("02:00:00:00:0a:01");
const Mac kHostMac = ParseMac("02:aa:00:00:0a:02");
const Mac kPodBMac = ParseMac("02:00:00:00:0b:01");
const Mac kHostBMac = ParseMac("02:aa:00:00:0b:02");
constexpr int kIfindex = 1;  // test_run receives on lo
constexpr uint32_t kEpA = 7, kEpB = 8;
constexpr const char* kA = "10.244.0.10";
constexpr const char* kB = "10.244.0.11";
constexpr const char* kStranger = "10.244.0.99";  // no endpoint owns it: spoofed_source
constexpr const char* kClusterIp = "10.96.0.10";
constexpr uint32_t kRevNatId = 42;
const std::vector<LbBackendSpec> kBackends = {{1, "10.244.0.21", 8080, IPPROTO_TCP},
                                              {2, "10.244.0.22", 8080, IPPROTO_TCP}};

std::vector<sluice_event> Drain(int ringbuf_fd) {
  std::vector<sluice_event> got;
  auto cb = [](void* ctx, void* data, size_t size) -> int {
    auto* out = static_cast<std::vector<sluice_event>*>(ctx);
    sluice_event e{};
    std::memcpy(&e, data, std::min(size, sizeof(e)));
    out->push_back(e);
    return 0;
  };
  struct ring_buffer* rb = ring_buffer__new(ringbuf_fd, cb, &got, nullptr);
  EXPECT_NE(rb, nullptr) << "ring_buffer__new: " << std::strerror(errno);
  if (rb) {
    EXPECT_GE(ring_buffer__consume(rb), 0);
    ring_buffer__free(rb);
  }
  return got;
}

class EventsTest : public DatapathTest {
 protected:
  void SetUp() override {
    DatapathTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_TRUE(AddEndpoint(*dp_, Ip4(kA), kIfindex, kPodMac, kHostMac, kEpA).ok());
    ASSERT_TRUE(AddEndpoint(*dp_, Ip4(kB), 4242, kPodBMac, kHostBMac, kEpB).ok());
    // Anything a fixture left in the ring buffer is not this test's.
    Drain(dp_->events_fd());
  }
  void Monitor(uint32_t events, uint32_t rate = 0, uint32_t burst = 0, uint32_t sample = 0) {
    sluice_monitor_config cfg{};
    cfg.events = events;
    cfg.rate = rate;
    cfg.burst = burst;
    cfg.sample = sample;
    ASSERT_TRUE(dp_->monitor_config().Update(0, cfg).ok());
  }
  sluice_monitor_cpu CpuTotals() {
    sluice_monitor_cpu sum{};
    auto per_cpu = dp_->monitor_cpu().Lookup(0);
    EXPECT_TRUE(per_cpu.ok());
    if (!per_cpu.ok()) return sum;
    for (const auto& c : *per_cpu) {
      sum.emitted += c.emitted;
      sum.lost_rate += c.lost_rate;
      sum.lost_full += c.lost_full;
    }
    return sum;
  }
  int SendSpoofed(uint16_t sport = 40000) {
    return Run(dp_->from_pod_fd(),
               Packet::Eth(kPodMac, kHostMac).IPv4(kStranger, kB).TCP(sport, 8080).Build(),
               kIfindex)
        .verdict;
  }
};

constexpr uint32_t Bit(int type) { return 1u << type; }

TEST_F(EventsTest, DropEmitsOneEventWithReasonInterfaceAndTuple) {
  Monitor(Bit(SLUICE_EVENT_DROP));
  ASSERT_EQ(SendSpoofed(), kTcShot);
  auto events = Drain(dp_->events_fd());
  ASSERT_EQ(events.size(), 1u);
  const sluice_event& e = events[0];
  EXPECT_EQ(e.type, SLUICE_EVENT_DROP);
  EXPECT_EQ(e.verdict, SLUICE_VERDICT_DROPPED);
  EXPECT_EQ(e.reason, SLUICE_DROP_SPOOFED_SOURCE);
  EXPECT_EQ(e.ifindex, static_cast<uint32_t>(kIfindex));
  EXPECT_EQ(e.family, 4);
  EXPECT_EQ(e.saddr[0], Ip4(kStranger));
  EXPECT_EQ(e.daddr[0], Ip4(kB));
  EXPECT_EQ(ntohs(e.sport), 40000);
  EXPECT_EQ(ntohs(e.dport), 8080);
  EXPECT_EQ(e.proto, IPPROTO_TCP);
  EXPECT_EQ(e.tcp_flags, kTcpSyn);
  EXPECT_GT(e.len, 0u);
  EXPECT_NE(e.ts_ns, 0u);
  EXPECT_EQ(CpuTotals().emitted, 1u);
}

TEST_F(EventsTest, NothingIsEmittedWhileTheMonitorIsOff) {
  Monitor(0);
  ASSERT_EQ(SendSpoofed(), kTcShot);
  EXPECT_TRUE(Drain(dp_->events_fd()).empty());
  EXPECT_EQ(Drops(SLUICE_DROP_SPOOFED_SOURCE), 1u);  // the counter never depends on the monitor
  sluice_monitor_cpu c = CpuTotals();
  EXPECT_EQ(c.emitted, 0u);
  EXPECT_EQ(c.lost_rate, 0u);
}

TEST_F(EventsTest, DropsAreNotReportedWhenOnlyOtherTypesAreOn) {
  Monitor(Bit(SLUICE_EVENT_TRANSLATE) | Bit(SLUICE_EVENT_POLICY));
  ASSERT_EQ(SendSpoofed(), kTcShot);
  EXPECT_TRUE(Drain(dp_->events_fd()).empty());
}

TEST_F(EventsTest, TokenBucketEmitsItsBurstAndCountsTheRestAsLost) {
  // One token a second: within this test the bucket only has its burst of 3.
  Monitor(Bit(SLUICE_EVENT_DROP), /*rate=*/1, /*burst=*/3);
  for (int i = 0; i < 10; ++i) ASSERT_EQ(SendSpoofed(40000 + i), kTcShot);
  auto events = Drain(dp_->events_fd());
  EXPECT_EQ(events.size(), 3u);
  sluice_monitor_cpu c = CpuTotals();
  EXPECT_EQ(c.emitted, 3u);
  EXPECT_EQ(c.lost_rate, 7u);
  EXPECT_EQ(Drops(SLUICE_DROP_SPOOFED_SOURCE), 10u);
}

TEST_F(EventsTest, PolicyDenialIsOneEventWithEndpointAndDirection) {
  sluice_policy_ep_entry pep{};
  pep.identity = 301;
  pep.flags = SLUICE_POLICY_EP_F_INGRESS;
  ASSERT_TRUE(dp_->policy_ep().Update(kEpB, pep).ok());
  Monitor(SLUICE_MON_EVENTS_ALL);
  ASSERT_EQ(Run(dp_->from_pod_fd(),
                Packet::Eth(kPodMac, kHostMac).IPv4(kA, kB).TCP(40000, 8080).Build(), kIfindex)
                .verdict,
            kTcShot);
  auto events = Drain(dp_->events_fd());
  ASSERT_EQ(events.size(), 1u) << "the drop is reported once, by the policy point";
  const sluice_event& e = events[0];
  EXPECT_EQ(e.type, SLUICE_EVENT_POLICY);
  EXPECT_EQ(e.verdict, SLUICE_VERDICT_DROPPED);
  EXPECT_EQ(e.reason, SLUICE_DROP_POLICY_DENIED);
  EXPECT_EQ(e.policy_dir, SLUICE_POLICY_INGRESS);
  EXPECT_EQ(e.id, kEpB);
  EXPECT_EQ(e.flags & SLUICE_EVENT_F_ENFORCED, SLUICE_EVENT_F_ENFORCED);
  EXPECT_EQ(e.saddr[0], Ip4(kA));
  EXPECT_EQ(e.daddr[0], Ip4(kB));
  EXPECT_EQ(ntohs(e.dport), 8080);
}

TEST_F(EventsTest, PolicyAllowsANewFlowOnceAndNotItsNextPackets) {
  sluice_policy_ep_entry pep{};
  pep.identity = 300;
  ASSERT_TRUE(dp_->policy_ep().Update(kEpA, pep).ok());  // outside enforcement: open
  Monitor(Bit(SLUICE_EVENT_POLICY));
  Bytes syn = Packet::Eth(kPodMac, kHostMac).IPv4(kA, kB).TCP(40001, 80).Build();
  Bytes ack = Packet::Eth(kPodMac, kHostMac).IPv4(kA, kB).TCP(40001, 80, kTcpAck).Build();
  ASSERT_EQ(Run(dp_->from_pod_fd(), syn, kIfindex).verdict, kTcRedirect);
  ASSERT_EQ(Run(dp_->from_pod_fd(), ack, kIfindex).verdict, kTcRedirect);
  auto events = Drain(dp_->events_fd());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, SLUICE_EVENT_POLICY);
  EXPECT_EQ(events[0].verdict, SLUICE_VERDICT_FORWARDED);
  EXPECT_EQ(events[0].policy_dir, SLUICE_POLICY_EGRESS);
  EXPECT_EQ(events[0].id, kEpA);
  EXPECT_EQ(events[0].flags & SLUICE_EVENT_F_ENFORCED, 0);
}

TEST_F(EventsTest, ServiceTranslationNamesFrontendBackendAndServiceThenCloseOnce) {
  ASSERT_TRUE(ProgramService(*dp_, kClusterIp, 80, IPPROTO_TCP, kRevNatId, kBackends).ok());
  Monitor(Bit(SLUICE_EVENT_TRANSLATE) | Bit(SLUICE_EVENT_CT_CLOSE));
  auto to_frontend = [](uint8_t flags) {
    return Packet::Eth(kPodMac, kHostMac).IPv4(kA, kClusterIp).TCP(40002, 80, flags).Build();
  };
  ASSERT_EQ(Run(dp_->from_pod_fd(), to_frontend(kTcpSyn), kIfindex).verdict, kTcOk);
  ASSERT_EQ(Run(dp_->from_pod_fd(), to_frontend(kTcpAck), kIfindex).verdict, kTcOk);
  ASSERT_EQ(Run(dp_->from_pod_fd(), to_frontend(kTcpAck | 0x01), kIfindex).verdict, kTcOk);
  ASSERT_EQ(Run(dp_->from_pod_fd(), to_frontend(kTcpAck | 0x01), kIfindex).verdict, kTcOk);
  auto events = Drain(dp_->events_fd());
  ASSERT_EQ(events.size(), 2u) << "one translation, one close (the second FIN is no event)";
  const sluice_event& t = events[0];
  EXPECT_EQ(t.type, SLUICE_EVENT_TRANSLATE);
  EXPECT_EQ(t.saddr[0], Ip4(kA));
  EXPECT_EQ(t.daddr[0], Ip4(kClusterIp));
  EXPECT_EQ(ntohs(t.dport), 80);
  EXPECT_EQ(t.id, kRevNatId);
  EXPECT_THAT(t.nat_addr[0], ::testing::AnyOf(Ip4(kBackends[0].addr), Ip4(kBackends[1].addr)));
  EXPECT_EQ(ntohs(t.nat_port), 8080);
  const sluice_event& c = events[1];
  EXPECT_EQ(c.type, SLUICE_EVENT_CT_CLOSE);
  EXPECT_EQ(c.id, kRevNatId);
  EXPECT_EQ(c.nat_addr[0], t.nat_addr[0]);
  EXPECT_EQ(c.sport, t.sport);
}

// The backend closes first: the close is reported from the reply path, once, with the tuple the
// client sent (to the frontend), which a flow entry keeps only in its value.
TEST_F(EventsTest, CloseSeenFromTheBackendIsReportedAsTheClientSentIt) {
  ASSERT_TRUE(ProgramService(*dp_, kClusterIp, 80, IPPROTO_TCP, kRevNatId, kBackends).ok());
  for (uint32_t n : {21u, 22u}) {
    ASSERT_TRUE(
        AddEndpoint(*dp_, Ip4(absl::StrFormat("10.244.0.%d", n)), kIfindex, kPodBMac, kHostBMac, n)
            .ok());
  }
  Monitor(Bit(SLUICE_EVENT_TRANSLATE) | Bit(SLUICE_EVENT_CT_CLOSE));
  ASSERT_EQ(Run(dp_->from_pod_fd(),
                Packet::Eth(kPodMac, kHostMac).IPv4(kA, kClusterIp).TCP(40004, 80, kTcpSyn).Build(),
                kIfindex)
                .verdict,
            kTcRedirect);
  auto events = Drain(dp_->events_fd());
  ASSERT_EQ(events.size(), 1u);
  const uint32_t backend = events[0].nat_addr[0];
  auto from_backend = [&](uint8_t flags) {
    return Packet::Eth(kPodBMac, kHostBMac)
        .IPv4(FormatIp4(backend), kA)
        .TCP(8080, 40004, flags)
        .Build();
  };
  ASSERT_EQ(Run(dp_->from_pod_fd(), from_backend(kTcpAck | 0x01), kIfindex).verdict, kTcRedirect);
  ASSERT_EQ(Run(dp_->from_pod_fd(), from_backend(kTcpAck | 0x01), kIfindex).verdict, kTcRedirect);
  ASSERT_EQ(Run(dp_->from_pod_fd(),
                Packet::Eth(kPodMac, kHostMac)
                    .IPv4(kA, kClusterIp)
                    .TCP(40004, 80, kTcpAck | 0x01)
                    .Build(),
                kIfindex)
                .verdict,
            kTcRedirect);
  events = Drain(dp_->events_fd());
  ASSERT_EQ(events.size(), 1u) << "one close, whichever side and however many FINs";
  const sluice_event& c = events[0];
  EXPECT_EQ(c.type, SLUICE_EVENT_CT_CLOSE);
  EXPECT_EQ(c.saddr[0], Ip4(kA));
  EXPECT_EQ(ntohs(c.sport), 40004);
  EXPECT_EQ(c.daddr[0], Ip4(kClusterIp));
  EXPECT_EQ(ntohs(c.dport), 80);
  EXPECT_EQ(c.nat_addr[0], backend);
  EXPECT_EQ(ntohs(c.nat_port), 8080);
  EXPECT_EQ(c.id, kRevNatId);
}

TEST_F(EventsTest, RejectedServiceFlowIsReportedAsTheClientSentIt) {
  // No usable endpoint anywhere: answered with a RST, counted and reported as service_rejected,
  // with the client's tuple (not the answer's).
  ASSERT_TRUE(ProgramService(*dp_, kClusterIp, 80, IPPROTO_TCP, kRevNatId, {},
                             SLUICE_SVC_F_REJECT)
                  .ok());
  Monitor(Bit(SLUICE_EVENT_DROP));
  ASSERT_EQ(Run(dp_->from_pod_fd(),
                Packet::Eth(kPodMac, kHostMac).IPv4(kA, kClusterIp).TCP(40003, 80).Build(),
                kIfindex)
                .verdict,
            kTcRedirect);
  auto events = Drain(dp_->events_fd());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].reason, SLUICE_DROP_SERVICE_REJECTED);
  EXPECT_EQ(events[0].saddr[0], Ip4(kA));
  EXPECT_EQ(events[0].daddr[0], Ip4(kClusterIp));
  EXPECT_EQ(ntohs(events[0].sport), 40003);
  EXPECT_EQ(ntohs(events[0].dport), 80);
  EXPECT_EQ(Drops(SLUICE_DROP_SERVICE_REJECTED), 1u);
}

TEST_F(EventsTest, SamplingThinsTranslationsButNeverDrops) {
  ASSERT_TRUE(ProgramService(*dp_, kClusterIp, 80, IPPROTO_TCP, kRevNatId, kBackends).ok());
  // 1 in 2^31: in 20 new flows the chance of one sampled in is 1e-8.
  Monitor(Bit(SLUICE_EVENT_TRANSLATE) | Bit(SLUICE_EVENT_DROP), 0, 0, /*sample=*/1u << 31);
  for (int i = 0; i < 20; ++i) {
    Bytes syn = Packet::Eth(kPodMac, kHostMac).IPv4(kA, kClusterIp).TCP(41000 + i, 80).Build();
    ASSERT_EQ(Run(dp_->from_pod_fd(), syn, kIfindex).verdict, kTcOk);
  }
  ASSERT_EQ(SendSpoofed(), kTcShot);
  auto events = Drain(dp_->events_fd());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, SLUICE_EVENT_DROP);
}

}  // namespace
}  // namespace sluice::testing
