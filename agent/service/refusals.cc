#include "agent/service/refusals.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace sluice::agent {

uint64_t RefusalCounts::total() const {
  uint64_t n = 0;
  for (uint64_t c : by_reason) n += c;
  return n;
}

std::string RefusalCounts::ToString() const {
  std::string out;
  for (size_t i = 0; i < by_reason.size(); ++i) {
    if (by_reason[i] == 0) continue;
    absl::StrAppend(&out, out.empty() ? "" : " ",
                    std::string(RefusalReasonName(static_cast<RefusalReason>(i))), "=",
                    by_reason[i]);
  }
  return out.empty() ? "none" : out;
}

size_t ServiceRefusals::Record(const std::string& service, const std::vector<Refusal>& refused) {
  absl::MutexLock lock(&mu_);
  if (refused.empty()) {
    current_.erase(service);
    return 0;
  }
  std::vector<Refusal>& before = current_[service];  // sorted, like the translation's
  size_t news = 0;
  for (const Refusal& r : refused) {
    if (std::binary_search(before.begin(), before.end(), r)) continue;
    ++news;
    ++counts_.by_reason[static_cast<size_t>(r.reason)];
    spdlog::warn("services: {}: {} refused ({})", service, r.what,
                 std::string(RefusalReasonName(r.reason)));
  }
  before = refused;
  if (news > 0) spdlog::warn("services: refusals so far: {}", counts_.ToString());
  return news;
}

void ServiceRefusals::Forget(const std::string& service) {
  absl::MutexLock lock(&mu_);
  current_.erase(service);
}

RefusalCounts ServiceRefusals::counts() const {
  absl::MutexLock lock(&mu_);
  return counts_;
}

size_t ServiceRefusals::services_with_refusals() const {
  absl::MutexLock lock(&mu_);
  return current_.size();
}

}  // namespace sluice::agent
