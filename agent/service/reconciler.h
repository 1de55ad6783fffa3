// Service reconciler: writes the translator's frontends (agent/service/translator.h) into the
// sluice_lb4_* maps in the hitless order of maps/lb.h, keeps rev_nat and backend ids stable (and
// restores them from the pinned maps after a restart), flushes the UDP flows of removed backends
// from sluice_ct4_any, and keeps one wildcard master per ClusterIP in use. The map writes go through
// LbMaps so the ordering is unit-tested against a recording fake.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "agent/service/maglev.h"
#include "agent/service/slot_records.h"
#include "agent/service/translator.h"
#include "loader/backend_ports.h"
#include "maps/maglev_tables.h"
#include "maps/sluice_maps.h"

namespace sluice::agent {

// Entries each Service map can hold (its max_entries).
struct LbCapacity {
  uint32_t services = UINT32_MAX;       // sluice_lb4_svc: masters, slots, wildcard masters
  uint32_t backends = UINT32_MAX;       // sluice_lb4_be: also the largest backend id
  uint32_t rev_nat = UINT32_MAX;        // sluice_lb4_rnat: one per frontend
  uint32_t source_ranges = UINT32_MAX;  // sluice_lb4_srcr
};

// The handful of operations the reconciler needs on sluice_lb4_* and sluice_ct4.
class LbMaps {
 public:
  virtual ~LbMaps() = default;

  // What the maps can hold; the reconciler programs only what fits (default: no limit).
  virtual LbCapacity Capacity() const { return {}; }

  virtual absl::Status UpdateService(const sluice_lb4_key& key, const sluice_lb4_service& v) = 0;
  virtual absl::Status DeleteService(const sluice_lb4_key& key) = 0;
  virtual absl::Status UpdateBackend(uint32_t id, const sluice_lb4_backend& v) = 0;
  virtual absl::Status DeleteBackend(uint32_t id) = 0;
  virtual absl::Status UpdateRevNat(uint32_t id, const sluice_lb4_revnat& v) = 0;
  virtual absl::Status DeleteRevNat(uint32_t id) = 0;
  virtual absl::Status UpdateSourceRange(const sluice_lb4_srcrange_key& key) = 0;
  virtual absl::Status DeleteSourceRange(const sluice_lb4_srcrange_key& key) = 0;
  // An implementation may hold updates back and write them in batches, as long as every
  // reader sees the writes of a map in the order they were made and no update later than any
  // delete or flush that followed it (see BpfLbMaps). Flush writes what is held back; its error
  // means some earlier update may be missing from the maps.
  virtual absl::Status Flush() { return absl::OkStatus(); }
  // Deletes the forward UDP conntrack entries of flows that were given one of
  // `flows` = {(rev_nat_id, backend_id)}, so that their next datagram is balanced again; their
  // reply entries stay for late replies (the GC ages them out). Returns how many entries went.
  virtual absl::StatusOr<size_t> FlushUdpFlows(
      const absl::flat_hash_set<std::pair<uint32_t, uint32_t>>& flows) = 0;
  // Socket LB: closes the connected UDP sockets of the node's processes that were sent to one of
  // `backends` = {(rev_nat_id, backend address, backend port), network order}, which a
  // connected socket would otherwise keep using (agent/kernel/sock_destroy.h). Returns how many
  // were closed (default: none).
  virtual absl::StatusOr<size_t> CloseUdpSockets(
      const absl::flat_hash_set<std::tuple<uint32_t, uint32_t, uint16_t>>& /*backends*/) {
    return 0;
  }
  // Deletes session affinity entries of the frontends `rev_nat_ids`, and those of `backends` =
  // {(rev_nat_id, backend_id)} (a client must not stick to a backend that left the frontend).
  virtual absl::Status FlushAffinity(
      const absl::flat_hash_set<uint32_t>& rev_nat_ids,
      const absl::flat_hash_set<std::pair<uint32_t, uint32_t>>& backends) = 0;

