// TC (clsact) attachment of Sluice programs. One filter per interface and direction, at a fixed
// handle and priority, replaced in place: attaching again swaps the program atomically.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sluice::loader {

enum class TcDirection { kIngress, kEgress };

// Attaches `prog_fd` on `ifindex` (creating the clsact qdisc when missing), replacing whatever
// Sluice program was there. Idempotent.
[[nodiscard]] absl::Status AttachTc(int ifindex, TcDirection dir, int prog_fd);

// Removes Sluice's filter; absent filter, qdisc or interface is not an error.
[[nodiscard]] absl::Status DetachTc(int ifindex, TcDirection dir);

// The id of the program attached at Sluice's slot; NotFound when there is none.
[[nodiscard]] absl::StatusOr<uint32_t> AttachedTcProgram(int ifindex, TcDirection dir);

// The kernel id of a loaded program.
[[nodiscard]] absl::StatusOr<uint32_t> ProgramId(int prog_fd);

}  // namespace sluice::loader
