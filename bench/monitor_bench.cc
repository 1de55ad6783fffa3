// Per-packet cost of the flow monitor in sluice_from_pod, measured with BPF_PROG_TEST_RUN in one
// process against today's programs without it. Four datapaths run the same packets:
//   baseline   - pod_egress.bpf.c built with -DSLUICE_EVENTS_COMPILED_OUT (no monitor code)
//   no-listen  - the production object, sluice_monitor's mask 0: nobody observes (the default)
//   listener   - the production object while an observer of the agent's FlowMonitor is attached
//                (mask: all events, no rate limit); a thread drains the observer as fast as it can
//   flood      - the same with a bucket that a flood has emptied (1000/s, burst 100 per CPU): most
//                events pay the bucket check and a counted loss instead
//   raw ring   - monitor on (all events, no limit) with no FlowMonitor: a thread that does nothing
//                but ring_buffer__consume, as fast as it can, drains the ring buffer while the
//                packets run (the datapath's cost with a listener at full rate, without the
//                agent's decoding and filtering)
//   no-dir     - pod_egress.bpf.c built with -DSLUICE_DIR_COUNTERS_COMPILED_OUT: the counters as
//                they were before sluice_forward and drops by direction (monitor code in, off);
//                no-listen / no-dir is what the direction counters cost
// The workloads:
//   (a) established: a pod's ACK to a ClusterIP whose flow is in conntrack (CT hit, DNAT,
//       redirect to the backend pod); no event is due, whoever listens
//   (b) new flow: a SYN per syscall (16 clients x distinct source ports); a translation event
//       each (the CT entries of a batch are deleted after it, untimed)
//   (c) dropped: a packet from an address the pod does not own (spoofed_source); a drop event
//       each
// Both objects share one bpffs, so the same maps (and the same conntrack) serve both.
// Timing as in lb_packet_bench: repeat = 1 on a fresh copy of the input, the kernel-reported
// duration, interquartile mean per batch, median over rounds; rounds interleave every case in a
// shuffled order. The claims: (a) no-listen / baseline <= 1.03; no-listen / no-dir <= 1.03.
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/bpf.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "agent/monitor/monitor.h"
#include "loader/datapath.h"
#include "loader/skeleton.h"
#include "sluice_pod_egress_nodir.skel.h"
#include "sluice_pod_egress_nomon.skel.h"
#include "support/fixture.h"
#include "support/packet.h"
#include "test_run.h"

namespace sluice::loader {
SLUICE_SKELETON_OPS(sluice_pod_egress_nomon);
SLUICE_SKELETON_OPS(sluice_pod_egress_nodir);
}

namespace sluice::bench {
namespace {

using testing::Bytes;
using testing::Ip4;
using testing::Mac;
using testing::Packet;
using testing::ParseMac;

constexpr int kIfindex = 1;  // lo: test_run receives on it
constexpr int kClients = 16;
constexpr int kBatch = 2000;
constexpr uint16_t kFirstSport = 1024;
constexpr const char* kClusterIp = "172.30.0.1";
constexpr const char* kStranger = "10.244.0.250";
const Mac kHostMac = ParseMac("02:aa:00:00:0a:02");

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "monitor_bench: %s\n", what.c_str());
  std::exit(1);
}

std::string ClientIp(int c) { return absl::StrFormat("10.244.0.%d", 100 + c); }
Mac ClientMac(int c) { return ParseMac(absl::StrFormat("02:00:00:00:0a:%02x", c + 1)); }

using RunOut = TestRunOut;

RunOut TestRun(int prog_fd, const Bytes& in) {
  RunOut r;
  if (!RunTc(prog_fd, in, kIfindex, &r))
    Die(absl::StrCat("BPF_PROG_TEST_RUN: ", std::strerror(errno)));
  return r;
}

Bytes ToService(int client, uint16_t sport, uint8_t flags) {
  return Packet::Eth(ClientMac(client), kHostMac)
      .IPv4(ClientIp(client), kClusterIp)
      .TCP(sport, 80, flags)
      .Payload("GET / HTTP/1.1\r\n\r\n")
      .Build();
}

