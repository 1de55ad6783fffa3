// The agent's flow monitor: reads the datapath's sluice_events ring buffer on its own thread,
// names each event (FlowNames), keeps the last `history` flows for `observe --last`, and hands
// flows to the observers subscribed. It owns sluice_monitor: while someone observes, the datapath
// emits `events`; while nobody does, `idle_events` (default none: one map lookup per packet and
// nothing else). docs/observe.md.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/monitor/filter.h"
#include "agent/monitor/flow.h"
#include "agent/monitor/names.h"
#include "maps/sluice_maps.h"

struct ring_buffer;

namespace sluice::monitor {

struct MonitorOptions {
  std::string node_name;
  size_t history = 4096;                    // flows kept for --last
  uint32_t events = SLUICE_MON_EVENTS_ALL;  // event types emitted while observed
  uint32_t idle_events = 0;                 // ... while nobody observes (kept in the history)
  uint32_t sample = 1;                      // 1 in `sample` events other than drops
  uint32_t rate = 5000;                     // per CPU, events per second
  uint32_t burst = 10000;                   // per CPU
  size_t observer_queue = 16384;            // flows buffered per observer; beyond: lost for it
};

// Sums of sluice_mon_cpu over CPUs: what the datapath emitted and could not.
struct MonitorCounters {
  uint64_t emitted = 0;
  uint64_t lost_rate = 0;  // refused by the per-CPU token bucket
  uint64_t lost_full = 0;  // no room in the ring buffer
  uint64_t lost() const { return lost_rate + lost_full; }
};
// Readable with or without an agent (sluicectl, metrics): the pinned map is enough.
[[nodiscard]] absl::StatusOr<MonitorCounters> ReadMonitorCounters(const maps::MonitorCpuMap& cpu);

// Parses "drops,policy,translate,close", "all" or "none" into an events mask.
[[nodiscard]] absl::StatusOr<uint32_t> ParseEventTypes(const std::string& text);

class FlowMonitor {
 public:
  class Observer {
   public:
    ~Observer();  // unsubscribes
    // The next flow, or nothing within `timeout` (or once the monitor stops).
    std::optional<Flow> Next(absl::Duration timeout);
    // Flows that matched but were lost because this observer fell behind.
    uint64_t overflowed() const;
    bool stopped() const;

   private:
    friend class FlowMonitor;
    Observer(FlowMonitor* m, FlowFilter f) : monitor_(m), filter_(std::move(f)) {}
    FlowMonitor* monitor_;
    const FlowFilter filter_;
    std::deque<Flow> queue_;   // guarded by monitor_->mu_
    uint64_t overflowed_ = 0;  // guarded by monitor_->mu_
  };

  // ringbuf_fd is borrowed for the monitor's lifetime (the Datapath's sluice_events fd).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<FlowMonitor>> Start(
      int ringbuf_fd, maps::MonitorConfigMap& config, const maps::MonitorCpuMap& cpu,
      FlowNames* names, MonitorOptions options);
  ~FlowMonitor();  // stops the reader; the datapath is told to emit nothing

  // The last `last` matching flows of the history (oldest first), and, when `follow`, an
  // observer that gets every matching flow after them (none missed, none twice).
  std::unique_ptr<Observer> Observe(const FlowFilter& filter, size_t last, bool follow,
                                    std::vector<Flow>* history) ABSL_LOCKS_EXCLUDED(mu_);

  // sluice_flow_events_lost_total (agent/main.cc exports it): events the datapath could not
  // emit (rate limit, full ring buffer) plus flows observers lost by falling behind.
  uint64_t EventsLost() const ABSL_LOCKS_EXCLUDED(mu_);
  MonitorCounters DatapathCounters() const;
  int observers() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t flows_read() const { return flows_read_.load(); }

  // For tests and the benchmark: handles one raw event as the reader thread does.
  void HandleEvent(const sluice_event& e) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  FlowMonitor(maps::MonitorConfigMap& config, const maps::MonitorCpuMap& cpu, FlowNames* names,
              MonitorOptions options);
  absl::Status WriteConfigLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unsubscribe(Observer* o) ABSL_LOCKS_EXCLUDED(mu_);
  void ReadLoop();

  maps::MonitorConfigMap& config_;
  const maps::MonitorCpuMap& cpu_;
  FlowNames* names_;
  const MonitorOptions options_;
  const absl::Duration mono_to_wall_;
  struct ring_buffer* rb_ = nullptr;
  std::thread reader_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> flows_read_{0};

  mutable absl::Mutex mu_;
  std::deque<Flow> history_ ABSL_GUARDED_BY(mu_);
  std::list<Observer*> observers_ ABSL_GUARDED_BY(mu_);
  uint64_t observer_lost_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace sluice::monitor
