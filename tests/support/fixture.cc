#include "support/fixture.h"

#include <bpf/bpf.h>
#include <linux/bpf.h>
#include <sys/mount.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "loader/bpffs.h"

namespace sluice::testing {

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
