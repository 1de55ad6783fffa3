// Per-packet cost of sluice_from_pod (TC ingress of a pod's host-side veth) measured with
// BPF_PROG_TEST_RUN, always next to an empty TC program (`r0 = 0; exit`) timed the same way in
// the same process: the claims are the ratio sluice/empty and the difference in ns.
//
// How the numbers are made, and the test_run pitfalls they avoid:
// - `duration` is the kernel's own mean over `repeat` runs (ktime around the loop / repeat, u32
//   ns, rounded down); syscall entry, skb allocation and copy-out are outside it. Each benchmark
//   iteration is one syscall; its manual time is duration * repeat, and ns_per_pkt is the sum of
//   those over the packets run. Whole-ns truncation is per syscall, the same for every case.
// - The kernel's loop itself costs something per iteration (local_bh_disable/enable, the timer's
//   need_resched/signal checks, the indirect call into the JITed program). The empty program
//   measures exactly that overhead, so "sluice - empty" is the program's own work.
// - The same skb is reused for all `repeat` runs: rewrites persist. The redirect path decrements
//   the TTL, so with repeat = 1e6 everything after run 63 would be the TTL-exceeded drop path.
//   Redirect cases therefore start from TTL 255 and use repeat = 250 per syscall (many
//   syscalls), and every syscall checks the verdict and that the TTL went down by exactly
//   `repeat`. The pass path does not touch the packet and also runs at repeat = 100000 to show
//   the per-packet figure does not depend on the batch size.
// - bpf_redirect_peer() only records the target in test_run; the verdict is returned and nothing
//   is delivered (no skb_do_redirect, no peer netns switch). Case (a) is the program's cost, not
//   the cost of the delivery it requests.
// - Map lookups hit a hot cache: the same key every run. The 10k-endpoint rows show the lookup is
//   O(1) in map size; the "dst cycles" row changes the destination every syscall, which is as far
//   as a reused skb lets one go toward cold lookups.
// - No conntrack or NAT state is touched on these paths, so no map side effect accumulates.
#include <arpa/inet.h>
#include <benchmark/benchmark.h>
#include <bpf/bpf.h>
#include <linux/bpf.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "loader/datapath.h"
#include "support/fixture.h"
#include "support/packet.h"
#include "test_run.h"

namespace sluice::bench {
namespace {

using testing::Bytes;
using testing::Ip4;
using testing::kTcOk;
using testing::kTcRedirect;
using testing::Mac;
using testing::Packet;
using testing::ParseMac;

const Mac kPodAMac = ParseMac("02:00:00:00:0a:01");
const Mac kPodBMac = ParseMac("02:00:00:00:0b:01");
const Mac kHostAMac = ParseMac("02:aa:00:00:0a:02");
const Mac kHostBMac = ParseMac("02:aa:00:00:0b:02");
constexpr int kPodAIfindex = 1;  // lo: test_run receives on it, so the source check passes
constexpr int kPodBIfindex = 4242;
constexpr uint8_t kStartTtl = 255;
constexpr uint32_t kRedirectRepeat = 250;  // < kStartTtl: every run stays on the redirect path
constexpr uint32_t kLargeRepeat = 100000;
constexpr uint64_t kPacketsPerRun = 1000000;
constexpr int kRepetitions = 9;
constexpr int kManyEndpoints = 10000;
constexpr size_t kTtlOffset = 14 + 8;  // Ethernet header + IPv4 TTL

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "pod_egress_bench: %s\n", what.c_str());
  std::exit(1);
}

TestRunOut TestRun(int prog_fd, const Bytes& in, uint32_t repeat) {
  TestRunOut r;
  if (!RunTc(prog_fd, in, kPodAIfindex, &r, repeat))
    Die(absl::StrCat("BPF_PROG_TEST_RUN: ", std::strerror(errno)));
  return r;
}

// One datapath on its own bpffs, so the 2-endpoint and 10k-endpoint maps coexist and the
// benchmarks can interleave.
struct LoadedDatapath {
  std::unique_ptr<testing::ScratchBpffs> bpffs;
  std::unique_ptr<loader::Datapath> dp;

  void AddEndpoint(uint32_t addr_be, int ifindex, const Mac& mac, const Mac& host_mac,
                   uint32_t id) {
    auto st = testing::AddEndpoint(*dp, addr_be, ifindex, mac, host_mac, id);
    if (!st.ok()) Die(absl::StrCat("program endpoint ", id, ": ", st.ToString()));
  }
};

