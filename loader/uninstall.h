// Taking Sluice's datapath off a node (`sluice-agent --uninstall --uninstall_datapath`): the
// inverse of Datapath::Load plus every attach, touching only what is Sluice's.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace sluice::loader {

// In the calling thread's network namespace: removes Sluice's tc filters (its own slot, and a
// Sluice program at the legacy slot) from both directions of every interface, node device and
// pod veths alike; then, under `bpffs_root`, unpins the socket-LB links and the native device's
// XDP link (which detaches their programs) and every pinned map, leaving the directory itself (it
// may be a mount point). Other filters, qdiscs and pins are left alone. Idempotent.
[[nodiscard]] absl::Status RemoveDatapath(const std::string& bpffs_root);

}  // namespace sluice::loader
