// cgroup attachment of Sluice programs through pinned bpf_links: a link pinned under the bpffs
// root keeps its program attached while no agent runs, a restarted agent swaps the program inside
// the same link (never a second attachment), and removing the pin detaches it.
#pragma once

#include <bpf/libbpf.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sluice::loader {

// Attaches `prog` to the cgroup open at `cgroup_fd` through a link pinned at `pin_path`. When the
// pin already holds a live link of the same attach type on the same cgroup, its program is
// replaced in place (BPF_LINK_UPDATE, atomic for the sockets it sees); a pin for another cgroup
// or a defunct link (its cgroup was removed) is replaced by a new link. Idempotent.
[[nodiscard]] absl::Status AttachCgroupLink(struct bpf_program* prog, int cgroup_fd,
                                            const std::string& pin_path);

// Unpins a cgroup link, which detaches its program unless something else holds the link. An
// absent pin is not an error.
[[nodiscard]] absl::Status DetachPinnedLink(const std::string& pin_path);

// The kernel id of a cgroup v2 directory (what bpf_link_info and bpftool report).
[[nodiscard]] absl::StatusOr<uint64_t> CgroupId(const std::string& cgroup_path);

// The cgroup v2 mount point from /proc/mounts (the first one); NotFound when there is none.
[[nodiscard]] absl::StatusOr<std::string> FindCgroup2Mount();

// FindCgroup2Mount, or when this mount namespace has none (`ip netns exec` replaces /sys, a
// container may not mount it), a cgroup2 filesystem mounted at `fallback`: the same hierarchy,
// seen from the root of the caller's cgroup namespace.
[[nodiscard]] absl::StatusOr<std::string> FindOrMountCgroup2(const std::string& fallback);

// SO_NETNS_COOKIE of the calling thread's network namespace (bpf_get_netns_cookie in BPF).
[[nodiscard]] absl::StatusOr<uint64_t> CurrentNetnsCookie();

// Ids of the programs attached directly to `cgroup_fd` for `type` (BPF_PROG_QUERY), in order.
[[nodiscard]] absl::StatusOr<std::vector<uint32_t>> CgroupPrograms(int cgroup_fd,
                                                                   enum bpf_attach_type type);

}  // namespace sluice::loader