  // Maglev (maps/lb.h, sluice_lb4_mag): puts `table` (slot s -> backend id) under the frontend's
  // master key, whole, replacing the one there. `backends` are the ids the table was computed
  // from (in the translator's order): equal ids give equal tables, which an implementation may
  // share between frontends. The reconciler calls it after the backends are written and before
  // the master that sets SLUICE_SVC_F_MAGLEV; an implementation that holds updates back still
  // makes the table visible before that master.
  virtual absl::Status UpdateMaglevTable(const sluice_lb4_key& /*key*/,
                                         const std::vector<uint32_t>& /*backends*/,
                                         const std::vector<uint32_t>& /*table*/) {
    return absl::OkStatus();
  }
  // Called once the master no longer sets the flag, or is deleted: the delete follows every
  // update made before it.
  virtual absl::Status DeleteMaglevTable(const sluice_lb4_key& /*key*/) {
    return absl::OkStatus();
  }
  // The master keys that have a table (restore after a restart, pruning).
  virtual absl::Status ForEachMaglevTable(
      const std::function<void(const sluice_lb4_key&)>& /*fn*/) {
    return absl::OkStatus();
  }

  // Reading what is there (restore after a restart).
  virtual absl::Status ForEachService(
      const std::function<void(const sluice_lb4_key&, const sluice_lb4_service&)>& fn) = 0;
  virtual absl::Status ForEachBackend(
      const std::function<void(uint32_t, const sluice_lb4_backend&)>& fn) = 0;
  virtual absl::Status ForEachRevNat(
      const std::function<void(uint32_t, const sluice_lb4_revnat&)>& fn) = 0;
  virtual absl::Status ForEachSourceRange(
      const std::function<void(const sluice_lb4_srcrange_key&)>& fn) = 0;

  // Once the maps hold every Service and nothing stale (after PruneStale): vouches for the ports
  // no backend is on (sluice_lb4_nbport), so non-service traffic skips the reverse NAT lookup.
  virtual absl::Status VouchNonBackendPorts() { return absl::OkStatus(); }
};

// LbMaps over the real (pinned) maps. The maps are borrowed and must outlive it.
// Backends are written at once, as stores into sluice_lb4_be's mapped slots
// (maps/slot_array.h). Updates of sluice_lb4_rnat and sluice_lb4_svc are held back and written
// with BPF_MAP_UPDATE_BATCH (a full programming of 10k Services is ~130k hash writes): on Flush,
// on any delete, conntrack or affinity flush, and when kMaxPending are held, in the order
// reverse NAT, services, each in the order it was made. That keeps the hitless order of
// maps/lb.h: a slot is written after the backend it names, a master after its slots and its
// reverse NAT entry, and every delete after the writes that made its entry unreferenced.
// (Backend and reverse NAT entries may become visible earlier than they were issued relative to
// service entries: nothing refers to them before the service entries that do.)
class BpfLbMaps : public LbMaps {
 public:
  static constexpr size_t kMaxPending = 16384;

  // ct is sluice_ct4_any (UDP flows); with nbport, ct_tcp (sluice_ct4) and nbport keep the ports
  // no backend is on. With records (sluice_lb4_rec), masters name a record of their slots
  // (SlotRecords): they are then held back until the flush and written after every slot queued
  // before it.
  BpfLbMaps(maps::Lb4ServiceMap& svc, maps::Lb4BackendMap& be, maps::Lb4RevNatMap& rnat,
            maps::Lb4SourceRangeMap& srcr, maps::Ct4Map& ct, maps::Lb4AffinityMap* aff,
            maps::Ct4Map* ct_tcp = nullptr, maps::Lb4NonBackendPortMap* nbport = nullptr,
            maps::Lb4SlotRecordMap* records = nullptr, const Clock* clock = RealClock::Get())
      : svc_(svc), be_(be), rnat_(rnat), srcr_(srcr), ct_(ct), aff_(aff), ct_tcp_(ct_tcp) {
    if (nbport != nullptr) nbport_.emplace(*nbport);
    if (records != nullptr) records_ = std::make_unique<SlotRecords>(*records, clock);
  }

  // Maglev tables go to `tables` (sluice_lb4_mag); without it, UpdateMaglevTable fails (a
  // master with SLUICE_SVC_F_MAGLEV and no table falls back to random slots).
  void WriteMaglevTablesTo(maps::MaglevTables* tables) { maglev_ = tables; }
  // Distinct tables in sluice_lb4_mag that this wrote (frontends with equal backends share one).
  size_t maglev_tables() const { return maglev_shared_.size(); }

  // Called after FlushUdpFlows wrote reply entries of its own (conntrack::ConntrackGc::
  // PairsWritten: the datapath must look them up).
  void OnPairsWritten(std::function<absl::Status()> fn) { pairs_written_ = std::move(fn); }

