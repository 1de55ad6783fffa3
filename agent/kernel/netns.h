// Network namespace plumbing for the agent: entering a pod's (or node's) network namespace
// without ever moving the calling thread, and sysctl writes scoped to a namespace.
#ifndef SLUICE_AGENT_NETNS_H_
#define SLUICE_AGENT_NETNS_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sluice::agent {

// An open network namespace file (/var/run/netns/<name>, /proc/<pid>/ns/net, ...). Owns the fd.
class NetnsFd {
 public:
  // Opens `path` and checks that it is a network namespace, without ever blocking or opening
  // anything else for reading: the path is opened with O_PATH (a FIFO, device or directory is
  // only looked at), checked with fstat/fstatfs (a regular file on nsfs), then reopened through
  // /proc/self/fd and checked with NS_GET_NSTYPE == CLONE_NEWNET. Errors name the path:
  // NotFound if it does not exist, InvalidArgument if it is not a network namespace (saying what
  // it is instead), PermissionDenied.
  [[nodiscard]] static absl::StatusOr<NetnsFd> Open(const std::string& path);

  // The namespace's identity (nsfs device and inode): two paths name the same namespace exactly
  // when their identities are equal.
  struct Identity {
    uint64_t dev = 0;
    uint64_t ino = 0;
    friend bool operator==(const Identity&, const Identity&) = default;
  };
  [[nodiscard]] absl::StatusOr<Identity> identity() const;
  // A path that names this very namespace for as long as this object lives (/proc/self/fd/N),
  // whatever happens to the original path meanwhile.
  std::string fd_path() const;

  NetnsFd() = default;
  NetnsFd(NetnsFd&& other) noexcept;
  NetnsFd& operator=(NetnsFd&& other) noexcept;
  NetnsFd(const NetnsFd&) = delete;
  NetnsFd& operator=(const NetnsFd&) = delete;
  ~NetnsFd();

  int get() const { return fd_; }
  const std::string& path() const { return path_; }
  bool valid() const { return fd_ >= 0; }

 private:
  NetnsFd(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

  int fd_ = -1;
  std::string path_;
};

// The identity of the network namespace of the calling thread.
[[nodiscard]] absl::StatusOr<NetnsFd::Identity> CurrentNetnsIdentity();

// Runs `fn` on a dedicated short-lived thread that has joined the network namespace at
// `netns_path` (setns(CLONE_NEWNET)); the caller's thread and namespace are never changed. Netlink
// sockets and /proc/sys/net files opened inside `fn` belong to that namespace. Returns fn's
// status, NotFound if the namespace path does not exist, or the setns failure.
[[nodiscard]] absl::Status RunInNetns(const std::string& netns_path,
                                      absl::FunctionRef<absl::Status()> fn);

// Writes `value` to a sysctl of the calling thread's network namespace. `key` is either dotted
// ("net.ipv4.ip_forward") or a path under /proc/sys ("/proc/sys/net/ipv4/ip_forward"). Use the
// path form when a component contains dots (interface names like "eth0.100"). A missing sysctl
// is NotFound.
[[nodiscard]] absl::Status WriteSysctl(absl::string_view key, absl::string_view value);

// WriteSysctl inside the network namespace at `netns_path` (via RunInNetns).
[[nodiscard]] absl::Status WriteSysctlInNetns(const std::string& netns_path, absl::string_view key,
                                              absl::string_view value);

// Makes `proc_sys` (normally /proc/sys) writable in the caller's mount namespace when it is a
// read-only mount, as container runtimes mount it for every container that is not privileged:
// a remount of that bind mount without MS_RDONLY (CAP_SYS_ADMIN). Returns whether it remounted.
[[nodiscard]] absl::StatusOr<bool> MakeProcSysWritable(const std::string& proc_sys = "/proc/sys");

// The /proc/sys path of a per-interface sysctl, e.g.
// InterfaceSysctlPath("ipv4", "slc1a2b", "rp_filter") =
// "/proc/sys/net/ipv4/conf/slc1a2b/rp_filter".
std::string InterfaceSysctlPath(absl::string_view family, absl::string_view ifname,
                                absl::string_view name);

}  // namespace sluice::agent

#endif  // SLUICE_AGENT_NETNS_H_
