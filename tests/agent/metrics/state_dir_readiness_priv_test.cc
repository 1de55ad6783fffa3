// /readyz with the state directory on a small tmpfs that fills up: every CNI ADD writes there
// (IPAM reservations, endpoint records), so a full file system makes the node not ready, and
// freeing space makes it ready again.
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "agent/metrics/agent_endpoints.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "support/temp_dir.h"

namespace sluice::metrics {
namespace {

using ::testing::HasSubstr;

class SmallTmpfs {
 public:
  explicit SmallTmpfs(const std::string& dir) : dir_(dir) {
    mounted_ = mount("sluice-test", dir.c_str(), "tmpfs", 0, "size=64k,mode=0700") == 0;
    EXPECT_TRUE(mounted_) << "mount tmpfs on " << dir << ": " << strerror(errno);
  }
  ~SmallTmpfs() {
    if (mounted_) umount2(dir_.c_str(), MNT_DETACH);
  }

 private:
  std::string dir_;
  bool mounted_ = false;
};

// Writes `path` until the file system is full; true when it stopped on ENOSPC.
bool FillUp(const std::string& path) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  const std::string block(4096, 'f');
  int err = 0;
  while (err == 0) {
    if (write(fd, block.data(), block.size()) < 0) err = errno;
  }
  close(fd);
  return err == ENOSPC;
}

TEST(StateDirReadinessTest, FullStateDirMakesTheNodeNotReadyUntilSpaceReturns) {
  sluice::testing::TempDir tmp("sluice-cor-state");
  const std::string state = tmp / "state";
  ASSERT_EQ(mkdir(state.c_str(), 0700), 0);
  SmallTmpfs fs(state);
  AgentReadiness ready(/*with_kubernetes=*/false);
  ready.datapath_loaded.Reach();
  ready.cni_installed.Reach();
  ready.RequireWritableStateDir(state);
  auto e = AgentEndpoints::Start({.health_address = "127.0.0.1:0"}, ready.readiness());
  ASSERT_TRUE(e.ok()) << e.status();
  httplib::Client c("127.0.0.1", (*e)->health_port());

  auto r = c.Get("/readyz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_THAT(r->body, HasSubstr("ok state\n"));

  ASSERT_TRUE(FillUp(state + "/filler"));
  r = c.Get("/readyz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503) << r->body;
  EXPECT_THAT(r->body, HasSubstr("fail state: cannot write " + state +
                                 " (every CNI ADD would fail): write " + state +
                                 "/.write-probe.tmp: ENOSPC (No space left on device)\n"));
  EXPECT_THAT(r->body, HasSubstr("ok datapath\n"));

  ASSERT_EQ(unlink((state + "/filler").c_str()), 0);
  r = c.Get("/readyz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(access((state + "/.write-probe").c_str(), F_OK), -1) << "the probe leaves no file";
  EXPECT_EQ(access((state + "/.write-probe.tmp").c_str(), F_OK), -1);
}

}  // namespace
}  // namespace sluice::metrics
