#include "loader/uninstall.h"

#include <net/if.h>

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "loader/datapath.h"
#include "loader/tc.h"
#include "loader/xdp.h"
#include "spdlog/spdlog.h"

namespace sluice::loader {

absl::Status RemoveDatapath(const std::string& bpffs_root) {
  struct if_nameindex* links = if_nameindex();
  if (links == nullptr) return absl::InternalError("if_nameindex failed");
  absl::Status status;
  int detached = 0;
  for (struct if_nameindex* l = links; l->if_index != 0 && status.ok(); ++l) {
    for (TcDirection dir : {TcDirection::kIngress, TcDirection::kEgress}) {
      const bool had = AttachedTcProgram(static_cast<int>(l->if_index), dir).ok();
      if (absl::Status st = DetachTc(static_cast<int>(l->if_index), dir); !st.ok()) {
        status = absl::Status(st.code(), absl::StrCat(l->if_name, ": ", st.message()));
        break;
      }
      detached += had ? 1 : 0;
    }
  }
  if_freenameindex(links);
  if (!status.ok()) return status;
  spdlog::info("uninstall: removed {} tc programs", detached);

  // The XDP link is detached at once (its unpin alone frees it later, from a workqueue).
  if (auto st = DetachXdpLink(absl::StrCat(bpffs_root, "/", SLUICE_LINKS_DIR, "/", kXdpLinkName));
      !st.ok()) {
    return st;
  }
  // Pins: links first (each unpin detaches a socket-LB program), then maps.
  std::error_code ec;
  int removed = 0;
  for (const auto& e : std::filesystem::directory_iterator(bpffs_root, ec)) {
    // The kernel's own iterators at the root of a bpffs mount (bpf_preload), when the root is one.
    const std::string name = e.path().filename();
    if (name == "maps.debug" || name == "progs.debug") continue;
    removed += static_cast<int>(std::filesystem::remove_all(e.path(), ec));
    if (ec)
      return absl::InternalError(absl::StrCat("unpin ", e.path().string(), ": ", ec.message()));
  }
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return absl::InternalError(absl::StrCat("list ", bpffs_root, ": ", ec.message()));
  }
  spdlog::info("uninstall: removed {} pins under {}", removed, bpffs_root);
  return absl::OkStatus();
}

}  // namespace sluice::loader