// Pods A (the sender, on lo) and B, plus `extra` more endpoints at 10.245.x.y.
std::unique_ptr<LoadedDatapath> LoadWithEndpoints(int extra) {
  auto l = std::make_unique<LoadedDatapath>();
  l->bpffs = std::make_unique<testing::ScratchBpffs>();
  auto dp = loader::Datapath::Load(l->bpffs->path());
  if (!dp.ok()) Die(absl::StrCat("Datapath::Load: ", dp.status().ToString()));
  l->dp = std::move(*dp);
  l->AddEndpoint(Ip4("10.244.0.10"), kPodAIfindex, kPodAMac, kHostAMac, 1);
  l->AddEndpoint(Ip4("10.244.0.11"), kPodBIfindex, kPodBMac, kHostBMac, 2);
  for (int i = 0; i < extra; ++i) {
    uint32_t addr = htonl((10u << 24) | (245u << 16) | static_cast<uint32_t>(i + 1));
    l->AddEndpoint(addr, 10000 + i, kPodBMac, kHostBMac, 100 + i);
  }
  auto n = l->dp->endpoints().Count();
  if (!n.ok() || *n != static_cast<size_t>(extra + 2))
    Die(absl::StrCat("endpoint map holds ", n.ok() ? *n : 0, " entries, want ", extra + 2));
  return l;
}

Bytes PodToPod(const std::string& dst) {
  return Packet::Eth(kPodAMac, kHostAMac)
      .IPv4("10.244.0.10", dst, kStartTtl)
      .TCP(40000, 8080)
      .Payload("hello")
      .Build();
}

struct Case {
  std::string name;
  std::string label;  // for the summary table
  int prog_fd;
  std::vector<Bytes> packets;  // one per syscall, cycling
  int verdict;
  bool rewrites_ttl;
};

// Validates a case once, on a single run, before anything is timed.
void Validate(const Case& c) {
  for (const Bytes& in : c.packets) {
    auto r = TestRun(c.prog_fd, in, 1);
    if (r.verdict != c.verdict)
      Die(absl::StrCat(c.name, ": verdict ", r.verdict, ", want ", c.verdict, " (",
                       testing::Describe(r.out), ")"));
    if (c.rewrites_ttl) {
      auto d = testing::Decode(r.out);
      if (!d || d->eth_dst != kPodBMac || d->ttl != kStartTtl - 1 || !d->ip_csum_ok ||
          !d->l4_csum_ok)
        Die(absl::StrCat(c.name, ": unexpected output ", testing::Describe(r.out)));
    } else if (r.out != in) {
      Die(absl::StrCat(c.name, ": packet changed: ", testing::Describe(r.out)));
    }
  }
}

void RunCase(benchmark::State& state, const Case& c) {
  const auto repeat = static_cast<uint32_t>(state.range(0));
  double total_ns = 0;
  uint64_t packets = 0;
  size_t i = 0;
  for (auto _ : state) {
    const Bytes& in = c.packets[i++ % c.packets.size()];
    auto r = TestRun(c.prog_fd, in, repeat);
    if (r.verdict != c.verdict) {
      state.SkipWithError(absl::StrCat("verdict ", r.verdict, ", want ", c.verdict).c_str());
      break;
    }
    if (c.rewrites_ttl && r.out[kTtlOffset] != kStartTtl - repeat) {
      state.SkipWithError("TTL not decremented once per run: not all runs took the redirect path");
      break;
    }
    const double ns = static_cast<double>(r.ns) * repeat;
    state.SetIterationTime(ns * 1e-9);
    total_ns += ns;
    packets += repeat;
  }
  if (packets > 0) state.counters["ns_per_pkt"] = total_ns / static_cast<double>(packets);
  state.SetItemsProcessed(static_cast<int64_t>(packets));
}

// Console output plus the median ns_per_pkt of each benchmark, for the ratio table.
class CapturingReporter : public benchmark::ConsoleReporter {
 public:
  // A display reporter passed in is not configured by --benchmark_color: colour only on a tty.
  CapturingReporter() : ConsoleReporter(isatty(STDOUT_FILENO) ? OO_ColorTabular : OO_Tabular) {}
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& run : runs) {
      if (run.run_type == Run::RT_Aggregate && run.aggregate_name == "median") {
        auto it = run.counters.find("ns_per_pkt");
        if (it != run.counters.end())
          median_ns[run.run_name.function_name + "/" + run.run_name.args] = it->second.value;
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<std::string, double> median_ns;
};

std::string JitSetting() {
  FILE* f = std::fopen("/proc/sys/net/core/bpf_jit_enable", "r");
  if (!f) return "?";
  char buf[16] = {};
  if (!std::fgets(buf, sizeof(buf), f)) buf[0] = '?';
  std::fclose(f);
  std::string s(buf);
  while (!s.empty() && (s.back() == '\n')) s.pop_back();
  return s;
}

}  // namespace
}  // namespace sluice::bench

