#include "agent/kernel/netns.h"

#include <fcntl.h>
#include <linux/nsfs.h>
#include <sched.h>
#include <linux/magic.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "agent/base/errno.h"
#include "spdlog/spdlog.h"

namespace sluice::agent {
namespace {

}  // namespace

static const char* FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a named pipe";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "a regular file";
}

absl::StatusOr<NetnsFd> NetnsFd::Open(const std::string& path) {
  // O_PATH opens nothing for I/O: a FIFO does not wait for a writer, a device driver is not
  // called. Only once the file is known to be on nsfs is it opened for real (setns and ioctl
  // need that), through /proc/self/fd so that the path cannot be swapped in between.
  int pfd = ::open(path.c_str(), O_PATH | O_CLOEXEC);
  if (pfd < 0) return ErrnoStatus(errno, absl::StrCat("open netns ", path));
  NetnsFd probe(pfd, path);
  struct stat st {};
  if (::fstat(pfd, &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat netns ", path));
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a network namespace: it is ", FileKind(st.st_mode)));
  }
  struct statfs fs {};
  if (::fstatfs(pfd, &fs) != 0) return ErrnoStatus(errno, absl::StrCat("statfs netns ", path));
  if (static_cast<uint64_t>(fs.f_type) != NSFS_MAGIC) {
    // A plain file, e.g. a /run/netns entry whose namespace was mounted in another mount
    // namespace (or already unmounted).
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is not a namespace file (a regular file, not nsfs: no namespace is mounted there "
              "in this mount namespace)"));
  }
  int fd = ::open(probe.fd_path().c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open netns ", path));
  NetnsFd ns(fd, path);
  int type = ::ioctl(fd, NS_GET_NSTYPE);
  if (type < 0) return ErrnoStatus(errno, absl::StrCat("query namespace type of ", path));
  if (type != CLONE_NEWNET) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is a namespace, but not a network namespace"));
  }
  return ns;
}

absl::StatusOr<NetnsFd::Identity> NetnsFd::identity() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat netns ", path_));
  return Identity{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}

std::string NetnsFd::fd_path() const { return absl::StrCat("/proc/self/fd/", fd_); }

absl::StatusOr<NetnsFd::Identity> CurrentNetnsIdentity() {
  struct stat st {};
  if (::stat("/proc/thread-self/ns/net", &st) != 0) {
    return ErrnoStatus(errno, "stat /proc/thread-self/ns/net");
  }
  return NetnsFd::Identity{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}

NetnsFd::NetnsFd(NetnsFd&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

NetnsFd& NetnsFd::operator=(NetnsFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

NetnsFd::~NetnsFd() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status RunInNetns(const std::string& netns_path, absl::FunctionRef<absl::Status()> fn) {
  absl::StatusOr<NetnsFd> ns = NetnsFd::Open(netns_path);
  if (!ns.ok()) return ns.status();

  absl::Status result;
  // setns() only affects the calling thread; a fresh thread that exits afterwards means no
  // thread of the agent is ever left in the wrong namespace, whatever fn does.
  auto body = [&]() {
    if (::setns(ns->get(), CLONE_NEWNET) != 0) {
      result = ErrnoStatus(errno, absl::StrCat("setns into ", netns_path));
      return;
    }
    result = fn();
  };
  try {
    std::thread worker(body);
    worker.join();
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("start a thread to enter netns ", netns_path, ": ", e.what()));
  }
  return result;
}

absl::StatusOr<bool> MakeProcSysWritable(const std::string& proc_sys) {
  struct statvfs vfs {};
  if (::statvfs(proc_sys.c_str(), &vfs) != 0) return ErrnoStatus(errno, "statvfs " + proc_sys);
  if ((vfs.f_flag & ST_RDONLY) == 0) return false;
  // Keep the mount's other flags: only MS_RDONLY goes.
  unsigned long flags = MS_REMOUNT | MS_BIND;
  if (vfs.f_flag & ST_NOSUID) flags |= MS_NOSUID;
  if (vfs.f_flag & ST_NODEV) flags |= MS_NODEV;
  if (vfs.f_flag & ST_NOEXEC) flags |= MS_NOEXEC;
  if (::mount(nullptr, proc_sys.c_str(), nullptr, flags, nullptr) != 0) {
    return ErrnoStatus(errno, "remount " + proc_sys + " read-write");
  }
  return true;
}

std::string InterfaceSysctlPath(absl::string_view family, absl::string_view ifname,
                                absl::string_view name) {
  return absl::StrCat("/proc/sys/net/", family, "/conf/", ifname, "/", name);
}

absl::Status WriteSysctl(absl::string_view key, absl::string_view value) {
  std::string path;
  if (absl::StartsWith(key, "/proc/sys/")) {
    path = std::string(key);
  } else {
    path = absl::StrCat("/proc/sys/", absl::StrReplaceAll(key, {{".", "/"}}));
  }
  std::string what = absl::StrCat("write sysctl ", key, "=", value);
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, what);
  ssize_t n = ::write(fd, value.data(), value.size());
  int err = errno;
  ::close(fd);
  if (n < 0) return ErrnoStatus(err, what);
  if (static_cast<size_t>(n) != value.size()) {
    return absl::InternalError(absl::StrCat(what, ": short write"));
  }
  spdlog::debug("sysctl {}={}", std::string(key), std::string(value));
  return absl::OkStatus();
}

absl::Status WriteSysctlInNetns(const std::string& netns_path, absl::string_view key,
                                absl::string_view value) {
  return RunInNetns(netns_path, [&]() { return WriteSysctl(key, value); });
}

}  // namespace sluice::agent
