#include "loader/endpoint_table.h"

#include <arpa/inet.h>

#include <cstring>
#include <map>
#include <string>

#include "spdlog/spdlog.h"

namespace sluice::loader {
namespace {

bool SameEndpoint(const sluice_endpoint& a, const sluice_endpoint& b) {
  return std::memcmp(&a, &b, sizeof(a)) == 0;
}

std::string Ip4(uint32_t addr) {
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &addr, buf, sizeof(buf));
  return buf;
}

}  // namespace

EndpointTable::EndpointTable(maps::EndpointMap& ep4, maps::Ep4SlotMap& slots,
                             maps::Ep4RecordMap& records, const Clock* clock)
    : ep4_(ep4),
      slots_(slots),
      records_(records),
      slot_addr_(SLUICE_EP4_SLOTS, 0),
      slot_rec_(SLUICE_EP4_SLOTS, kNoRecord),
      rec_value_(SLUICE_EP4_RECS),
      pool_(SLUICE_EP4_RECS, absl::Seconds(SLUICE_EP4_REC_QUARANTINE_S), clock) {}

uint32_t EndpointTable::SlotOf(uint32_t addr) { return ntohl(addr) & (SLUICE_EP4_SLOTS - 1); }

absl::Status EndpointTable::Rebuild() {
  absl::MutexLock lock(&mu_);
  std::map<uint32_t, sluice_endpoint> endpoints;
  if (auto st = ep4_.ForEach(
          [&](const sluice_ep4_key& k, const sluice_endpoint& v) { endpoints[k.addr] = v; });
      !st.ok()) {
    return st;
  }
  std::vector<std::pair<uint32_t, sluice_ep4_ref>> named;
  if (auto st = slots_.ForEach([&](uint32_t i, const sluice_ep4_ref& s) {
        named.push_back({i, s});
      });
      !st.ok()) {
    return st;
  }

  std::fill(slot_addr_.begin(), slot_addr_.end(), 0);
  std::fill(slot_rec_.begin(), slot_rec_.end(), kNoRecord);
  unindexed_.clear();
  std::vector<bool> taken(SLUICE_EP4_RECS, false);
  std::vector<uint32_t> stale;
  size_t kept = 0, freed = 0;
  for (const auto& [i, s] : named) {
    auto it = endpoints.find(s.addr);
    bool keep = it != endpoints.end() && SlotOf(s.addr) == i && s.rec != 0 &&
                s.rec < SLUICE_EP4_RECS && !taken[s.rec];
    if (keep) {
      auto rec = records_.Lookup(s.rec);
      keep = rec.ok() && SameEndpoint(*rec, it->second);
    }
    if (keep) {
      slot_addr_[i] = s.addr;
      slot_rec_[i] = s.rec;
      rec_value_[s.rec] = it->second;
      taken[s.rec] = true;
      ++kept;
      continue;
    }
    // Names what sluice_ep4 no longer holds, or holds otherwise: programs may still be reading
    // its record, which therefore waits like any retired one.
    if (auto st = slots_.Delete(i); !st.ok()) return st;
    if (s.rec != 0 && s.rec < SLUICE_EP4_RECS && !taken[s.rec]) {
      taken[s.rec] = true;
      stale.push_back(s.rec);
    }
    ++freed;
  }
  pool_.Reset(taken, stale);
  for (const auto& [addr, value] : endpoints) {
    if (slot_addr_[SlotOf(addr)] == addr) continue;
    if (auto st = IndexLocked(addr, value); !st.ok()) return st;
  }
  spdlog::info("endpoints: index of {} endpoints: {} slots kept, {} freed, {} found by hash only",
               endpoints.size(), kept, freed, unindexed_.size());
  return absl::OkStatus();
}

absl::Status EndpointTable::Upsert(uint32_t addr, const sluice_endpoint& value) {
  absl::MutexLock lock(&mu_);
  if (auto st = ep4_.Update(sluice_ep4_key{addr}, value); !st.ok()) return st;
  return IndexLocked(addr, value);
}

absl::Status EndpointTable::Delete(uint32_t addr) {
  absl::MutexLock lock(&mu_);
  unindexed_.erase(addr);
  const uint32_t slot = SlotOf(addr);
  if (slot_addr_[slot] == addr) {
    if (auto st = FreeSlotLocked(slot); !st.ok()) return st;
  }
  if (auto st = ep4_.Delete(sluice_ep4_key{addr}); !st.ok()) return st;
  if (slot_addr_[slot] != 0) return absl::OkStatus();
  // The slot is free: another endpoint whose address maps to it takes it.
  for (uint32_t other : unindexed_) {
    if (SlotOf(other) != slot) continue;
    auto value = ep4_.Lookup(sluice_ep4_key{other});
    if (!value.ok()) continue;
    return IndexLocked(other, *value);
  }
  return absl::OkStatus();
}

absl::Status EndpointTable::IndexLocked(uint32_t addr, const sluice_endpoint& value) {
  const uint32_t slot = SlotOf(addr);
  const bool owner = slot_addr_[slot] == addr;
  if (!owner && slot_addr_[slot] != 0) {
    unindexed_.insert(addr);
    return absl::OkStatus();
  }
  if (owner && SameEndpoint(rec_value_[slot_rec_[slot]], value)) return absl::OkStatus();
  const uint32_t rec = TakeRecordLocked();
  if (rec == kNoRecord) {
    // Every record is named or waiting: the slot must not name the old value.
    if (owner) {
      if (auto st = FreeSlotLocked(slot); !st.ok()) return st;
    }
    spdlog::warn("endpoints: no free index record for {}: found through sluice_ep4", Ip4(addr));
    unindexed_.insert(addr);
    return absl::OkStatus();
  }
  if (auto st = records_.Update(rec, value); !st.ok()) {
    pool_.Release(rec);
    // sluice_ep4 has the new value: the slot must not keep naming the old one.
    if (owner) (void)FreeSlotLocked(slot);
    return st;
  }
  rec_value_[rec] = value;
  const uint32_t old = owner ? slot_rec_[slot] : kNoRecord;
  if (auto st = slots_.Update(slot, sluice_ep4_ref{addr, rec}); !st.ok()) {
    RetireRecordLocked(rec);
    return st;
  }
  slot_addr_[slot] = addr;
  slot_rec_[slot] = rec;
  unindexed_.erase(addr);
  if (old != kNoRecord) RetireRecordLocked(old);
  return absl::OkStatus();
}

absl::Status EndpointTable::FreeSlotLocked(uint32_t slot) {
  if (auto st = slots_.Delete(slot); !st.ok()) return st;
  RetireRecordLocked(slot_rec_[slot]);
  slot_addr_[slot] = 0;
  slot_rec_[slot] = kNoRecord;
  return absl::OkStatus();
}

uint32_t EndpointTable::TakeRecordLocked() {
  const uint32_t rec = pool_.Take();
  return rec == 0 ? kNoRecord : rec;
}

void EndpointTable::RetireRecordLocked(uint32_t rec) {
  if (rec != kNoRecord) pool_.Retire(rec);
}

EndpointTable::Stats EndpointTable::stats() const {
  absl::MutexLock lock(&mu_);
  Stats s;
  for (uint32_t a : slot_addr_) s.indexed += a != 0;
  s.unindexed = unindexed_.size();
  return s;
}

}  // namespace sluice::loader
