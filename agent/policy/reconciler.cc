#include "agent/policy/reconciler.h"

#include <arpa/inet.h>
#include <bpf/bpf.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace sluice::agent {
namespace {

#define RETURN_IF_ERROR(expr)  \
  do {                         \
    absl::Status _st = (expr); \
    if (!_st.ok()) return _st; \
  } while (0)

sluice_lpm4_key Lpm4Key(const IpPrefix& p) {
  sluice_lpm4_key k{};
  k.prefixlen = static_cast<uint32_t>(p.length());
  k.addr = htonl(p.network().v4_host_order());
  return k;
}

sluice_policy4_key KeyOf(uint32_t endpoint_id, const PolicyAllow& a) {
  return maps::MakePolicy4Key(endpoint_id, a.identity, a.direction, a.proto, a.port,
                              a.proto_port_bits);
}

uint8_t FlagsOf(const EndpointPolicy& ep) {
  return (ep.enforce_ingress ? SLUICE_POLICY_EP_F_INGRESS : 0) |
         (ep.enforce_egress ? SLUICE_POLICY_EP_F_EGRESS : 0);
}

absl::Status Context(absl::Status st, const std::string& what) {
  if (st.ok()) return st;
  return absl::Status(st.code(), absl::StrCat(what, ": ", st.message()));
}

}  // namespace

PolicyAllow AllowOfKey(const sluice_policy4_key& key, uint32_t* endpoint_id) {
  PolicyAllow a;
  *endpoint_id = ntohl(key.endpoint_id);
  a.identity = ntohl(key.identity);
  a.direction = key.direction;
  a.proto = key.proto;
  a.port = ntohs(key.port);
  a.proto_port_bits = static_cast<uint8_t>(key.prefixlen - SLUICE_POLICY4_PREFIX_EXACT);
  return a;
}

absl::Status BpfPolicyMaps::ForEachIpcache(const IpcacheFn& fn) {
  absl::Status bad;
  auto st = ipcache_.ForEach([&](const sluice_lpm4_key& k, const sluice_ipcache4_entry& v) {
    auto p = IpPrefix::Make(IpAddress::V4(ntohl(k.addr)), static_cast<int>(k.prefixlen));
    if (p.ok()) {
      fn(*p, v.identity);
    } else if (bad.ok()) {
      bad = p.status();
    }
  });
  return st.ok() ? bad : st;
}

absl::Status BpfPolicyMaps::UpsertIpcache(const IpPrefix& prefix, uint32_t identity) {
  sluice_ipcache4_entry e{};
  e.identity = identity;
  return ipcache_.Update(Lpm4Key(prefix), e);
}

absl::Status BpfPolicyMaps::DeleteIpcache(const IpPrefix& prefix) {
  auto st = ipcache_.Delete(Lpm4Key(prefix));
  return absl::IsNotFound(st) ? absl::OkStatus() : st;
}

absl::Status BpfPolicyMaps::ForEachAllow(const AllowFn& fn) {
  return policy_.ForEach([&](const sluice_policy4_key& k, const sluice_policy4_entry&) {
    uint32_t ep = 0;
    PolicyAllow a = AllowOfKey(k, &ep);
    fn(ep, a);
  });
}

absl::Status BpfPolicyMaps::UpsertAllow(uint32_t endpoint_id, const PolicyAllow& a) {
  sluice_policy4_entry v{};
  v.verdict = SLUICE_POLICY_ALLOW;
  return policy_.Update(KeyOf(endpoint_id, a), v);
}

absl::Status BpfPolicyMaps::DeleteAllow(uint32_t endpoint_id, const PolicyAllow& a) {
  auto st = policy_.Delete(KeyOf(endpoint_id, a));
  return absl::IsNotFound(st) ? absl::OkStatus() : st;
}

uint64_t BpfPolicyMaps::AllowCapacity() const {
  bpf_map_info info{};
  uint32_t len = sizeof(info);
  if (bpf_obj_get_info_by_fd(policy_.fd(), &info, &len) != 0) return UINT64_MAX;  // unknown
  return info.max_entries;
}

absl::Status BpfPolicyMaps::ForEachEndpoint(const EndpointFn& fn) {
  return endpoints_.ForEach([&](const __u32& id, const sluice_policy_ep_entry& e) { fn(id, e); });
}

