#include "agent/conntrack/gc.h"

#include <bpf/bpf.h>
#include <netinet/in.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "agent/base/errno.h"
#include "spdlog/spdlog.h"

namespace sluice::conntrack {
namespace {

constexpr uint32_t kBatch = 4096;

struct Entry {
  sluice_ct4_key key;
  sluice_ct4_entry value;
};

// Every entry of the map, read with BPF_MAP_LOOKUP_BATCH (a few syscalls for the whole map).
// Entries the datapath adds or deletes meanwhile may be missed or seen: the next pass sees them.
absl::Status ReadAll(const maps::Ct4Map& map, std::vector<Entry>& out) {
  return map.ForEachBatch(
      [&](const sluice_ct4_key& k, const sluice_ct4_entry& v) {
        out.push_back({k, v});
      },
      kBatch);
}

// What deleting one entry the walk doomed came to.
enum class Doom { kDeleted, kGone, kSpared };

// Deletes `key` unless the datapath wrote its entry after the walk read it (`seen`): a packet
// moved its time or state (a closed tuple reopened by a new SYN, an idle flow that woke up).
// The entry is looked up again right before the delete: a delete of what the walk read would
// remove a flow the datapath has just taken up again, where the window left is that between
// this lookup and the delete (microseconds, not the whole pass).
template <typename MapT, typename Key, typename Value>
absl::StatusOr<Doom> DeleteIfUnchanged(MapT& map, const Key& key, const Value& seen) {
  auto now = map.Lookup(key);
  if (!now.ok()) {
    if (absl::IsNotFound(now.status())) return Doom::kGone;
    return now.status();
  }
  if (now->last_seen_ns != seen.last_seen_ns || now->flags != seen.flags) return Doom::kSpared;
  if (auto st = map.Delete(key); !st.ok()) return st;
  return Doom::kDeleted;
}

// A load-balanced flow's two entries (forward: client -> frontend, reply: backend -> client)
// expire together: a one-way flow refreshes only one of them, and the other must live as long.
// (A flow entry, SLUICE_CT_DIR_FLOW, holds both directions: its flow has no other entry.)
// Both carry the rev_nat id; the backend is in the forward entry's value and is the reply key's
// source; the client's address and port are the forward key's source and the reply key's
// destination (a hairpinned flow's reply goes to the gateway, and its
// client is the backend itself).
using FlowKey = std::tuple<uint8_t, uint32_t, uint32_t, uint16_t, uint32_t, uint16_t>;
bool FlowOf(const Entry& e, FlowKey* out) {
  const auto& k = e.key;
  const auto& v = e.value;
  if (k.dir == SLUICE_CT_DIR_FORWARD || k.dir == SLUICE_CT_DIR_FLOW) {  // a flow entry is alone
    *out = {k.proto, v.rev_nat_id, v.backend_addr, v.backend_port, k.saddr, k.sport};
    return true;
  }
  if (k.dir == SLUICE_CT_DIR_REPLY) {
    // The backend is the reply's source (a reply entry's backend_addr names its frontend, or,
    // written by older programs, the backend again).
    uint32_t client = (v.flags & SLUICE_CT_F_HAIRPIN) ? k.saddr : k.daddr;
    *out = {k.proto, v.rev_nat_id, k.saddr, k.sport, client, k.dport};
    return true;
  }
  return false;  // policy entries stand alone
}

template <typename MapT>
uint64_t CapacityOf(const MapT& map) {
  bpf_map_info info{};
  uint32_t len = sizeof(info);
  if (bpf_obj_get_info_by_fd(map.fd(), &info, &len) != 0) return 0;
  return info.max_entries;
}

uint64_t SumStat(maps::CtStatsMap& stats, uint32_t slot) {
  uint64_t n = 0;
  if (auto v = stats.Lookup(slot); v.ok())
    for (uint64_t c : *v) n += c;
  return n;
}

// A masquerade mapping's entries: the leaving one (sluice_snat4, keyed by the pod's tuple) and
// the reply's (sluice_rnat4, keyed by the tuple the remote answers to). NatKey packs a key for
// hashing.
using NatKey = std::tuple<uint32_t, uint32_t, uint16_t, uint16_t, uint8_t>;
NatKey PackNat(const sluice_nat4_key& k) { return {k.saddr, k.daddr, k.sport, k.dport, k.proto}; }

// The conntrack state a mapping's flags stand for: a TCP mapping written by programs that kept
// no state (SLUICE_NAT_F_STATEFUL unset) is taken as established, so an upgrade never cuts a
// live idle connection's mapping short.
uint8_t NatCtFlags(uint8_t proto, uint8_t flags) {
  if (proto == IPPROTO_TCP && !(flags & SLUICE_NAT_F_STATEFUL)) return SLUICE_CT_F_ESTABLISHED;
  return flags & (SLUICE_CT_F_ESTABLISHED | SLUICE_CT_F_CLOSING);
}

}  // namespace

uint64_t MonotonicNowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

absl::Duration TimeoutOf(uint8_t proto, uint8_t flags, const Timeouts& t) {
  if (proto == IPPROTO_TCP) {
    if (flags & SLUICE_CT_F_CLOSING) return t.tcp_closing;
    return (flags & SLUICE_CT_F_ESTABLISHED) ? t.tcp_established : t.tcp_syn;
  }
  if (proto == IPPROTO_UDP) return t.udp;
  return t.other;
}

ConntrackGc::ConntrackGc(maps::Ct4Map& tcp, maps::Ct4Map& any, maps::CtStatsMap* stats,
                         GcOptions opts, NowNs now)
    : tcp_(tcp), any_(any), stats_(stats), opts_(opts), now_(std::move(now)) {}

ConntrackGc::~ConntrackGc() { Stop(); }

absl::Status ConntrackGc::Collect(maps::Ct4Map& map, bool tcp_map, uint64_t now,
                                  MapTotals& totals) {
  std::vector<Entry> entries;
  entries.reserve(static_cast<size_t>(CapacityOf(map)) / 4);
  if (auto st = ReadAll(map, entries); !st.ok()) return st;

  // Per flow: the latest time either direction was seen and the most advanced state.
  struct Flow {
    uint64_t last_seen = 0;
    uint8_t flags = 0;
  };
  absl::flat_hash_map<FlowKey, Flow> flows;
  flows.reserve(entries.size() / 2 + 1);
  FlowKey fk;
  for (const Entry& e : entries) {
    if (!FlowOf(e, &fk)) continue;
    Flow& f = flows[fk];
    f.last_seen = std::max<uint64_t>(f.last_seen, e.value.last_seen_ns);
    f.flags |= e.value.flags;
  }
  auto state_of = [&](const Entry& e) -> Flow {
    if (FlowOf(e, &fk)) return flows.at(fk);
    return {e.value.last_seen_ns, e.value.flags};
  };

  if (on_walked_) on_walked_();
  std::vector<size_t> doomed;  // indices in entries: expired, then deleted for room
  std::vector<std::pair<uint64_t, size_t>> spare;  // (last seen, index): deletable for room
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    const Flow f = state_of(e);
    const uint64_t timeout =
        static_cast<uint64_t>(absl::ToInt64Nanoseconds(TimeoutOf(e.key.proto, f.flags,
                                                                 opts_.timeouts)));
    // The coarse clock may run a tick ahead of this one: such an entry is fresh.
    if (now > f.last_seen && now - f.last_seen > timeout) {
      doomed.push_back(i);
      continue;
    }
    // Counted even when the headroom pass below deletes it: the count only errs high.
    if (e.key.dir == SLUICE_CT_DIR_FORWARD || e.key.dir == SLUICE_CT_DIR_REPLY) ++pairs_left_;
    if (tcp_map && (!(f.flags & SLUICE_CT_F_ESTABLISHED) || (f.flags & SLUICE_CT_F_CLOSING))) {
      spare.emplace_back(f.last_seen, i);
    }
  }
  const uint64_t expired = doomed.size();
  uint64_t pressure = 0;
  const uint64_t capacity = CapacityOf(map);
  const uint64_t left = entries.size() - expired;
  if (tcp_map && capacity > 0 && left > opts_.tcp_high_water * capacity) {
    const uint64_t target = static_cast<uint64_t>(opts_.tcp_low_water * capacity);
    // Least recently seen first; a flow's two entries share their time, so they go together.
    std::sort(spare.begin(), spare.end());
    for (const auto& [seen, i] : spare) {
      if (left - pressure <= target) break;
      doomed.push_back(i);
      ++pressure;
    }
  }
  uint64_t deleted[2] = {0, 0}, spared = 0;  // deleted: expired, for room
  for (size_t d = 0; d < doomed.size(); ++d) {
    const Entry& e = entries[doomed[d]];
    auto done = DeleteIfUnchanged(map, e.key, e.value);
    if (!done.ok()) return done.status();
    if (*done == Doom::kDeleted) ++deleted[d < expired ? 0 : 1];
    if (*done == Doom::kSpared) ++spared;
  }
  absl::MutexLock lock(&mu_);
  totals.scanned += entries.size();
  totals.expired += deleted[0];
  totals.pressure += deleted[1];
  totals.spared += spared;
  totals.live = entries.size() - std::min<uint64_t>(deleted[0] + deleted[1], entries.size());
  return absl::OkStatus();
}

