// What the kernel's verifier costs the agent at every start: each BPF object Sluice embeds is
// loaded as the agent loads it (the skeleton's ELF bytes, maps pinned on a scratch bpffs), the
// TC objects in their main build (bpf_cast_to_kern_ctx, inline L4 checksums) and in their
// SLUICE_NO_KERN_CTX build, in the same run. Printed per object and build: the instructions the
// verifier processed (the sum over the object's programs, from the kernel's BPF_LOG_STATS line)
// and the median wall time of bpf_object__load over --rounds loads, then the ratio main / compat.
// The compat build updates checksums through the helper and has no branches on the skb's checksum
// state, so the ratio is what the inline checksum code costs at start-up.
//
// --baseline_obj=NAME=PATH (repeatable) loads an object built from another tree (the code before
// a change: the monoliths before the stages) in the same rounds, NAME being the embedded object it
// stands beside (sluice_pod_egress, sluice_pod_egress_compat, sluice_netdev, sluice_sock_lb,
// sluice_xdp, ...). Its maps are pinned under a scratch root of their own, so an older map layout
// loads as it did in its own tree. Printed then: new / old per object, and for every program the
// agent loads at a start (the main builds of the TC objects, sluice_sock_lb and sluice_xdp), the
// median over rounds of each round's summed load time, new / old.
//
// Usage: verifier_bench [--rounds=N] [--baseline_obj=NAME=PATH]... (root: mounts a scratch bpffs,
// loads programs).
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "sluice_netdev.skel.h"
#include "sluice_netdev_compat.skel.h"
#include "sluice_overlay.skel.h"
#include "sluice_overlay_compat.skel.h"
#include "sluice_pod_egress.skel.h"
#include "sluice_pod_egress_compat.skel.h"
#include "sluice_sock_lb.skel.h"
#include "sluice_xdp.skel.h"
#include "support/fixture.h"