  // Socket LB is on: CloseUdpSockets finds the sockets in `revnat` (sluice_sock4_rnat: socket
  // cookie and backend -> frontend) and closes them with `destroy`.
  // Closes the sockets (cookie, peer address, peer port) that are still connected to that peer.
  using SocketDestroyer = std::function<absl::StatusOr<size_t>(
      const absl::flat_hash_set<std::tuple<uint64_t, uint32_t, uint16_t>>& sockets)>;
  void CloseSocketLbUdpWith(maps::Sock4RevNatMap* revnat, SocketDestroyer destroy) {
    sock_revnat_ = revnat;
    destroy_sockets_ = std::move(destroy);
  }

  // The slot records' state; none without records.
  SlotRecords::Stats slot_record_stats() const {
    return records_ ? records_->stats() : SlotRecords::Stats{};
  }

  absl::Status UpdateService(const sluice_lb4_key& key, const sluice_lb4_service& v) override;
  absl::Status DeleteService(const sluice_lb4_key& key) override;
  absl::Status UpdateBackend(uint32_t id, const sluice_lb4_backend& v) override;
  absl::Status DeleteBackend(uint32_t id) override;
  absl::Status UpdateRevNat(uint32_t id, const sluice_lb4_revnat& v) override;
  absl::Status DeleteRevNat(uint32_t id) override;
  absl::Status UpdateSourceRange(const sluice_lb4_srcrange_key& key) override;
  absl::Status DeleteSourceRange(const sluice_lb4_srcrange_key& key) override;
  absl::Status Flush() override;
  // max_entries of the four maps, read from the kernel.
  LbCapacity Capacity() const override;
  absl::StatusOr<size_t> FlushUdpFlows(
      const absl::flat_hash_set<std::pair<uint32_t, uint32_t>>& flows) override;
  absl::StatusOr<size_t> CloseUdpSockets(
      const absl::flat_hash_set<std::tuple<uint32_t, uint32_t, uint16_t>>& backends) override;
  absl::Status FlushAffinity(
      const absl::flat_hash_set<uint32_t>& rev_nat_ids,
      const absl::flat_hash_set<std::pair<uint32_t, uint32_t>>& backends) override;
  absl::Status ForEachService(
      const std::function<void(const sluice_lb4_key&, const sluice_lb4_service&)>& fn) override;
  absl::Status ForEachBackend(
      const std::function<void(uint32_t, const sluice_lb4_backend&)>& fn) override;
  absl::Status ForEachRevNat(
      const std::function<void(uint32_t, const sluice_lb4_revnat&)>& fn) override;
  absl::Status ForEachSourceRange(
      const std::function<void(const sluice_lb4_srcrange_key&)>& fn) override;
  absl::Status VouchNonBackendPorts() override;
  absl::Status UpdateMaglevTable(const sluice_lb4_key& key, const std::vector<uint32_t>& backends,
                                 const std::vector<uint32_t>& table) override;
  absl::Status DeleteMaglevTable(const sluice_lb4_key& key) override;
  absl::Status ForEachMaglevTable(const std::function<void(const sluice_lb4_key&)>& fn) override;

