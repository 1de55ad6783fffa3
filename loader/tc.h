// TC (clsact) attachment of Sluice programs. One filter per interface and direction, at Sluice's
// own handle and priority, replaced in place: attaching again swaps the program atomically.
// Filters at any other slot (another plugin's, an operator's) are never touched.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sluice::loader {

enum class TcDirection { kIngress, kEgress };

// Sluice's slot on every hook: `tc filter show dev D ingress` lists it as
// "pref 1308 bpf chain 0 handle 0x51c sluice_...". 0x51c spells "SLC"; it is neither pref 1
// handle 1 (Cilium's legacy tc slot, and the first one a hand-written filter gets) nor in the
// range tc numbers filters added without a pref (49152 and down).
inline constexpr uint32_t kTcHandle = 0x51c;
inline constexpr uint32_t kTcPriority = 0x51c;
// Where Sluice attached before it had a slot of its own. AttachTc and DetachTc remove a filter
// there only when its program's name starts with "sluice_"; anything else at 1/1 is left alone.
inline constexpr uint32_t kLegacyTcHandle = 1;
inline constexpr uint32_t kLegacyTcPriority = 1;

// Attaches `prog_fd` on `ifindex` (creating the clsact qdisc when missing) at Sluice's slot,
// replacing whatever Sluice program was there, then removes a Sluice program left at the legacy
// slot (an upgrade: the new filter is in place before the old one goes). Idempotent.
[[nodiscard]] absl::Status AttachTc(int ifindex, TcDirection dir, int prog_fd);

// Removes Sluice's filter (and a Sluice program at the legacy slot); absent filter, qdisc or
// interface is not an error. The clsact qdisc and every other filter stay.
[[nodiscard]] absl::Status DetachTc(int ifindex, TcDirection dir);

// The id of the program attached at Sluice's slot; NotFound when there is none.
[[nodiscard]] absl::StatusOr<uint32_t> AttachedTcProgram(int ifindex, TcDirection dir);

// The kernel id of a loaded program.
[[nodiscard]] absl::StatusOr<uint32_t> ProgramId(int prog_fd);

}  // namespace sluice::loader
