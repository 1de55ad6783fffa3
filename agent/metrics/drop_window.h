// Drops in the last minute (`sluicectl status`): the per-reason totals of sluice_drops sampled
// every `step`, so the difference between now and the oldest sample within `window` is what
// the datapath dropped recently. Served as /v1/drops on the health server.
#pragma once

#include <deque>
#include <map>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "agent/base/clock.h"

namespace sluice::metrics {

struct DropWindowOptions {
  std::string bpffs_root;
  absl::Duration window = absl::Minutes(1);
  absl::Duration step = absl::Seconds(10);
  const Clock* clock = RealClock::Get();
  bool sample_in_background = true;  // false: only SampleNow (tests)
};

class DropWindow {
 public:
  explicit DropWindow(DropWindowOptions options);
  ~DropWindow();
  DropWindow(const DropWindow&) = delete;
  DropWindow& operator=(const DropWindow&) = delete;

  void SampleNow();
  struct Recent {
    absl::Duration span;                      // how far back the oldest sample used goes
    std::map<std::string, uint64_t> packets;  // reason -> packets dropped in the span (> 0 only)
  };
  Recent Get() const;
  // {"windowSeconds": 60, "packets": {"policy_denied": 4}}
  std::string Json() const;

 private:
  const DropWindowOptions options_;
  absl::Notification stop_;
  std::thread thread_;
  mutable absl::Mutex mu_;
  std::deque<std::pair<absl::Time, std::map<std::string, uint64_t>>> samples_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::metrics