absl::Status BpfPolicyMaps::UpsertEndpoint(uint32_t endpoint_id, const sluice_policy_ep_entry& e) {
  return endpoints_.Update(endpoint_id, e);
}

absl::Status BpfPolicyMaps::DeleteEndpoint(uint32_t endpoint_id) {
  auto st = endpoints_.Delete(endpoint_id);
  return absl::IsNotFound(st) ? absl::OkStatus() : st;
}

absl::Status PolicyReconciler::ReadMapsLocked() {
  known_ = false;
  ipcache_.clear();
  allows_.clear();
  endpoints_.clear();
  RETURN_IF_ERROR(
      Context(maps_.ForEachIpcache([&](const IpPrefix& p, uint32_t id) { ipcache_[p] = id; }),
              "read sluice_ipcache4"));
  RETURN_IF_ERROR(
      Context(maps_.ForEachAllow([&](uint32_t ep, const PolicyAllow& a) { allows_[ep].insert(a); }),
              "read sluice_policy4"));
  RETURN_IF_ERROR(Context(maps_.ForEachEndpoint([&](uint32_t ep, const sluice_policy_ep_entry& e) {
    endpoints_[ep] = e;
  }),
                          "read sluice_policy_ep"));
  known_ = true;
  Count(&PolicyApplyStats::map_reads);
  return absl::OkStatus();
}

absl::Status PolicyReconciler::Apply(const PolicyTranslation& full, const EndpointOwner& owner) {
  absl::MutexLock l(&mu_);
  // What the maps hold now: read once, then kept as written (nothing else writes these maps).
  // A failed write keeps the copy right too: each write is recorded as it succeeds, and one the
  // kernel refused (a full map: E2BIG) changed nothing. Reading the maps again after it would
  // make every retry against a full sluice_policy4 walk its million entries (~25 s), not wait
  // the controller's 1 s.
  if (!known_) RETURN_IF_ERROR(ReadMapsLocked());
  return ApplyLocked(full, owner);
}

uint64_t PolicyReconciler::AllowCountLocked() const {
  uint64_t n = 0;
  for (const auto& [id, have] : allows_) n += have.size();
  return n;
}

absl::Status PolicyReconciler::RollBackLocked(uint32_t id, const std::vector<PolicyAllow>& added,
                                              uint64_t* used) {
  absl::Status first;
  std::set<PolicyAllow>& have = allows_[id];
  for (const PolicyAllow& a : added) {
    absl::Status st = maps_.DeleteAllow(id, a);
    if (!st.ok()) {
      // Still in the map as far as anyone knows: the copy keeps it, the next Apply deletes it
      // as stale once the endpoint's policy is whole again.
      if (first.ok()) first = Context(st, absl::StrCat("roll back allow of endpoint ", id));
      continue;
    }
    Count(&PolicyApplyStats::rollbacks);
    have.erase(a);
    --*used;
  }
  if (have.empty()) allows_.erase(id);
  return first;
}

bool PolicyReconciler::AddAllowsLocked(uint32_t id, const EndpointPolicy& ep,
                                       const std::vector<PolicyAllow>& want, uint64_t* used,
                                       std::vector<PolicyAllow>* added, DegradedEndpoint* why) {
  added->clear();
  std::set<PolicyAllow>& have = allows_[id];
  std::vector<PolicyAllow> missing;
  std::set_difference(want.begin(), want.end(), have.begin(), have.end(),
                      std::back_inserter(missing));
  const uint64_t capacity = maps_.AllowCapacity();
  const uint64_t free = capacity > *used ? capacity - *used : 0;
  auto degraded = [&](const char* reason, std::string error) {
    why->endpoint_id = id;
    why->pod = ep.pod;
    why->policies = ep.policies;
    why->wanted = want.size();
    why->missing = missing.size();
    why->free = free;
    why->reason = reason;
    why->error = std::move(error);
    return false;
  };
  if (missing.size() > free) {
    if (have.empty()) allows_.erase(id);
    return degraded("map_full",
                    absl::StrCat(free, " of its ", capacity, " entries free, the policy needs ",
                                 missing.size(), " more beside the ones it replaces"));
  }
  for (const PolicyAllow& a : missing) {
    absl::Status st = maps_.UpsertAllow(id, a);
    if (!st.ok()) {
      std::string error = Context(st, absl::StrCat("allow for endpoint ", id)).ToString();
      absl::Status rb = RollBackLocked(id, *added, used);
      added->clear();
      if (!rb.ok()) {
        absl::StrAppend(&error, "; ", rb.ToString());
      }
      return degraded("write_failed", std::move(error));
    }
    Count(&PolicyApplyStats::allow_writes);
    have.insert(a);
    added->push_back(a);
    ++*used;
  }
  return true;
}

