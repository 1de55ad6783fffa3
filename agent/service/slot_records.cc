#include "agent/service/slot_records.h"

#include <bpf/bpf.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "spdlog/spdlog.h"

namespace sluice::agent {
namespace {

uint32_t MaxEntries(int fd) {
  bpf_map_info info{};
  uint32_t len = sizeof(info);
  if (bpf_obj_get_info_by_fd(fd, &info, &len) != 0) return 0;
  return info.max_entries;
}

}  // namespace

SlotRecords::SlotRecords(maps::Lb4SlotRecordMap& map, const Clock* clock)
    : map_(map), pool_(MaxEntries(map.fd()), absl::Seconds(SLUICE_LB4_REC_QUARANTINE_S), clock) {}

SlotRecords::FrontendKey SlotRecords::KeyOf(const sluice_lb4_key& key) {
  return {key.addr, key.dport, key.proto, key.scope};
}

void SlotRecords::Hold(const FrontendKey& key, Frontend& fe) {
  if (fe.held || !fe.has_master) return;
  fe.held = true;
  held_.push_back(key);
}

void SlotRecords::SlotWritten(const sluice_lb4_key& key, uint32_t backend_id) {
  const FrontendKey fk = KeyOf(key);
  Frontend& fe = frontends_[fk];
  if (fe.slots.size() < key.backend_slot) fe.slots.resize(key.backend_slot, 0);
  fe.slots[key.backend_slot - 1] = backend_id;
  // The master names a record of the old slots: it is written again with a new one.
  Hold(fk, fe);
}

void SlotRecords::SlotDeleted(const sluice_lb4_key& key) {
  auto it = frontends_.find(KeyOf(key));
  if (it == frontends_.end()) return;
  Frontend& fe = it->second;
  // Deleted after the master stopped counting it (maps/lb.h): its record needs no change.
  if (key.backend_slot <= fe.slots.size()) fe.slots[key.backend_slot - 1] = 0;
  while (!fe.slots.empty() && fe.slots.back() == 0) fe.slots.pop_back();
  if (!fe.has_master && fe.slots.empty()) frontends_.erase(it);
}

void SlotRecords::MasterWritten(const sluice_lb4_key& key, const sluice_lb4_service& master) {
  const FrontendKey fk = KeyOf(key);
  Frontend& fe = frontends_[fk];
  fe.master = master;
  fe.master.backend_id = 0;
  fe.has_master = true;
  Hold(fk, fe);
}

void SlotRecords::MasterDeleted(const sluice_lb4_key& key) {
  auto it = frontends_.find(KeyOf(key));
  if (it == frontends_.end()) return;
  pool_.Retire(it->second.record);
  if (it->second.held) {
    held_.erase(std::find(held_.begin(), held_.end(), it->first));
  }
  frontends_.erase(it);
}

uint32_t SlotRecords::RecordFor(Frontend& fe, std::vector<uint32_t>* ids, bool* fresh) {
  *fresh = false;
  const uint16_t count = fe.master.count;
  if (count == 0 || count > SLUICE_LB4_RECORD_SLOTS || fe.slots.size() < count) return 0;
  ids->assign(fe.slots.begin(), fe.slots.begin() + count);
  if (std::find(ids->begin(), ids->end(), 0u) != ids->end()) return 0;
  if (fe.record != 0 && fe.record_ids == *ids) return fe.record;
  const uint32_t rec = pool_.Take();
  *fresh = rec != 0;
  return rec;
}

std::vector<std::pair<sluice_lb4_key, sluice_lb4_service>> SlotRecords::TakeMasters() {
  std::vector<std::pair<sluice_lb4_key, sluice_lb4_service>> out;
  std::vector<uint32_t> rec_keys;
  std::vector<sluice_lb4_slot_record> rec_values;
  std::vector<size_t> rec_masters;  // the master (index in out) each fresh record is for
  taken_.clear();
  for (const FrontendKey& fk : held_) {
    Frontend& fe = frontends_[fk];
    fe.held = false;
    Taken t{fk, 0, {}};
    bool fresh = false;
    t.record = RecordFor(fe, &t.ids, &fresh);
    if (fresh) {
      sluice_lb4_slot_record value{};
      std::copy(t.ids.begin(), t.ids.end(), value.backend_id);
      rec_keys.push_back(t.record);
      rec_values.push_back(value);
      rec_masters.push_back(out.size());
    }
    sluice_lb4_key key{};
    std::tie(key.addr, key.dport, key.proto, key.scope) = fk;
    sluice_lb4_service v = fe.master;
    v.backend_id = t.record;
    out.emplace_back(key, v);
    taken_.push_back(std::move(t));
  }
  held_.clear();
  // The fresh records in one batch, before any master names them. A master whose record did
  // not reach the map names none (its slots are read from sluice_lb4_svc).
  size_t done = 0;
  if (!rec_keys.empty()) {
    auto st = map_.UpdateBatch(rec_keys.data(), rec_values.data(), rec_keys.size(), &done);
    if (st.ok()) done = rec_keys.size();
    if (!st.ok()) {
      spdlog::warn("services: {} of {} slot records written: {}", done, rec_keys.size(),
                   std::string(st.message()));
    }
  }
  for (size_t i = done; i < rec_keys.size(); ++i) {
    const size_t m = rec_masters[i];
    pool_.Release(rec_keys[i]);
    out[m].second.backend_id = 0;
    taken_[m].record = 0;
    taken_[m].ids.clear();
  }
  return out;
}

void SlotRecords::MastersWritten(size_t written) {
  for (size_t i = 0; i < taken_.size(); ++i) {
    Taken& t = taken_[i];
    auto it = frontends_.find(t.key);
    if (it == frontends_.end()) {
      // Deleted since (MasterDeleted retired what the map named).
      if (i < written) pool_.Retire(t.record);
      continue;
    }
    Frontend& fe = it->second;
    if (i < written) {
      if (fe.record != t.record) pool_.Retire(fe.record);
      fe.record = t.record;
      fe.record_ids = std::move(t.ids);
      continue;
    }
    // Not written: the map's master still names fe.record; the fresh record was never named.
    if (t.record != fe.record) pool_.Release(t.record);
    Hold(t.key, fe);
  }
  taken_.clear();
}

void SlotRecords::BeginRestore() {
  frontends_.clear();
  held_.clear();
  taken_.clear();
}

sluice_lb4_service SlotRecords::Restored(const sluice_lb4_key& key, const sluice_lb4_service& v) {
  if (key.backend_slot != 0) {
    Frontend& fe = frontends_[KeyOf(key)];
    if (fe.slots.size() < key.backend_slot) fe.slots.resize(key.backend_slot, 0);
    fe.slots[key.backend_slot - 1] = v.backend_id;
    return v;
  }
  Frontend& fe = frontends_[KeyOf(key)];
  fe.has_master = true;
  fe.master = v;
  fe.master.backend_id = 0;
  fe.record = v.backend_id;
  return fe.master;
}

void SlotRecords::EndRestore() {
  const uint32_t size = pool_.size();
  std::vector<bool> named(size, false);
  size_t kept = 0, held = 0;
  for (auto& [fk, fe] : frontends_) {
    if (!fe.has_master) continue;
    std::vector<uint32_t> ids;
    const uint16_t count = fe.master.count;
    bool wants = count > 0 && count <= SLUICE_LB4_RECORD_SLOTS && fe.slots.size() >= count;
    if (wants) {
      ids.assign(fe.slots.begin(), fe.slots.begin() + count);
      wants = std::find(ids.begin(), ids.end(), 0u) == ids.end();
    }
    if (fe.record >= size || (fe.record != 0 && named[fe.record])) {
      // Beyond the array, or another master's: the programs read nothing sensible through it.
      fe.record = 0;
    }
    if (fe.record != 0) {
      named[fe.record] = true;
      auto value = map_.Lookup(fe.record);
      if (wants && value.ok() && std::equal(ids.begin(), ids.end(), value->backend_id)) {
        fe.record_ids = std::move(ids);
        ++kept;
        continue;
      }
    }
    // The master names no record, or one that does not hold its slots: written again with the
    // right one at the next flush, which retires what it names now.
    if (wants || fe.record != 0) {
      Hold(fk, fe);
      ++held;
    }
  }
  // A record no master names was retired by the last agent, long enough ago (the restart took
  // longer than a program runs): free, like the index of endpoints (loader/endpoint_table.h).
  pool_.Reset(named, {});
  spdlog::info("services: slot records: {} kept, {} masters to write with a new one", kept, held);
}

SlotRecords::Stats SlotRecords::stats() const {
  Stats s;
  for (const auto& [fk, fe] : frontends_) s.named += fe.record != 0;
  s.retired = pool_.retired();
  s.free = pool_.free();
  return s;
}

}  // namespace sluice::agent
