#include "agent/k8s/store.h"

namespace sluice::k8s {

SyncGate::Id SyncGate::Register(std::string name) {
  absl::MutexLock lock(&mu_);
  parts_.emplace_back(std::move(name), false);
  return parts_.size() - 1;
}

void SyncGate::MarkSynced(Id id) {
  absl::MutexLock lock(&mu_);
  if (id < parts_.size()) parts_[id].second = true;
}

bool SyncGate::AllSynced() const {
  absl::MutexLock lock(&mu_);
  if (parts_.empty()) return false;
  for (const auto& p : parts_) {
    if (!p.second) return false;
  }
  return true;
}

bool SyncGate::WaitAllSynced(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto all = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (parts_.empty()) return false;
    for (const auto& p : parts_) {
      if (!p.second) return false;
    }
    return true;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&all), timeout);
}

std::vector<std::string> SyncGate::Pending() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& p : parts_) {
    if (!p.second) out.push_back(p.first);
  }
  return out;
}

}  // namespace sluice::k8s
