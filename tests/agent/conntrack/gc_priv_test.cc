// Conntrack under pressure, on the real programs and maps: a flood of new flows from one pod (UDP
// into the LRU map, TCP SYNs into the hash that never evicts) leaves another pod's established
// TCP connections in place, the datapath and the GC count what happened, and the GC deletes what
// has expired. Time for the GC is moved by hand (its clock is injected), never slept.
#include <arpa/inet.h>

#include <cstdio>
#include <set>
#include <vector>

#include "absl/strings/str_format.h"
#include "agent/conntrack/gc.h"
#include "support/fixture.h"

namespace sluice::testing {
namespace {

const Mac kFlooderMac = ParseMac("02:00:00:00:0a:01");
const Mac kVictimMac = ParseMac("02:00:00:00:0b:01");
const Mac kBackendMac = ParseMac("02:00:00:00:15:01");
const Mac kHostMac = ParseMac("02:aa:00:00:00:02");
constexpr const char* kFlooder = "10.244.0.10";
constexpr const char* kVictim = "10.244.0.11";
constexpr const char* kBackend = "10.244.0.21";
constexpr int kServices = 5;  // ClusterIPs 10.96.0.10 .. 10.96.0.14, TCP 80 and UDP 53 each
constexpr int kVictimFlows = 20;

std::string ClusterIp(int i) { return absl::StrFormat("10.96.0.%d", 10 + i); }

class ConntrackGcPrivTest : public DatapathTest {
 protected:
  void SetUp() override {
    DatapathTest::SetUp();
    if (HasFatalFailure()) return;
    uint32_t id = 10;
    for (auto [ip, mac] : {std::pair{kFlooder, kFlooderMac}, {kVictim, kVictimMac},
                           {kBackend, kBackendMac}}) {
      ASSERT_TRUE(AddEndpoint(*dp_, Ip4(ip), 1, mac, kHostMac, id++).ok());
    }
    // One backend pod, a target port per Service: flows from one client port to two Services
    // are distinct at the backend too (their reply entries do not collide).
    for (int i = 0; i < kServices; ++i) {
      const uint16_t n = static_cast<uint16_t>(i);
      ASSERT_TRUE(ProgramService(*dp_, ClusterIp(i), 80, IPPROTO_TCP, 1 + 2 * i,
                                 {{100u + n, kBackend, static_cast<uint16_t>(8080 + n),
                                   IPPROTO_TCP}})
                      .ok());
      ASSERT_TRUE(ProgramService(*dp_, ClusterIp(i), 53, IPPROTO_UDP, 2 + 2 * i,
                                 {{200u + n, kBackend, static_cast<uint16_t>(5353 + n),
                                   IPPROTO_UDP}})
                      .ok());
    }
    sluice_node_config cfg{};
    cfg.node_ip4 = Ip4("192.168.50.10");
    cfg.pod_cidr4 = Ip4("10.244.0.0");
    cfg.pod_cidr4_len = 24;
    cfg.gateway_ip4 = Ip4("10.244.0.1");
    cfg.service_cidr4 = Ip4("10.96.0.0");
    cfg.service_cidr4_len = 16;
    ASSERT_TRUE(dp_->node_config().Update(0, cfg).ok());
  }

  int FromPod(const Bytes& in) { return Run(dp_->from_pod_fd(), in).verdict; }

  // The victim's established connection from source port `sport`: SYN, SYN-ACK, ACK.
  void Connect(uint16_t sport) {
    auto to_svc = [&](uint8_t flags) {
      return Packet::Eth(kVictimMac, kHostMac).IPv4(kVictim, ClusterIp(0)).TCP(sport, 80, flags);
    };
    ASSERT_EQ(FromPod(to_svc(kTcpSyn).Build()), kTcRedirect);
    ASSERT_EQ(FromPod(Packet::Eth(kBackendMac, kHostMac)
                          .IPv4(kBackend, kVictim)
                          .TCP(8080, sport, kTcpSyn | kTcpAck)
                          .Build()),
              kTcRedirect);
    ASSERT_EQ(FromPod(to_svc(kTcpAck).Build()), kTcRedirect);
  }

