// Conntrack garbage collection: walks sluice_ct4 (TCP) and sluice_ct4_any (the rest) with batch
// lookups, deletes the entries whose state's timeout has passed since they were last seen, keeps
// headroom in the TCP map (which never evicts) by deleting its unanswered and closing entries
// first, and estimates the LRU evictions of sluice_ct4_any from the datapath's counters. The
// masquerade mappings (sluice_snat4 + sluice_rnat4) go the same way: a mapping whose flow's
// timeout has passed is deleted, both directions together, and a destination whose node ports
// run short gets its closed TCP mappings' ports back early, least recently seen first.
// The datapath records state and last-seen time only; the timeouts live here, in one table for
// every kind of entry, so they are configurable without reloading programs (maps/conntrack.h,
// maps/nat.h, docs/operating.md).
#pragma once

#include <cstdint>
#include <functional>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "agent/base/clock.h"
#include "agent/metrics/registry.h"
#include "maps/sluice_maps.h"

namespace sluice::conntrack {

// Idle time after which an entry is deleted, per protocol and state (enum sluice_ct_flags).
struct Timeouts {
  absl::Duration tcp_syn = absl::Seconds(60);        // no reply seen yet
  absl::Duration tcp_established = absl::Hours(6);   // answered, no FIN/RST
  absl::Duration tcp_closing = absl::Seconds(30);    // FIN or RST seen
  absl::Duration udp = absl::Seconds(60);
  absl::Duration other = absl::Seconds(60);          // any other protocol (ICMP, SCTP)
};

// The timeout of an entry of `proto` carrying `flags`.
absl::Duration TimeoutOf(uint8_t proto, uint8_t flags, const Timeouts& t);

struct GcOptions {
  Timeouts timeouts;
  absl::Duration interval = absl::Seconds(10);
  // sluice_ct4 never evicts, so a flood of new TCP flows fills it and further inserts fail. When
  // a pass leaves it fuller than high_water (of its capacity), entries that are not established
  // (SYN only, closing) are deleted, least recently seen first, down to low_water. Established
  // connections are never deleted for room.
  double tcp_high_water = 0.9;
  double tcp_low_water = 0.8;
  // Node ports a masquerade destination (remote address, port and protocol) can be given
  // (--nat_port_range). When one destination's mappings hold more than nat_high_water of them,
  // its closed TCP mappings (FIN or RST seen) are deleted, least recently seen first, down to
  // nat_low_water, before their closing timeout. 0: no such pass.
  uint32_t nat_ports = 0;
  double nat_high_water = 0.9;
  double nat_low_water = 0.8;
};

// What the GC did to one map, summed over passes.
struct MapTotals {
  uint64_t scanned = 0;
  uint64_t expired = 0;        // deleted: idle past their timeout
  uint64_t pressure = 0;       // deleted early for headroom (sluice_ct4), or ports (NAT)
  uint64_t lru_evictions = 0;  // estimated (the LRU maps sluice_ct4_any and sluice_snat4)
  uint64_t spared = 0;         // doomed, but written by the datapath after the walk: kept
  uint64_t live = 0;           // entries left after the last pass
};

struct GcTotals {
  uint64_t runs = 0;
  uint64_t errors = 0;
  MapTotals tcp;  // sluice_ct4
  MapTotals any;  // sluice_ct4_any
  MapTotals nat;  // masquerade mappings, counted in sluice_snat4 entries (see CollectNat)
};

// CLOCK_MONOTONIC in ns: the clock of the datapath's timestamps (bpf_ktime_get[_coarse]_ns).
uint64_t MonotonicNowNs();

class ConntrackGc {
 public:
  using NowNs = std::function<uint64_t()>;

