#include "agent/conntrack/start.h"

#include "loader/datapath.h"

namespace sluice::conntrack {

RunningConntrackGc::RunningConntrackGc(loader::Datapath& dp, const GcOptions& options,
                                       metrics::Registry& registry)
    : gc(dp.ct4(), dp.ct4_any(), &dp.ct_stats(), options),
      gc_metrics(registry, AddConntrackGcCollector(registry, &gc)) {}

absl::StatusOr<std::unique_ptr<RunningConntrackGc>> StartConntrackGc(
    const agent::StartPieces& pieces, const GcOptions& options) {
  if (options.interval <= absl::ZeroDuration()) {
    return agent::StartError(absl::InvalidArgumentError("want a positive duration"),
                             "--ct_gc_interval");
  }
  loader::Datapath& dp = *pieces.datapath;
  auto running = std::make_unique<RunningConntrackGc>(dp, options, *pieces.registry);
  running->gc.TrackPairs(&dp.ct_pairs());
  running->gc.CollectNat(&dp.snat(), &dp.rnat());
  running->gc.Start(pieces.clock);
  return running;
}

}  // namespace sluice::conntrack
