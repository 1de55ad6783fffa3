#include "agent/monitor/monitor.h"

#include <bpf/libbpf.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/base/errno.h"
#include "spdlog/spdlog.h"

namespace sluice::monitor {

absl::StatusOr<MonitorCounters> ReadMonitorCounters(const maps::MonitorCpuMap& cpu) {
  auto per_cpu = cpu.Lookup(0);
  if (!per_cpu.ok()) return per_cpu.status();
  MonitorCounters c;
  for (const auto& v : *per_cpu) {
    c.emitted += v.emitted;
    c.lost_rate += v.lost_rate;
    c.lost_full += v.lost_full;
  }
  return c;
}

absl::StatusOr<uint32_t> ParseEventTypes(const std::string& text) {
  if (text == "all") return SLUICE_MON_EVENTS_ALL;
  if (text == "none" || text.empty()) return 0u;
  uint32_t mask = 0;
  for (absl::string_view t : absl::StrSplit(text, ',')) {
    if (t == "drops" || t == "drop")
      mask |= 1u << SLUICE_EVENT_DROP;
    else if (t == "policy")
      mask |= 1u << SLUICE_EVENT_POLICY;
    else if (t == "translate" || t == "translations")
      mask |= 1u << SLUICE_EVENT_TRANSLATE;
    else if (t == "close")
      mask |= 1u << SLUICE_EVENT_CT_CLOSE;
    else
      return absl::InvalidArgumentError(absl::StrCat(
          "event type ", t, ": want all, none or a list of drops, policy, translate, close"));
  }
  return mask;
}

FlowMonitor::FlowMonitor(maps::MonitorConfigMap& config, const maps::MonitorCpuMap& cpu,
                         FlowNames* names, MonitorOptions options)
    : config_(config),
      cpu_(cpu),
      names_(names),
      options_(std::move(options)),
      mono_to_wall_(MonotonicToWallOffset()) {}

absl::StatusOr<std::unique_ptr<FlowMonitor>> FlowMonitor::Start(int ringbuf_fd,
                                                                maps::MonitorConfigMap& config,
                                                                const maps::MonitorCpuMap& cpu,
                                                                FlowNames* names,
                                                                MonitorOptions options) {
  if (options.burst == 0 && options.rate != 0) {
    return absl::InvalidArgumentError("a monitor rate limit needs a burst of at least 1");
  }
  std::unique_ptr<FlowMonitor> m(new FlowMonitor(config, cpu, names, std::move(options)));
  auto on_event = [](void* ctx, void* data, size_t size) -> int {
    sluice_event e{};
    std::memcpy(&e, data, std::min(size, sizeof(e)));
    static_cast<FlowMonitor*>(ctx)->HandleEvent(e);
    return 0;
  };
  errno = 0;
  m->rb_ = ring_buffer__new(ringbuf_fd, on_event, m.get(), nullptr);
  if (m->rb_ == nullptr)
    return ErrnoStatus(errno ? errno : EINVAL, "open the sluice_events ring buffer");
  {
    absl::MutexLock lock(&m->mu_);
    if (auto st = m->WriteConfigLocked(); !st.ok()) return st;
  }
  m->reader_ = std::thread([p = m.get()] { p->ReadLoop(); });
  return m;
}

FlowMonitor::~FlowMonitor() {
  stopping_ = true;
  if (reader_.joinable()) reader_.join();
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    // Nobody reads any more: the datapath pays the lookup only.
    sluice_monitor_config off{};
    if (auto st = config_.Update(0, off); !st.ok()) {
      spdlog::warn("monitor: cannot switch the datapath's events off: {}", st.ToString());
    }
  }
  if (rb_) ring_buffer__free(rb_);
}

absl::Status FlowMonitor::WriteConfigLocked() {
  sluice_monitor_config cfg{};
  cfg.events = observers_.empty() ? options_.idle_events : options_.events;
  cfg.sample = options_.sample;
  cfg.rate = options_.rate;
  cfg.burst = options_.burst;
  if (auto st = config_.Update(0, cfg); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat("write sluice_monitor: ", st.message()));
  }
  return absl::OkStatus();
}

