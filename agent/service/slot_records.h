// The slot records of sluice_lb4_rec (maps/lb.h): a frontend's backend ids, which its master
// entry names so that a new flow reads its backend with one array lookup. BpfLbMaps tells this
// every slot and master entry it writes or deletes; when it flushes, each master whose slots or
// value changed gets a record of its slots, written before the master that names it.
//
// A record is never changed while a master in sluice_lb4_svc may name it: a master that stops
// naming it (rewritten, or deleted) retires it, and a retired record is written again only after
// SLUICE_LB4_REC_QUARANTINE_S, so a program that read the old master still reads what that master
// meant. Frontends with more than SLUICE_LB4_RECORD_SLOTS backends, none, or slots this has not
// seen get no record (master backend_id 0): their slots are read from sluice_lb4_svc, as before
// records existed. So do all when the records run out.
#pragma once

#include <cstdint>
#include <functional>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "loader/quarantined_records.h"
#include "maps/sluice_maps.h"

namespace sluice::agent {

class SlotRecords {
 public:
  struct Stats {
    size_t named = 0;    // records a master names
    size_t retired = 0;  // records waiting out their quarantine
    size_t free = 0;
  };

  explicit SlotRecords(maps::Lb4SlotRecordMap& map, const Clock* clock = RealClock::Get());

  // A slot entry (backend_slot >= 1) was written, or is queued to be.
  void SlotWritten(const sluice_lb4_key& key, uint32_t backend_id);
  // A slot entry was deleted.
  void SlotDeleted(const sluice_lb4_key& key);
  // A master entry to write, as the reconciler made it (its backend_id is ignored): held back
  // until TakeMasters, so that it is written after its slots.
  void MasterWritten(const sluice_lb4_key& key, const sluice_lb4_service& master);
  // The master entry was deleted: its record is retired.
  void MasterDeleted(const sluice_lb4_key& key);

  // The masters held back, each naming the record of its slots (already written to
  // sluice_lb4_rec) or 0; MastersWritten must follow, with how many of them reached the map.
  std::vector<std::pair<sluice_lb4_key, sluice_lb4_service>> TakeMasters();
  // The first `written` masters TakeMasters gave are in sluice_lb4_svc; the rest are not, and
  // are held back again with the records their entries in the map still name.
  void MastersWritten(size_t written);

  // Restore after a restart: forgets everything, then takes sluice_lb4_svc's entries as the map
  // holds them (one Restored call each, then EndRestore). Restored returns the entry as the
  // reconciler wrote it (a master without its record). EndRestore keeps the records that
  // masters name and that match their slots, frees those no master names, and holds back the
  // masters that should name a record and do not, or name one that does not hold their slots
  // (an upgrade from an agent without records), so that the next flush writes them.
  void BeginRestore();
  sluice_lb4_service Restored(const sluice_lb4_key& key, const sluice_lb4_service& v);
  void EndRestore();

  Stats stats() const;

 private:
  using FrontendKey = std::tuple<uint32_t, uint16_t, uint8_t, uint8_t>;  // addr, port, proto,
                                                                         // scope (network order)
  struct Frontend {
    bool has_master = false;
    sluice_lb4_service master{};       // as the reconciler wrote it, backend_id 0
    std::vector<uint32_t> slots;       // backend id of slot i + 1; 0: unknown
    uint32_t record = 0;               // what its master in the map names
    std::vector<uint32_t> record_ids;  // what that record holds (count ids)
    bool held = false;                 // a master to write at the next flush
  };
  struct Taken {
    FrontendKey key;
    uint32_t record;
    std::vector<uint32_t> ids;
  };

  static FrontendKey KeyOf(const sluice_lb4_key& key);
  void Hold(const FrontendKey& key, Frontend& fe);
  // The record for fe's slots (ids): its current one when it holds them, else a fresh one to
  // write (*fresh); 0 when it gets none.
  uint32_t RecordFor(Frontend& fe, std::vector<uint32_t>* ids, bool* fresh);

  maps::Lb4SlotRecordMap& map_;
  // sluice_lb4_rec's records: free, and those no master names any more waiting out their
  // quarantine.
  loader::QuarantinedRecords pool_;
  absl::flat_hash_map<FrontendKey, Frontend> frontends_;
  std::vector<FrontendKey> held_;
  std::vector<Taken> taken_;
};

}  // namespace sluice::agent
