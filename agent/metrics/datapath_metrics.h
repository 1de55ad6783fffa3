// Metrics read from the pinned maps, so they are right whatever wrote the maps (the datapath, the
// agent, an earlier agent): drops per reason, policy drops per direction, each map's entries and
// capacity (map pressure), conntrack entries. Counters are read at scrape time; map entries are
// counted by a walk of each map (1-10 us an entry: ~30 s for a full sluice_policy4), which runs
// off the scrape path (MapFillCounter): a scrape reports the last finished count.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/base/clock.h"
#include "agent/metrics/registry.h"

namespace sluice::metrics {

// One pinned map's fill level. Arrays are full by construction: entries == capacity; but a slot
// array (sluice_lb4_be) counts its used slots, like a hash map its keys.
struct MapFill {
  std::string name;
  uint32_t type = 0;  // BPF_MAP_TYPE_*
  uint64_t entries = 0;
  uint32_t capacity = 0;
  bool is_array = false;
};

// Every map of maps/map_list.h pinned under `bpffs_root`; maps not pinned (yet) are left out.
// Walks every hash map and trie: seconds for full maps. Cancelled when `*stop` becomes true.
[[nodiscard]] absl::StatusOr<std::vector<MapFill>> ReadMapFill(
    const std::string& bpffs_root, const std::atomic<bool>* stop = nullptr);

// ReadMapFill in a thread of its own, for /metrics. A scrape asks for a count (Latest): one starts
// unless the last ended less than `idle_factor` times its own duration ago (so counting full maps
// takes at most 1 / (1 + idle_factor) of a core, however often Prometheus scrapes), and the scrape
// waits up to `scrape_wait` for it. It then reports the latest finished count, with its time:
// with small maps the one it started, with full ones an earlier one.
class MapFillCounter {
 public:
  struct Options {
    std::string bpffs_root;
    absl::Duration scrape_wait = absl::Milliseconds(250);
    double idle_factor = 9;
    const Clock* clock = RealClock::Get();  // times the walks; borrowed
  };
  struct Count {
    std::vector<MapFill> fill;
    absl::Time finished;  // when the walk ended
    absl::Duration took;  // how long it walked
  };

  explicit MapFillCounter(Options options);
  ~MapFillCounter();  // cancels a walk under way
  MapFillCounter(const MapFillCounter&) = delete;
  MapFillCounter& operator=(const MapFillCounter&) = delete;

  // Starts a count when one is due, waits up to scrape_wait for the one under way, and returns the
  // latest finished count (none before the first has finished).
  std::optional<Count> Latest();

 private:
  void Run();

  const Options options_;
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  bool wanted_ ABSL_GUARDED_BY(mu_) = false;   // a scrape asked for a count
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // a walk is under way
  uint64_t walks_ ABSL_GUARDED_BY(mu_) = 0;    // walks finished, failed ones too
  absl::Time last_end_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Duration last_took_ ABSL_GUARDED_BY(mu_);
  std::optional<Count> latest_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// Counts every failed maps::Map / PerCpuMap update of this process in
// sluice_bpf_map_update_errors_total{map_name, errno} on Default() (maps::update_failure_hook).
void CountMapUpdateFailures();

// The full map name for a kernel map name (bpf_map_info.name keeps 15 characters).
std::string MapNameOf(const char* kernel_name);

// Registers the collector on `registry`; returns its id.
int AddDatapathCollector(Registry& registry, const std::string& bpffs_root);

}  // namespace sluice::metrics