void FlowMonitor::ReadLoop() {
  // The datapath wakes this thread only when the ring buffer fills up (lib/events.h): every
  // 50 ms it reads what arrived without a wakeup. That is also how soon a stop is seen.
  while (!stopping_) {
    int n = ring_buffer__poll(rb_, 50);
    if (n >= 0) n = ring_buffer__consume(rb_);
    if (n < 0 && n != -EINTR) {
      spdlog::error("monitor: reading sluice_events: {}", ErrnoText(-n));
      return;
    }
  }
}

void FlowMonitor::HandleEvent(const sluice_event& e) {
  Flow f = DecodeEvent(e, mono_to_wall_, options_.node_name);
  if (names_) names_->Name(f);
  flows_read_.fetch_add(1, std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  for (Observer* o : observers_) {
    if (!Matches(o->filter_, f)) continue;
    if (o->queue_.size() >= options_.observer_queue) {
      ++o->overflowed_;
      ++observer_lost_;
      continue;
    }
    o->queue_.push_back(f);
  }
  if (options_.history == 0) return;
  if (history_.size() >= options_.history) history_.pop_front();
  history_.push_back(std::move(f));
}

std::unique_ptr<FlowMonitor::Observer> FlowMonitor::Observe(const FlowFilter& filter, size_t last,
                                                            bool follow,
                                                            std::vector<Flow>* history) {
  absl::MutexLock lock(&mu_);
  if (history && last > 0) {
    std::vector<const Flow*> picked;
    for (auto it = history_.rbegin(); it != history_.rend() && picked.size() < last; ++it) {
      if (Matches(filter, *it)) picked.push_back(&*it);
    }
    for (auto it = picked.rbegin(); it != picked.rend(); ++it) history->push_back(**it);
  }
  if (!follow || stopped_) return nullptr;
  std::unique_ptr<Observer> o(new Observer(this, filter));
  bool first = observers_.empty();
  observers_.push_back(o.get());
  if (first) {
    if (auto st = WriteConfigLocked(); !st.ok())
      spdlog::warn("monitor: {}", st.ToString());
    else
      spdlog::info("monitor: an observer is attached; the datapath emits its events");
  }
  return o;
}

void FlowMonitor::Unsubscribe(Observer* o) {
  absl::MutexLock lock(&mu_);
  observers_.remove(o);
  if (observers_.empty() && !stopped_) {
    if (auto st = WriteConfigLocked(); !st.ok())
      spdlog::warn("monitor: {}", st.ToString());
    else
      spdlog::info("monitor: no observer left; the datapath emits {} events",
                   options_.idle_events ? "its idle" : "no");
  }
}

FlowMonitor::Observer::~Observer() { monitor_->Unsubscribe(this); }

std::optional<Flow> FlowMonitor::Observer::Next(absl::Duration timeout) {
  absl::MutexLock lock(&monitor_->mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(monitor_->mu_) {
    return !queue_.empty() || monitor_->stopped_;
  };
  monitor_->mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  if (queue_.empty()) return std::nullopt;
  Flow f = std::move(queue_.front());
  queue_.pop_front();
  return f;
}

uint64_t FlowMonitor::Observer::overflowed() const {
  absl::MutexLock lock(&monitor_->mu_);
  return overflowed_;
}

bool FlowMonitor::Observer::stopped() const {
  absl::MutexLock lock(&monitor_->mu_);
  return monitor_->stopped_;
}

MonitorCounters FlowMonitor::DatapathCounters() const {
  auto c = ReadMonitorCounters(cpu_);
  return c.ok() ? *c : MonitorCounters{};
}

uint64_t FlowMonitor::EventsLost() const {
  uint64_t datapath = DatapathCounters().lost();
  absl::MutexLock lock(&mu_);
  return datapath + observer_lost_;
}

int FlowMonitor::observers() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(observers_.size());
}

}  // namespace sluice::monitor