int main(int argc, char** argv) {
  using namespace sluice::bench;
  // Defaults that make the ratios fair: repetitions interleaved at random, so a noisy moment on a
  // shared machine does not land on one case only. Flags given on the command line win.
  std::vector<char*> args(argv, argv + argc);
  std::string interleave = "--benchmark_enable_random_interleaving=true";
  args.insert(args.begin() + 1, interleave.data());
  int nargs = static_cast<int>(args.size());
  benchmark::Initialize(&nargs, args.data());
  if (benchmark::ReportUnrecognizedArguments(nargs, args.data())) return 1;

  const int empty_fd = LoadEmptyTcProgram();
  if (empty_fd < 0) Die(absl::StrCat("load empty SCHED_CLS program: ", std::strerror(errno)));
  auto small = LoadWithEndpoints(0);
  auto large = LoadWithEndpoints(kManyEndpoints - 2);

  const Bytes to_b = PodToPod("10.244.0.11");
  const Bytes outside = Packet::Eth(kPodAMac, kHostAMac)
                            .IPv4("10.244.0.10", "198.51.100.7", kStartTtl)
                            .TCP(40000, 80)
                            .Payload("hello")
                            .Build();
  std::vector<Bytes> to_many;
  for (uint64_t i = 1; i <= kPacketsPerRun / kRedirectRepeat && i <= kManyEndpoints - 2; ++i)
    to_many.push_back(PodToPod(absl::StrFormat("10.245.%d.%d", i >> 8, i & 0xff)));

  const int small_fd = small->dp->from_pod_fd();
  const int large_fd = large->dp->from_pod_fd();
  const std::vector<Bytes> just_to_b = {to_b}, just_outside = {outside};
  const std::vector<Case> cases = {
      // name, label, program, packets (one per syscall), verdict, rewrites TTL
      {"empty_tc", "empty TC program (r0 = 0; exit)", empty_fd, just_to_b, kTcOk, false},
      {"a_pod_to_pod/eps:2", "(a) pod->same-node pod, 2 endpoints", small_fd, just_to_b,
       kTcRedirect, true},
      {"a_pod_to_pod/eps:10000", "(a) pod->same-node pod, 10k endpoints", large_fd, just_to_b,
       kTcRedirect, true},
      {"a_pod_to_pod_dst_cycles/eps:10000",
       absl::StrCat("(a) 10k endpoints, dst cycles over ", to_many.size()), large_fd, to_many,
       kTcRedirect, true},
      {"b_pod_to_outside/eps:2", "(b) pod->outside, 2 endpoints", small_fd, just_outside, kTcOk,
       false},
  };
  for (const auto& c : cases) Validate(c);

  std::vector<std::pair<std::string, std::string>> rows;  // label, captured key
  for (const auto& c : cases) {
    std::vector<uint32_t> repeats = {kRedirectRepeat};
    if (!c.rewrites_ttl) repeats.push_back(kLargeRepeat);
    for (uint32_t repeat : repeats) {
      benchmark::RegisterBenchmark(c.name.c_str(), [&c](benchmark::State& s) { RunCase(s, c); })
          ->Arg(repeat)
          ->ArgName("repeat")
          ->Iterations(static_cast<int64_t>(kPacketsPerRun / repeat))
          ->Repetitions(kRepetitions)
          ->DisplayAggregatesOnly(true)
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
      rows.emplace_back(absl::StrCat(c.label, ", repeat ", repeat),
                        absl::StrCat(c.name, "/repeat:", repeat));
    }
  }

  CapturingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();

  auto& got = reporter.median_ns;
  auto find = [&](const std::string& key) -> double {
    for (const auto& [name, ns] : got)
      if (name.rfind(key, 0) == 0) return ns;
    return -1;
  };
  const double empty = find(absl::StrCat("empty_tc/repeat:", kRedirectRepeat));
  std::printf(
      "\n== sluice_from_pod vs empty TC program: BPF_PROG_TEST_RUN kernel duration, "
      "median of %d x %llu packets, bpf_jit_enable=%s\n",
      kRepetitions, static_cast<unsigned long long>(kPacketsPerRun), JitSetting().c_str());
  std::printf("%-58s %10s %14s %12s\n", "case", "ns/pkt", "x empty(r250)", "+ns vs empty");
  for (const auto& [label, key] : rows) {
    const double ns = find(key);
    if (ns < 0) continue;  // filtered out on the command line
    if (empty > 0)
      std::printf("%-58s %10.2f %13.2fx %12.2f\n", label.c_str(), ns, ns / empty, ns - empty);
    else
      std::printf("%-58s %10.2f %14s %12s\n", label.c_str(), ns, "-", "-");
  }
  const double eps2 = find(absl::StrCat("a_pod_to_pod/eps:2/repeat:", kRedirectRepeat));
  const double eps10k = find(absl::StrCat("a_pod_to_pod/eps:10000/repeat:", kRedirectRepeat));
  const double cyc =
      find(absl::StrCat("a_pod_to_pod_dst_cycles/eps:10000/repeat:", kRedirectRepeat));
  if (eps2 > 0 && eps10k > 0)
    std::printf("O(1) in map size: (a) 10k / 2 endpoints = %.3fx (%+.2f ns)\n", eps10k / eps2,
                eps10k - eps2);
  if (eps2 > 0 && cyc > 0)
    std::printf("               (a) 10k, dst cycles / 2 endpoints = %.3fx (%+.2f ns)\n", cyc / eps2,
                cyc - eps2);
  return 0;
}
