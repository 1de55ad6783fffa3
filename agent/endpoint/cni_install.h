// Installing Sluice into the node's CNI directories: the plugin binary and 05-sluice.conflist,
// each written atomically, and only once the agent serves ADD (a runtime that finds the
// configuration must find a working plugin). Other plugins' configurations are left alone
// (a warning names any the runtime would pick before ours) unless `exclusive`, which renames
// them to <name>.sluice_bak; uninstall removes Sluice's files and restores those.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cni/protocol/wire.h"

namespace sluice::agent {

struct CniInstallOptions {
  std::string conf_dir = "/etc/cni/net.d";
  std::string bin_dir = "/opt/cni/bin";
  std::string plugin_source;  // the sluice-cni binary to copy
  std::string network_name = "sluice";
  std::string cni_version = "1.0.0";
  std::string socket_path;
  int mtu = 0;             // 0: leave it to the agent's default
  bool exclusive = false;  // rename other plugins' configurations out of the runtime's way
};

inline constexpr char kConflistName[] = "05-sluice.conflist";
inline constexpr char kBackupSuffix[] = ".sluice_bak";

// The binaries the runtime will run besides Sluice's own plugin: every other type the
// conflist names, and loopback, which runtimes (containerd, CRI-O, podman) run for each pod.
std::vector<std::string> RequiredCniBinaries(const CniInstallOptions& options);

// OK when each of RequiredCniBinaries is an executable file in bin_dir; else FailedPrecondition
// naming the missing ones and the directory.
[[nodiscard]] absl::Status CheckCniBinaries(const CniInstallOptions& options);

// Other plugins' configurations in conf_dir (*.conf, *.conflist, *.json), sorted: the runtime
// (libcni) takes the first in this order.
std::vector<std::string> ForeignCniConfigs(const std::string& conf_dir);

struct ForeignConfigReport {
  std::vector<std::string> renamed;      // exclusive: now <name>.sluice_bak
  std::vector<std::string> before_ours;  // not exclusive: would be used instead of Sluice's
};

// The conflist text Sluice installs.
std::string RenderConflist(const CniInstallOptions& options);

// Copies the plugin, writes the conflist, then deals with the others' configurations (so the
// node is never without one). The report says what was renamed or warned about (also logged).
[[nodiscard]] absl::StatusOr<ForeignConfigReport> InstallCni(const CniInstallOptions& options);

// Removes 05-sluice.conflist and bin_dir/sluice (absent ones are fine) and renames every
// *.sluice_bak back unless its original name has been taken again since.
[[nodiscard]] absl::Status UninstallCni(const CniInstallOptions& options);

}  // namespace sluice::agent
