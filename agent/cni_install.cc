#include "agent/cni_install.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "maps/map.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace sluice::agent {
namespace {

// Writes `content` to `path` through a temporary file in the same directory and rename(2), so
// a reader (the runtime) sees the old file or the new one, never a partial one.
absl::Status WriteAtomically(const std::string& path, const std::string& content, mode_t mode) {
  std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return maps::ErrnoStatus(errno, absl::StrCat("create ", tmp));
  size_t off = 0;
  while (off < content.size()) {
    ssize_t n = ::write(fd, content.data() + off, content.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return maps::ErrnoStatus(err, absl::StrCat("write ", tmp));
    }
    off += n;
  }
  if (::fchmod(fd, mode) != 0 || ::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return maps::ErrnoStatus(err, absl::StrCat("sync ", tmp));
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return maps::ErrnoStatus(err, absl::StrCat("rename to ", path));
  }
  return absl::OkStatus();
}

}  // namespace

std::string RenderConflist(const CniInstallOptions& o) {
  nlohmann::json plugin = {{"type", "sluice"}};
  if (!o.socket_path.empty()) plugin["socketPath"] = o.socket_path;
  if (o.mtu > 0) plugin["mtu"] = o.mtu;
  nlohmann::json conflist = {
      {"cniVersion", o.cni_version}, {"name", o.network_name}, {"plugins", {plugin}}};
  return conflist.dump(2) + "\n";
}

absl::Status InstallCni(const CniInstallOptions& o) {
  std::error_code ec;
  for (const auto& dir : {o.conf_dir, o.bin_dir}) {
    std::filesystem::create_directories(dir, ec);
    if (ec) return absl::InternalError(absl::StrCat("create ", dir, ": ", ec.message()));
  }
  std::ifstream in(o.plugin_source, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("CNI plugin binary ", o.plugin_source, " not found"));
  }
  std::string binary((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string bin_path = absl::StrCat(o.bin_dir, "/sluice");
  if (auto st = WriteAtomically(bin_path, binary, 0755); !st.ok()) return st;
  std::string conf_path = absl::StrCat(o.conf_dir, "/", kConflistName);
  if (auto st = WriteAtomically(conf_path, RenderConflist(o), 0644); !st.ok()) return st;
  spdlog::info("installed CNI plugin {} and {}", bin_path, conf_path);
  return absl::OkStatus();
}

}  // namespace sluice::agent
