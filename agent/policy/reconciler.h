// Writes NetworkPolicy translations (agent/policy/translator.h) into sluice_ipcache4,
// sluice_policy4 and sluice_policy_ep, in an order in which no packet sees a pod opened by
// mistake:
//   1. allow entries that are new (for a new identity too, before any address has it)
//   2. ipcache entries that are new or changed
//   3. sluice_policy_ep entries that are new or changed (an enforce bit after its allows)
//   4. allow entries no longer wanted (after the bit that needed them is cleared)
//   5. ipcache prefixes no longer wanted; sluice_policy_ep entries of endpoints that are gone
// Level-triggered: Apply writes the difference between the translation and what the maps hold.
// The maps are read once (first Apply, and again after a failed write of WriteNewEndpoint or
// RemoveEndpoint, whose first write the copy records only with the second) and then known from
// what this reconciler wrote: nothing else writes these three maps, and reading them (LPM tries
// iterate at ~10 us an entry) would cost more than the rest of a batch. An Apply that fails (a
// full map) keeps the copy: its writes are recorded one by one, and a refused one changed nothing.
// The endpoint service owns the birth and death of an endpoint's entries (WriteClosed /
// RemoveEndpoint): Apply never deletes the sluice_policy_ep entry of an endpoint that still exists,
// even one its translation did not know yet.
// Per endpoint, an Apply is all or nothing: an endpoint whose new allows do not fit in the room
// sluice_policy4 has left (checked before any write), or one of whose writes the kernel refuses
// (its allows written so far are deleted again), keeps its last complete policy: its old allows
// and its old sluice_policy_ep entry, never a part of the new set nor an empty one. It is
// reported degraded (Degraded()) until an Apply writes its policy whole; the other endpoints are
// written as usual, and the ones that did not fit are tried once more after the stale allows of
// the others were deleted.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "agent/base/net.h"
#include "agent/policy/translator.h"
#include "maps/sluice_maps.h"

namespace sluice::agent {

// The operations the reconciler needs on the three policy maps.
class PolicyMaps {
 public:
  virtual ~PolicyMaps() = default;
  using IpcacheFn = std::function<void(const IpPrefix&, uint32_t identity)>;
  using AllowFn = std::function<void(uint32_t endpoint_id, const PolicyAllow&)>;
  using EndpointFn = std::function<void(uint32_t endpoint_id, const sluice_policy_ep_entry&)>;
  [[nodiscard]] virtual absl::Status ForEachIpcache(const IpcacheFn& fn) = 0;
  [[nodiscard]] virtual absl::Status UpsertIpcache(const IpPrefix& prefix, uint32_t identity) = 0;
  [[nodiscard]] virtual absl::Status DeleteIpcache(const IpPrefix& prefix) = 0;
  [[nodiscard]] virtual absl::Status ForEachAllow(const AllowFn& fn) = 0;
  [[nodiscard]] virtual absl::Status UpsertAllow(uint32_t endpoint_id, const PolicyAllow& a) = 0;
  [[nodiscard]] virtual absl::Status DeleteAllow(uint32_t endpoint_id, const PolicyAllow& a) = 0;
  [[nodiscard]] virtual absl::Status ForEachEndpoint(const EndpointFn& fn) = 0;
  [[nodiscard]] virtual absl::Status UpsertEndpoint(uint32_t endpoint_id,
                                                    const sluice_policy_ep_entry& e) = 0;
  [[nodiscard]] virtual absl::Status DeleteEndpoint(uint32_t endpoint_id) = 0;
  // max_entries of sluice_policy4: how many allows all endpoints together may have.
  virtual uint64_t AllowCapacity() const = 0;
};

// PolicyMaps over the pinned maps.
class BpfPolicyMaps final : public PolicyMaps {
 public:
  BpfPolicyMaps(maps::Ipcache4Map& ipcache, maps::Policy4Map& policy,
                maps::PolicyEndpointMap& endpoints)
      : ipcache_(ipcache), policy_(policy), endpoints_(endpoints) {}
  absl::Status ForEachIpcache(const IpcacheFn& fn) override;
  absl::Status UpsertIpcache(const IpPrefix& prefix, uint32_t identity) override;
  absl::Status DeleteIpcache(const IpPrefix& prefix) override;
  absl::Status ForEachAllow(const AllowFn& fn) override;
  absl::Status UpsertAllow(uint32_t endpoint_id, const PolicyAllow& a) override;
  absl::Status DeleteAllow(uint32_t endpoint_id, const PolicyAllow& a) override;
  absl::Status ForEachEndpoint(const EndpointFn& fn) override;
  absl::Status UpsertEndpoint(uint32_t endpoint_id, const sluice_policy_ep_entry& e) override;
  absl::Status DeleteEndpoint(uint32_t endpoint_id) override;
  uint64_t AllowCapacity() const override;

