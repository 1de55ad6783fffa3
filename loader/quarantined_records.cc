#include "loader/quarantined_records.h"

namespace sluice::loader {

QuarantinedRecords::QuarantinedRecords(uint32_t size, absl::Duration quarantine, const Clock* clock)
    : size_(size), quarantine_(quarantine), clock_(clock) {
  Reset(std::vector<bool>(size_, false), {});
}

uint32_t QuarantinedRecords::Take() {
  if (free_.empty() && !retired_.empty() && clock_->Now() - retired_.front().first >= quarantine_) {
    free_.push_back(retired_.front().second);
    retired_.pop_front();
  }
  if (free_.empty()) return 0;
  const uint32_t record = free_.back();
  free_.pop_back();
  return record;
}

void QuarantinedRecords::Retire(uint32_t record) {
  if (record != 0) retired_.emplace_back(clock_->Now(), record);
}

void QuarantinedRecords::Release(uint32_t record) {
  if (record != 0) free_.push_back(record);
}

void QuarantinedRecords::Reset(const std::vector<bool>& in_use,
                               const std::vector<uint32_t>& retired) {
  free_.clear();
  retired_.clear();
  for (uint32_t r = size_; r-- > 1;) {
    if (r >= in_use.size() || !in_use[r]) free_.push_back(r);
  }
  const absl::Time now = clock_->Now();
  for (uint32_t r : retired) retired_.emplace_back(now, r);
}

}  // namespace sluice::loader
