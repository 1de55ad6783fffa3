// Metrics read from the pinned maps at scrape time, so they are right whatever wrote the maps
// (the datapath, the agent, an earlier agent): drops per reason, policy drops per direction,
// each map's entries and capacity (map pressure), conntrack entries. The flow monitor's
// "events lost" counter joins these when it lands (sluice_flow_events_lost_total, docs/metrics.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
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
[[nodiscard]] absl::StatusOr<std::vector<MapFill>> ReadMapFill(const std::string& bpffs_root);

// Counts every failed maps::Map / PerCpuMap update of this process in
// sluice_bpf_map_update_errors_total{map_name, errno} on Default() (maps::update_failure_hook).
void CountMapUpdateFailures();

// The full map name for a kernel map name (bpf_map_info.name keeps 15 characters).
std::string MapNameOf(const char* kernel_name);

// Registers the collector on `registry`; returns its id.
int AddDatapathCollector(Registry& registry, const std::string& bpffs_root);

}  // namespace sluice::metrics
