#include "support/fixture.h"

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <linux/bpf.h>
#include <sys/mount.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "loader/bpffs.h"

namespace sluice::testing {

sluice_lb4_key LbKey(const std::string& addr, uint16_t port, uint8_t proto, uint16_t slot) {
  sluice_lb4_key k{};
  k.addr = Ip4(addr);
  k.dport = htons(port);
  k.proto = proto;
  k.scope = SLUICE_LB_SCOPE_EXTERNAL;
  k.backend_slot = slot;
  return k;
}

sluice_ct4_key CtKey(const std::string& saddr, const std::string& daddr, uint16_t sport,
                     uint16_t dport, uint8_t proto, uint8_t dir) {
  sluice_ct4_key k{};
  k.saddr = Ip4(saddr);
  k.daddr = Ip4(daddr);
  k.sport = htons(sport);
  k.dport = htons(dport);
  k.proto = proto;
  k.dir = dir;
  return k;
}

absl::Status ProgramService(loader::Datapath& dp, const std::string& addr, uint16_t port,
                            uint8_t proto, uint32_t rev_nat_id,
                            const std::vector<LbBackendSpec>& backends, uint16_t flags,
                            uint32_t affinity_timeout, uint8_t scope) {
  auto key = [&](uint16_t slot) {
    sluice_lb4_key k = LbKey(addr, port, proto, slot);
    k.scope = scope;
    return k;
  };
  for (const auto& b : backends) {
    sluice_lb4_backend be{};
    be.addr = Ip4(b.addr);
    be.port = htons(b.port);
    be.proto = b.proto;
    if (auto st = dp.lb4_backends().Update(b.id, be); !st.ok()) return st;
  }
  sluice_lb4_revnat rnat{};
  rnat.addr = Ip4(addr);
  rnat.port = htons(port);
  if (auto st = dp.lb4_revnat().Update(rev_nat_id, rnat); !st.ok()) return st;
  for (size_t i = 0; i < backends.size(); ++i) {
    sluice_lb4_service slot{};
    slot.backend_id = backends[i].id;
    if (auto st = dp.lb4_services().Update(key(i + 1), slot); !st.ok()) {
      return st;
    }
  }
  sluice_lb4_service master{};
  master.count = backends.size();
  master.flags = flags;
  master.rev_nat_id = rev_nat_id;
  master.affinity_timeout = affinity_timeout;
  return dp.lb4_services().Update(key(0), master);
}

ScratchBpffs::ScratchBpffs() {
  static std::atomic<int> seq{0};
  path_ = absl::StrCat("/run/sluice-test/bpffs-", getpid(), "-", seq++);
  auto st = loader::EnsureBpffs(path_);
  if (!st.ok()) ADD_FAILURE() << st;
}

ScratchBpffs::~ScratchBpffs() {
  umount2(path_.c_str(), MNT_DETACH);
  std::error_code ec;
  std::filesystem::remove(path_, ec);
}

void DatapathTest::SetUp() {
  bpffs_ = std::make_unique<ScratchBpffs>();
  auto dp = loader::Datapath::Load(bpffs_->path());
  ASSERT_TRUE(dp.ok()) << dp.status();
  dp_ = std::move(*dp);
}

void DatapathTest::TearDown() {
  dp_.reset();
  bpffs_.reset();
}

namespace {

// BPF_PROG_TEST_RUN once on `in` with the program type's context `ctx`.
RunResult TestRun(int prog_fd, const Bytes& in, const void* ctx, size_t ctx_size,
                  void* ctx_out = nullptr) {
  RunResult r;
  r.out.assign(in.size() + 256, 0);
  LIBBPF_OPTS(bpf_test_run_opts, opts, .data_in = in.data(), .data_out = r.out.data(),
              .data_size_in = static_cast<__u32>(in.size()),
              .data_size_out = static_cast<__u32>(r.out.size()), .ctx_in = ctx, .ctx_out = ctx_out,
              .ctx_size_in = static_cast<__u32>(ctx_size),
              .ctx_size_out = ctx_out ? static_cast<__u32>(ctx_size) : 0u, .repeat = 1);
  int err = bpf_prog_test_run_opts(prog_fd, &opts);
  EXPECT_EQ(err, 0) << "BPF_PROG_TEST_RUN: " << strerror(errno);
  r.verdict = static_cast<int>(opts.retval);
  r.out.resize(opts.data_size_out);
  return r;
}

}  // namespace

RunResult DatapathTest::Run(int prog_fd, const Bytes& in, int ifindex, uint32_t mark) {
  struct __sk_buff ctx {};
  ctx.ifindex = ifindex;
  ctx.mark = mark;
  struct __sk_buff out {};
  RunResult r = TestRun(prog_fd, in, &ctx, sizeof(ctx), &out);
  r.mark = out.mark;
  return r;
}

RunResult DatapathTest::RunXdp(int prog_fd, const Bytes& in, int ifindex) {
  struct xdp_md ctx {};
  ctx.data_end = static_cast<__u32>(in.size());  // the whole frame is linear
  ctx.ingress_ifindex = ifindex;
  return TestRun(prog_fd, in, &ctx, sizeof(ctx));
}

uint64_t DatapathTest::Drops(unsigned reason) {
  uint64_t n = 0;
  for (unsigned dir = 0; dir < SLUICE_DROP_DIR_MAX; ++dir) n += Drops(reason, dir);
  return n;
}

uint64_t DatapathTest::Drops(unsigned reason, unsigned dir) {
  auto per_cpu = dp_->drops().Lookup(SLUICE_DROP_KEY(reason, dir));
  EXPECT_TRUE(per_cpu.ok()) << per_cpu.status();
  uint64_t n = 0;
  if (per_cpu.ok())
    for (const auto& c : *per_cpu) n += c.packets;
  return n;
}

sluice_fwd_count DatapathTest::Forwarded(unsigned dir) {
  auto per_cpu = dp_->forwards().Lookup(dir);
  EXPECT_TRUE(per_cpu.ok()) << per_cpu.status();
  sluice_fwd_count n{};
  if (per_cpu.ok()) {
    for (const auto& c : *per_cpu) {
      n.packets += c.packets;
      n.bytes += c.bytes;
    }
  }
  return n;
}

std::map<unsigned, uint64_t> DatapathTest::DropCounts() {
  std::map<unsigned, uint64_t> counts;
  auto totals = dp_->DropTotals();
  EXPECT_TRUE(totals.ok()) << totals.status();
  if (totals.ok()) {
    for (const auto& t : *totals) counts[t.reason] = t.packets;
  }
  return counts;
}

const char* ProgName(Prog p) {
  switch (p) {
    case Prog::kFromPod:
      return "sluice_from_pod";
    case Prog::kToPod:
      return "sluice_to_pod";
    case Prog::kFromNet:
      return "sluice_from_net";
    case Prog::kToNet:
      return "sluice_to_net";
    case Prog::kFromOverlay:
      return "sluice_from_overlay";
    case Prog::kXdpNet:
      return "sluice_xdp_net";
  }
  return "?";
}

void PrintTo(const PacketCase& c, std::ostream* os) {
  *os << c.name << " (" << c.steps.size() << " steps)";
}

std::string CaseName(const ::testing::TestParamInfo<PacketCase>& info) { return info.param.name; }

namespace {

// The sluice_forward slot a Sluice program counts what it passes in (maps/forward.h).
unsigned FwdDirOf(Prog p) {
  switch (p) {
    case Prog::kFromPod:
      return SLUICE_FWD_POD_EGRESS;
    case Prog::kToPod:
      return SLUICE_FWD_POD_INGRESS;
    case Prog::kFromNet:
    case Prog::kFromOverlay:
      return SLUICE_FWD_NET_INGRESS;
    case Prog::kToNet:
      return SLUICE_FWD_NET_EGRESS;
    case Prog::kXdpNet:
      return SLUICE_FWD_NET_XDP;
  }
  return SLUICE_FWD_DIR_MAX;
}

unsigned DropDirOf(Prog p) {
  return p == Prog::kFromPod || p == Prog::kToNet ? SLUICE_DROP_DIR_EGRESS
                                                  : SLUICE_DROP_DIR_INGRESS;
}

std::string VerdictName(Prog p, int v) {
  if (p == Prog::kXdpNet) {
    switch (v) {
      case kXdpDrop:
        return "XDP_DROP";
      case kXdpPass:
        return "XDP_PASS";
      case kXdpTx:
        return "XDP_TX";
      case kXdpRedirect:
        return "XDP_REDIRECT";
    }
    return absl::StrCat("XDP verdict ", v);
  }
  switch (v) {
    case kTcOk:
      return "TC_ACT_OK";
    case kTcShot:
      return "TC_ACT_SHOT";
    case kTcRedirect:
      return "TC_ACT_REDIRECT";
  }
  return absl::StrCat("verdict ", v);
}

}  // namespace

void DatapathTest::RunCase(const PacketCase& c) {
  Trail trail;
  for (size_t i = 0; i < c.steps.size(); ++i) {
    const Step& step = c.steps[i];
    SCOPED_TRACE(absl::StrCat(c.name, " step ", i + 1, "/", c.steps.size(), " through ",
                              step.companion.empty() ? ProgName(step.prog) : step.companion));
    if (step.setup) {
      step.setup(*dp_);
      if (HasFatalFailure()) return;
    }
    Bytes in = step.in.Make(trail);
    int fd = step.prog == Prog::kFromPod       ? dp_->from_pod_fd()
             : step.prog == Prog::kToPod       ? dp_->to_pod_fd()
             : step.prog == Prog::kFromNet     ? dp_->from_net_fd()
             : step.prog == Prog::kFromOverlay ? dp_->from_overlay_fd()
             : step.prog == Prog::kXdpNet      ? dp_->xdp_net_fd()
                                               : dp_->to_net_fd();
    if (!step.companion.empty()) {
      auto it = companions_.find(step.companion);
      ASSERT_NE(it, companions_.end()) << "no companion program " << step.companion;
      fd = it->second;
    }
    const bool own_prog = step.companion.empty();
    const unsigned drop_dir = DropDirOf(step.prog);
    std::vector<sluice_fwd_count> fwd_before;
    for (unsigned d = 0; d < SLUICE_FWD_DIR_MAX; ++d) fwd_before.push_back(Forwarded(d));
    const uint64_t dir_drops_before = step.drop ? Drops(*step.drop, drop_dir) : 0;
    auto drops_before = DropCounts();
    const bool xdp = step.prog == Prog::kXdpNet;
    RunResult r = xdp ? RunXdp(fd, in, step.ifindex) : Run(fd, in, step.ifindex, step.mark_in);
    // XDP counts only what it sends on (a pass is TC's to count); TC everything it does not drop.
    const bool dropped = xdp ? r.verdict == kXdpDrop : r.verdict == kTcShot;
    const bool sent_on = xdp ? r.verdict == kXdpTx || r.verdict == kXdpRedirect : !dropped;
    auto drops_after = DropCounts();
    std::string shown = absl::StrCat("input:\n", Layers(in), "\nactual output:\n", Layers(r.out));
    ASSERT_EQ(VerdictName(step.prog, r.verdict), VerdictName(step.prog, step.verdict)) << shown;
    if (step.mark_out) EXPECT_EQ(r.mark, *step.mark_out) << "skb mark after the run\n" << shown;

    for (const auto& [reason, after] : drops_after) {
      uint64_t want = drops_before[reason] + (step.drop == reason ? 1 : 0);
      EXPECT_EQ(after, want) << "drop reason " << sluice_drop_reason_name(reason) << "\n" << shown;
    }
    if (step.drop) {
      EXPECT_TRUE(drops_after.count(*step.drop)) << "no counter for reason " << *step.drop;
      // A Sluice program counts its drop under its own direction (maps/drop.h).
      if (own_prog) {
        EXPECT_EQ(Drops(*step.drop, drop_dir), dir_drops_before + 1)
            << "drop reason " << sluice_drop_reason_name(*step.drop) << " not counted as "
            << sluice_drop_dir_name(drop_dir) << " by " << ProgName(step.prog) << "\n"
            << shown;
      }
    }
    // Whatever a Sluice program does not drop it counts as forwarded, once, in its direction,
    // with the length it hands on; no other direction moves.
    for (unsigned d = 0; d < SLUICE_FWD_DIR_MAX; ++d) {
      const bool counted = own_prog && d == FwdDirOf(step.prog) && sent_on;
      const sluice_fwd_count now = Forwarded(d);
      if (!own_prog) continue;  // a companion may count under any direction
      EXPECT_EQ(now.packets, fwd_before[d].packets + (counted ? 1 : 0))
          << "forwarded " << sluice_fwd_dir_name(d) << " by " << ProgName(step.prog) << "\n"
          << shown;
      EXPECT_EQ(now.bytes, fwd_before[d].bytes + (counted ? r.out.size() : 0))
          << "forwarded bytes " << sluice_fwd_dir_name(d) << "\n"
          << shown;
    }

    auto decoded = Decode(r.out);
    trail.out.push_back(decoded.value_or(Decoded{}));
    trail.raw.push_back(r.out);
    if (!dropped && decoded && decoded->ethertype == 0x0800) {
      EXPECT_TRUE(decoded->ip_csum_ok) << shown;
      if (!decoded->later_fragment) EXPECT_TRUE(decoded->l4_csum_ok) << shown;
    }
    if (step.unchanged) {
      EXPECT_EQ(PacketDiff(in, r.out), "") << "the output must be the input unchanged\n" << shown;
    }
    if (!step.out.empty()) {
      std::vector<Bytes> expected;
      for (const auto& f : step.out) expected.push_back(f.Make(trail));
      bool matched = false;
      for (const auto& e : expected) matched = matched || e == r.out;
      if (!matched) {
        std::string why;
        for (size_t k = 0; k < expected.size(); ++k) {
          absl::StrAppend(
              &why, "expected",
              expected.size() > 1 ? absl::StrCat(" (", k + 1, " of ", expected.size(), ")") : "",
              ":\n", Layers(expected[k]), "\ndiffers from the actual output in:\n",
              PacketDiff(expected[k], r.out), "\n");
        }
        ADD_FAILURE() << "the output matches no expected packet\n" << shown << "\n" << why;
      }
    }
    if (step.effects) {
      step.effects(*dp_, trail);
      if (HasFatalFailure()) return;
    }
  }
}

absl::Status AddEndpoint(loader::Datapath& dp, uint32_t addr_be, int ifindex, const Mac& mac,
                         const Mac& host_mac, uint32_t endpoint_id, uint32_t flags) {
  sluice_endpoint ep{};
  ep.ifindex = static_cast<uint32_t>(ifindex);
  ep.flags = flags;
  std::memcpy(ep.mac, mac.data(), sizeof(ep.mac));
  std::memcpy(ep.host_mac, host_mac.data(), sizeof(ep.host_mac));
  ep.endpoint_id = endpoint_id;
  return dp.endpoint_table().Upsert(addr_be, ep);
}

}  // namespace sluice::testing