enum class Mode { kBaseline, kNoListener, kListener, kLimited, kRawRing, kCountersAsBefore };
enum class Work { kEstablished, kNewFlow, kDropped };
const char* ModeName(Mode m) {
  switch (m) {
    case Mode::kBaseline:
      return "baseline (no monitor code)";
    case Mode::kNoListener:
      return "monitor, nobody listens";
    case Mode::kListener:
      return "monitor, listener, no limit";
    case Mode::kLimited:
      return "monitor, listener, bucket empty";
    case Mode::kRawRing:
      return "monitor, raw ring consumer";
    case Mode::kCountersAsBefore:
      return "no direction counters, mon off";
  }
  return "?";
}
const char* WorkName(Work w) {
  switch (w) {
    case Work::kEstablished:
      return "(a) established";
    case Work::kNewFlow:
      return "(b) new flow";
    case Work::kDropped:
      return "(c) dropped";
  }
  return "?";
}

struct Case {
  Work work;
  Mode mode;
  std::vector<double> rounds;
};

}  // namespace

int Main(int rounds) {
  testing::ScratchBpffs bpffs;
  auto dp = loader::Datapath::Load(bpffs.path());
  if (!dp.ok()) Die(dp.status().ToString());
  auto nomon = loader::Skeleton<sluice_pod_egress_nomon>::OpenAndLoad(bpffs.path());
  if (!nomon.ok()) Die(nomon.status().ToString());
  auto nodir = loader::Skeleton<sluice_pod_egress_nodir>::OpenAndLoad(bpffs.path());
  if (!nodir.ok()) Die(nodir.status().ToString());
  const int prog_monitor = (*dp)->from_pod_fd();
  const int prog_baseline = bpf_program__fd((**nomon)->progs.sluice_from_pod);
  const int prog_nodir = bpf_program__fd((**nodir)->progs.sluice_from_pod);

  for (int c = 0; c < kClients; ++c) {
    if (auto st =
            testing::AddEndpoint(**dp, Ip4(ClientIp(c)), kIfindex, ClientMac(c), kHostMac, 100 + c);
        !st.ok())
      Die(st.ToString());
  }
  std::vector<testing::LbBackendSpec> backends;
  for (int j = 0; j < 3; ++j) {
    std::string ip = absl::StrFormat("10.244.0.%d", 21 + j);
    backends.push_back({static_cast<uint32_t>(j + 1), ip, 8080, IPPROTO_TCP});
    if (auto st = testing::AddEndpoint(**dp, Ip4(ip), 4242 + j,
                                       ParseMac(absl::StrFormat("02:00:00:00:b0:%02x", j + 1)),
                                       kHostMac, 10 + j);
        !st.ok())
      Die(st.ToString());
  }
  if (auto st = testing::ProgramService(**dp, kClusterIp, 80, IPPROTO_TCP, 1, backends); !st.ok())
    Die(st.ToString());

  monitor::MonitorOptions mopts;
  mopts.rate = 0;  // switched per case below
  mopts.burst = 0;
  mopts.history = 4096;
  auto mon = monitor::FlowMonitor::Start((*dp)->events_fd(), (*dp)->monitor_config(),
                                         (*dp)->monitor_cpu(), nullptr, mopts);
  if (!mon.ok()) Die(mon.status().ToString());

  // The established flow, and a check that both programs balance it the same way.
  const Bytes syn = ToService(0, 999, testing::kTcpSyn);
  const Bytes ack = ToService(0, 999, testing::kTcpAck);
  if (TestRun(prog_monitor, syn).verdict != testing::kTcRedirect) Die("SYN not redirected");
  for (int prog : {prog_monitor, prog_baseline, prog_nodir}) {
    if (TestRun(prog, ack).verdict != testing::kTcRedirect) Die("established ACK not redirected");
  }
  const Bytes dropped =
      Packet::Eth(ClientMac(0), kHostMac).IPv4(kStranger, "10.244.0.21").TCP(40000, 8080).Build();
  if (TestRun(prog_baseline, dropped).verdict != testing::kTcShot) Die("spoofed not dropped");

  std::vector<Case> cases;
  for (Work w : {Work::kEstablished, Work::kNewFlow, Work::kDropped}) {
    for (Mode m : {Mode::kBaseline, Mode::kNoListener, Mode::kListener, Mode::kLimited,
                   Mode::kRawRing, Mode::kCountersAsBefore}) {
      cases.push_back({w, m, {}});
    }
  }

  uint32_t next_flow = 0;
  auto new_flow = [&] {
    const uint32_t ports = 65535 - kFirstSport;
    uint32_t f = next_flow++;
    return ToService(static_cast<int>((f / ports) % kClients),
                     static_cast<uint16_t>(kFirstSport + f % ports), testing::kTcpSyn);
  };
  auto clear_new_flows = [&] {
    std::vector<sluice_ct4_key> keys;
    (void)(*dp)->ct4().ForEach([&](const sluice_ct4_key& k, const sluice_ct4_entry&) {
      if (!(k.sport == htons(999) || k.dport == htons(999))) keys.push_back(k);
    });
    for (const auto& k : keys) (void)(*dp)->ct4().Delete(k);
  };

  uint64_t events_seen = 0;
  std::atomic<uint64_t> raw_seen{0};
  auto count_raw = [](void* ctx, void*, size_t) -> int {
    static_cast<std::atomic<uint64_t>*>(ctx)->fetch_add(1, std::memory_order_relaxed);
    return 0;
  };
  std::mt19937 rng(7);
  std::vector<size_t> order(cases.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (int round = 0; round < rounds; ++round) {
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t idx : order) {
      Case& cs = cases[idx];
      // The listener: a FlowMonitor observer, drained by its own thread for the whole batch.
      std::unique_ptr<monitor::FlowMonitor::Observer> observer;
      std::atomic<bool> done{false};
      std::thread drain;
      struct ring_buffer* raw = nullptr;
      if (cs.mode == Mode::kRawRing) {
        // The ring buffer has one consumer position: the FlowMonitor lets go of it first.
        mon->reset();
        raw = ring_buffer__new((*dp)->events_fd(), count_raw, &raw_seen, nullptr);
        if (raw == nullptr) Die(absl::StrCat("ring_buffer__new: ", std::strerror(errno)));
        sluice_monitor_config cfg{};
        cfg.events = SLUICE_MON_EVENTS_ALL;
        if (auto st = (*dp)->monitor_config().Update(0, cfg); !st.ok()) Die(st.ToString());
        drain = std::thread([&] {
          while (!done) ring_buffer__consume(raw);
        });
      }
      if (cs.mode == Mode::kListener || cs.mode == Mode::kLimited) {
        mon->reset();
        mopts.rate = cs.mode == Mode::kLimited ? 1000 : 0;
        mopts.burst = cs.mode == Mode::kLimited ? 100 : 0;
        auto m = monitor::FlowMonitor::Start((*dp)->events_fd(), (*dp)->monitor_config(),
                                             (*dp)->monitor_cpu(), nullptr, mopts);
        if (!m.ok()) Die(m.status().ToString());
        *mon = std::move(*m);
        std::vector<monitor::Flow> none;
        observer = (*mon)->Observe({}, 0, true, &none);
        drain = std::thread([&] {
          while (!done) {
            if (observer->Next(absl::Milliseconds(5))) ++events_seen;
          }
        });
      }
      std::vector<Bytes> inputs;
      if (cs.work == Work::kNewFlow) {
        for (int k = 0; k < kBatch; ++k) inputs.push_back(new_flow());
      }
      const int prog = cs.mode == Mode::kBaseline           ? prog_baseline
                       : cs.mode == Mode::kCountersAsBefore ? prog_nodir
                                                            : prog_monitor;
      const int want = cs.work == Work::kDropped ? testing::kTcShot : testing::kTcRedirect;
      std::vector<uint32_t> ns;
      ns.reserve(kBatch);
      for (int k = 0; k < kBatch; ++k) {
        const Bytes& in = cs.work == Work::kEstablished ? ack
                          : cs.work == Work::kDropped   ? dropped
                                                        : inputs[k];
        RunOut r = TestRun(prog, in);
        if (r.verdict != want) Die(absl::StrCat(WorkName(cs.work), ": verdict ", r.verdict));
        ns.push_back(r.ns);
      }
      if (observer) {
        done = true;
        drain.join();
        observer.reset();  // the mask goes back to 0
      }
      if (raw != nullptr) {
        if (auto st = (*dp)->monitor_config().Update(0, sluice_monitor_config{}); !st.ok())
          Die(st.ToString());
        done = true;
        drain.join();
        ring_buffer__consume(raw);
        ring_buffer__free(raw);
        mopts.rate = 0;
        mopts.burst = 0;
        auto m = monitor::FlowMonitor::Start((*dp)->events_fd(), (*dp)->monitor_config(),
                                             (*dp)->monitor_cpu(), nullptr, mopts);
        if (!m.ok()) Die(m.status().ToString());
        *mon = std::move(*m);
      }
      if (cs.work == Work::kNewFlow) clear_new_flows();
      cs.rounds.push_back(InterquartileMean(ns));
    }
  }

  auto counters = (*mon)->DatapathCounters();
  std::printf(
      "\n== flow monitor in sluice_from_pod: BPF_PROG_TEST_RUN kernel duration, repeat=1, median "
      "over %d rounds of the interquartile mean of %d runs (%s)\n",
      rounds, kBatch, "same process, same maps");
  std::printf("%-18s %-31s %9s %11s %9s\n", "workload", "monitor", "ns/pkt", "- baseline",
              "x base");
  for (Work w : {Work::kEstablished, Work::kNewFlow, Work::kDropped}) {
    double base = 0;
    for (const Case& cs : cases) {
      if (cs.work != w) continue;
      double m = Median(cs.rounds);
      if (cs.mode == Mode::kBaseline) base = m;
      std::printf("%-18s %-31s %9.1f %11.1f %8.3fx\n", WorkName(w), ModeName(cs.mode), m, m - base,
                  m / base);
    }
  }
  double a_base = 0, a_off = 0;
  for (const Case& cs : cases) {
    if (cs.work != Work::kEstablished) continue;
    if (cs.mode == Mode::kBaseline) a_base = Median(cs.rounds);
    if (cs.mode == Mode::kNoListener) a_off = Median(cs.rounds);
  }
  std::printf("(a) nobody listens / baseline = %.3fx (target <= 1.03)\n", a_off / a_base);
  auto median_of = [&](Work w, Mode m) {
    for (const Case& cs : cases)
      if (cs.work == w && cs.mode == m) return Median(cs.rounds);
    return 0.0;
  };
  for (Work w : {Work::kEstablished, Work::kNewFlow, Work::kDropped}) {
    std::printf("%s: raw ring consumer at full rate / monitor off (nobody listens) = %.3fx\n",
                WorkName(w), median_of(w, Mode::kRawRing) / median_of(w, Mode::kNoListener));
  }
  for (Work w : {Work::kEstablished, Work::kNewFlow, Work::kDropped}) {
    std::printf("%s: direction counters (today) / counters as before = %.3fx (target <= 1.03)\n",
                WorkName(w),
                median_of(w, Mode::kNoListener) / median_of(w, Mode::kCountersAsBefore));
  }
  std::printf(
      "datapath, all rounds: %llu events emitted, %llu refused by the rate limit, %llu for a "
      "full ring buffer; the listeners took %llu flows while their batches ran, the raw consumer "
      "%llu records\n",
      static_cast<unsigned long long>(counters.emitted),
      static_cast<unsigned long long>(counters.lost_rate),
      static_cast<unsigned long long>(counters.lost_full),
      static_cast<unsigned long long>(events_seen),
      static_cast<unsigned long long>(raw_seen.load()));
  return 0;
}

}  // namespace sluice::bench

int main(int argc, char** argv) {
  int rounds = argc > 1 ? std::atoi(argv[1]) : 15;
  return sluice::bench::Main(rounds > 0 ? rounds : 15);
}