absl::Status ConntrackGc::CollectNatMappings(uint64_t now, uint64_t* found) {
  struct NatEntry {
    sluice_nat4_key key;
    sluice_nat4_entry value;
  };
  std::vector<NatEntry> leaving, replies;
  auto read = [](const maps::NatMap& map, std::vector<NatEntry>& out) {
    return map.ForEachBatch(
        [&](const sluice_nat4_key& k, const sluice_nat4_entry& v) { out.push_back({k, v}); },
        kBatch);
  };
  // The leaving entries first: a mapping the datapath writes meanwhile (reply entry first) has
  // its reply entry found, or neither.
  if (auto st = read(*snat_, leaving); !st.ok()) return st;
  if (auto st = read(*rnat_, replies); !st.ok()) return st;
  *found = leaving.size();

  absl::flat_hash_map<NatKey, size_t> reply_at;
  reply_at.reserve(replies.size());
  for (size_t i = 0; i < replies.size(); ++i) reply_at[PackNat(replies[i].key)] = i;
  std::vector<bool> paired(replies.size(), false);

  auto expired = [&](uint8_t proto, uint8_t flags, uint64_t last_seen) {
    const uint64_t timeout = static_cast<uint64_t>(
        absl::ToInt64Nanoseconds(TimeoutOf(proto, NatCtFlags(proto, flags), opts_.timeouts)));
    return now > last_seen && now - last_seen > timeout;
  };
  // A destination's node ports: (remote address, remote port, protocol, node address).
  using Destination = std::tuple<uint32_t, uint16_t, uint8_t, uint32_t>;
  struct Closed {
    uint64_t last_seen;
    size_t leaving;  // index in leaving
    std::optional<size_t> reply;
  };
  absl::flat_hash_map<Destination, uint64_t> ports_held;
  absl::flat_hash_map<Destination, std::vector<Closed>> closed;
  // A doomed mapping: its leaving entry and, where found, its reply entry (indices).
  struct Doomed {
    size_t leaving;
    std::optional<size_t> reply;
  };
  std::vector<Doomed> doomed;  // expired ones first, then those freed for ports
  std::vector<size_t> doomed_orphans;  // reply entries without their leaving half, expired

  for (size_t i = 0; i < leaving.size(); ++i) {
    const NatEntry& e = leaving[i];
    sluice_nat4_key rkey;
    sluice_nat4_reply_key(&rkey, &e.key, e.value.addr, e.value.port);
    std::optional<size_t> r;
    if (auto it = reply_at.find(PackNat(rkey)); it != reply_at.end()) {
      r = it->second;
      paired[it->second] = true;
    }
    uint8_t flags = e.value.flags;
    uint64_t last_seen = e.value.last_seen_ns;
    if (r) {
      flags |= replies[*r].value.flags;
      last_seen = std::max<uint64_t>(last_seen, replies[*r].value.last_seen_ns);
    }
    if (expired(e.key.proto, flags, last_seen)) {
      doomed.push_back({i, r});
      continue;
    }
    if (!r) continue;  // holds no node port
    const Destination d{rkey.saddr, rkey.sport, rkey.proto, rkey.daddr};
    ++ports_held[d];
    if (e.key.proto == IPPROTO_TCP && (NatCtFlags(e.key.proto, flags) & SLUICE_CT_F_CLOSING)) {
      closed[d].push_back({last_seen, i, r});
    }
  }
  // Reply entries without their leaving half (the LRU evicted it, or the datapath is between
  // its two writes): they hold a port, and go by their own state.
  for (size_t i = 0; i < replies.size(); ++i) {
    if (paired[i]) continue;
    const NatEntry& e = replies[i];
    if (expired(e.key.proto, e.value.flags, e.value.last_seen_ns)) {
      doomed_orphans.push_back(i);
      continue;
    }
    ++ports_held[{e.key.saddr, e.key.sport, e.key.proto, e.key.daddr}];
  }
  if (on_walked_) on_walked_();
  const size_t expired_mappings = doomed.size();
  if (opts_.nat_ports > 0) {
    const uint64_t high = static_cast<uint64_t>(opts_.nat_high_water * opts_.nat_ports);
    const uint64_t low = static_cast<uint64_t>(opts_.nat_low_water * opts_.nat_ports);
    for (auto& [d, list] : closed) {
      uint64_t held = ports_held[d];
      if (held <= high) continue;
      std::sort(list.begin(), list.end(),
                [](const Closed& a, const Closed& b) { return a.last_seen < b.last_seen; });
      for (const Closed& c : list) {
        if (held <= low) break;
        doomed.push_back({c.leaving, c.reply});
        --held;
      }
    }
  }
  // A mapping goes only if neither entry was written since the walk read it (a new SYN reopening
  // it, a late packet). The leaving entry first: a packet between the two deletions allocates a
  // new mapping rather than leave with a port whose replies would no longer be translated.
  uint64_t deleted[2] = {0, 0}, spared = 0;  // mappings deleted: expired, for ports
  for (size_t d = 0; d < doomed.size(); ++d) {
    const NatEntry& out = leaving[doomed[d].leaving];
    if (doomed[d].reply) {
      const NatEntry& back = replies[*doomed[d].reply];
      auto now = rnat_->Lookup(back.key);
      if (now.ok() && (now->last_seen_ns != back.value.last_seen_ns ||
                       now->flags != back.value.flags)) {
        ++spared;
        continue;
      }
    }
    auto done = DeleteIfUnchanged(*snat_, out.key, out.value);
    if (!done.ok()) return done.status();
    if (*done == Doom::kSpared) {
      ++spared;
      continue;
    }
    if (doomed[d].reply) {
      if (auto st = rnat_->Delete(replies[*doomed[d].reply].key); !st.ok()) return st;
    }
    if (*done == Doom::kDeleted) ++deleted[d < expired_mappings ? 0 : 1];
  }
  for (size_t i : doomed_orphans) {
    auto done = DeleteIfUnchanged(*rnat_, replies[i].key, replies[i].value);
    if (!done.ok()) return done.status();
    if (*done == Doom::kSpared) ++spared;
  }
  absl::MutexLock lock(&mu_);
  totals_.nat.scanned += leaving.size();
  totals_.nat.expired += deleted[0];
  totals_.nat.pressure += deleted[1];
  totals_.nat.spared += spared;
  totals_.nat.live = leaving.size() - std::min<uint64_t>(deleted[0] + deleted[1], leaving.size());
  return absl::OkStatus();
}