namespace {

struct Build {
  const char* name;    // the bpf_object() name: sluice_pod_egress_compat
  const char* object;  // sluice_pod_egress
  const char* build;   // main or compat
  const void* (*elf)(size_t*);
  bool agent_loads;  // on a kernel with bpf_cast_to_kern_ctx, as this bench's
};

// ELF bytes of one load: an embedded object's, or a baseline's read from its file.
struct Elf {
  const void* data = nullptr;
  size_t size = 0;
};

// "processed 12345 insns (limit ..." in a program's verifier log.
long long ProcessedInsns(const char* log) {
  const char* p = strstr(log, "processed ");
  return p == nullptr ? -1 : atoll(p + strlen("processed "));
}

// One load of the object in elf; insns < 0 when a program's log held no count. log_level: 4
// (BPF_LOG_STATS) to time it, 1 | 4 to show why a program was refused.
bool LoadOnce(const std::string& what, const Elf& elf, const std::string& pin_root,
              long long* insns, double* ms, int log_level = 4) {
  LIBBPF_OPTS(bpf_object_open_opts, opts, .pin_root_path = pin_root.c_str());
  struct bpf_object* obj = bpf_object__open_mem(elf.data, elf.size, &opts);
  if (obj == nullptr) {
    fprintf(stderr, "%s: open: %s\n", what.c_str(), strerror(errno));
    return false;
  }
  std::vector<std::vector<char>> logs;
  struct bpf_program* prog;
  bpf_object__for_each_program(prog, obj) {
    logs.emplace_back(log_level == 4 ? 1 << 16 : 1 << 26);
    bpf_program__set_log_buf(prog, logs.back().data(), logs.back().size());
    bpf_program__set_log_level(prog, log_level);
  }
  auto start = std::chrono::steady_clock::now();
  int err = bpf_object__load(obj);
  *ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (err != 0) {
    fprintf(stderr, "%s: load: %s\n", what.c_str(), strerror(-err));
    bpf_object__close(obj);
    if (log_level == 4) return LoadOnce(what, elf, pin_root, insns, ms, 1 | 4);
    // The end of each program's log: where the verifier stopped in the refused one.
    for (const auto& log : logs) {
      size_t len = strlen(log.data());
      if (len > 0) fprintf(stderr, "%s\n", log.data() + (len > 3000 ? len - 3000 : 0));
    }
    return false;
  }
  *insns = 0;
  for (const auto& log : logs) {
    long long n = ProcessedInsns(log.data());
    if (n < 0) {
      *insns = -1;
      break;
    }
    *insns += n;
  }
  bpf_object__close(obj);
  return true;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One object's loads: its times over the rounds and the instructions verified.
struct Loads {
  std::vector<double> ms;
  long long insns = -1;
};

}  // namespace

int main(int argc, char** argv) {
  const Build builds[] = {
      {"sluice_pod_egress", "sluice_pod_egress", "main", sluice_pod_egress__elf_bytes, true},
      {"sluice_pod_egress_compat", "sluice_pod_egress", "compat",
       sluice_pod_egress_compat__elf_bytes, false},
      {"sluice_netdev", "sluice_netdev", "main", sluice_netdev__elf_bytes, true},
      {"sluice_netdev_compat", "sluice_netdev", "compat", sluice_netdev_compat__elf_bytes, false},
      {"sluice_overlay", "sluice_overlay", "main", sluice_overlay__elf_bytes, true},
      {"sluice_overlay_compat", "sluice_overlay", "compat", sluice_overlay_compat__elf_bytes,
       false},
      {"sluice_sock_lb", "sluice_sock_lb", "main", sluice_sock_lb__elf_bytes, true},
      {"sluice_xdp", "sluice_xdp", "main", sluice_xdp__elf_bytes, true},
  };
  constexpr int kBuilds = sizeof(builds) / sizeof(builds[0]);
  int rounds = 5;
  std::vector<std::string> baseline_path(kBuilds);
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (strncmp(a, "--rounds=", 9) == 0) {
      rounds = atoi(a + 9);
      continue;
    }
    const char* eq = strncmp(a, "--baseline_obj=", 15) == 0 ? strchr(a + 15, '=') : nullptr;
    int which = -1;
    for (int b = 0; eq != nullptr && b < kBuilds; ++b) {
      if (std::string(a + 15, eq) == builds[b].name) which = b;
    }
    if (which < 0) {
      fprintf(stderr,
              "usage: %s [--rounds=N] [--baseline_obj=NAME=PATH]...\n"
              "  NAME: an embedded object (sluice_pod_egress, sluice_pod_egress_compat, "
              "sluice_netdev, sluice_netdev_compat, sluice_overlay, sluice_overlay_compat, "
              "sluice_sock_lb, sluice_xdp)\n",
              argv[0]);
      return 2;
    }
    baseline_path[which] = eq + 1;
  }
  if (rounds < 1) rounds = 1;