  // How many of the victim's connections have their flow entry, established.
  int VictimFlowsTracked() {
    int n = 0;
    for (int f = 0; f < kVictimFlows; ++f) {
      auto flow = dp_->ct4().Lookup(
          CtKey(kVictim, "0.0.0.0", 30000 + f, 0, IPPROTO_TCP, SLUICE_CT_DIR_FLOW));
      if (flow.ok() && (flow->flags & SLUICE_CT_F_ESTABLISHED) &&
          flow->backend_addr == Ip4(kBackend) && flow->frontend_addr == Ip4(ClusterIp(0))) {
        ++n;
      }
    }
    return n;
  }

  // The victim's connections still go to their backend mid-stream (an ACK with data).
  int VictimFlowsForwarded() {
    int n = 0;
    for (int f = 0; f < kVictimFlows; ++f) {
      auto r = Run(dp_->from_pod_fd(), Packet::Eth(kVictimMac, kHostMac)
                                           .IPv4(kVictim, ClusterIp(0))
                                           .TCP(30000 + f, 80, kTcpAck)
                                           .Payload("more")
                                           .Build());
      auto d = Decode(r.out);
      if (r.verdict == kTcRedirect && d && d->ip_dst == Ip4(kBackend) && d->dport == 8080) ++n;
    }
    return n;
  }

  // The flooder's first packet from `sport` to ClusterIP i: a TCP SYN to port 80 or a UDP
  // datagram to port 53.
  Bytes Opening(uint8_t proto, int i, uint16_t sport) {
    Packet p = Packet::Eth(kFlooderMac, kHostMac).IPv4(kFlooder, ClusterIp(i));
    if (proto == IPPROTO_UDP) {
      p.UDP(sport, 53, /*zero_checksum=*/true).Payload("q");
    } else {
      p.TCP(sport, 80, kTcpSyn);
    }
    return p.Build();
  }

  // `flows` new flows from the flooder, `proto` to port 80 (TCP SYN) or 53 (UDP), spread over
  // the ClusterIPs and source ports: the first kPorts from a port each (one flow entry each),
  // the rest from ports already in a flow (two entries each). Returns how many the datapath
  // passed (redirect).
  static constexpr int kPorts = 64000;
  int Flood(uint8_t proto, int flows) {
    int passed = 0;
    for (int f = 0; f < flows; ++f) {
      passed += FromPod(Opening(proto, f / kPorts, static_cast<uint16_t>(1024 + f % kPorts))) ==
                kTcRedirect;
    }
    return passed;
  }
  // The entries `flows` flows of Flood write.
  static uint64_t FloodEntries(int flows) {
    return flows <= kPorts ? flows : kPorts + 2u * (flows - kPorts);
  }

  uint64_t Stat(uint32_t slot) {
    uint64_t n = 0;
    auto v = dp_->ct_stats().Lookup(slot);
    EXPECT_TRUE(v.ok());
    if (v.ok())
      for (uint64_t c : *v) n += c;
    return n;
  }

