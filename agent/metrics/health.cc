#include "agent/metrics/health.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace sluice::metrics {

void Readiness::Require(std::string name, std::function<std::string()> check) {
  absl::MutexLock l(&mu_);
  checks_.emplace_back(std::move(name), std::move(check));
}

HealthVerdict Readiness::Check() const {
  std::vector<std::pair<std::string, std::function<std::string()>>> checks;
  {
    absl::MutexLock l(&mu_);
    checks = checks_;
  }
  HealthVerdict v{.ok = true};
  for (const auto& [name, check] : checks) {
    std::string why = check();
    if (why.empty()) {
      absl::StrAppend(&v.text, "ok ", name, "\n");
    } else {
      v.ok = false;
      absl::StrAppend(&v.text, "fail ", name, ": ", why, "\n");
    }
  }
  return v;
}

Heartbeat::Heartbeat(Heartbeats* owner, std::string name, absl::Duration limit)
    : owner_(owner), name_(std::move(name)), limit_(limit) {}

Heartbeat::~Heartbeat() { owner_->Remove(this); }

void Heartbeat::Beat() { last_ns_.store(absl::ToUnixNanos(owner_->clock_->Now())); }

std::unique_ptr<Heartbeat> Heartbeats::Register(std::string name, absl::Duration limit) {
  std::unique_ptr<Heartbeat> h(new Heartbeat(this, std::move(name), limit));
  h->Beat();
  absl::MutexLock l(&mu_);
  beats_.push_back(h.get());
  return h;
}

void Heartbeats::Remove(Heartbeat* h) {
  absl::MutexLock l(&mu_);
  beats_.erase(std::remove(beats_.begin(), beats_.end(), h), beats_.end());
}

HealthVerdict Heartbeats::Check() const {
  const absl::Time now = clock_->Now();
  HealthVerdict v{.ok = true, .text = "ok process\n"};
  absl::MutexLock l(&mu_);
  for (const Heartbeat* h : beats_) {
    absl::Duration since = now - absl::FromUnixNanos(h->last_ns_.load());
    if (since > h->limit_) {
      v.ok = false;
      absl::StrAppend(&v.text, "fail ", h->name_, ": no progress for ",
                      absl::FormatDuration(absl::Trunc(since, absl::Seconds(1))), " (limit ",
                      absl::FormatDuration(h->limit_), ")\n");
    } else {
      absl::StrAppend(&v.text, "ok ", h->name_, "\n");
    }
  }
  return v;
}

Heartbeats& DefaultHeartbeats() {
  static Heartbeats* h = new Heartbeats();
  return *h;
}

}  // namespace sluice::metrics
