// Maglev consistent hashing (agent/service/maglev.h), each figure a ratio measured in this run:
//   1. disruption: the fraction of 1M flows (random client address and port, hashed with the
//      datapath's sluice_maglev_flow_hash) whose backend changes when 1 of N backends is
//      removed or one is added, N = 10 and 100, as a multiple of 1/N (the target: 1.2);
//   2. balance: max/mean flows per backend over 1M flows (target <= 1.05);
//   3. table computation for M = 65537 (and 16381) and 1,000 backends: MaglevTable against
//      MaglevTableBaseline (the paper's and Katran's fill, a 64-bit modulo per probe), best of
//      --reps runs each, interleaved;
//   4. memory of the datapath's tables for 10k Maglev Services (4 bytes a slot, plus the slot
//      holding M), computed from the table layout.
// No root needed: pure computation. usage: maglev_bench [--reps=20] [--flows=1000000]
#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "agent/service/maglev.h"
#include "maps/lb.h"

namespace {

using sluice::agent::MaglevBackend;
using sluice::agent::MaglevTable;
using sluice::agent::MaglevTableBaseline;

struct Flow {
  uint32_t saddr;
  uint16_t sport;
};

std::vector<MaglevBackend> Backends(uint32_t n) {
  std::vector<MaglevBackend> b;
  for (uint32_t i = 0; i < n; ++i) b.push_back({htonl(0x0a010000u + i), 8080, IPPROTO_TCP, 1});
  return b;
}

// The backend address each flow lands on.
std::vector<uint32_t> Route(const std::vector<Flow>& flows, const std::vector<MaglevBackend>& b,
                            uint32_t m) {
  auto table = MaglevTable(b, m);
  std::vector<uint32_t> out;
  out.reserve(flows.size());
  for (const Flow& f : flows) {
    uint32_t h = sluice_maglev_flow_hash(f.saddr, f.sport, htons(80), IPPROTO_TCP);
    out.push_back(b[table[h % m]].addr);
  }
  return out;
}

double Moved(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  size_t moved = 0;
  for (size_t i = 0; i < a.size(); ++i) moved += a[i] != b[i];
  return static_cast<double>(moved) / a.size();
}

double Millis(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  size_t nflows = 1000000;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--reps=", 7) == 0) {
      reps = std::max(1, std::atoi(argv[i] + 7));
    } else if (std::strncmp(argv[i], "--flows=", 8) == 0) {
      nflows = std::max(1000, std::atoi(argv[i] + 8));
    } else {
      std::fprintf(stderr, "usage: %s [--reps=N] [--flows=N]\n", argv[0]);
      return 2;
    }
  }
  std::mt19937_64 rng(33);
  std::vector<Flow> flows(nflows);
  for (Flow& f : flows) {
    f.saddr = static_cast<uint32_t>(rng());
    f.sport = static_cast<uint16_t>(1024 + rng() % 64512);
  }

  std::printf("## 1. disruption: flows moved when 1 of N backends leaves or joins (x 1/N)\n");
  std::printf("%-7s %-5s %14s %14s %8s\n", "M", "N", "remove (x1/N)", "add (x1/N)", "target");
  for (uint32_t m : {16381u, 65537u}) {
    for (uint32_t n : {10u, 100u}) {
      auto all = Backends(n + 1);
      std::vector<MaglevBackend> base(all.begin(), all.begin() + n);
      auto before = Route(flows, base, m);
      // Remove: the worst and mean over a few positions (first, middle, last).
      double remove = 0;
      for (uint32_t k : {0u, n / 2, n - 1}) {
        auto fewer = base;
        fewer.erase(fewer.begin() + k);
        remove = std::max(remove, Moved(before, Route(flows, fewer, m)) * n);
      }
      double add = Moved(before, Route(flows, all, m)) * n;
      std::printf("%-7u %-5u %14.3f %14.3f %8s\n", m, n, remove, add, "1.2");
    }
  }

  std::printf("\n## 2. balance: max/mean flows per backend over %zu flows\n", nflows);
  std::printf("%-7s %-5s %10s %8s\n", "M", "N", "max/mean", "target");
  for (uint32_t m : {16381u, 65537u}) {
    for (uint32_t n : {10u, 100u}) {
      auto b = Backends(n);
      auto routed = Route(flows, b, m);
      std::vector<size_t> load(n, 0);
      for (uint32_t addr : routed) ++load[ntohl(addr) - 0x0a010000u];
      double mean = static_cast<double>(nflows) / n;
      std::printf("%-7u %-5u %10.4f %8s\n", m, n,
                  *std::max_element(load.begin(), load.end()) / mean, "1.05");
    }
  }

  std::printf("\n## 3. table computation, 1,000 backends: MaglevTable vs the baseline fill "
              "(best of %d)\n",
              reps);
  std::printf("%-7s %14s %14s %8s\n", "M", "sluice ms", "baseline ms", "ratio");
  for (uint32_t m : {65537u, 16381u}) {
    auto b = Backends(1000);
    double fast = 1e18, base = 1e18;
    bool same = true;
    for (int r = 0; r < reps; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      auto a = MaglevTable(b, m);
      auto t1 = std::chrono::steady_clock::now();
      auto c = MaglevTableBaseline(b, m);
      auto t2 = std::chrono::steady_clock::now();
      fast = std::min(fast, Millis(t1 - t0));
      base = std::min(base, Millis(t2 - t1));
      same &= a == c;
    }
    std::printf("%-7u %14.3f %14.3f %7.2fx%s\n", m, fast, base, base / fast,
                same ? "" : "  (TABLES DIFFER)");
    if (!same) return 1;
  }

  std::printf("\n## 4. datapath memory of 10,000 Maglev frontends (tables only)\n");
  for (uint32_t m : {16381u, 65537u}) {
    double bytes = 10000.0 * (m + 1) * sizeof(uint32_t);
    std::printf("M=%-6u %8.1f MiB (%u bytes a table)\n", m, bytes / (1 << 20),
                static_cast<unsigned>((m + 1) * sizeof(uint32_t)));
  }
  return 0;
}
