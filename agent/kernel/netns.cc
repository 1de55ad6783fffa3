#include "agent/kernel/netns.h"

#include <fcntl.h>
#include <linux/nsfs.h>
#include <sched.h>
#include <sys/ioctl.h>
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

absl::StatusOr<NetnsFd> NetnsFd::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open netns ", path));
  NetnsFd ns(fd, path);
  int type = ::ioctl(fd, NS_GET_NSTYPE);
  if (type < 0 && errno == ENOTTY) {
    // A plain file, e.g. a /run/netns entry whose namespace was mounted in another mount
    // namespace (or already unmounted).
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is not a namespace file (no namespace is mounted there in this mount namespace)"));
  }
  if (type < 0) return ErrnoStatus(errno, absl::StrCat("query namespace type of ", path));
  if (type != CLONE_NEWNET) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a network namespace"));
  }
  return ns;
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
