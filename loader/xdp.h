// XDP attachment of Sluice's native-device program through a bpf_link pinned under the bpffs
// root: the program stays attached while no agent runs, a restarted agent swaps the program
// inside the same link (hitless), and removing the pin detaches it. An XDP program that is not
// Sluice's (no live link of Sluice's pinned for the device) is never replaced or detached.
#pragma once

#include <bpf/libbpf.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sluice::loader {

enum class XdpMode {
  kNone,     // not attached: another program holds the device's XDP hook
  kNative,   // the driver runs it (XDP_FLAGS_DRV_MODE)
  kGeneric,  // the stack runs it on the skb (XDP_FLAGS_SKB_MODE): the driver lacks native XDP
};
const char* XdpModeName(XdpMode mode);

// Attaches `prog` to `ifindex` through a link pinned at `pin_path`: native mode, generic mode
// where the driver has no native XDP. A live XDP link at the pin for the same device gets its
// program replaced in place (BPF_LINK_UPDATE, no packet sees the hook empty); a pin for another
// device or a defunct link is replaced. When the device already runs an XDP program that is not
// the pinned link's, nothing is attached and kNone is returned. Idempotent.
[[nodiscard]] absl::StatusOr<XdpMode> AttachXdpLink(struct bpf_program* prog, int ifindex,
                                                    const std::string& pin_path);

// Detaches the XDP link pinned at `pin_path` from its device (BPF_LINK_DETACH: the hook is empty
// when this returns; dropping the last reference alone frees the link later, from a workqueue)
// and removes the pin. An absent pin is not an error.
[[nodiscard]] absl::Status DetachXdpLink(const std::string& pin_path);

// The mode of the XDP program attached to `ifindex`: kNone when there is none.
[[nodiscard]] absl::StatusOr<XdpMode> AttachedXdpMode(int ifindex);

// The id of the XDP program attached to `ifindex` (0: none).
[[nodiscard]] absl::StatusOr<uint32_t> AttachedXdpProgram(int ifindex);

}  // namespace sluice::loader
