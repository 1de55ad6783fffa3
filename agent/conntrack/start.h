// The conntrack GC as the agent runs it: over the pinned conntrack, pair and NAT maps, with its
// collector on the agent's registry.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "agent/conntrack/gc.h"
#include "agent/metrics/agent_endpoints.h"
#include "agent/start/pieces.h"

namespace sluice::conntrack {

struct RunningConntrackGc {
  RunningConntrackGc(loader::Datapath& dp, const GcOptions& options, metrics::Registry& registry);

  ConntrackGc gc;
  metrics::ScopedCollector gc_metrics;  // reads gc: declared after it
};

// Starts the GC passes (a thread of its own, timed by the pieces' clock); an interval that is not
// positive is refused.
[[nodiscard]] absl::StatusOr<std::unique_ptr<RunningConntrackGc>> StartConntrackGc(
    const agent::StartPieces& pieces, const GcOptions& options);

}  // namespace sluice::conntrack