absl::Status ConntrackGc::RunOnce() {
  absl::MutexLock run(&run_mu_);
  const uint64_t now = now_();
  // The creation counter is read before the walk: what is created during the walk counts next
  // time, and the estimate never goes below zero.
  const uint64_t any_created =
      stats_ != nullptr ? SumStat(*stats_, SLUICE_CT_STAT_ANY_CREATED) : 0;
  // Entries the datapath itself deleted (a direct flow crossing a stale translated one) did not
  // leave by eviction.
  const uint64_t any_crossed = stats_ != nullptr ? SumStat(*stats_, SLUICE_CT_STAT_ANY_CROSSED) : 0;
  // Read before the walk, as the datapath counts a two-entry flow after writing it: a flow this
  // walk may have missed moves the count past what is written back (maps/conntrack.h).
  std::optional<uint64_t> pairs_created;
  if (pairs_ != nullptr) {
    if (auto v = pairs_->Lookup(SLUICE_CT_PAIRS_CREATED); v.ok()) pairs_created = *v;
  }
  pairs_left_ = 0;
  absl::Status st = Collect(tcp_, /*tcp_map=*/true, now, totals_.tcp);
  uint64_t any_scanned_before;
  {
    absl::MutexLock lock(&mu_);
    any_scanned_before = totals_.any.scanned;
  }
  absl::Status any_st = Collect(any_, /*tcp_map=*/false, now, totals_.any);
  uint64_t nat_evicted = 0;
  if (snat_ != nullptr && rnat_ != nullptr) {
    // Read before the walk, as above: a mapping made meanwhile counts next time.
    const uint64_t nat_created =
        stats_ != nullptr ? SumStat(*stats_, SLUICE_CT_STAT_NAT_CREATED) : 0;
    uint64_t found = 0;
    if (auto nat_st = CollectNatMappings(now, &found); nat_st.ok()) {
      const uint64_t made = nat_left_ + (nat_created - nat_created_);
      if (stats_ != nullptr && have_nat_baseline_ && made > found) nat_evicted = made - found;
      have_nat_baseline_ = true;
      nat_created_ = nat_created;
      absl::MutexLock lock(&mu_);
      nat_left_ = totals_.nat.live;
    } else {
      any_st.Update(nat_st);
    }
  }
  absl::MutexLock lock(&mu_);
  if (any_st.ok() && stats_ != nullptr) {
    const uint64_t found = totals_.any.scanned - any_scanned_before;
    if (have_baseline_) {
      const uint64_t gone = any_crossed - any_crossed_;
      const uint64_t made = any_left_ + (any_created - any_created_);
      const uint64_t expected = made > gone ? made - gone : 0;
      if (expected > found) totals_.any.lru_evictions += expected - found;
    }
    have_baseline_ = true;
    any_created_ = any_created;
    any_crossed_ = any_crossed;
    any_left_ = totals_.any.live;
  }
  if (nat_evicted > 0) totals_.nat.lru_evictions += nat_evicted;
  if (st.ok() && any_st.ok() && pairs_created && pairs_left_ == 0) {
    st.Update(pairs_->Update(SLUICE_CT_PAIRS_CLEAR, *pairs_created + 1));
  }
  ++totals_.runs;
  st.Update(any_st);
  if (!st.ok()) ++totals_.errors;
  return st;
}

