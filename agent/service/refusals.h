// What the Service translator refused (translator.h, RefusalReason), logged once per object and
// counted per reason. A refusal is news when a Service's translation first contains it: the same
// refusal on every later resync or recomputation is neither logged nor counted again; one that
// goes away and comes back is. The counts are what a metrics endpoint will export
// (sluice_service_refusals_total{reason=...}); until then they appear in a log line and through
// counts().
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "agent/service/translator.h"

namespace sluice::agent {

struct RefusalCounts {
  std::array<uint64_t, static_cast<size_t>(RefusalReason::kCount)> by_reason{};

  uint64_t of(RefusalReason r) const { return by_reason[static_cast<size_t>(r)]; }
  uint64_t total() const;
  // "backend_loopback=1 port_invalid=2" (reasons with a zero count left out; "none" if all are).
  std::string ToString() const;
  friend bool operator==(const RefusalCounts&, const RefusalCounts&) = default;
};

class ServiceRefusals {
 public:
  // The refusals of `service`'s current translation (empty: nothing refused). Returns how many
  // are new (logged and counted now).
  size_t Record(const std::string& service, const std::vector<Refusal>& refused);
  // The Service is gone: its refusals are forgotten (not uncounted).
  void Forget(const std::string& service);

  RefusalCounts counts() const;
  // Services whose current translation has at least one refusal.
  size_t services_with_refusals() const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::vector<Refusal>> current_ ABSL_GUARDED_BY(mu_);
  RefusalCounts counts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::agent
