// MakeProcSysWritable against a real read-only bind mount of /proc/sys, made as a container
// runtime makes it, in a child process's own mount namespace (the test's stays untouched).
#include <sched.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/kernel/netns.h"
#include "gtest/gtest.h"

namespace sluice::agent {
namespace {

bool ReadOnly(const char* path) {
  struct statvfs vfs {};
  return ::statvfs(path, &vfs) == 0 && (vfs.f_flag & ST_RDONLY) != 0;
}

// Exit codes of the child: 0 all as expected, else the number of the failed step.
int ChildRemountsAReadOnlyProcSys() {
  if (::unshare(CLONE_NEWNS) != 0) return 1;
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return 2;
  if (::mount("/proc/sys", "/proc/sys", nullptr, MS_BIND, nullptr) != 0) return 3;
  if (::mount(nullptr, "/proc/sys", nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID,
              nullptr) != 0) {
    return 4;
  }
  if (!ReadOnly("/proc/sys")) return 5;
  auto first = MakeProcSysWritable();
  if (!first.ok() || !*first) return 6;  // remounted
  if (ReadOnly("/proc/sys")) return 7;
  struct statvfs vfs {};
  if (::statvfs("/proc/sys", &vfs) != 0 || (vfs.f_flag & ST_NOSUID) == 0) return 8;  // kept
  auto second = MakeProcSysWritable();
  if (!second.ok() || *second) return 9;  // already writable: nothing to do
  return 0;
}

TEST(ProcSysPrivTest, AReadOnlyProcSysIsRemountedWritableKeepingItsOtherFlags) {
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) ::_exit(ChildRemountsAReadOnlyProcSys());
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "failed at step " << WEXITSTATUS(status);
  EXPECT_FALSE(ReadOnly("/proc/sys")) << "the test's own mount namespace was changed";
}

TEST(ProcSysPrivTest, AWritableProcSysIsLeftAlone) {
  auto done = MakeProcSysWritable();
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_FALSE(*done);
}

}  // namespace
}  // namespace sluice::agent