 private:
  maps::Ipcache4Map& ipcache_;
  maps::Policy4Map& policy_;
  maps::PolicyEndpointMap& endpoints_;
};

// The allow a sluice_policy4 key holds (the inverse of MakePolicy4Key).
PolicyAllow AllowOfKey(const sluice_policy4_key& key, uint32_t* endpoint_id);

// An endpoint whose desired policy is not in the maps: it keeps the one it had.
struct DegradedEndpoint {
  uint32_t endpoint_id = 0;
  std::string pod;                    // "namespace/name"
  std::vector<std::string> policies;  // the policies selecting it ("namespace/name")
  uint64_t wanted = 0;                // allow entries its desired policy has
  uint64_t kept = 0;                  // allow entries it keeps (its last complete policy)
  uint64_t missing = 0;               // entries the desired policy needs beyond those
  uint64_t free = 0;                  // room left in sluice_policy4 when it was tried
  std::string reason;                 // "map_full" or "write_failed"
  std::string error;                  // what the map or the kernel said
  friend bool operator==(const DegradedEndpoint&, const DegradedEndpoint&) = default;
};

struct PolicyApplyStats {
  uint64_t ipcache_writes = 0, ipcache_deletes = 0;
  uint64_t allow_writes = 0, allow_deletes = 0;
  uint64_t endpoint_writes = 0, endpoint_deletes = 0;
  uint64_t map_reads = 0;  // times the three maps were read whole (start, after a failed write of
                           // WriteNewEndpoint or RemoveEndpoint)
  uint64_t rollbacks = 0;  // allows deleted again after a write of their endpoint failed
  uint64_t degraded = 0;   // endpoints found degraded by an Apply (each time)
  uint64_t allow_entries = 0;   // entries of sluice_policy4 (as written by this reconciler)
  uint64_t allow_capacity = 0;  // its max_entries
};

class PolicyReconciler {
 public:
  explicit PolicyReconciler(PolicyMaps& maps) : maps_(maps) {}

  // Which pod ("namespace/name") holds an endpoint id now; nullopt when none does.
  using EndpointOwner = std::function<std::optional<std::string>(uint32_t endpoint_id)>;

  // Makes the maps hold `t`. `owner` is asked (after the maps were read, under the lock that
  // WriteNewEndpoint and RemoveEndpoint take) about every endpoint involved: an endpoint of `t`
  // whose id another pod holds by now (ids are reused) or that has gone is not written; one
  // with an entry but no place in `t` keeps its entries untouched while it exists (the
  // translation predates it) and loses them once it is gone.
  [[nodiscard]] absl::Status Apply(const PolicyTranslation& t, const EndpointOwner& owner)
      ABSL_LOCKS_EXCLUDED(mu_);

  // A new endpoint before its first packet: closed in both directions but to its own node
  // (kubelet probes), until Apply writes its real state. `open` (no policy can select it yet)
  // writes an entry without enforced directions instead.
  [[nodiscard]] absl::Status WriteNewEndpoint(uint32_t endpoint_id, bool open)
      ABSL_LOCKS_EXCLUDED(mu_);
  // An endpoint that is gone: its sluice_policy_ep entry, then its allows.
  [[nodiscard]] absl::Status RemoveEndpoint(uint32_t endpoint_id) ABSL_LOCKS_EXCLUDED(mu_);

  // Never waits for an Apply under way (a /metrics scrape reads it: reading full maps takes ~25 s).
  PolicyApplyStats stats() const ABSL_LOCKS_EXCLUDED(stats_mu_) {
    absl::MutexLock l(&stats_mu_);
    return stats_;
  }
  // The endpoints the last Apply left with their previous policy, by endpoint id. Never waits
  // for an Apply under way.
  std::map<uint32_t, DegradedEndpoint> Degraded() const ABSL_LOCKS_EXCLUDED(stats_mu_) {
    absl::MutexLock l(&stats_mu_);
    return degraded_;
  }

 private:
  void Count(uint64_t PolicyApplyStats::*field) ABSL_LOCKS_EXCLUDED(stats_mu_) {
    absl::MutexLock l(&stats_mu_);
    ++(stats_.*field);
  }

  absl::Status ReadMapsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ApplyLocked(const PolicyTranslation& t, const EndpointOwner& owner)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the allows of `want` that the endpoint lacks, all or none: false (and *why filled)
  // when they do not fit or a write failed, after deleting those it wrote.
  // `*used`: the entries sluice_policy4 holds, kept up to date.
  // *added: the allows it wrote (and kept).
  bool AddAllowsLocked(uint32_t id, const EndpointPolicy& ep, const std::vector<PolicyAllow>& want,
                       uint64_t* used, std::vector<PolicyAllow>* added, DegradedEndpoint* why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Deletes again `added`, allows AddAllowsLocked wrote for `id`.
  absl::Status RollBackLocked(uint32_t id, const std::vector<PolicyAllow>& added, uint64_t* used)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t AllowCountLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The controller's thread applies, CNI requests add and remove endpoints: one at a time.
  mutable absl::Mutex mu_;
  PolicyMaps& maps_;
  mutable absl::Mutex stats_mu_ ABSL_ACQUIRED_AFTER(mu_);
  PolicyApplyStats stats_ ABSL_GUARDED_BY(stats_mu_);
  std::map<uint32_t, DegradedEndpoint> degraded_ ABSL_GUARDED_BY(stats_mu_);
  // What the maps hold, while known_ (see the top of this file).
  bool known_ ABSL_GUARDED_BY(mu_) = false;
  std::map<IpPrefix, uint32_t> ipcache_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, std::set<PolicyAllow>> allows_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, sluice_policy_ep_entry> endpoints_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::agent