  // The embedded objects, then the baselines read whole from their files.
  std::vector<Elf> elf(kBuilds), base_elf(kBuilds);
  std::vector<std::string> base_bytes(kBuilds);
  bool with_baselines = false;
  for (int i = 0; i < kBuilds; ++i) {
    elf[i].data = builds[i].elf(&elf[i].size);
    if (baseline_path[i].empty()) continue;
    std::ifstream in(baseline_path[i], std::ios::binary);
    base_bytes[i].assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) {
      fprintf(stderr, "%s: read %s: %s\n", builds[i].name, baseline_path[i].c_str(),
              strerror(errno));
      return 1;
    }
    if (base_bytes[i].empty()) {
      fprintf(stderr, "%s: %s is empty or unreadable\n", builds[i].name, baseline_path[i].c_str());
      return 1;
    }
    base_elf[i] = {base_bytes[i].data(), base_bytes[i].size()};
    with_baselines = true;
  }

  sluice::testing::ScratchBpffs bpffs;  // unmounted, pins and all, on return
  const std::string pin_root = bpffs.path();
  // The baselines' maps apart from this build's: a layout that changed since loads as it did.
  const std::string base_pin_root = pin_root + "/baseline";
  if (with_baselines && mkdir(base_pin_root.c_str(), 0700) != 0) {
    fprintf(stderr, "mkdir %s: %s\n", base_pin_root.c_str(), strerror(errno));
    return 1;
  }

  std::vector<Loads> now(kBuilds), old(kBuilds);
  // Per round, what every program the agent loads took, summed: this build's and the baselines'
  // (the latter only when every object the agent loads has one).
  std::vector<double> agent_now, agent_old;
  bool agent_has_baselines = with_baselines;
  for (int i = 0; i < kBuilds; ++i) {
    if (builds[i].agent_loads && base_elf[i].data == nullptr) agent_has_baselines = false;
  }
  // Rounds interleave every load, this build's beside its baseline, in an order reversed every
  // other round: a busy moment of the host falls on both, and neither always goes first.
  struct Step {
    int build;
    bool baseline;
  };
  std::vector<Step> order;
  for (int i = 0; i < kBuilds; ++i) {
    order.push_back({i, false});
    if (base_elf[i].data != nullptr) order.push_back({i, true});
  }
  for (int r = 0; r < rounds; ++r) {
    double round_now = 0, round_old = 0;
    for (const Step& s : order) {
      const Build& b = builds[s.build];
      const std::string what = std::string(b.name) + (s.baseline ? " (baseline)" : "");
      Loads& loads = s.baseline ? old[s.build] : now[s.build];
      double ms = 0;
      if (!LoadOnce(what, s.baseline ? base_elf[s.build] : elf[s.build],
                    s.baseline ? base_pin_root : pin_root, &loads.insns, &ms)) {
        return 1;
      }
      loads.ms.push_back(ms);
      if (b.agent_loads) (s.baseline ? round_old : round_now) += ms;
    }
    agent_now.push_back(round_now);
    agent_old.push_back(round_old);
    std::reverse(order.begin(), order.end());
  }

  printf("%-18s %-7s %14s %12s", "object", "build", "insns_verified", "load_ms_p50");
  if (with_baselines)
    printf(" %14s %12s %11s %10s", "old_insns", "old_ms_p50", "insns_ratio", "load_ratio");
  printf("\n");
  for (int i = 0; i < kBuilds; ++i) {
    printf("%-18s %-7s %14lld %12.1f", builds[i].object, builds[i].build, now[i].insns,
           Median(now[i].ms));
    if (!old[i].ms.empty()) {
      printf(" %14lld %12.1f %10.2fx %9.2fx", old[i].insns, Median(old[i].ms),
             static_cast<double>(now[i].insns) / static_cast<double>(old[i].insns),
             Median(now[i].ms) / Median(old[i].ms));
    }
    printf("\n");
  }
  for (int i = 0; i + 1 < kBuilds; ++i) {
    if (strcmp(builds[i].object, builds[i + 1].object) != 0) continue;
    printf("%s main/compat: insns %.2fx, load %.2fx\n", builds[i].object,
           static_cast<double>(now[i].insns) / static_cast<double>(now[i + 1].insns),
           Median(now[i].ms) / Median(now[i + 1].ms));
  }
  long long agent_insns = 0, agent_old_insns = 0;
  for (int i = 0; i < kBuilds; ++i) {
    if (!builds[i].agent_loads) continue;
    agent_insns += now[i].insns;
    agent_old_insns += old[i].insns;
  }
  printf(
      "every program the agent loads (main builds, sluice_sock_lb, sluice_xdp): %lld insns, "
      "%.1f ms (median over rounds of each round's sum)",
      agent_insns, Median(agent_now));
  if (agent_has_baselines) {
    // The rounds' own ratios too: a round's two sums were taken moments apart.
    std::vector<double> ratios;
    for (int r = 0; r < rounds; ++r) ratios.push_back(agent_now[r] / agent_old[r]);
    std::sort(ratios.begin(), ratios.end());
    printf("; baselines %lld insns, %.1f ms; new/old: insns %.2fx, load %.2fx (rounds %.2f-%.2fx)",
           agent_old_insns, Median(agent_old),
           static_cast<double>(agent_insns) / static_cast<double>(agent_old_insns),
           Median(agent_now) / Median(agent_old), ratios.front(), ratios.back());
  }
  printf("\n");
  return 0;
}