 private:
  using MaglevKey = std::tuple<uint32_t, uint16_t, uint8_t, uint8_t>;  // master key fields
  struct SharedTable {
    maps::MapFd fd;  // the table array, kept open while a key names it
    int refs = 0;
  };
  void ReleaseMaglevTable(const MaglevKey& key);
  maps::Lb4ServiceMap& svc_;
  maps::Lb4BackendMap& be_;
  maps::Lb4RevNatMap& rnat_;
  maps::Lb4SourceRangeMap& srcr_;
  maps::Ct4Map& ct_;
  maps::Lb4AffinityMap* aff_;
  maps::Ct4Map* ct_tcp_;
  std::function<absl::Status()> pairs_written_;
  maps::Sock4RevNatMap* sock_revnat_ = nullptr;
  SocketDestroyer destroy_sockets_;
  std::optional<loader::NonBackendPorts> nbport_;
  std::unique_ptr<SlotRecords> records_;
  std::vector<uint32_t> rnat_ids_;
  std::vector<sluice_lb4_revnat> rnat_values_;
  std::vector<sluice_lb4_key> svc_keys_;
  std::vector<sluice_lb4_service> svc_values_;
  maps::MaglevTables* maglev_ = nullptr;
  // Tables by what they were computed from (backend ids and size); keys -> what they hold.
  std::map<std::pair<std::vector<uint32_t>, uint32_t>, SharedTable> maglev_shared_;
  absl::flat_hash_map<MaglevKey, std::pair<std::vector<uint32_t>, uint32_t>> maglev_of_;
};

struct ServiceReconcilerStats {
  uint64_t map_updates = 0;  // successful map writes (services, backends, rnat, ranges)
  uint64_t map_deletes = 0;
  uint64_t ct_flushed = 0;  // forward UDP conntrack entries deleted
  uint64_t udp_sockets_closed = 0;  // socket LB: connected UDP sockets of removed backends
  uint64_t udp_socket_close_failures = 0;  // ... a close that failed (best effort, not retried)
  uint64_t errors = 0;      // failed map operations
  uint64_t conflicts = 0;   // frontends skipped: the key is another Service's
  uint64_t frontends_removed = 0;
  size_t frontends = 0;  // programmed (owned) frontends
  size_t backends = 0;
  size_t unprogrammed = 0;  // frontends refused now: no room in the maps (map_full)
  size_t truncated = 0;     // programmed frontends holding fewer backends than wanted (map_full)
};

// A frontend not programmed, or programmed with fewer backends than its Service has, because a
// Service map has no room for it (reason "map_full").
struct UnprogrammedFrontend {
  std::string service;  // "namespace/name"
  IpAddress addr;
  uint16_t port = 0;
  uint8_t proto = 0;
  uint8_t scope = 0;
  std::string map;  // the first map without room: "sluice_lb4_rnat", ...
  size_t backends_wanted = 0;
  size_t backends_programmed = 0;  // truncated frontends only; 0 for a refused one
  bool truncated = false;          // programmed, with backends_programmed of backends_wanted
};

class ServiceReconciler {
 public:
  // Restores frontends, ids, backends and source ranges from `maps`: they stay as they are
  // until a Service claims them (Apply) or PruneStale() removes the unclaimed ones.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ServiceReconciler>> Create(LbMaps& maps);

  // Makes the maps hold `translation` for `service` ("namespace/name"); nullopt removes the
  // Service's frontends. Writes nothing when nothing changed.
  [[nodiscard]] absl::Status Apply(const std::string& service,
                                   const std::optional<ServiceTranslation>& translation);
  // Several Services in one pass (one conntrack flush at the end).
  //
  // Only what fits in the maps (LbMaps::Capacity) is programmed, decided before writing: first
  // the frontends already programmed (restored or applied before) are updated, so none is ever
  // evicted for a newcomer (one that grows beyond the room left keeps the first backends that
  // fit); then every frontend not yet programmed, of this pass or refused earlier, is taken in
  // the order (namespace/name, address, port, protocol, scope) and programmed whole (backends,
  // reverse NAT, source ranges, slots, master, wildcard) if it fits, else refused: logged once,
  // listed by Unprogrammed(). A refused frontend is no error (nothing to retry with back-off);
  // it is programmed by the first pass that finds room for it (a Service deleted or shrunk).
  [[nodiscard]] absl::Status ApplyAll(
      const std::vector<std::pair<std::string, std::optional<ServiceTranslation>>>& changes);
  // Deletes what was restored from the maps and never claimed since, plus entries nothing
  // refers to (orphan backends, rnat entries, source ranges, slots, wildcard masters). Call once
  // every watch has synced and every Service has been applied.
  [[nodiscard]] absl::Status PruneStale();

  // Ids (0 when unknown), for tests and sluicectl-like introspection.
  uint32_t RevNatId(const IpAddress& addr, uint16_t port, uint8_t proto, uint8_t scope) const;
  uint32_t BackendId(const IpAddress& addr, uint16_t port, uint8_t proto) const;
  // Services that own at least one frontend.
  std::vector<std::string> Services() const;
  // Services with a frontend skipped at their last apply because another Service held its key:
  // worth applying again once some frontend is removed.
  std::vector<std::string> BlockedServices() const;
  // What does not fit in the maps now, in the programming order (see ApplyAll): the first
  // `limit`, and in *total (if given) how many there are.
  std::vector<UnprogrammedFrontend> Unprogrammed(size_t limit = SIZE_MAX,
                                                 size_t* total = nullptr) const;
  // How many frontends are refused / truncated now, by the map without room (every Service map
  // named, zeros included).
  struct UnprogrammedCount {
    size_t refused = 0;
    size_t truncated = 0;
  };
  std::map<std::string, UnprogrammedCount> UnprogrammedByMap() const;
  // Counters and sizes; walks every frontend (for tests and debug logs, not per change).
  ServiceReconcilerStats stats() const;
  // stats().frontends_removed without the walk.
  uint64_t FrontendsRemoved() const;
  // Slots of the Maglev tables written from now on (--maglev-table-size; a prime that
  // ValidateMaglevTableSize accepts). Default kDefaultMaglevTableSize.
  void SetMaglevTableSize(uint32_t m);