  // The GC's clock: the real monotonic one plus what a test moved it by.
  uint64_t offset_ns_ = 0;
  conntrack::ConntrackGc::NowNs GcClock() {
    return [this] { return conntrack::MonotonicNowNs() + offset_ns_; };
  }
};

// The reproduction: 320k distinct UDP flows from one pod (640k entries into a 262144-entry
// LRU) while another pod holds 20 idle TCP connections through a ClusterIP. The TCP flows live in
// the map that does not evict: all 20 survive and keep their backend; the LRU's evictions are
// counted; after the UDP timeout the GC deletes every UDP entry and keeps the TCP ones.
TEST_F(ConntrackGcPrivTest, UdpFloodFromOnePodLeavesAnotherPodsEstablishedTcpFlows) {
  for (int f = 0; f < kVictimFlows; ++f) ASSERT_NO_FATAL_FAILURE(Connect(30000 + f));
  ASSERT_EQ(VictimFlowsTracked(), kVictimFlows);
  conntrack::ConntrackGc gc(dp_->ct4(), dp_->ct4_any(), &dp_->ct_stats(), {}, GcClock());
  ASSERT_TRUE(gc.RunOnce().ok());  // the baseline of the eviction estimate
  const uint64_t created_before = Stat(SLUICE_CT_STAT_ANY_CREATED);

  constexpr int kFlood = 320000;
  EXPECT_EQ(Flood(IPPROTO_UDP, kFlood), kFlood) << "the LRU map takes every new UDP flow";

  // Whether a later flow from a port finds the port's flow entry still there or evicted decides
  // whether it writes two entries or one.
  const uint64_t created = Stat(SLUICE_CT_STAT_ANY_CREATED) - created_before;
  EXPECT_GE(created, static_cast<uint64_t>(kFlood));
  EXPECT_LE(created, FloodEntries(kFlood));
  EXPECT_EQ(Stat(SLUICE_CT_STAT_ANY_INSERT_FAILED), 0u);
  EXPECT_EQ(VictimFlowsTracked(), kVictimFlows);
  EXPECT_EQ(VictimFlowsForwarded(), kVictimFlows);

  ASSERT_TRUE(gc.RunOnce().ok());  // nothing has expired yet: the pass only counts
  auto t = gc.totals();
  const uint64_t capacity = SLUICE_CT4_ANY_MAX_ENTRIES;
  EXPECT_EQ(t.any.expired, 0u);
  EXPECT_LE(t.any.live, capacity);
  EXPECT_GE(t.any.lru_evictions, created - capacity) << "evictions are counted";
  EXPECT_EQ(t.any.lru_evictions + t.any.live, created);
  EXPECT_EQ(t.tcp.live, static_cast<uint64_t>(kVictimFlows));
  std::printf(
      "UDP flood: %d flows, %llu entries created, %llu left in sluice_ct4_any, %llu "
      "evictions counted; %d of %d established TCP flows kept\n",
      kFlood, static_cast<unsigned long long>(created), static_cast<unsigned long long>(t.any.live),
      static_cast<unsigned long long>(t.any.lru_evictions), VictimFlowsTracked(), kVictimFlows);

  // Past the UDP timeout (60 s), well inside the established one (6 h).
  const uint64_t udp_left = t.any.live;
  offset_ns_ = absl::ToInt64Nanoseconds(absl::Seconds(61));
  ASSERT_TRUE(gc.RunOnce().ok());
  t = gc.totals();
  EXPECT_EQ(*dp_->ct4_any().Count(), 0u);
  EXPECT_EQ(t.any.expired, udp_left);
  EXPECT_EQ(t.any.live, 0u);
  EXPECT_EQ(t.tcp.expired, 0u);
  EXPECT_EQ(VictimFlowsTracked(), kVictimFlows);

  // Idle past the established timeout, they go too.
  offset_ns_ = absl::ToInt64Nanoseconds(absl::Hours(6) + absl::Seconds(1));
  ASSERT_TRUE(gc.RunOnce().ok());
  EXPECT_EQ(gc.totals().tcp.expired, static_cast<uint64_t>(kVictimFlows));
  EXPECT_EQ(*dp_->ct4().Count(), 0u);
}

// A SYN flood from one pod fills the TCP map (it never evicts): inserts then fail, counted by the
// datapath and as ct_map_full drops, and the established connections of another pod stay. The
// GC's headroom pass deletes the unanswered entries (least recently seen first) so new
// connections work again before the SYN timeout; it never deletes established ones.
TEST_F(ConntrackGcPrivTest, SynFloodFillsTheTcpMapWithoutEvictingEstablishedFlows) {
  for (int f = 0; f < kVictimFlows; ++f) ASSERT_NO_FATAL_FAILURE(Connect(30000 + f));
  const uint64_t capacity = SLUICE_CT4_MAX_ENTRIES;
  // The flows that fit: one entry each from the first kPorts ports, two each after.
  const int fit = kPorts + static_cast<int>(capacity - kVictimFlows - kPorts) / 2;
  const int flood = fit + 1000;  // more flows than fit
  const uint64_t full_before = Drops(SLUICE_DROP_CT_MAP_FULL);
  const int passed = Flood(IPPROTO_TCP, flood);

  EXPECT_EQ(passed, fit);
  EXPECT_EQ(Stat(SLUICE_CT_STAT_TCP_INSERT_FAILED), static_cast<uint64_t>(flood - passed));
  EXPECT_EQ(Drops(SLUICE_DROP_CT_MAP_FULL) - full_before, static_cast<uint64_t>(flood - passed));
  EXPECT_EQ(VictimFlowsTracked(), kVictimFlows);
  EXPECT_EQ(VictimFlowsForwarded(), kVictimFlows);

  conntrack::ConntrackGc gc(dp_->ct4(), dp_->ct4_any(), &dp_->ct_stats(), {}, GcClock());
  ASSERT_TRUE(gc.RunOnce().ok());  // nothing expired: headroom only
  auto t = gc.totals();
  EXPECT_EQ(t.tcp.expired, 0u);
  EXPECT_EQ(t.tcp.live, static_cast<uint64_t>(0.8 * capacity));
  EXPECT_EQ(t.tcp.pressure, capacity - t.tcp.live);
  EXPECT_EQ(VictimFlowsTracked(), kVictimFlows) << "established flows are never deleted for room";
  std::printf("SYN flood: %d flows, %d passed, %d refused; GC headroom pass deleted %llu, left "
              "%llu of %llu\n",
              flood, passed, flood - passed, static_cast<unsigned long long>(t.tcp.pressure),
              static_cast<unsigned long long>(t.tcp.live),
              static_cast<unsigned long long>(capacity));
  ASSERT_NO_FATAL_FAILURE(Connect(40000)) << "a new connection fits again";

  // Past the SYN timeout the rest of the flood expires; the established flows stay.
  offset_ns_ = absl::ToInt64Nanoseconds(absl::Seconds(61));
  ASSERT_TRUE(gc.RunOnce().ok());
  EXPECT_EQ(*dp_->ct4().Count(), static_cast<uint64_t>(kVictimFlows + 1));
  EXPECT_EQ(VictimFlowsTracked(), kVictimFlows);
}

// A load-balanced flow's two entries expire together: a one-way UDP stream refreshes only its
// forward entry, and its reply entry must stay as long (replies would miss their reverse NAT).
// Flows from ports already in a flow entry (to another ClusterIP) have two entries.
TEST_F(ConntrackGcPrivTest, OneWayFlowKeepsItsReplyEntry) {
  for (int i : {1, 0}) {
    for (uint16_t sport : {1024, 1025})
      ASSERT_EQ(FromPod(Opening(IPPROTO_UDP, i, sport)), kTcRedirect);
  }
  const uint64_t now = conntrack::MonotonicNowNs();
  const uint64_t old = now - absl::ToInt64Nanoseconds(absl::Seconds(120));
  // The flow entries (to ClusterIP 1) fresh. Flow 1024 to ClusterIP 0: forward fresh, reply old.
  // Flow 1025: both old.
  std::vector<std::pair<sluice_ct4_key, sluice_ct4_entry>> all;
  ASSERT_TRUE(dp_->ct4_any()
                  .ForEach([&](const sluice_ct4_key& k, const sluice_ct4_entry& e) {
                    all.push_back({k, e});
                  })
                  .ok());
  ASSERT_EQ(all.size(), 6u);
  for (auto& [k, e] : all) {
    const uint16_t client_port = ntohs(k.dir == SLUICE_CT_DIR_REPLY ? k.dport : k.sport);
    const bool fresh =
        k.dir == SLUICE_CT_DIR_FLOW || (client_port == 1024 && k.dir == SLUICE_CT_DIR_FORWARD);
    e.last_seen_ns = fresh ? now : old;
    ASSERT_TRUE(dp_->ct4_any().Update(k, e).ok());
  }
  conntrack::ConntrackGc gc(dp_->ct4(), dp_->ct4_any(), &dp_->ct_stats(), {}, GcClock());
  gc.TrackPairs(&dp_->ct_pairs());
  ASSERT_TRUE(gc.RunOnce().ok());
  EXPECT_EQ(gc.totals().any.expired, 2u);
  EXPECT_EQ(*dp_->ct_pairs().Lookup(SLUICE_CT_PAIRS_CREATED), 2u) << "the two flows of two entries";
  EXPECT_EQ(*dp_->ct_pairs().Lookup(SLUICE_CT_PAIRS_CLEAR), 0u) << "one is left: still looked up";
  std::multiset<std::pair<int, uint16_t>> left;  // (dir, client port)
  ASSERT_TRUE(dp_->ct4_any()
                  .ForEach([&](const sluice_ct4_key& k, const sluice_ct4_entry&) {
                    left.insert({k.dir, ntohs(k.dir == SLUICE_CT_DIR_REPLY ? k.dport : k.sport)});
                  })
                  .ok());
  EXPECT_EQ(left, (std::multiset<std::pair<int, uint16_t>>{{SLUICE_CT_DIR_FORWARD, 1024},
                                                           {SLUICE_CT_DIR_REPLY, 1024},
                                                           {SLUICE_CT_DIR_FLOW, 1024},
                                                           {SLUICE_CT_DIR_FLOW, 1025}}));
  // Once the last one expires, the datapath is told it may skip their lookups.
  offset_ns_ = absl::ToInt64Nanoseconds(absl::Seconds(61));
  ASSERT_TRUE(gc.RunOnce().ok());
  EXPECT_EQ(*dp_->ct_pairs().Lookup(SLUICE_CT_PAIRS_CLEAR), 3u);
  EXPECT_EQ(*dp_->ct4_any().Count(), 0u);
  // The agent writes a reply entry of its own: the lookups are on again.
  ASSERT_TRUE(gc.PairsWritten().ok());
  EXPECT_EQ(*dp_->ct_pairs().Lookup(SLUICE_CT_PAIRS_CLEAR), 0u);
}

// A flow entry holds both directions: a stream the backend alone sends (replies only) keeps it
// fresh, and the GC keeps it past the timeout the client's silence alone would give it.
TEST_F(ConntrackGcPrivTest, RepliesAloneKeepAFlowEntry) {
  ASSERT_EQ(FromPod(Opening(IPPROTO_UDP, 0, 2000)), kTcRedirect);
  const sluice_ct4_key key = CtKey(kFlooder, "0.0.0.0", 2000, 0, IPPROTO_UDP, SLUICE_CT_DIR_FLOW);
  auto flow = dp_->ct4_any().Lookup(key);
  ASSERT_TRUE(flow.ok()) << flow.status();
  const uint64_t old = conntrack::MonotonicNowNs() - absl::ToInt64Nanoseconds(absl::Seconds(120));
  sluice_ct4_entry aged = *flow;
  aged.last_seen_ns = old;
  ASSERT_TRUE(dp_->ct4_any().Update(key, aged).ok());
  ASSERT_EQ(FromPod(Packet::Eth(kBackendMac, kHostMac)
                        .IPv4(kBackend, kFlooder)
                        .UDP(5353, 2000, /*zero_checksum=*/true)
                        .Payload("a")
                        .Build()),
            kTcRedirect);
  auto seen = dp_->ct4_any().Lookup(key);
  ASSERT_TRUE(seen.ok());
  EXPECT_GT(seen->last_seen_ns, old) << "the reply refreshed the entry";
  conntrack::ConntrackGc gc(dp_->ct4(), dp_->ct4_any(), &dp_->ct_stats(), {}, GcClock());
  ASSERT_TRUE(gc.RunOnce().ok());
  EXPECT_EQ(gc.totals().any.expired, 0u);
  EXPECT_TRUE(dp_->ct4_any().Lookup(key).ok());
}

}  // namespace
}  // namespace sluice::testing
