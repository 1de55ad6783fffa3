// The records of an array map that BPF programs reach through a reference held elsewhere (an
// index slot, a Service master entry), and that are written only while no reference names them.
// A record a reference stopped naming is handed out again only after a quarantine: a program
// that read the old reference just before still reads the record it named, unchanged, with no
// lock between the agent and BPF. Record 0 is never handed out (a free reference names none).
// Used by loader::EndpointTable (sluice_ep4_rec) and agent::SlotRecords (sluice_lb4_rec). Not
// thread-safe: its owner locks. Quarantines are timed by the agent's clock (agent/base/clock.h),
// which tests move by hand.
#pragma once

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "agent/base/clock.h"

namespace sluice::loader {

class QuarantinedRecords {
 public:
  // Records 1 .. size - 1, all free. `clock` is borrowed.
  QuarantinedRecords(uint32_t size, absl::Duration quarantine, const Clock* clock);

  // A free record, or one whose quarantine ended; 0 when there is none.
  uint32_t Take();
  // A record a reference stopped naming: free once the quarantine ends. 0 is ignored.
  void Retire(uint32_t record);
  // A record taken but never named by any reference: free at once.
  void Release(uint32_t record);
  // Starts over (a restart took over the maps): records that `in_use` marks stay out of the
  // pool, `retired` ones (marked too) wait out the quarantine from now, the rest are free.
  void Reset(const std::vector<bool>& in_use, const std::vector<uint32_t>& retired);

  uint32_t size() const { return size_; }
  size_t free() const { return free_.size(); }
  size_t retired() const { return retired_.size(); }

 private:
  const uint32_t size_;
  const absl::Duration quarantine_;
  const Clock* const clock_;
  std::vector<uint32_t> free_;  // taken from the back: the lowest first after a reset
  std::deque<std::pair<absl::Time, uint32_t>> retired_;  // oldest first
};

}  // namespace sluice::loader