 private:
  // (addr in network order, port in host order, proto, scope).
  using FrontendKey = std::tuple<uint32_t, uint16_t, uint8_t, uint8_t>;
  // (addr in network order, port in host order, proto).
  using BackendKey = std::tuple<uint32_t, uint16_t, uint8_t>;
  // (rev_nat_id, prefix length, network address in network order).
  using RangeKey = std::tuple<uint32_t, uint8_t, uint32_t>;

  struct Frontend {
    std::string service;  // owner; "" while restored and unclaimed
    uint32_t rev_nat_id = 0;
    bool cluster_ip = false;                   // counts toward the address's wildcard master
    std::optional<sluice_lb4_revnat> rnat;     // as written
    std::optional<sluice_lb4_service> master;  // as written
    std::vector<uint32_t> slots;               // slot i+1 as written (0: absent)
    std::set<RangeKey> ranges;                 // as written
    absl::flat_hash_set<uint32_t> held;        // backend ids it holds a reference on
    // Maglev: the backend ids its table was computed from, and the table's size (0: no table
    // written by this agent). maglev_table: a table may be in sluice_lb4_mag (written, or
    // restored with a master that sets SLUICE_SVC_F_MAGLEV).
    std::vector<uint32_t> maglev_ids;
    uint32_t maglev_m = 0;
    bool maglev_table = false;
  };
  struct Backend {
    BackendKey key;
    uint8_t flags = 0;
    int refs = 0;
    bool written = true;
  };

  // Free entries per map during a pass (may go negative when a programmed frontend grows).
  struct Room {
    int64_t svc = 0, be = 0, rnat = 0, srcr = 0;
  };
  // A Service with frontends not programmed (or truncated) for want of room: its translation,
  // applied again when room appears, and what was refused, by frontend, with the map.
  struct Pending {
    std::optional<ServiceTranslation> translation;
    std::map<FrontendKey, UnprogrammedFrontend> refused;
  };

  explicit ServiceReconciler(LbMaps& maps) : maps_(maps), capacity_(maps.Capacity()) {}
  absl::Status Restore();

