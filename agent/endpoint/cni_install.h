// Installing Sluice into the node's CNI directories: the plugin binary and 05-sluice.conflist,
// each written atomically, and only once the agent serves ADD (a runtime that finds the
// configuration must find a working plugin).
#pragma once

#include <string>

#include "absl/status/status.h"

namespace sluice::agent {

struct CniInstallOptions {
  std::string conf_dir = "/etc/cni/net.d";
  std::string bin_dir = "/opt/cni/bin";
  std::string plugin_source;  // the sluice-cni binary to copy
  std::string network_name = "sluice";
  std::string cni_version = "1.0.0";
  std::string socket_path;
  int mtu = 0;  // 0: leave it to the agent's default
};

inline constexpr char kConflistName[] = "05-sluice.conflist";

// The conflist text Sluice installs.
std::string RenderConflist(const CniInstallOptions& options);

[[nodiscard]] absl::Status InstallCni(const CniInstallOptions& options);

}  // namespace sluice::agent
