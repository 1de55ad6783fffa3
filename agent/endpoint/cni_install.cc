#include "agent/endpoint/cni_install.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/base/errno.h"
#include "agent/base/files.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace sluice::agent {
std::string RenderConflist(const CniInstallOptions& o) {
  // The runtime passes a pod's kubernetes.io/ingress-bandwidth and egress-bandwidth annotations
  // as runtimeConfig "bandwidth" to a plugin declaring the capability: Sluice enforces them.
  nlohmann::json plugin = {{"type", api::kPluginType}, {"capabilities", {{"bandwidth", true}}}};
  if (!o.socket_path.empty()) plugin["socketPath"] = o.socket_path;
  if (o.mtu > 0) plugin["mtu"] = o.mtu;
  nlohmann::json conflist = {
      {"cniVersion", o.cni_version}, {"name", o.network_name}, {"plugins", {plugin}}};
  return conflist.dump(2) + "\n";
}

std::vector<std::string> RequiredCniBinaries(const CniInstallOptions& o) {
  std::vector<std::string> out = {"loopback"};
  for (const auto& plugin : nlohmann::json::parse(RenderConflist(o))["plugins"]) {
    const std::string type = plugin.value("type", "");
    if (type != api::kPluginType && std::find(out.begin(), out.end(), type) == out.end()) {
      out.push_back(type);
    }
  }
  return out;
}

absl::Status CheckCniBinaries(const CniInstallOptions& o) {
  std::vector<std::string> missing;
  for (const auto& name : RequiredCniBinaries(o)) {
    const std::string path = o.bin_dir + "/" + name;
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
        ::access(path.c_str(), X_OK) != 0) {
      missing.push_back(name);
    }
  }
  if (missing.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("CNI plugin binaries missing in ", o.bin_dir, ": ", absl::StrJoin(missing, ", "),
                   " (the runtime runs them for every pod; install the reference plugins, e.g. "
                   "Debian's containernetworking-plugins)"));
}

std::vector<std::string> ForeignCniConfigs(const std::string& conf_dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(conf_dir, ec)) {
    const std::string name = e.path().filename();
    if (name == kConflistName || !e.is_regular_file(ec)) continue;
    if (absl::EndsWith(name, ".conf") || absl::EndsWith(name, ".conflist") ||
        absl::EndsWith(name, ".json")) {
      out.push_back(name);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

absl::StatusOr<ForeignConfigReport> HandleForeignConfigs(const CniInstallOptions& o) {
  ForeignConfigReport report;
  for (const auto& name : ForeignCniConfigs(o.conf_dir)) {
    const std::string path = o.conf_dir + "/" + name;
    if (o.exclusive) {
      if (::rename(path.c_str(), (path + kBackupSuffix).c_str()) != 0) {
        return ErrnoStatus(errno, absl::StrCat("rename ", path, " to ", path, kBackupSuffix));
      }
      spdlog::info("cni exclusive: renamed another plugin's configuration {} to {}{}", path, path,
                   kBackupSuffix);
      report.renamed.push_back(name);
    } else if (name < kConflistName) {
      spdlog::warn(
          "{} sorts before {}: the runtime uses it instead of Sluice's (set "
          "--cni_exclusive to move it aside)",
          path, kConflistName);
      report.before_ours.push_back(name);
    }
  }
  if (o.exclusive && report.renamed.empty()) spdlog::info("cni exclusive: no other configuration");
  return report;
}

// Whether dir/name is a regular file with exactly `data` and `mode`: a restarted agent finds its
// own plugin in place, and need not write megabytes of the same bytes again, with two fsyncs,
// before it is ready (bench/README.md, "Start-up does not grow").
bool AlreadyInstalled(const std::string& dir, const std::string& name, const std::string& data,
                      mode_t mode) {
  const std::string path = dir + "/" + name;
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || (st.st_mode & 07777) != mode ||
      static_cast<size_t>(st.st_size) != data.size()) {
    return false;
  }
  std::ifstream in(path, std::ios::binary);
  std::string have((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return in && have == data;
}

}  // namespace

absl::StatusOr<ForeignConfigReport> InstallCni(const CniInstallOptions& o) {
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
  if (!AlreadyInstalled(o.bin_dir, api::kPluginType, binary, 0755)) {
    if (auto st = WriteFileAtomically(o.bin_dir, api::kPluginType, binary, 0755); !st.ok()) {
      return st;
    }
  }
  const std::string conflist = RenderConflist(o);
  if (!AlreadyInstalled(o.conf_dir, kConflistName, conflist, 0644)) {
    if (auto st = WriteFileAtomically(o.conf_dir, kConflistName, conflist, 0644); !st.ok()) {
      return st;
    }
  }
  spdlog::info("installed CNI plugin {}/sluice and {}/{}", o.bin_dir, o.conf_dir, kConflistName);
  return HandleForeignConfigs(o);
}

absl::Status UninstallCni(const CniInstallOptions& o) {
  for (const auto& path : {o.conf_dir + "/" + kConflistName, o.bin_dir + "/" + api::kPluginType}) {
    if (::unlink(path.c_str()) == 0) {
      spdlog::info("uninstall: removed {}", path);
    } else if (errno != ENOENT) {
      return ErrnoStatus(errno, absl::StrCat("remove ", path));
    }
  }
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(o.conf_dir, ec)) {
    const std::string path = e.path();
    if (!absl::EndsWith(path, kBackupSuffix)) continue;
    const std::string original = path.substr(0, path.size() - strlen(kBackupSuffix));
    if (std::filesystem::exists(original, ec)) {
      spdlog::warn("uninstall: {} exists again; {} left as it is", original, path);
      continue;
    }
    if (::rename(path.c_str(), original.c_str()) != 0) {
      return ErrnoStatus(errno, absl::StrCat("restore ", original));
    }
    spdlog::info("uninstall: restored {}", original);
  }
  return absl::OkStatus();
}

}  // namespace sluice::agent
