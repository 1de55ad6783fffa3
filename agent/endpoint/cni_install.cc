#include "agent/endpoint/cni_install.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "agent/base/files.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace sluice::agent {
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
  if (auto st = WriteFileAtomically(o.bin_dir, "sluice", binary, 0755); !st.ok()) return st;
  if (auto st = WriteFileAtomically(o.conf_dir, kConflistName, RenderConflist(o), 0644); !st.ok()) {
    return st;
  }
  spdlog::info("installed CNI plugin {}/sluice and {}/{}", o.bin_dir, o.conf_dir, kConflistName);
  return absl::OkStatus();
}

}  // namespace sluice::agent
