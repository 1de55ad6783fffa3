// What the per-packet benchmarks share (lb_packet_bench, policy_packet_bench, monitor_bench,
// pod_egress_bench): the empty TC program their figures are measured against, a
// BPF_PROG_TEST_RUN of one packet with the kernel-reported duration, and the statistics of
// interleaved rounds.
#pragma once

#include <bpf/bpf.h>
#include <linux/bpf.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "support/packet.h"

namespace sluice::bench {

// The empty TC program, `r0 = 0 (TC_ACT_OK); exit`, loaded with raw libbpf: the per-run cost of
// test_run itself (ktime reads, the run loop). The fd, or -1 with errno set.
inline int LoadEmptyTcProgram() {
  struct bpf_insn insns[2] = {};
  insns[0].code = BPF_ALU64 | BPF_MOV | BPF_K;  // r0 = 0
  insns[0].dst_reg = BPF_REG_0;
  insns[1].code = BPF_JMP | BPF_EXIT;
  return bpf_prog_load(BPF_PROG_TYPE_SCHED_CLS, "bench_empty", "GPL", insns, 2, nullptr);
}

// The empty XDP program, `r0 = XDP_PASS; exit`: the same for the XDP hook (the Katran comparison in
// lb_packet_bench).
inline int LoadEmptyXdpProgram() {
  struct bpf_insn insns[2] = {};
  insns[0].code = BPF_ALU64 | BPF_MOV | BPF_K;  // r0 = XDP_PASS
  insns[0].dst_reg = BPF_REG_0;
  insns[0].imm = XDP_PASS;
  insns[1].code = BPF_JMP | BPF_EXIT;
  return bpf_prog_load(BPF_PROG_TYPE_XDP, "bench_empty_xdp", "GPL", insns, 2, nullptr);
}

struct TestRunOut {
  int verdict = -1;
  uint32_t ns = 0;     // the kernel's duration, the mean over `repeat` runs
  testing::Bytes out;  // the packet as the (last) run left it
};

// Runs the TC program prog_fd `repeat` times on `in`, as received on `ifindex` (1 = lo: test_run
// needs a real device). Keep repeat = 1 for anything with side effects: test_run reuses the skb
// and the maps across repeats. False with errno set when the kernel refuses the run.
inline bool RunTc(int prog_fd, const testing::Bytes& in, int ifindex, TestRunOut* r,
                  uint32_t repeat = 1) {
  r->out.assign(in.size() + 256, 0);
  struct __sk_buff ctx {};
  ctx.ifindex = static_cast<__u32>(ifindex);
  LIBBPF_OPTS(bpf_test_run_opts, opts, .data_in = in.data(), .data_out = r->out.data(),
              .data_size_in = static_cast<__u32>(in.size()),
              .data_size_out = static_cast<__u32>(r->out.size()), .ctx_in = &ctx,
              .ctx_size_in = sizeof(ctx), .repeat = static_cast<int>(repeat));
  if (bpf_prog_test_run_opts(prog_fd, &opts) != 0) return false;
  r->verdict = static_cast<int>(opts.retval);
  r->ns = opts.duration;
  r->out.resize(opts.data_size_out);
  return true;
}

// Runs the XDP program prog_fd once on `in` (the kernel gives the frame XDP's headroom, so the
// program may grow it at the front). False with errno set when the kernel refuses the run.
inline bool RunXdp(int prog_fd, const testing::Bytes& in, TestRunOut* r) {
  r->out.assign(in.size() + 256, 0);
  LIBBPF_OPTS(bpf_test_run_opts, opts, .data_in = in.data(), .data_out = r->out.data(),
              .data_size_in = static_cast<__u32>(in.size()),
              .data_size_out = static_cast<__u32>(r->out.size()), .repeat = 1);
  if (bpf_prog_test_run_opts(prog_fd, &opts) != 0) return false;
  r->verdict = static_cast<int>(opts.retval);
  r->ns = opts.duration;
  r->out.resize(opts.data_size_out);
  return true;
}

// The mean of the middle half of a round's runs (the quartiles at both ends dropped).
inline double InterquartileMean(std::vector<uint32_t> v) {
  std::sort(v.begin(), v.end());
  size_t lo = v.size() / 4, hi = v.size() - v.size() / 4;
  double s = 0;
  for (size_t i = lo; i < hi; ++i) s += v[i];
  return s / static_cast<double>(hi - lo);
}

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

}  // namespace sluice::bench