  // `admit_new`: also program the Service's frontends not programmed yet, those that fit.
  absl::Status ApplyOneLocked(const std::string& service,
                              const std::optional<ServiceTranslation>& translation, bool admit_new)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The room left in the maps by what the reconciler holds (written or restored).
  Room FreeRoomLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Programs what fits of the pending Services, in order (all of them when room grew since the
  // last time, else only those that became pending in this pass).
  absl::Status AdmitPendingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `service` wanting `translation` has nothing the first look of ApplyAll would
  // update: no frontend of its own, none pending, none of its keys restored or held.
  bool FreshLocked(const std::string& service, const ServiceTranslation& translation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tables computed in one pass, by the backend ids they are computed from: the frontends of a
  // Service port (ClusterIP, NodePorts, ...) share their backends, so they share one computation.
  using MaglevMemo = std::map<std::vector<uint32_t>, std::vector<uint32_t>>;
  absl::Status ProgramFrontendLocked(const FrontendKey& key, Frontend& fe, const LbFrontend& want,
                                     const std::vector<uint32_t>& backend_ids,
                                     MaglevMemo* memo = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RemoveFrontendLocked(const FrontendKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<uint32_t> AcquireBackendLocked(const LbBackend& b, Frontend& fe)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseBackendLocked(uint32_t id, Frontend& fe) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Backend `id` left frontend `rev_nat_id`: its UDP flows are flushed (and, with socket LB,
  // connected UDP sockets sent to it closed) at the next flush.
  void FlushUdpBackendLocked(uint32_t rev_nat_id, uint32_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DeleteOrphanBackendsLocked(bool all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SyncWildcardsLocked(bool prune) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes what the maps hold back, then the pending conntrack / affinity flushes.
  absl::Status FlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a failed batched write: nothing is known to be written any more, so the next apply of
  // each Service writes its entries again (slots become kSlotUnknown, deleted when beyond count).
  void ForgetWrittenLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static constexpr uint32_t kSlotUnknown = 0xffffffff;
  uint32_t NextRevNatIdLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t NextBackendIdLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t MaxBackendId() const;
  absl::Status Count(absl::Status st, bool is_delete) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetClusterIpLocked(const FrontendKey& key, Frontend& fe, bool cluster_ip)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  LbMaps& maps_;
  const LbCapacity capacity_;
  mutable absl::Mutex mu_;
  uint32_t maglev_m_ ABSL_GUARDED_BY(mu_) = kDefaultMaglevTableSize;
  Room room_ ABSL_GUARDED_BY(mu_);
  // Room when pending Services were last tried: only more room can admit one of them.
  std::optional<Room> room_tried_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> new_pending_ ABSL_GUARDED_BY(mu_);  // became pending in this pass
  // During ApplyAll: its Services of which nothing is programmed, pending or restored, sorted
  // by name. Their first look would refuse every frontend (only newcomers), so they go straight
  // to AdmitPendingLocked, merged into the name order of the pending ones.
  std::vector<std::pair<const std::string*, const std::optional<ServiceTranslation>*>> fresh_
      ABSL_GUARDED_BY(mu_);
  // Frontends whose refusal (or truncation) was logged; forgotten once they are programmed whole.
  std::set<std::tuple<std::string, FrontendKey>> refusal_logged_ ABSL_GUARDED_BY(mu_);
  std::map<FrontendKey, Frontend> frontends_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::set<FrontendKey>> by_service_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint32_t, Backend> backends_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<BackendKey, uint32_t> backend_ids_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint32_t> rev_nat_ids_ ABSL_GUARDED_BY(mu_);  // in use by a frontend
  // Found at restore and not (yet) explained by a frontend.
  std::set<uint32_t> stale_rnat_ ABSL_GUARDED_BY(mu_);
  std::set<RangeKey> stale_ranges_ ABSL_GUARDED_BY(mu_);
  std::set<std::tuple<FrontendKey, uint16_t>> stale_slots_ ABSL_GUARDED_BY(mu_);
  // ClusterIP wildcard masters written, by address (network order) -> restored and not claimed
  // since (kept until PruneStale even when no frontend uses the address).
  std::map<uint32_t, bool> wildcards_ ABSL_GUARDED_BY(mu_);
  // ClusterIP frontends per address, and the addresses whose count changed since the last sync.
  absl::flat_hash_map<uint32_t, int> cluster_ip_refs_ ABSL_GUARDED_BY(mu_);
  // For FreeRoomLocked without a walk: addresses of cluster_ip_refs_ not in wildcards_, and the
  // slots and source ranges of every frontend (Frontend::slots / ranges sizes).
  int64_t wildcards_missing_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t slots_total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t ranges_total_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<uint32_t> wildcard_dirty_ ABSL_GUARDED_BY(mu_);
  // After a failed batched write: the next sync writes the wanted wildcards again.
  bool rewrite_wildcards_ ABSL_GUARDED_BY(mu_) = false;
  // Backends whose last reference went in this pass (deleted at its end); restored backends
  // nothing refers to wait for PruneStale.
  std::set<uint32_t> orphans_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> blocked_ ABSL_GUARDED_BY(mu_);
  // Pending conntrack/affinity flushes.
  absl::flat_hash_set<std::pair<uint32_t, uint32_t>> flush_udp_ ABSL_GUARDED_BY(mu_);
  // The same removed UDP backends as (rev_nat_id, address, port), for LbMaps::CloseUdpSockets.
  absl::flat_hash_set<std::tuple<uint32_t, uint32_t, uint16_t>> close_udp_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint32_t> flush_affinity_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::pair<uint32_t, uint32_t>> flush_affinity_backends_ ABSL_GUARDED_BY(mu_);
  uint32_t next_rev_nat_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint32_t next_backend_id_ ABSL_GUARDED_BY(mu_) = 1;
  ServiceReconcilerStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::agent
