// This node's endpoints as the datapath reads them: sluice_ep4 (address -> endpoint, the record
// every tool reads) and its direct-mapped index, sluice_ep4_slot + sluice_ep4_rec, which the
// programs read first with two array lookups instead of a hash lookup (maps/endpoint.h).
//
// Every write of an endpoint goes through here, so that the index never names what sluice_ep4
// no longer holds: an endpoint is written to sluice_ep4 before the index names it, and the index
// stops naming it before it leaves sluice_ep4. An address the index cannot name (its slot names
// another endpoint, or every record is in use) is found through sluice_ep4 alone, as before the
// index existed; it gets the slot when the slot's endpoint leaves.
//
// A record the index stopped naming is written again only after SLUICE_EP4_REC_QUARANTINE_S: a
// program that read the slot just before still reads the record it named, unchanged. Record 0 is
// never used: a free slot (all zero) names no record.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "loader/quarantined_records.h"
#include "maps/sluice_maps.h"

namespace sluice::loader {

class EndpointTable {
 public:
  struct Stats {
    size_t indexed = 0;    // endpoints the index names
    size_t unindexed = 0;  // endpoints found through sluice_ep4 only
  };

  EndpointTable(maps::EndpointMap& ep4, maps::Ep4SlotMap& slots, maps::Ep4RecordMap& records,
                const Clock* clock = RealClock::Get());

  // Takes over the maps as an earlier run left them (an agent restart, an upgrade from programs
  // without the index): keeps every slot that names its endpoint's current value, frees every
  // other, and indexes what sluice_ep4 holds that no slot names.
  [[nodiscard]] absl::Status Rebuild() ABSL_LOCKS_EXCLUDED(mu_);

  // Writes addr's endpoint (network order) to sluice_ep4, then to the index.
  [[nodiscard]] absl::Status Upsert(uint32_t addr, const sluice_endpoint& value)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Takes addr's endpoint out of the index, then out of sluice_ep4; none is not an error.
  [[nodiscard]] absl::Status Delete(uint32_t addr) ABSL_LOCKS_EXCLUDED(mu_);

  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);

  static uint32_t SlotOf(uint32_t addr);

 private:
  static constexpr uint32_t kNoRecord = UINT32_MAX;

  absl::Status IndexLocked(uint32_t addr, const sluice_endpoint& value)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FreeSlotLocked(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t TakeRecordLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RetireRecordLocked(uint32_t rec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  maps::EndpointMap& ep4_;
  maps::Ep4SlotMap& slots_;
  maps::Ep4RecordMap& records_;

  mutable absl::Mutex mu_;
  // Per slot: the address it names (0: free) and its record.
  std::vector<uint32_t> slot_addr_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> slot_rec_ ABSL_GUARDED_BY(mu_);
  // Per record: what it holds while a slot names it.
  std::vector<sluice_endpoint> rec_value_ ABSL_GUARDED_BY(mu_);
  // Records free, and those no slot names any more waiting out their quarantine.
  QuarantinedRecords pool_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint32_t> unindexed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::loader
