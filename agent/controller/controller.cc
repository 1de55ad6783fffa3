#include "agent/controller/controller.h"

#include <utility>

#include "agent/metrics/agent_metrics.h"
#include "agent/metrics/health.h"
#include "spdlog/spdlog.h"

namespace sluice::controller {
namespace {

// With the gate open and nothing dirty the loop only waits for a mark; this bounds the wait
// anyway, so a lost wake-up costs at most this much.
constexpr absl::Duration kIdleWait = absl::Seconds(1);

}  // namespace

void DirtyKeys::Mark(std::string key) {
  absl::MutexLock l(&mu_);
  dirty_.insert(std::move(key));
  ++seen_;
}

Controller::Controller(ControllerOptions options, ReconcileFn reconcile)
    : options_(std::move(options)), reconcile_(std::move(reconcile)) {
  thread_ = std::thread([this] { Run(); });
}

Controller::~Controller() {
  {
    absl::MutexLock l(&keys_->mu_);
    keys_->stop_ = true;
  }
  thread_.join();
}

bool Controller::WaitIdle(absl::Duration timeout) {
  DirtyKeys* k = keys_.get();
  absl::MutexLock l(&k->mu_);
  auto idle = [k]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu_) {
    return k->applied_ == k->seen_ && k->dirty_.empty() && !k->retry_ && k->primed_;
  };
  return k->mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

bool Controller::primed() const {
  absl::MutexLock l(&keys_->mu_);
  return keys_->primed_;
}

uint64_t Controller::reconciled() const {
  absl::MutexLock l(&keys_->mu_);
  return keys_->reconciled_;
}

void Controller::Run() {
  DirtyKeys* k = keys_.get();
  // The loop wakes at least every kIdleWait: a beat older than kLoopWedgedAfter means a
  // reconcile that does not return, and /healthz says so.
  std::unique_ptr<metrics::Heartbeat> beat = metrics::DefaultHeartbeats().Register(
      "controller " + options_.name, metrics::kLoopWedgedAfter);
  while (true) {
    beat->Beat();
    // The gate and the feature's key list have locks of their own: asked outside k->mu_.
    const bool synced_before = options_.synced();
    bool full = false;
    {
      absl::MutexLock l(&k->mu_);
      auto ready = [k, synced_before]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu_) {
        return k->stop_ || (synced_before && !k->retry_ && (!k->dirty_.empty() || !k->primed_));
      };
      // Marks made before the gate opens do not wake the loop: they wait for the gate, which is
      // polled. A pending retry waits out its delay.
      k->mu_.AwaitWithTimeout(absl::Condition(&ready), !synced_before ? options_.gate_poll
                                                       : k->retry_    ? options_.retry_delay
                                                                      : kIdleWait);
      if (k->stop_) return;
      k->retry_ = false;
      full = !k->primed_;
    }
    if (!options_.synced()) continue;
    std::vector<std::string> all;
    if (full && options_.all_keys) all = options_.all_keys();
    Batch batch;
    uint64_t gen = 0;
    {
      absl::MutexLock l(&k->mu_);
      for (std::string& key : all) {
        k->dirty_.insert(std::move(key));
        ++k->seen_;
      }
      if (k->dirty_.empty() && !full) {
        k->applied_ = k->seen_;
        continue;
      }
      batch.keys.swap(k->dirty_);
      batch.full = full;
      gen = k->seen_;
    }
    const absl::Time started = options_.clock->Now();
    absl::Status st = reconcile_(batch);
    metrics::ObserveReconcile(options_.name, options_.clock->Now() - started, st.ok());
    absl::MutexLock l(&k->mu_);
    k->reconciled_ += batch.keys.size();
    if (!st.ok()) {
      spdlog::warn("{}: {} (after {}); retrying in {}", options_.name, st.ToString(),
                   absl::FormatDuration(options_.clock->Now() - started),
                   absl::FormatDuration(options_.retry_delay));
      for (const std::string& key : batch.keys) k->dirty_.insert(key);
      k->retry_ = true;
      continue;
    }
    if (full) k->primed_ = true;
    k->applied_ = gen;
  }
}

}  // namespace sluice::controller
