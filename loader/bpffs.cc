#include "loader/bpffs.h"

#include <linux/magic.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>

#include <cerrno>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "maps/map.h"
#include "spdlog/spdlog.h"

namespace sluice::loader {

bool IsOnBpffs(const std::string& path) {
  struct statfs st {};
  return statfs(path.c_str(), &st) == 0 && st.f_type == BPF_FS_MAGIC;
}

absl::Status EnsureBpffs(const std::string& root) {
  // /sys/fs/bpf is sysfs until something mounts bpffs there; mount it like systemd would so
  // bpftool and other tools see the same pins.
  constexpr char kConventional[] = "/sys/fs/bpf";
  std::error_code ec;
  if (root.rfind(kConventional, 0) == 0 && std::filesystem::exists(kConventional) &&
      !IsOnBpffs(kConventional)) {
    if (mount("bpffs", kConventional, "bpf", 0, "mode=0700") != 0) {
      return ErrnoStatus(errno, absl::StrCat("mount bpffs on ", kConventional));
    }
    spdlog::info("mounted bpffs on {}", kConventional);
  }
  std::filesystem::create_directories(root, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("create bpffs root ", root, ": ", ec.message()));
  }
  if (IsOnBpffs(root)) return absl::OkStatus();
  if (mount("bpffs", root.c_str(), "bpf", 0, "mode=0700") != 0) {
    return ErrnoStatus(errno, absl::StrCat("mount bpffs on ", root));
  }
  spdlog::info("mounted bpffs on {}", root);
  return absl::OkStatus();
}

}  // namespace sluice::loader