absl::Status PolicyReconciler::ApplyLocked(const PolicyTranslation& full,
                                           const EndpointOwner& owner) {
  std::map<IpPrefix, uint32_t>& ipcache = ipcache_;
  std::map<uint32_t, std::set<PolicyAllow>>& allows = allows_;
  std::map<uint32_t, sluice_policy_ep_entry>& endpoints = endpoints_;

  // Only the endpoints that are still the pods the translation saw, each with its allows sorted
  // and unique (as the translator gives them; sorted here otherwise).
  struct Desired {
    const EndpointPolicy* ep = nullptr;
    bool resorted = false;  // ep->allows was not sorted and unique: `sorted` is
    std::vector<PolicyAllow> sorted;
    const std::vector<PolicyAllow>& allows() const { return resorted ? sorted : ep->allows; }
  };
  std::map<uint32_t, Desired> desired;
  for (const EndpointPolicy& ep : full.endpoints) {
    std::optional<std::string> now = owner(ep.endpoint_id);
    if (!now || *now != ep.pod) continue;
    Desired d;
    d.ep = &ep;
    if (std::adjacent_find(ep.allows.begin(), ep.allows.end(), std::greater_equal<>()) !=
        ep.allows.end()) {
      std::set<PolicyAllow> unique(ep.allows.begin(), ep.allows.end());
      d.sorted.assign(unique.begin(), unique.end());
      d.resorted = true;
    }
    desired[ep.endpoint_id] = std::move(d);
  }

  // Endpoints whose new allows are not (all) in the map: they keep what they have, entry and
  // allows, and are tried again after step 4 freed the stale allows of the others.
  std::map<uint32_t, DegradedEndpoint> degraded;
  uint64_t used = AllowCountLocked();  // entries of sluice_policy4
  absl::Status write_error;            // a refused write (not a full map): the controller retries
  auto write_entry = [&](uint32_t id, const Desired& d) -> absl::Status {
    sluice_policy_ep_entry want{};
    want.identity = d.ep->identity;
    want.flags = FlagsOf(*d.ep);
    auto it = endpoints.find(id);
    if (it != endpoints.end() && it->second.identity == want.identity &&
        it->second.flags == want.flags) {
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(
        Context(maps_.UpsertEndpoint(id, want), absl::StrCat("policy entry of endpoint ", id)));
    Count(&PolicyApplyStats::endpoint_writes);
    endpoints[id] = want;
    return absl::OkStatus();
  };
  // The endpoint's allows beyond `want` (its stale ones).
  auto delete_stale = [&](uint32_t id, const std::vector<PolicyAllow>& want) -> absl::Status {
    auto it = allows.find(id);
    if (it == allows.end()) return absl::OkStatus();
    std::set<PolicyAllow>& have = it->second;
    std::vector<PolicyAllow> stale;
    std::set_difference(have.begin(), have.end(), want.begin(), want.end(),
                        std::back_inserter(stale));
    for (const PolicyAllow& a : stale) {
      RETURN_IF_ERROR(
          Context(maps_.DeleteAllow(id, a), absl::StrCat("stale allow of endpoint ", id)));
      Count(&PolicyApplyStats::allow_deletes);
      have.erase(a);
      --used;
    }
    if (have.empty()) allows.erase(it);
    return absl::OkStatus();
  };
  // The entry of an endpoint whose new allows are in: if it is refused, the allows it added go
  // again (the endpoint keeps its old entry and allows), and it is degraded.
  auto write_entry_or_roll_back = [&](uint32_t id, const Desired& d,
                                      const std::vector<PolicyAllow>& added) {
    absl::Status st = write_entry(id, d);
    if (st.ok()) return true;
    std::string error = st.ToString();
    if (absl::Status rb = RollBackLocked(id, added, &used); !rb.ok()) {
      absl::StrAppend(&error, "; ", rb.ToString());
    }
    DegradedEndpoint& why = degraded[id];
    why.endpoint_id = id;
    why.pod = d.ep->pod;
    why.policies = d.ep->policies;
    why.wanted = d.allows().size();
    why.reason = "write_failed";
    why.error = std::move(error);
    if (write_error.ok()) write_error = st;
    return false;
  };

  // 1. New allows, all of an endpoint's or none.
  std::map<uint32_t, std::vector<PolicyAllow>> added;  // by endpoint: the allows step 1 wrote
  for (const auto& [id, d] : desired) {
    DegradedEndpoint why;
    if (!AddAllowsLocked(id, *d.ep, d.allows(), &used, &added[id], &why)) {
      if (why.reason == "write_failed" && write_error.ok()) {
        write_error = absl::InternalError(why.error);
      }
      degraded[id] = std::move(why);
    }
  }
  // 2. New and changed ipcache entries (both sides sorted by prefix: one walk).
  std::vector<IpcacheEntry> wanted_ipcache;
  const std::vector<IpcacheEntry>* ipcache_in = &full.ipcache;
  if (!std::is_sorted(full.ipcache.begin(), full.ipcache.end())) {
    wanted_ipcache = full.ipcache;
    std::sort(wanted_ipcache.begin(), wanted_ipcache.end());
    ipcache_in = &wanted_ipcache;
  }
  {
    auto it = ipcache.begin();
    for (const IpcacheEntry& e : *ipcache_in) {
      while (it != ipcache.end() && it->first < e.prefix) ++it;
      if (it != ipcache.end() && it->first == e.prefix && it->second == e.identity) continue;
      RETURN_IF_ERROR(Context(maps_.UpsertIpcache(e.prefix, e.identity),
                              absl::StrCat("ipcache entry ", e.prefix.ToString())));
      Count(&PolicyApplyStats::ipcache_writes);
      if (it != ipcache.end() && it->first == e.prefix) {
        it->second = e.identity;
      } else {
        it = ipcache.emplace_hint(it, e.prefix, e.identity);
      }
    }
  }
  // 3. Endpoint entries (enforce bits), of the endpoints whose allows are all in.
  for (const auto& [id, d] : desired) {
    if (degraded.contains(id)) continue;
    write_entry_or_roll_back(id, d, added[id]);
  }
  // Endpoints with an entry the translation does not know: still there (newer than the
  // translation's view) or gone (their DEL was missed, e.g. while the agent was down).
  std::set<uint32_t> gone;
  for (const auto& [id, e] : endpoints) {
    if (!desired.contains(id) && !owner(id).has_value()) gone.insert(id);
  }
  for (uint32_t id : gone) {
    RETURN_IF_ERROR(
        Context(maps_.DeleteEndpoint(id), absl::StrCat("policy entry of gone endpoint ", id)));
    Count(&PolicyApplyStats::endpoint_deletes);
    endpoints.erase(id);
  }
  // 4. Allows no longer wanted: of desired endpoints, of gone ones, and of endpoints without
  // any entry (left over). An endpoint that exists but is not in the translation keeps its own,
  // and so does a degraded one (its last complete policy).
  static const std::vector<PolicyAllow> kNone;
  std::vector<uint32_t> with_allows;
  for (const auto& [id, have] : allows) with_allows.push_back(id);
  for (uint32_t id : with_allows) {
    auto dit = desired.find(id);
    bool managed = dit != desired.end();
    bool kept = !managed && endpoints.contains(id);
    if (kept || degraded.contains(id)) continue;
    RETURN_IF_ERROR(delete_stale(id, managed ? dit->second.allows() : kNone));
  }
  // The endpoints that did not fit, once more with the room step 4 made: each whole, in the
  // order of one endpoint's (the ipcache is already as wanted).
  for (auto it = degraded.begin(); it != degraded.end();) {
    const uint32_t id = it->first;
    const Desired& d = desired.at(id);
    if (it->second.reason != "map_full") {
      ++it;
      continue;
    }
    DegradedEndpoint why;
    if (!AddAllowsLocked(id, *d.ep, d.allows(), &used, &added[id], &why)) {
      if (why.reason == "write_failed" && write_error.ok()) {
        write_error = absl::InternalError(why.error);
      }
      it->second = std::move(why);
      ++it;
      continue;
    }
    it = degraded.erase(it);
    if (!write_entry_or_roll_back(id, d, added[id])) continue;
    RETURN_IF_ERROR(delete_stale(id, d.allows()));
  }
  std::erase_if(allows, [](const auto& kv) { return kv.second.empty(); });
  for (auto& [id, why] : degraded) {
    auto it = allows.find(id);
    why.kept = it == allows.end() ? 0 : it->second.size();
  }
  // 5. Stale ipcache prefixes (one walk again).
  std::vector<IpPrefix> stale_prefixes;
  {
    auto w = ipcache_in->begin();
    for (const auto& [prefix, id] : ipcache) {
      while (w != ipcache_in->end() && w->prefix < prefix) ++w;
      if (w == ipcache_in->end() || w->prefix != prefix) stale_prefixes.push_back(prefix);
    }
  }
  for (const IpPrefix& prefix : stale_prefixes) {
    RETURN_IF_ERROR(Context(maps_.DeleteIpcache(prefix),
                            absl::StrCat("stale ipcache entry ", prefix.ToString())));
    Count(&PolicyApplyStats::ipcache_deletes);
    ipcache.erase(prefix);
  }
  {
    absl::MutexLock l(&stats_mu_);
    stats_.degraded += degraded.size();
    stats_.allow_entries = used;
    stats_.allow_capacity = maps_.AllowCapacity();
    degraded_ = std::move(degraded);
  }
  return write_error;
}

absl::Status PolicyReconciler::WriteNewEndpoint(uint32_t endpoint_id, bool open) {
  absl::MutexLock l(&mu_);
  const bool known = known_;
  known_ = false;  // until every write below succeeded
  sluice_policy_ep_entry e{};
  e.identity = SLUICE_IDENTITY_UNMANAGED;
  PolicyAllow host;
  if (!open) {
    // The node (kubelet probes) is always let in; the allow goes before the bits.
    host.identity = SLUICE_IDENTITY_HOST;
    host.direction = SLUICE_POLICY_INGRESS;
    RETURN_IF_ERROR(maps_.UpsertAllow(endpoint_id, host));
    Count(&PolicyApplyStats::allow_writes);
    e.flags = SLUICE_POLICY_EP_F_INGRESS | SLUICE_POLICY_EP_F_EGRESS;
  }
  RETURN_IF_ERROR(maps_.UpsertEndpoint(endpoint_id, e));
  Count(&PolicyApplyStats::endpoint_writes);
  if (known) {
    if (!open) allows_[endpoint_id].insert(host);
    endpoints_[endpoint_id] = e;
    known_ = true;
  }
  return absl::OkStatus();
}

absl::Status PolicyReconciler::RemoveEndpoint(uint32_t endpoint_id) {
  absl::MutexLock l(&mu_);
  const bool known = known_;
  known_ = false;  // until every write below succeeded
  RETURN_IF_ERROR(maps_.DeleteEndpoint(endpoint_id));
  Count(&PolicyApplyStats::endpoint_deletes);
  std::vector<PolicyAllow> mine;
  if (known) {
    auto it = allows_.find(endpoint_id);
    if (it != allows_.end()) mine.assign(it->second.begin(), it->second.end());
  } else {
    RETURN_IF_ERROR(maps_.ForEachAllow([&](uint32_t ep, const PolicyAllow& a) {
      if (ep == endpoint_id) mine.push_back(a);
    }));
  }
  for (const PolicyAllow& a : mine) {
    RETURN_IF_ERROR(maps_.DeleteAllow(endpoint_id, a));
    Count(&PolicyApplyStats::allow_deletes);
  }
  if (known) {
    endpoints_.erase(endpoint_id);
    allows_.erase(endpoint_id);
    known_ = true;
  }
  absl::MutexLock sl(&stats_mu_);
  degraded_.erase(endpoint_id);
  return absl::OkStatus();
}

}  // namespace sluice::agent