absl::Status ConntrackGc::PairsWritten() {
  absl::MutexLock run(&run_mu_);
  if (pairs_ == nullptr) return absl::OkStatus();
  return pairs_->Update(SLUICE_CT_PAIRS_CLEAR, 0);  // never CREATED + 1: the lookups are on
}

void ConntrackGc::Start(const Clock* clock) {
  thread_ = std::thread([this, clock] {
    while (clock->SleepFor(opts_.interval, stop_)) {
      if (auto st = RunOnce(); !st.ok()) spdlog::warn("conntrack GC: {}", st.ToString());
    }
  });
}

void ConntrackGc::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

GcTotals ConntrackGc::totals() const {
  absl::MutexLock lock(&mu_);
  return totals_;
}

int AddConntrackGcCollector(metrics::Registry& registry, const ConntrackGc* gc) {
  return registry.AddCollector([gc](metrics::ScrapeSink& out) {
    const GcTotals t = gc->totals();
    out.Counter("sluice_ct_gc_runs_total", "Conntrack GC passes over sluice_ct4 and sluice_ct4_any",
                {}, static_cast<double>(t.runs));
    out.Counter("sluice_ct_gc_errors_total", "Conntrack GC passes that failed (logged)", {},
                static_cast<double>(t.errors));
    for (const auto& [name, m] : {std::pair<const char*, const MapTotals&>{
                                      maps::name::sluice_ct4, t.tcp},
                                  {maps::name::sluice_ct4_any, t.any}}) {
      out.Counter("sluice_ct_gc_scanned_total", "Conntrack entries the GC looked at, per map",
                  {{"map_name", name}}, static_cast<double>(m.scanned));
      out.Counter("sluice_ct_gc_deleted_total",
                  "Conntrack entries the GC deleted, per map and reason (expired: idle past "
                  "their timeout; pressure: unanswered or closing TCP entries deleted early to "
                  "keep headroom in sluice_ct4)",
                  {{"map_name", name}, {"reason", "expired"}}, static_cast<double>(m.expired));
      out.Counter("sluice_ct_gc_deleted_total", "", {{"map_name", name}, {"reason", "pressure"}},
                  static_cast<double>(m.pressure));
      out.Counter("sluice_ct_gc_spared_total",
                  "Conntrack entries the GC had doomed but kept, per map: the datapath wrote them "
                  "after its walk read them (a closed tuple reopened, an idle flow woke up)",
                  {{"map_name", name}}, static_cast<double>(m.spared));
    }
    out.Counter("sluice_ct_lru_evictions_total",
                "Conntrack entries that left the LRU map sluice_ct4_any other than through the GC "
                "(estimated per GC pass from the datapath's creation counter: LRU evictions, and "
                "the agent's or sluicectl's flushes)",
                {{"map_name", maps::name::sluice_ct4_any}},
                static_cast<double>(t.any.lru_evictions));
    out.Counter("sluice_nat_lru_evictions_total",
                "Masquerade mappings the LRU map sluice_snat4 evicted for new ones (estimated per "
                "GC pass from the datapath's creation counter)",
                {{"map_name", maps::name::sluice_snat4}}, static_cast<double>(t.nat.lru_evictions));
    out.Counter("sluice_nat_gc_deleted_total",
                "Masquerade mappings the GC deleted, both directions, per reason (expired: their "
                "flow idle past its conntrack timeout; pressure: closed TCP mappings freed early "
                "for a destination short of node ports)",
                {{"reason", "expired"}}, static_cast<double>(t.nat.expired));
    out.Counter("sluice_nat_gc_deleted_total", "", {{"reason", "pressure"}},
                static_cast<double>(t.nat.pressure));
    out.Counter("sluice_nat_gc_spared_total",
                "Masquerade mappings the GC had doomed but kept: the datapath wrote one of their "
                "entries after its walk read them (a new SYN reopening a closed mapping, a late "
                "packet)",
                {}, static_cast<double>(t.nat.spared));
  });
}

}  // namespace sluice::conntrack