  // `stats` (sluice_ct_stats) feeds the LRU eviction estimate: entries the datapath created
  // since the last pass, minus those the walk finds and those the GC deleted, left the map
  // another way, i.e. by LRU eviction (or a flush by the agent or sluicectl, rare). Null: no
  // estimate. `now` is injected so tests move time without sleeping.
  ConntrackGc(maps::Ct4Map& tcp, maps::Ct4Map& any, maps::CtStatsMap* stats, GcOptions opts,
              NowNs now = MonotonicNowNs);
  ~ConntrackGc();
  ConntrackGc(const ConntrackGc&) = delete;
  ConntrackGc& operator=(const ConntrackGc&) = delete;

  // Each pass also collects the masquerade mappings of sluice_snat4 and sluice_rnat4 (borrowed):
  // a mapping's two entries (leaving, and the reply's) are one flow, whose state and last packet
  // are the later of the two; it is deleted, leaving entry first, when the conntrack timeout of
  // that state has passed, or early under port pressure (GcOptions::nat_ports). An entry without
  // its other half goes by its own state. With `stats`, the pass also estimates sluice_snat4's
  // LRU evictions as for sluice_ct4_any. Call before Start().
  void CollectNat(maps::NatMap* snat, maps::NatMap* rnat) {
    snat_ = snat;
    rnat_ = rnat;
  }

  // A pass that leaves no forward or reply entry in either map tells the datapath through
  // `pairs` (sluice_ct_pairs, borrowed) that it may skip their lookups, until it writes such a
  // flow again (maps/conntrack.h). Call before Start().
  void TrackPairs(maps::CtPairsMap* pairs) { pairs_ = pairs; }
  // The agent wrote a reply entry of its own (a flow entry split): the datapath looks such
  // entries up again. Waits for a pass in progress, so none that began before the write can end
  // by telling the datapath otherwise.
  [[nodiscard]] absl::Status PairsWritten();

  // Called after each map's walk, before its deletions: where the datapath may write entries the
  // walk read (tests run packets there). Call before Start().
  void OnWalked(std::function<void()> fn) { on_walked_ = std::move(fn); }

  // One pass over both maps.
  [[nodiscard]] absl::Status RunOnce();
  // Runs a pass every interval (timed by `clock`) on a thread of its own until Stop().
  void Start(const Clock* clock = RealClock::Get());
  void Stop();

  GcTotals totals() const;
  const GcOptions& options() const { return opts_; }

 private:
  absl::Status Collect(maps::Ct4Map& map, bool tcp_map, uint64_t now, MapTotals& totals);
  // One pass over the masquerade maps; sets *found to the sluice_snat4 entries it read.
  absl::Status CollectNatMappings(uint64_t now, uint64_t* found);

  maps::Ct4Map& tcp_;
  maps::Ct4Map& any_;
  maps::CtStatsMap* stats_;
  GcOptions opts_;
  NowNs now_;
  absl::Mutex run_mu_;  // one pass at a time
  mutable absl::Mutex mu_;
  GcTotals totals_ ABSL_GUARDED_BY(mu_);
  bool have_baseline_ = false;  // guarded by run_mu_
  uint64_t any_created_ = 0;    // at the previous pass
  uint64_t any_crossed_ = 0;    // SLUICE_CT_STAT_ANY_CROSSED at the previous pass
  uint64_t any_left_ = 0;       // entries the previous pass left in sluice_ct4_any
  maps::NatMap* snat_ = nullptr;
  maps::NatMap* rnat_ = nullptr;
  std::function<void()> on_walked_;
  maps::CtPairsMap* pairs_ = nullptr;
  uint64_t pairs_left_ = 0;         // forward and reply entries this pass left; guarded by run_mu_
  bool have_nat_baseline_ = false;  // the rest guarded by run_mu_
  uint64_t nat_created_ = 0;
  uint64_t nat_left_ = 0;
  absl::Notification stop_;
  std::thread thread_;
};

// sluice_ct_gc_* and sluice_ct_lru_evictions_total on `registry` from gc's totals; returns the
// collector's id.
int AddConntrackGcCollector(metrics::Registry& registry, const ConntrackGc* gc);

}  // namespace sluice::conntrack
