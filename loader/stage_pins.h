// The program arrays of earlier loads left pinned under <bpffs root>/stages/ after a start or an
// upgrade replaced their entry programs (docs/architecture.md, "Stages").
#pragma once

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/base/clock.h"
#include "loader/datapath.h"

namespace sluice::loader {

// Waits until <bpffs root>/stages/ holds only the arrays `dp`'s entry programs call, releasing
// the arrays of replaced builds (Datapath::ReleaseReplacedStages) as the kernel frees their last
// entry program: an RCU grace period after the attach that replaced it, so the attach's own
// release may come too early for the last device a start replaces. Called once the start has
// attached every device; returns how many arrays of other builds are still pinned at `timeout`
// (an attached program of another build still calls them: a device this agent did not replace).
// The timeout and the pauses between looks are `clock`'s.
[[nodiscard]] absl::StatusOr<int> AwaitReplacedStagesReleased(
    Datapath& dp, absl::Duration timeout, const Clock* clock = RealClock::Get());

}  // namespace sluice::loader
