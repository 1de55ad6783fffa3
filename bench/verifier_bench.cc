// What the kernel's verifier costs the agent at every start: each TC object Sluice embeds is
// loaded as the agent loads it (the skeleton's ELF bytes, maps pinned on a scratch bpffs), in its main build (bpf_cast_to_kern_ctx, inline L4 checksums) and in its
// SLUICE_NO_KERN_CTX build, in the same run. Printed per object and build: the instructions the
// verifier processed (the sum over the object's programs, from the kernel's BPF_LOG_STATS line)
// and the median wall time of bpf_object__load over --rounds loads, then the ratio main / compat.
// The compat build updates checksums through the helper and has no branches on the skb's checksum
// state, so the ratio is what the inline checksum code costs at start-up.
//
// Usage: verifier_bench [--rounds=N] (root: mounts a scratch bpffs, loads programs).
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "sluice_netdev.skel.h"
#include "sluice_netdev_compat.skel.h"
#include "sluice_overlay.skel.h"
#include "sluice_overlay_compat.skel.h"
#include "sluice_pod_egress.skel.h"
#include "sluice_pod_egress_compat.skel.h"
#include "support/fixture.h"

namespace {

struct Build {
  const char* object;
  const char* build;
  const void* (*elf)(size_t*);
};

struct Result {
  long long insns = 0;  // summed over the object's programs
  double load_ms = 0;   // median over the rounds
};

// "processed 12345 insns (limit ..." in a program's verifier log.
long long ProcessedInsns(const char* log) {
  const char* p = strstr(log, "processed ");
  return p == nullptr ? -1 : atoll(p + strlen("processed "));
}

// One load of the object in elf; insns < 0 when a program's log held no count. log_level: 4
// (BPF_LOG_STATS) to time it, 1 | 4 to show why a program was refused.
bool LoadOnce(const Build& b, const std::string& pin_root, long long* insns, double* ms,
              int log_level = 4) {
  size_t size = 0;
  const void* data = b.elf(&size);
  LIBBPF_OPTS(bpf_object_open_opts, opts, .pin_root_path = pin_root.c_str());
  struct bpf_object* obj = bpf_object__open_mem(data, size, &opts);
  if (obj == nullptr) {
    fprintf(stderr, "%s/%s: open: %s\n", b.object, b.build, strerror(errno));
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
    fprintf(stderr, "%s/%s: load: %s\n", b.object, b.build, strerror(-err));
    bpf_object__close(obj);
    if (log_level == 4) return LoadOnce(b, pin_root, insns, ms, 1 | 4);
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

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  for (int i = 1; i < argc; ++i) {
    if (strncmp(argv[i], "--rounds=", 9) == 0) {
      rounds = atoi(argv[i] + 9);
    } else {
      fprintf(stderr, "usage: %s [--rounds=N]\n", argv[0]);
      return 2;
    }
  }
  if (rounds < 1) rounds = 1;
  sluice::testing::ScratchBpffs bpffs;  // unmounted, pins and all, on return
  const std::string pin_root = bpffs.path();
  const Build builds[] = {
      {"sluice_pod_egress", "main", sluice_pod_egress__elf_bytes},
      {"sluice_pod_egress", "compat", sluice_pod_egress_compat__elf_bytes},
      {"sluice_netdev", "main", sluice_netdev__elf_bytes},
      {"sluice_netdev", "compat", sluice_netdev_compat__elf_bytes},
      {"sluice_overlay", "main", sluice_overlay__elf_bytes},
      {"sluice_overlay", "compat", sluice_overlay_compat__elf_bytes},
  };
  constexpr int kBuilds = sizeof(builds) / sizeof(builds[0]);
  std::vector<std::vector<double>> times(kBuilds);
  std::vector<long long> insns(kBuilds, -1);
  bool ok = true;
  // Rounds interleave the builds, so a busy moment of the host falls on both.
  for (int r = 0; r < rounds && ok; ++r) {
    for (int i = 0; i < kBuilds && ok; ++i) {
      double ms = 0;
      ok = LoadOnce(builds[i], pin_root, &insns[i], &ms);
      times[i].push_back(ms);
    }
  }
  if (!ok) return 1;
  std::vector<Result> results(kBuilds);
  for (int i = 0; i < kBuilds; ++i) {
    std::sort(times[i].begin(), times[i].end());
    results[i] = {insns[i], times[i][times[i].size() / 2]};
  }
  printf("%-18s %-7s %14s %12s\n", "object", "build", "insns_verified", "load_ms_p50");
  for (int i = 0; i < kBuilds; ++i)
    printf("%-18s %-7s %14lld %12.1f\n", builds[i].object, builds[i].build, results[i].insns,
           results[i].load_ms);
  for (int i = 0; i + 1 < kBuilds; i += 2) {
    printf("%s main/compat: insns %.2fx, load %.2fx\n", builds[i].object,
           static_cast<double>(results[i].insns) / static_cast<double>(results[i + 1].insns),
           results[i].load_ms / results[i + 1].load_ms);
  }
  return 0;
}
