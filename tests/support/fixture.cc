#include "support/fixture.h"

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <linux/bpf.h>
#include <sys/mount.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>

#include "absl/strings/str_cat.h"
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

absl::Status ProgramService(loader::Datapath& dp, const std::string& addr, uint16_t port,
                            uint8_t proto, uint32_t rev_nat_id,
                            const std::vector<LbBackendSpec>& backends, uint16_t flags,
                            uint32_t affinity_timeout) {
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
    if (auto st = dp.lb4_services().Update(LbKey(addr, port, proto, i + 1), slot); !st.ok()) {
      return st;
    }
  }
  sluice_lb4_service master{};
  master.count = backends.size();
  master.flags = flags;
  master.rev_nat_id = rev_nat_id;
  master.affinity_timeout = affinity_timeout;
  return dp.lb4_services().Update(LbKey(addr, port, proto, 0), master);
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

RunResult DatapathTest::Run(int prog_fd, const Bytes& in, int ifindex) {
  RunResult r;
  r.out.assign(in.size() + 256, 0);
  struct __sk_buff ctx {};
  ctx.ifindex = ifindex;
  LIBBPF_OPTS(bpf_test_run_opts, opts, .data_in = in.data(),
              .data_out = r.out.data(), .data_size_in = static_cast<__u32>(in.size()),
              .data_size_out = static_cast<__u32>(r.out.size()), .ctx_in = &ctx,
              .ctx_size_in = sizeof(ctx), .repeat = 1);
  int err = bpf_prog_test_run_opts(prog_fd, &opts);
  EXPECT_EQ(err, 0) << "BPF_PROG_TEST_RUN: " << strerror(errno);
  r.verdict = static_cast<int>(opts.retval);
  r.out.resize(opts.data_size_out);
  return r;
}

uint64_t DatapathTest::Drops(unsigned reason) {
  auto per_cpu = dp_->drops().Lookup(reason);
  EXPECT_TRUE(per_cpu.ok()) << per_cpu.status();
  uint64_t n = 0;
  if (per_cpu.ok())
    for (const auto& c : *per_cpu) n += c.packets;
  return n;
}

}  // namespace sluice::testing
