#include "loader/cgroup.h"

#include <bpf/bpf.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "maps/map.h"

#ifndef SO_NETNS_COOKIE
#define SO_NETNS_COOKIE 71
#endif

namespace sluice::loader {
namespace {

struct LinkCloser {
  // For an fd-based link this only closes the process's fd: a pin keeps the link and its
  // attachment. (bpf_link__disconnect would leak the fd, and with it the attachment.)
  void operator()(struct bpf_link* l) const { bpf_link__destroy(l); }
};
using LinkPtr = std::unique_ptr<struct bpf_link, LinkCloser>;

// Updates the link pinned at `pin_path` to `prog` when it is a live link of `prog`'s attach type
// on cgroup `cgroup_id`. Returns true when updated, false when the pin must be replaced.
absl::StatusOr<bool> UpdatePinnedLink(struct bpf_program* prog, uint64_t cgroup_id,
                                      const std::string& pin_path) {
  if (access(pin_path.c_str(), F_OK) != 0 && errno == ENOENT) return false;
  LinkPtr link(bpf_link__open(pin_path.c_str()));
  if (!link) {
    if (errno == ENOENT) return false;
    // Not a link (a stray file): replaced like a stale one.
    if (errno == EINVAL || errno == EPERM) return false;
    return ErrnoStatus(errno, absl::StrCat("open pinned link ", pin_path));
  }
  struct bpf_link_info info = {};
  __u32 len = sizeof(info);
  if (bpf_obj_get_info_by_fd(bpf_link__fd(link.get()), &info, &len) != 0) {
    if (errno == EINVAL) return false;  // a pinned map or program, not a link
    return ErrnoStatus(errno, absl::StrCat("link info of ", pin_path));
  }
  if (info.type != BPF_LINK_TYPE_CGROUP || info.cgroup.cgroup_id != cgroup_id ||
      info.cgroup.attach_type != bpf_program__expected_attach_type(prog)) {
    return false;
  }
  if (int err = bpf_link__update_program(link.get(), prog); err != 0) {
    // ENOLINK: the link's cgroup was removed, the link is defunct.
    if (-err == ENOLINK) return false;
    return ErrnoStatus(-err, absl::StrCat("update program of link ", pin_path));
  }
  return true;
}

}  // namespace

absl::Status AttachCgroupLink(struct bpf_program* prog, int cgroup_fd,
                              const std::string& pin_path) {
  struct stat st;
  if (fstat(cgroup_fd, &st) != 0) return ErrnoStatus(errno, "stat cgroup fd");
  // On cgroup v2 the directory's inode number is the cgroup id.
  auto updated = UpdatePinnedLink(prog, st.st_ino, pin_path);
  if (!updated.ok()) return updated.status();
  if (*updated) return absl::OkStatus();

  if (unlink(pin_path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus(errno, absl::StrCat("remove stale link pin ", pin_path));
  }
  errno = 0;
  LinkPtr link(bpf_program__attach_cgroup(prog, cgroup_fd));
  if (!link) {
    return ErrnoStatus(errno ? errno : EINVAL,
                             absl::StrCat("attach ", bpf_program__name(prog), " to cgroup"));
  }
  if (int err = bpf_link__pin(link.get(), pin_path.c_str()); err != 0) {
    // Closing the only reference detaches the program again.
    return ErrnoStatus(-err, absl::StrCat("pin link ", pin_path));
  }
  return absl::OkStatus();
}

absl::Status DetachPinnedLink(const std::string& pin_path) {
  if (unlink(pin_path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus(errno, absl::StrCat("unpin link ", pin_path));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> CgroupId(const std::string& cgroup_path) {
  struct stat st;
  if (stat(cgroup_path.c_str(), &st) != 0) {
    return ErrnoStatus(errno, absl::StrCat("stat cgroup ", cgroup_path));
  }
  return static_cast<uint64_t>(st.st_ino);
}

absl::StatusOr<std::string> FindCgroup2Mount() {
  std::ifstream mounts("/proc/mounts");
  std::string line;
  while (std::getline(mounts, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    if (f.size() >= 3 && f[2] == "cgroup2") return f[1];
  }
  return absl::NotFoundError("no cgroup2 filesystem in /proc/mounts");
}

absl::StatusOr<std::string> FindOrMountCgroup2(const std::string& fallback) {
  auto found = FindCgroup2Mount();
  if (found.ok() || !absl::IsNotFound(found.status())) return found;
  std::error_code ec;
  std::filesystem::create_directories(fallback, ec);
  if (ec) return absl::InternalError(absl::StrCat("mkdir ", fallback, ": ", ec.message()));
  if (mount("cgroup2", fallback.c_str(), "cgroup2", 0, nullptr) != 0) {
    return ErrnoStatus(errno, absl::StrCat("mount cgroup2 on ", fallback));
  }
  return fallback;
}

absl::StatusOr<uint64_t> CurrentNetnsCookie() {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus(errno, "socket for SO_NETNS_COOKIE");
  uint64_t cookie = 0;
  socklen_t len = sizeof(cookie);
  int rc = getsockopt(fd, SOL_SOCKET, SO_NETNS_COOKIE, &cookie, &len);
  int err = errno;
  close(fd);
  if (rc != 0) return ErrnoStatus(err, "getsockopt SO_NETNS_COOKIE");
  return cookie;
}

absl::StatusOr<std::vector<uint32_t>> CgroupPrograms(int cgroup_fd, enum bpf_attach_type type) {
  std::vector<uint32_t> ids(64);
  __u32 count = ids.size();
  if (bpf_prog_query(cgroup_fd, type, 0, nullptr, ids.data(), &count) != 0) {
    return ErrnoStatus(errno, "BPF_PROG_QUERY on cgroup");
  }
  ids.resize(count);
  return ids;
}

}  // namespace sluice::loader
