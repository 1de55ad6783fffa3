#include "agent/service/reconciler.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <bpf/bpf.h>

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace sluice::agent {
namespace {

constexpr uint16_t kNotClusterIpFlags =
    SLUICE_SVC_F_NODEPORT | SLUICE_SVC_F_EXTERNAL_IP | SLUICE_SVC_F_LOADBALANCER;
// Ids stay below this (and wrap, skipping ids in use): keeps them printable as ints.
constexpr uint32_t kMaxId = 0x7fffffff;

uint32_t AddrBe(const IpAddress& a) { return htonl(a.v4_host_order()); }

sluice_lb4_key MapKey(uint32_t addr_be, uint16_t port, uint8_t proto, uint8_t scope,
                      uint16_t slot) {
  sluice_lb4_key k{};
  k.addr = addr_be;
  k.dport = htons(port);
  k.proto = proto;
  k.scope = scope;
  k.backend_slot = slot;
  return k;
}

bool SameMaster(const sluice_lb4_service& a, const sluice_lb4_service& b) {
  return a.count == b.count && a.flags == b.flags && a.rev_nat_id == b.rev_nat_id &&
         a.affinity_timeout == b.affinity_timeout;
}

bool SameRevNat(const sluice_lb4_revnat& a, const sluice_lb4_revnat& b) {
  return a.addr == b.addr && a.port == b.port;
}

sluice_lb4_srcrange_key RangeMapKey(uint32_t rev_nat_id, uint8_t len, uint32_t addr_be) {
  sluice_lb4_srcrange_key k{};
  k.prefixlen = 32 + len;
  k.rev_nat_id = htonl(rev_nat_id);
  k.addr = addr_be;
  return k;
}

sluice_lb4_service WildcardMaster() {
  sluice_lb4_service v{};
  v.flags = SLUICE_SVC_F_REJECT;
  return v;
}

#define RETURN_IF_ERROR(expr)  \
  do {                         \
    absl::Status _st = (expr); \
    if (!_st.ok()) return _st; \
  } while (0)

}  // namespace

// ---------------------------------------------------------------------------------------------
// BpfLbMaps

namespace {

// Writes the held-back updates of one map in one batch (in the order they were made) and
// clears them, also on error.
template <typename M, typename K, typename V>
absl::Status FlushPending(M& map, std::vector<K>& keys, std::vector<V>& values, const char* what,
                          size_t* written = nullptr) {
  if (written != nullptr) *written = 0;
  if (keys.empty()) return absl::OkStatus();
  size_t done = 0;
  absl::Status st = map.UpdateBatch(keys.data(), values.data(), keys.size(), &done);
  if (written != nullptr) *written = st.ok() ? keys.size() : done;
  if (!st.ok()) {
    st = absl::Status(st.code(), absl::StrCat("batched ", what, " update (", done, " of ",
                                              keys.size(), " written): ", st.message()));
  }
  keys.clear();
  values.clear();
  return st;
}

}  // namespace

absl::Status BpfLbMaps::Flush() {
  // Reverse NAT before the service entries that name them (backends are written at once).
  absl::Status st = FlushPending(rnat_, rnat_ids_, rnat_values_, "sluice_lb4_rnat");
  if (!st.ok()) {
    // Slots or masters would name what is missing: leave them unwritten.
    svc_keys_.clear();
    svc_values_.clear();
    return st;
  }
  if (!records_) return FlushPending(svc_, svc_keys_, svc_values_, "sluice_lb4_svc");
  // The held masters go last, each after its slots, naming a record written before it.
  const size_t slots = svc_keys_.size();
  for (auto& [key, value] : records_->TakeMasters()) {
    svc_keys_.push_back(key);
    svc_values_.push_back(value);
  }
  size_t written = 0;
  st = FlushPending(svc_, svc_keys_, svc_values_, "sluice_lb4_svc", &written);
  records_->MastersWritten(written > slots ? written - slots : 0);
  return st;
}

namespace {

uint32_t MaxEntries(int fd) {
  bpf_map_info info{};
  uint32_t len = sizeof(info);
  if (bpf_obj_get_info_by_fd(fd, &info, &len) != 0) return UINT32_MAX;  // unknown: no limit
  return info.max_entries;
}

}  // namespace

LbCapacity BpfLbMaps::Capacity() const {
  // sluice_lb4_be is a slot array whose index 0 is never a backend's.
  return LbCapacity{.services = MaxEntries(svc_.fd()),
                    .backends = be_.size() > 0 ? be_.size() - 1 : 0,
                    .rev_nat = MaxEntries(rnat_.fd()),
                    .source_ranges = MaxEntries(srcr_.fd())};
}

absl::Status BpfLbMaps::UpdateMaglevTable(const sluice_lb4_key& key,
                                          const std::vector<uint32_t>& backends,
                                          const std::vector<uint32_t>& table) {
  if (maglev_ == nullptr) return absl::FailedPreconditionError("no sluice_lb4_mag to write to");
  const MaglevKey mk{key.addr, key.dport, key.proto, key.scope};
  std::pair<std::vector<uint32_t>, uint32_t> what{backends,
                                                  static_cast<uint32_t>(table.size())};
  auto held = maglev_of_.find(mk);
  if (held != maglev_of_.end() && held->second == what) return absl::OkStatus();
  auto it = maglev_shared_.find(what);
  if (it == maglev_shared_.end()) {
    absl::StatusOr<maps::MapFd> fd = maps::MaglevTables::Create(table);
    if (!fd.ok()) return fd.status();
    it = maglev_shared_.emplace(what, SharedTable{std::move(*fd), 0}).first;
  }
  // Written at once, not held back: the backends it names are written already (sluice_lb4_be
  // takes stores at once), and the master that sets the flag is held back, so it comes after.
  RETURN_IF_ERROR(maglev_->Swap(key, it->second.fd));
  ++it->second.refs;
  ReleaseMaglevTable(mk);
  maglev_of_[mk] = std::move(what);
  return absl::OkStatus();
}

absl::Status BpfLbMaps::DeleteMaglevTable(const sluice_lb4_key& key) {
  if (maglev_ == nullptr) return absl::OkStatus();
  // After the master that no longer sets the flag (held back until now).
  RETURN_IF_ERROR(Flush());
  RETURN_IF_ERROR(maglev_->Delete(key));
  ReleaseMaglevTable(MaglevKey{key.addr, key.dport, key.proto, key.scope});
  return absl::OkStatus();
}

absl::Status BpfLbMaps::ForEachMaglevTable(const std::function<void(const sluice_lb4_key&)>& fn) {
  if (maglev_ == nullptr) return absl::OkStatus();
  return maglev_->ForEachKey(fn);
}

// The kernel keeps a table while the outer map names it; this only closes its fd when no key
// this wrote names it any more.
void BpfLbMaps::ReleaseMaglevTable(const MaglevKey& key) {
  auto held = maglev_of_.find(key);
  if (held == maglev_of_.end()) return;
  auto it = maglev_shared_.find(held->second);
  if (it != maglev_shared_.end() && --it->second.refs <= 0) maglev_shared_.erase(it);
  maglev_of_.erase(held);
}

absl::Status BpfLbMaps::UpdateService(const sluice_lb4_key& key, const sluice_lb4_service& v) {
  if (records_ && key.backend_slot == 0) {
    records_->MasterWritten(key, v);
  } else {
    if (records_) records_->SlotWritten(key, v.backend_id);
    svc_keys_.push_back(key);
    svc_values_.push_back(v);
  }
  return svc_keys_.size() >= kMaxPending ? Flush() : absl::OkStatus();
}
absl::Status BpfLbMaps::DeleteService(const sluice_lb4_key& key) {
  RETURN_IF_ERROR(Flush());
  RETURN_IF_ERROR(svc_.Delete(key));
  if (records_ && key.backend_slot == 0) records_->MasterDeleted(key);
  if (records_ && key.backend_slot != 0) records_->SlotDeleted(key);
  return absl::OkStatus();
}
absl::Status BpfLbMaps::UpdateBackend(uint32_t id, const sluice_lb4_backend& v) {
  // Before any slot can name it: a reply from its port must get its reverse NAT lookup.
  if (nbport_) RETURN_IF_ERROR(nbport_->Claim(v.port));
  // A store into the mapped slot array, visible before any later write can name it.
  return be_.Update(id, v);
}
absl::Status BpfLbMaps::DeleteBackend(uint32_t id) {
  RETURN_IF_ERROR(Flush());
  return be_.Delete(id);
}
absl::Status BpfLbMaps::UpdateRevNat(uint32_t id, const sluice_lb4_revnat& v) {
  rnat_ids_.push_back(id);
  rnat_values_.push_back(v);
  return rnat_ids_.size() >= kMaxPending ? Flush() : absl::OkStatus();
}
absl::Status BpfLbMaps::DeleteRevNat(uint32_t id) {
  RETURN_IF_ERROR(Flush());
  return rnat_.Delete(id);
}
// Source ranges are few and written at once (before the master that turns them on).
absl::Status BpfLbMaps::UpdateSourceRange(const sluice_lb4_srcrange_key& key) {
  return srcr_.Update(key, 1);
}
absl::Status BpfLbMaps::DeleteSourceRange(const sluice_lb4_srcrange_key& key) {
  RETURN_IF_ERROR(Flush());
  return srcr_.Delete(key);
}

absl::StatusOr<size_t> BpfLbMaps::FlushUdpFlows(
    const absl::flat_hash_set<std::pair<uint32_t, uint32_t>>& flows) {
  RETURN_IF_ERROR(Flush());
  // The forward direction only: the client's next datagram is balanced afresh, while a reply the
  // terminating backend still sends finds its reply entry (which names its frontend) and reaches
  // the client from the frontend. The GC deletes the reply entry once it is idle.
  // Collect first: deleting while walking with get_next_key restarts the walk.
  // A flow entry (both directions) is split first: its reply half is written as a reply entry
  // naming the frontend, as a flow with two entries has.
  std::vector<sluice_ct4_key> doomed;
  std::vector<std::pair<sluice_ct4_key, sluice_ct4_entry>> replies;
  RETURN_IF_ERROR(ct_.ForEach([&](const sluice_ct4_key& k, const sluice_ct4_entry& e) {
    if (k.proto != IPPROTO_UDP || !flows.contains({e.rev_nat_id, e.backend_id})) return;
    if (k.dir == SLUICE_CT_DIR_FLOW) {
      sluice_ct4_key rk{};
      rk.saddr = e.backend_addr;
      rk.daddr = k.saddr;
      rk.sport = e.backend_port;
      rk.dport = k.sport;
      rk.proto = k.proto;
      rk.dir = SLUICE_CT_DIR_REPLY;
      sluice_ct4_entry r = e;
      r.created_ns = e.last_seen_ns;
      r.backend_addr = e.frontend_addr;
      r.backend_port = e.frontend_port;
      r.flags |= SLUICE_CT_F_FRONTEND;
      replies.emplace_back(rk, r);
    }
    if (k.dir == SLUICE_CT_DIR_FORWARD || k.dir == SLUICE_CT_DIR_FLOW) doomed.push_back(k);
  }));
  for (const auto& [k, v] : replies) RETURN_IF_ERROR(ct_.Update(k, v));
  if (!replies.empty() && pairs_written_) RETURN_IF_ERROR(pairs_written_());
  size_t n = 0;
  for (const auto& k : doomed) {
    RETURN_IF_ERROR(ct_.Delete(k));
    ++n;
  }
  return n;
}

absl::StatusOr<size_t> BpfLbMaps::CloseUdpSockets(
    const absl::flat_hash_set<std::tuple<uint32_t, uint32_t, uint16_t>>& backends) {
  if (sock_revnat_ == nullptr || !destroy_sockets_) return 0;
  // Every socket socket LB sent to one of the backends: connected UDP sockets (closed), and
  // unconnected ones that sent a datagram there (left open: their next datagram picks again).
  // TCP sockets have other frontends (rev_nat_ids) than the UDP ones listed.
  // The entries stay (LRU): a late reply of a terminating backend to an unconnected socket
  // still reads as the frontend.
  absl::flat_hash_set<std::tuple<uint64_t, uint32_t, uint16_t>> sockets;
  RETURN_IF_ERROR(
      sock_revnat_->ForEach([&](const sluice_sock4_revnat_key& k, const sluice_sock4_revnat& v) {
        if (backends.contains({v.rev_nat_id, k.addr, k.port})) {
          sockets.insert({k.cookie, k.addr, k.port});
        }
      }));
  if (sockets.empty()) return 0;
  return destroy_sockets_(sockets);
}

absl::Status BpfLbMaps::FlushAffinity(
    const absl::flat_hash_set<uint32_t>& rev_nat_ids,
    const absl::flat_hash_set<std::pair<uint32_t, uint32_t>>& backends) {
  RETURN_IF_ERROR(Flush());
  if (aff_ == nullptr) return absl::OkStatus();
  std::vector<sluice_lb4_affinity_key> doomed;
  RETURN_IF_ERROR(
      aff_->ForEach([&](const sluice_lb4_affinity_key& k, const sluice_lb4_affinity& v) {
        if (rev_nat_ids.contains(k.rev_nat_id) || backends.contains({k.rev_nat_id, v.backend_id}))
          doomed.push_back(k);
      }));
  for (const auto& k : doomed) RETURN_IF_ERROR(aff_->Delete(k));
  return absl::OkStatus();
}

absl::Status BpfLbMaps::ForEachService(
    const std::function<void(const sluice_lb4_key&, const sluice_lb4_service&)>& fn) {
  RETURN_IF_ERROR(Flush());
  if (!records_) return svc_.ForEach(fn);
  // The reconciler sees its own entries: masters without the records this adds.
  records_->BeginRestore();
  RETURN_IF_ERROR(svc_.ForEach([&](const sluice_lb4_key& k, const sluice_lb4_service& v) {
    fn(k, records_->Restored(k, v));
  }));
  records_->EndRestore();
  return absl::OkStatus();
}
absl::Status BpfLbMaps::ForEachBackend(
    const std::function<void(uint32_t, const sluice_lb4_backend&)>& fn) {
  RETURN_IF_ERROR(Flush());
  return be_.ForEach([&](const __u32& id, const sluice_lb4_backend& v) { fn(id, v); });
}
absl::Status BpfLbMaps::ForEachRevNat(
    const std::function<void(uint32_t, const sluice_lb4_revnat&)>& fn) {
  RETURN_IF_ERROR(Flush());
  return rnat_.ForEach([&](const __u32& id, const sluice_lb4_revnat& v) { fn(id, v); });
}
absl::Status BpfLbMaps::ForEachSourceRange(
    const std::function<void(const sluice_lb4_srcrange_key&)>& fn) {
  RETURN_IF_ERROR(Flush());
  return srcr_.ForEach([&](const sluice_lb4_srcrange_key& k, const __u8&) { fn(k); });
}

absl::Status BpfLbMaps::VouchNonBackendPorts() {
  if (!nbport_) return absl::OkStatus();
  absl::flat_hash_set<uint16_t> ports;
  RETURN_IF_ERROR(
      ForEachBackend([&](uint32_t, const sluice_lb4_backend& v) { ports.insert(v.port); }));
  absl::StatusOr<size_t> n = nbport_->Vouch(ports, {&ct_, ct_tcp_});
  if (!n.ok()) return n.status();
  spdlog::info("services: {} ports vouched free of backends ({} backend ports)", *n, ports.size());
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// ServiceReconciler

absl::StatusOr<std::unique_ptr<ServiceReconciler>> ServiceReconciler::Create(LbMaps& maps) {
  std::unique_ptr<ServiceReconciler> r(new ServiceReconciler(maps));
  RETURN_IF_ERROR(r->Restore());
  return r;
}

absl::Status ServiceReconciler::Count(absl::Status st, bool is_delete) {
  if (!st.ok()) {
    ++stats_.errors;
  } else if (is_delete) {
    ++stats_.map_deletes;
  } else {
    ++stats_.map_updates;
  }
  return st;
}

void ServiceReconciler::SetClusterIpLocked(const FrontendKey& key, Frontend& fe, bool cluster_ip) {
  if (fe.cluster_ip == cluster_ip) return;
  uint32_t addr = std::get<0>(key);
  if (cluster_ip) {
    if (++cluster_ip_refs_[addr] == 1 && !wildcards_.contains(addr)) ++wildcards_missing_;
  } else if (--cluster_ip_refs_[addr] <= 0) {
    cluster_ip_refs_.erase(addr);
    if (!wildcards_.contains(addr)) --wildcards_missing_;
  }
  fe.cluster_ip = cluster_ip;
  wildcard_dirty_.insert(addr);
}

absl::Status ServiceReconciler::Restore() {
  absl::MutexLock l(&mu_);
  std::map<FrontendKey, std::map<uint16_t, uint32_t>> slots;
  uint32_t max_rnat = 0, max_be = 0;
  RETURN_IF_ERROR(maps_.ForEachService([&](const sluice_lb4_key& k, const sluice_lb4_service& v) {
    FrontendKey fk{k.addr, ntohs(k.dport), k.proto, k.scope};
    if (k.backend_slot != 0) {
      slots[fk][k.backend_slot] = v.backend_id;
      return;
    }
    if (k.dport == 0 && k.proto == 0) {
      wildcards_[k.addr] = true;
      return;
    }
    Frontend& fe = frontends_[fk];
    fe.master = v;
    fe.rev_nat_id = v.rev_nat_id;
    // Its table (if any) stays until the frontend is claimed (and written again) or pruned.
    fe.maglev_table = (v.flags & SLUICE_SVC_F_MAGLEV) != 0;
  }));
  for (auto& [fk, fe] : frontends_) {
    if (fe.rev_nat_id == 0 || !rev_nat_ids_.insert(fe.rev_nat_id).second) {
      // A master without a usable id of its own: rewritten (with a fresh id) once claimed.
      spdlog::warn("services: restored frontend with rev_nat_id {} already in use", fe.rev_nat_id);
      fe.rev_nat_id = 0;
      fe.master.reset();
    }
    max_rnat = std::max(max_rnat, fe.rev_nat_id);
    SetClusterIpLocked(fk, fe, fe.master && (fe.master->flags & kNotClusterIpFlags) == 0);
  }
  for (auto& [fk, by_slot] : slots) {
    auto it = frontends_.find(fk);
    if (it == frontends_.end()) {
      for (const auto& [slot, id] : by_slot) stale_slots_.insert({fk, slot});
      continue;
    }
    Frontend& fe = it->second;
    fe.slots.assign(by_slot.rbegin()->first, 0);
    slots_total_ += static_cast<int64_t>(fe.slots.size());
    for (const auto& [slot, id] : by_slot) fe.slots[slot - 1] = id;
  }
  RETURN_IF_ERROR(maps_.ForEachBackend([&](uint32_t id, const sluice_lb4_backend& v) {
    BackendKey bk{v.addr, ntohs(v.port), v.proto};
    backends_[id] = Backend{bk, v.flags, 0, true};
    backend_ids_.try_emplace(bk, id);
    max_be = std::max(max_be, id);
  }));
  for (auto& [fk, fe] : frontends_) {
    for (uint32_t id : fe.slots) {
      if (id == 0 || !backends_.contains(id) || !fe.held.insert(id).second) continue;
      ++backends_[id].refs;
    }
  }
  absl::flat_hash_map<uint32_t, Frontend*> by_rnat;
  for (auto& [fk, fe] : frontends_) {
    if (fe.rev_nat_id != 0) by_rnat[fe.rev_nat_id] = &fe;
  }
  RETURN_IF_ERROR(maps_.ForEachRevNat([&](uint32_t id, const sluice_lb4_revnat& v) {
    max_rnat = std::max(max_rnat, id);
    auto it = by_rnat.find(id);
    if (it == by_rnat.end()) {
      stale_rnat_.insert(id);
    } else {
      it->second->rnat = v;
    }
  }));
  RETURN_IF_ERROR(maps_.ForEachSourceRange([&](const sluice_lb4_srcrange_key& k) {
    uint32_t id = ntohl(k.rev_nat_id);
    RangeKey rk{id, static_cast<uint8_t>(k.prefixlen - 32), k.addr};
    auto it = by_rnat.find(id);
    if (k.prefixlen < 32 || it == by_rnat.end()) {
      stale_ranges_.insert(rk);
    } else {
      if (it->second->ranges.insert(rk).second) ++ranges_total_;
    }
  }));
  next_rev_nat_id_ = max_rnat >= kMaxId ? 1 : max_rnat + 1;
  next_backend_id_ = max_be >= MaxBackendId() ? 1 : max_be + 1;
  wildcard_dirty_.clear();
  spdlog::info("services: restored {} frontends, {} backends, {} wildcard masters from the maps",
               frontends_.size(), backends_.size(), wildcards_.size());
  return absl::OkStatus();
}

uint32_t ServiceReconciler::NextRevNatIdLocked() {
  // Fresh ids are never ones in use, nor (until wrapping) ones used before: a conntrack entry of
  // a deleted frontend must not name a new one.
  while (rev_nat_ids_.contains(next_rev_nat_id_) || stale_rnat_.contains(next_rev_nat_id_) ||
         next_rev_nat_id_ == 0) {
    next_rev_nat_id_ = next_rev_nat_id_ >= kMaxId ? 1 : next_rev_nat_id_ + 1;
  }
  uint32_t id = next_rev_nat_id_;
  next_rev_nat_id_ = id >= kMaxId ? 1 : id + 1;
  return id;
}

uint32_t ServiceReconciler::MaxBackendId() const {
  // sluice_lb4_be is indexed by id: ids run from 1 to its capacity.
  return std::min(kMaxId, capacity_.backends);
}

uint32_t ServiceReconciler::NextBackendIdLocked() {
  // The caller checked the room: with ids from 1 to max, one of them is free.
  const uint32_t max = std::max(MaxBackendId(), uint32_t{1});
  while (backends_.contains(next_backend_id_) || next_backend_id_ == 0 || next_backend_id_ > max) {
    next_backend_id_ = next_backend_id_ >= max ? 1 : next_backend_id_ + 1;
  }
  uint32_t id = next_backend_id_;
  next_backend_id_ = id >= max ? 1 : id + 1;
  return id;
}

absl::StatusOr<uint32_t> ServiceReconciler::AcquireBackendLocked(const LbBackend& b, Frontend& fe) {
  BackendKey bk{AddrBe(b.addr), b.port, b.proto};
  uint8_t flags = (b.terminating ? SLUICE_BE_F_TERMINATING : 0) | (b.local ? SLUICE_BE_F_LOCAL : 0);
  sluice_lb4_backend v{};
  v.addr = std::get<0>(bk);
  v.port = htons(b.port);
  v.proto = b.proto;
  v.flags = flags;
  uint32_t id;
  auto it = backend_ids_.find(bk);
  if (it != backend_ids_.end()) {
    id = it->second;
    Backend& be = backends_[id];
    if (!be.written || be.flags != flags) {
      RETURN_IF_ERROR(Count(maps_.UpdateBackend(id, v), false));
      be.flags = flags;
      be.written = true;
    }
  } else {
    id = NextBackendIdLocked();
    RETURN_IF_ERROR(Count(maps_.UpdateBackend(id, v), false));
    backends_[id] = Backend{bk, flags, 0, true};
    backend_ids_[bk] = id;
  }
  if (fe.held.insert(id).second) {
    ++backends_[id].refs;
    orphans_.erase(id);
  }
  return id;
}

void ServiceReconciler::FlushUdpBackendLocked(uint32_t rev_nat_id, uint32_t id) {
  flush_udp_.insert({rev_nat_id, id});
  auto it = backends_.find(id);
  if (it == backends_.end()) return;
  const auto& [addr, port, proto] = it->second.key;
  if (proto == IPPROTO_UDP) close_udp_.insert({rev_nat_id, addr, htons(port)});
}

void ServiceReconciler::ReleaseBackendLocked(uint32_t id, Frontend& fe) {
  if (fe.held.erase(id) == 0) return;
  if (fe.rev_nat_id != 0 && fe.master) FlushUdpBackendLocked(fe.rev_nat_id, id);
  auto it = backends_.find(id);
  if (it != backends_.end() && --it->second.refs <= 0) orphans_.insert(id);
}

absl::Status ServiceReconciler::ProgramFrontendLocked(const FrontendKey& key, Frontend& fe,
                                                      const LbFrontend& want,
                                                      const std::vector<uint32_t>& ids,
                                                      MaglevMemo* memo) {
  const auto [addr, port, proto, scope] = key;
  const uint32_t r = fe.rev_nat_id;
  // Reverse NAT before any slot can hand out a flow whose replies need it.
  sluice_lb4_revnat rn{};
  rn.addr = addr;
  rn.port = htons(port);
  if (!fe.rnat || !SameRevNat(*fe.rnat, rn)) {
    RETURN_IF_ERROR(Count(maps_.UpdateRevNat(r, rn), false));
    fe.rnat = rn;
  }
  std::set<RangeKey> want_ranges;
  for (const IpPrefix& p : want.source_ranges) {
    if (!p.network().is_v4()) continue;
    want_ranges.insert({r, static_cast<uint8_t>(p.length()), AddrBe(p.network())});
  }
  for (const RangeKey& rk : want_ranges) {
    if (fe.ranges.contains(rk)) continue;
    RETURN_IF_ERROR(Count(
        maps_.UpdateSourceRange(RangeMapKey(std::get<0>(rk), std::get<1>(rk), std::get<2>(rk))),
        false));
    fe.ranges.insert(rk);
    ++ranges_total_;
  }
  // Slots in place, then the master (count last), then what lies beyond the new count.
  const size_t n = ids.size();
  for (size_t i = 0; i < n; ++i) {
    if (i < fe.slots.size() && fe.slots[i] == ids[i]) continue;
    sluice_lb4_service slot{};
    slot.backend_id = ids[i];
    RETURN_IF_ERROR(Count(
        maps_.UpdateService(MapKey(addr, port, proto, scope, static_cast<uint16_t>(i + 1)), slot),
        false));
    if (fe.slots.size() <= i) {
      slots_total_ += static_cast<int64_t>(i + 1 - fe.slots.size());
      fe.slots.resize(i + 1, 0);
    }
    fe.slots[i] = ids[i];
  }
  // The Maglev table after the backends it names and before the master that sets the flag.
  const bool maglev = (want.flags & SLUICE_SVC_F_MAGLEV) && n > 0;
  if (maglev && (fe.maglev_ids != ids || fe.maglev_m != maglev_m_)) {
    std::vector<uint32_t> table;
    auto cached = memo != nullptr ? memo->find(ids) : MaglevMemo::iterator{};
    if (memo != nullptr && cached != memo->end()) {
      table = cached->second;
    } else {
      std::vector<MaglevBackend> identities;
      identities.reserve(n);
      for (size_t i = 0; i < n; ++i) {
        const LbBackend& b = want.backends[i];
        identities.push_back({AddrBe(b.addr), b.port, b.proto, 1});
      }
      std::vector<uint32_t> slots = MaglevTable(identities, maglev_m_);
      table.reserve(slots.size());
      for (uint32_t i : slots) table.push_back(ids[i]);
      if (memo != nullptr) memo->emplace(ids, table);
    }
    RETURN_IF_ERROR(Count(
        maps_.UpdateMaglevTable(MapKey(addr, port, proto, scope, 0), ids, table), false));
    fe.maglev_ids = ids;
    fe.maglev_m = maglev_m_;
    fe.maglev_table = true;
  }
  sluice_lb4_service master{};
  master.count = static_cast<uint16_t>(n);
  master.flags = want.flags;
  master.rev_nat_id = r;
  master.affinity_timeout = want.affinity_timeout;
  if (!fe.master || !SameMaster(*fe.master, master)) {
    RETURN_IF_ERROR(Count(maps_.UpdateService(MapKey(addr, port, proto, scope, 0), master), false));
    fe.master = master;
  }
  if (!maglev && fe.maglev_table) {
    RETURN_IF_ERROR(Count(maps_.DeleteMaglevTable(MapKey(addr, port, proto, scope, 0)), true));
    fe.maglev_ids.clear();
    fe.maglev_m = 0;
    fe.maglev_table = false;
  }
  while (fe.slots.size() > n) {
    if (fe.slots.back() != 0) {
      RETURN_IF_ERROR(Count(maps_.DeleteService(MapKey(addr, port, proto, scope,
                                                       static_cast<uint16_t>(fe.slots.size()))),
                            true));
    }
    fe.slots.pop_back();
    --slots_total_;
    ++room_.svc;
  }
  for (auto it = fe.ranges.begin(); it != fe.ranges.end();) {
    if (want_ranges.contains(*it)) {
      ++it;
      continue;
    }
    RETURN_IF_ERROR(Count(
        maps_.DeleteSourceRange(RangeMapKey(std::get<0>(*it), std::get<1>(*it), std::get<2>(*it))),
        true));
    it = fe.ranges.erase(it);
    --ranges_total_;
    ++room_.srcr;
  }
  absl::flat_hash_set<uint32_t> keep(ids.begin(), ids.end());
  std::vector<uint32_t> dropped;
  for (uint32_t id : fe.held) {
    if (!keep.contains(id)) dropped.push_back(id);
  }
  for (uint32_t id : dropped) {
    if (want.flags & SLUICE_SVC_F_AFFINITY) flush_affinity_backends_.insert({r, id});
    if (proto == IPPROTO_UDP) {
      ReleaseBackendLocked(id, fe);
    } else {
      fe.held.erase(id);
      auto it = backends_.find(id);
      if (it != backends_.end() && --it->second.refs <= 0) orphans_.insert(id);
    }
  }
  return absl::OkStatus();
}

absl::Status ServiceReconciler::RemoveFrontendLocked(const FrontendKey& key) {
  auto it = frontends_.find(key);
  if (it == frontends_.end()) return absl::OkStatus();
  Frontend& fe = it->second;
  const auto [addr, port, proto, scope] = key;
  // What FreeRoomLocked counts for it (written or not), free once the deletes below are done.
  const Room freed{.svc = 1 + static_cast<int64_t>(fe.slots.size()),
                   .rnat = 1,
                   .srcr = static_cast<int64_t>(fe.ranges.size())};
  if (fe.master) {
    RETURN_IF_ERROR(Count(maps_.DeleteService(MapKey(addr, port, proto, scope, 0)), true));
    if (fe.master->flags & SLUICE_SVC_F_AFFINITY) flush_affinity_.insert(fe.rev_nat_id);
    fe.master.reset();
  }
  if (fe.maglev_table) {
    RETURN_IF_ERROR(Count(maps_.DeleteMaglevTable(MapKey(addr, port, proto, scope, 0)), true));
    fe.maglev_table = false;
  }
  while (!fe.slots.empty()) {
    if (fe.slots.back() != 0) {
      RETURN_IF_ERROR(Count(maps_.DeleteService(MapKey(addr, port, proto, scope,
                                                       static_cast<uint16_t>(fe.slots.size()))),
                            true));
    }
    fe.slots.pop_back();
    --slots_total_;
  }
  if (fe.rnat) {
    RETURN_IF_ERROR(Count(maps_.DeleteRevNat(fe.rev_nat_id), true));
    fe.rnat.reset();
  }
  for (auto rit = fe.ranges.begin(); rit != fe.ranges.end();) {
    RETURN_IF_ERROR(Count(maps_.DeleteSourceRange(
                              RangeMapKey(std::get<0>(*rit), std::get<1>(*rit), std::get<2>(*rit))),
                          true));
    rit = fe.ranges.erase(rit);
    --ranges_total_;
  }
  std::vector<uint32_t> held(fe.held.begin(), fe.held.end());
  for (uint32_t id : held) {
    if (proto == IPPROTO_UDP && fe.rev_nat_id != 0) FlushUdpBackendLocked(fe.rev_nat_id, id);
    fe.held.erase(id);
    auto bit = backends_.find(id);
    if (bit != backends_.end() && --bit->second.refs <= 0) orphans_.insert(id);
  }
  SetClusterIpLocked(key, fe, false);
  rev_nat_ids_.erase(fe.rev_nat_id);
  if (!fe.service.empty()) {
    auto sit = by_service_.find(fe.service);
    if (sit != by_service_.end()) {
      sit->second.erase(key);
      if (sit->second.empty()) by_service_.erase(sit);
    }
  }
  frontends_.erase(it);
  ++stats_.frontends_removed;
  room_.svc += freed.svc;
  room_.rnat += freed.rnat;
  room_.srcr += freed.srcr;
  return absl::OkStatus();
}

absl::Status ServiceReconciler::DeleteOrphanBackendsLocked(bool all) {
  std::vector<uint32_t> doomed;
  if (all) {
    for (const auto& [id, be] : backends_) {
      if (be.refs <= 0) doomed.push_back(id);
    }
  } else {
    doomed.assign(orphans_.begin(), orphans_.end());
  }
  std::sort(doomed.begin(), doomed.end());
  for (uint32_t id : doomed) {
    auto it = backends_.find(id);
    if (it == backends_.end() || it->second.refs > 0) {
      orphans_.erase(id);
      continue;
    }
    // Also when not known to be written (after a failed batch): deleting an absent id is no
    // error.
    RETURN_IF_ERROR(Count(maps_.DeleteBackend(id), true));
    auto kit = backend_ids_.find(it->second.key);
    if (kit != backend_ids_.end() && kit->second == id) backend_ids_.erase(kit);
    backends_.erase(it);
    orphans_.erase(id);
    ++room_.be;
  }
  return absl::OkStatus();
}

absl::Status ServiceReconciler::SyncWildcardsLocked(bool prune) {
  std::set<uint32_t> check;
  if (prune) {
    for (const auto& [addr, restored] : wildcards_) check.insert(addr);
    for (const auto& [addr, n] : cluster_ip_refs_) check.insert(addr);
  }
  check.insert(wildcard_dirty_.begin(), wildcard_dirty_.end());
  for (uint32_t addr : check) {
    const bool want = cluster_ip_refs_.contains(addr);
    auto it = wildcards_.find(addr);
    if (want && (it == wildcards_.end() || rewrite_wildcards_)) {
      RETURN_IF_ERROR(
          Count(maps_.UpdateService(MapKey(addr, 0, 0, 0, 0), WildcardMaster()), false));
      if (wildcards_.insert_or_assign(addr, false).second) --wildcards_missing_;
    } else if (want) {
      it->second = false;
    } else if (it != wildcards_.end() && (!it->second || prune)) {
      RETURN_IF_ERROR(Count(maps_.DeleteService(MapKey(addr, 0, 0, 0, 0)), true));
      wildcards_.erase(it);
      ++room_.svc;
    }
    wildcard_dirty_.erase(addr);
  }
  rewrite_wildcards_ = false;
  return absl::OkStatus();
}

absl::Status ServiceReconciler::FlushLocked() {
  if (absl::Status st = maps_.Flush(); !st.ok()) {
    ++stats_.errors;
    ForgetWrittenLocked();
    return st;
  }
  if (!flush_udp_.empty()) {
    absl::StatusOr<size_t> n = maps_.FlushUdpFlows(flush_udp_);
    if (!n.ok()) {
      ++stats_.errors;
      return n.status();
    }
    stats_.ct_flushed += *n;
    flush_udp_.clear();
  }
  if (!close_udp_.empty()) {
    // Best effort: a socket that cannot be closed (a kernel without SOCK_DESTROY) keeps its
    // backend, as before; that is no reason to fail and retry the reconcile.
    absl::StatusOr<size_t> n = maps_.CloseUdpSockets(close_udp_);
    if (n.ok()) {
      stats_.udp_sockets_closed += *n;
      if (*n > 0) spdlog::info("services: closed {} connected UDP sockets of removed backends", *n);
    } else {
      ++stats_.udp_socket_close_failures;
      spdlog::warn("services: close connected UDP sockets of removed backends: {}",
                   n.status().ToString());
    }
    close_udp_.clear();
  }
  if (!flush_affinity_.empty() || !flush_affinity_backends_.empty()) {
    absl::Status st = maps_.FlushAffinity(flush_affinity_, flush_affinity_backends_);
    if (!st.ok()) {
      ++stats_.errors;
      return st;
    }
    flush_affinity_.clear();
    flush_affinity_backends_.clear();
  }
  return absl::OkStatus();
}

void ServiceReconciler::ForgetWrittenLocked() {
  for (auto& [fk, fe] : frontends_) {
    fe.rnat.reset();
    fe.master.reset();
    for (uint32_t& slot : fe.slots) {
      if (slot != 0) slot = kSlotUnknown;
    }
  }
  for (auto& [id, be] : backends_) be.written = false;
  for (const auto& [addr, restored] : wildcards_) wildcard_dirty_.insert(addr);
  for (const auto& [addr, n] : cluster_ip_refs_) wildcard_dirty_.insert(addr);
  rewrite_wildcards_ = true;
}

ServiceReconciler::Room ServiceReconciler::FreeRoomLocked() const {
  Room used;
  // Kept as counters, not walked: this runs at every Apply (a change per Service at 10k
  // frontends walked them all).
  used.svc = static_cast<int64_t>(stale_slots_.size() + wildcards_.size()) +
             wildcards_missing_ +  // wanted, written at the end of the pass
             static_cast<int64_t>(frontends_.size()) + slots_total_;
  used.srcr = ranges_total_;
  used.rnat = static_cast<int64_t>(frontends_.size() + stale_rnat_.size());
  used.srcr += static_cast<int64_t>(stale_ranges_.size());
  used.be = static_cast<int64_t>(backends_.size());
  return Room{.svc = static_cast<int64_t>(capacity_.services) - used.svc,
              .be = static_cast<int64_t>(capacity_.backends) - used.be,
              .rnat = static_cast<int64_t>(capacity_.rev_nat) - used.rnat,
              .srcr = static_cast<int64_t>(capacity_.source_ranges) - used.srcr};
}

absl::Status ServiceReconciler::ApplyOneLocked(const std::string& service,
                                               const std::optional<ServiceTranslation>& translation,
                                               bool admit_new) {
  // What this Service wants, by map key; a key another Service holds is left to it.
  std::map<FrontendKey, const LbFrontend*> want;
  blocked_.erase(service);
  std::vector<const LbFrontend*> wanted;
  if (translation) {
    for (const auto* list : {&translation->frontends, &translation->in_cluster_frontends}) {
      for (const LbFrontend& f : *list) wanted.push_back(&f);
    }
  }
  for (const LbFrontend* f : wanted) {
    if (!f->addr.is_v4()) continue;
    FrontendKey fk{AddrBe(f->addr), f->port, f->proto, f->scope};
    auto it = frontends_.find(fk);
    if (it != frontends_.end() && !it->second.service.empty() && it->second.service != service) {
      ++stats_.conflicts;
      blocked_.insert(service);
      spdlog::warn("services: {} {}:{} is already {}'s; skipped", service, f->addr.ToString(),
                   f->port, it->second.service);
      continue;
    }
    want.try_emplace(fk, f);
  }
  // Frontends the Service no longer has go first: their room is free for what it gains.
  if (auto sit = by_service_.find(service); sit != by_service_.end()) {
    std::vector<FrontendKey> gone;
    for (const FrontendKey& fk : sit->second) {
      if (!want.contains(fk)) gone.push_back(fk);
    }
    for (const FrontendKey& fk : gone) RETURN_IF_ERROR(RemoveFrontendLocked(fk));
  }
  // Decide what fits before writing anything: a frontend programmed already keeps its place
  // (and as many of its new backends as fit), a new one goes in whole or not at all.
  std::map<FrontendKey, UnprogrammedFrontend> refused;
  std::map<FrontendKey, size_t> take;  // backends to program, per frontend
  absl::flat_hash_set<BackendKey> reserved_be;  // new backends counted in this call
  std::set<uint32_t> reserved_wild;    // new wildcard masters counted in this call
  for (auto it = want.begin(); it != want.end();) {
    const auto& [fk, f] = *it;
    const size_t n = std::min<size_t>(f->backends.size(), std::numeric_limits<uint16_t>::max());
    UnprogrammedFrontend u{.service = service,
                           .addr = f->addr,
                           .port = f->port,
                           .proto = f->proto,
                           .scope = f->scope,
                           .backends_wanted = n};
    auto fit = frontends_.find(fk);
    if (fit == frontends_.end()) {
      if (!admit_new) {  // decided in order, with every other newcomer (AdmitPendingLocked)
        refused.emplace(fk, std::move(u));
        it = want.erase(it);
        continue;
      }
      Room need{.svc = 1 + static_cast<int64_t>(n), .rnat = 1};
      const uint32_t addr = std::get<0>(fk);
      const bool new_wild = (f->flags & kNotClusterIpFlags) == 0 &&
                            !cluster_ip_refs_.contains(addr) && !wildcards_.contains(addr) &&
                            !reserved_wild.contains(addr);
      if (new_wild) ++need.svc;
      absl::flat_hash_set<BackendKey> new_be;
      for (size_t i = 0; i < n; ++i) {
        const LbBackend& b = f->backends[i];
        BackendKey bk{AddrBe(b.addr), b.port, b.proto};
        if (!backend_ids_.contains(bk) && !reserved_be.contains(bk)) new_be.insert(bk);
      }
      need.be = static_cast<int64_t>(new_be.size());
      std::set<std::pair<uint32_t, int>> ranges;
      for (const IpPrefix& p : f->source_ranges) {
        if (p.network().is_v4()) ranges.insert({AddrBe(p.network()), p.length()});
      }
      need.srcr = static_cast<int64_t>(ranges.size());
      const char* full = need.rnat > room_.rnat   ? maps::name::sluice_lb4_rnat
                         : need.svc > room_.svc   ? maps::name::sluice_lb4_svc
                         : need.be > room_.be     ? maps::name::sluice_lb4_be
                         : need.srcr > room_.srcr ? maps::name::sluice_lb4_srcr
                                                  : nullptr;
      if (full != nullptr) {
        u.map = full;
        refused.emplace(fk, std::move(u));
        it = want.erase(it);
        continue;
      }
      room_.svc -= need.svc;
      room_.be -= need.be;
      room_.rnat -= need.rnat;
      room_.srcr -= need.srcr;
      reserved_be.insert(new_be.begin(), new_be.end());
      if (new_wild) reserved_wild.insert(std::get<0>(fk));
      take[fk] = n;
    } else {
      // Growth: each slot beyond the current count and each new backend needs room.
      const Frontend& fe = fit->second;
      size_t k = 0;
      const char* full = nullptr;
      for (; k < n; ++k) {
        const LbBackend& b = f->backends[k];
        BackendKey bk{AddrBe(b.addr), b.port, b.proto};
        const int64_t slot = k >= fe.slots.size() ? 1 : 0;
        const int64_t be = !backend_ids_.contains(bk) && !reserved_be.contains(bk) ? 1 : 0;
        if (slot > room_.svc) full = maps::name::sluice_lb4_svc;
        if (full == nullptr && be > room_.be) full = maps::name::sluice_lb4_be;
        if (full != nullptr) break;
        room_.svc -= slot;
        room_.be -= be;
        if (be != 0) reserved_be.insert(bk);
      }
      take[fk] = k;
      if (k < n) {
        u.map = full;
        u.truncated = true;
        u.backends_programmed = k;
        refused.emplace(fk, std::move(u));
      }
    }
    ++it;
  }
  // Claim (or create) the frontends and write their backends first.
  std::map<FrontendKey, std::vector<uint32_t>> ids;
  for (const auto& [fk, f] : want) {
    Frontend& fe = frontends_[fk];
    if (fe.service.empty()) {
      fe.service = service;
      by_service_[service].insert(fk);
    }
    if (fe.rev_nat_id == 0) {
      fe.rev_nat_id = NextRevNatIdLocked();
      rev_nat_ids_.insert(fe.rev_nat_id);
    }
    SetClusterIpLocked(fk, fe, (f->flags & kNotClusterIpFlags) == 0);
    std::vector<uint32_t>& v = ids[fk];
    size_t n = take[fk];
    if (f->backends.size() > std::numeric_limits<uint16_t>::max()) {
      spdlog::warn("services: {} {}:{} has {} backends; programming the first {}", service,
                   f->addr.ToString(), f->port, f->backends.size(), n);
    }
    for (size_t i = 0; i < n; ++i) {
      absl::StatusOr<uint32_t> id = AcquireBackendLocked(f->backends[i], fe);
      if (!id.ok()) return id.status();
      v.push_back(*id);
    }
  }
  MaglevMemo memo;
  for (const auto& [fk, f] : want) {
    RETURN_IF_ERROR(ProgramFrontendLocked(fk, frontends_[fk], *f, ids[fk], &memo));
  }
  // What did not fit: logged once per frontend (and again only after it was programmed whole).
  for (const auto& [fk, f] : want) {
    if (!refused.contains(fk)) refusal_logged_.erase({service, fk});
  }
  for (const auto& [fk, u] : refused) {
    if (u.map.empty() || !refusal_logged_.insert({service, fk}).second) continue;
    if (u.truncated) {
      spdlog::warn("services: {} {}:{}/{}: {} is full; programmed {} of {} backends", service,
                   u.addr.ToString(), u.port, u.proto, u.map, u.backends_programmed,
                   u.backends_wanted);
    } else {
      spdlog::warn("services: {} {}:{}/{}: {} is full; frontend not programmed", service,
                   u.addr.ToString(), u.port, u.proto, u.map);
    }
  }
  if (refused.empty()) {
    pending_.erase(service);
  } else {
    Pending& p = pending_[service];
    if (!admit_new) p.translation = translation;  // AdmitPendingLocked keeps its own
    p.refused = std::move(refused);
    if (!admit_new) new_pending_.insert(service);
  }
  if (!translation) {
    for (auto it = refusal_logged_.lower_bound({service, FrontendKey{}});
         it != refusal_logged_.end() && std::get<0>(*it) == service;) {
      it = refusal_logged_.erase(it);
    }
  }
  RETURN_IF_ERROR(DeleteOrphanBackendsLocked(/*all=*/false));
  return SyncWildcardsLocked(/*prune=*/false);
}

absl::Status ServiceReconciler::AdmitPendingLocked() {
  const bool grew = !room_tried_ || room_.svc > room_tried_->svc || room_.be > room_tried_->be ||
                    room_.rnat > room_tried_->rnat || room_.srcr > room_tried_->srcr;
  // Pending Services to try (a null translation) merged with ApplyAll's fresh ones, by name.
  std::vector<std::pair<std::string, const std::optional<ServiceTranslation>*>> order;
  order.reserve(fresh_.size() + pending_.size());
  auto fresh = fresh_.begin();
  for (const auto& [service, p] : pending_) {
    if (!grew && !new_pending_.contains(service)) continue;
    for (; fresh != fresh_.end() && *fresh->first < service; ++fresh) {
      order.emplace_back(*fresh->first, fresh->second);
    }
    order.emplace_back(service, nullptr);
  }
  for (; fresh != fresh_.end(); ++fresh) order.emplace_back(*fresh->first, fresh->second);
  fresh_.clear();
  new_pending_.clear();
  absl::Status first;
  for (const auto& [service, fresh_translation] : order) {
    if (fresh_translation != nullptr) {
      // Nothing of it is programmed: every frontend is a newcomer, decided here in order.
      absl::Status st = ApplyOneLocked(service, *fresh_translation, /*admit_new=*/true);
      if (auto again = pending_.find(service); again != pending_.end()) {
        again->second.translation = *fresh_translation;  // kept to retry when room appears
      }
      if (!st.ok() && first.ok()) {
        first = absl::Status(st.code(), absl::StrCat(service, ": ", st.message()));
      }
      continue;
    }
    auto it = pending_.find(service);
    if (it == pending_.end()) continue;
    const bool truncated = std::any_of(it->second.refused.begin(), it->second.refused.end(),
                                       [](const auto& r) { return r.second.truncated; });
    if ((room_.rnat < 1 || room_.svc < 1) && (!truncated || room_.svc < 1)) {
      // Not even a frontend without backends fits (nor, without room in sluice_lb4_svc, a slot
      // of a truncated one): refuse what is undecided without a walk.
      const char* full = room_.rnat < 1 ? maps::name::sluice_lb4_rnat : maps::name::sluice_lb4_svc;
      for (auto& [fk, u] : it->second.refused) {
        if (!u.map.empty()) continue;
        u.map = full;
        if (refusal_logged_.insert({service, fk}).second) {
          spdlog::warn("services: {} {}:{}/{}: {} is full; frontend not programmed", service,
                       u.addr.ToString(), u.port, u.proto, u.map);
        }
      }
      continue;
    }
    // ApplyOneLocked replaces the entry: keep the translation out of it meanwhile.
    std::optional<ServiceTranslation> t = std::move(it->second.translation);
    it->second.translation.reset();
    absl::Status st = ApplyOneLocked(service, t, /*admit_new=*/true);
    if (auto again = pending_.find(service); again != pending_.end()) {
      again->second.translation = std::move(t);
    }
    if (!st.ok() && first.ok()) {
      first = absl::Status(st.code(), absl::StrCat(service, ": ", st.message()));
    }
  }
  room_tried_ = room_;
  return first;
}

bool ServiceReconciler::FreshLocked(const std::string& service,
                                    const ServiceTranslation& translation) const {
  if (by_service_.contains(service) || pending_.contains(service)) return false;
  for (const auto* list : {&translation.frontends, &translation.in_cluster_frontends}) {
    for (const LbFrontend& f : *list) {
      if (!f.addr.is_v4()) continue;
      if (frontends_.contains(FrontendKey{AddrBe(f.addr), f.port, f.proto, f.scope})) return false;
    }
  }
  return true;
}

absl::Status ServiceReconciler::Apply(const std::string& service,
                                      const std::optional<ServiceTranslation>& translation) {
  absl::MutexLock l(&mu_);
  room_ = FreeRoomLocked();
  new_pending_.clear();
  absl::Status st = ApplyOneLocked(service, translation, /*admit_new=*/false);
  if (st.ok()) st = AdmitPendingLocked();
  // A failed write may have been a batch that the maps flushed on the way.
  if (!st.ok()) ForgetWrittenLocked();
  absl::Status flushed = FlushLocked();
  return st.ok() ? flushed : st;
}

absl::Status ServiceReconciler::ApplyAll(
    const std::vector<std::pair<std::string, std::optional<ServiceTranslation>>>& changes) {
  absl::MutexLock l(&mu_);
  room_ = FreeRoomLocked();
  new_pending_.clear();
  fresh_.clear();
  absl::Status first;
  for (const auto& [service, translation] : changes) {
    if (translation && FreshLocked(service, *translation)) {
      fresh_.emplace_back(&service, &translation);
      continue;
    }
    absl::Status st = ApplyOneLocked(service, translation, /*admit_new=*/false);
    if (!st.ok() && first.ok()) {
      first = absl::Status(st.code(), absl::StrCat(service, ": ", st.message()));
    }
  }
  // By name; a Service named twice is applied as its last change.
  std::stable_sort(fresh_.begin(), fresh_.end(),
                   [](const auto& a, const auto& b) { return *a.first < *b.first; });
  for (size_t i = 0; i + 1 < fresh_.size();) {
    if (*fresh_[i].first == *fresh_[i + 1].first) {
      fresh_.erase(fresh_.begin() + static_cast<ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  if (first.ok()) {
    first = AdmitPendingLocked();
  } else {
    // Not admitted now: they wait (undecided) in pending_ as any newcomer refused by a pass.
    for (const auto& [service, translation] : fresh_) {
      ApplyOneLocked(*service, *translation, /*admit_new=*/false).IgnoreError();
    }
  }
  fresh_.clear();
  if (!first.ok()) ForgetWrittenLocked();
  absl::Status flushed = FlushLocked();
  return first.ok() ? flushed : first;
}

absl::Status ServiceReconciler::PruneStale() {
  absl::MutexLock l(&mu_);
  room_ = FreeRoomLocked();
  std::vector<FrontendKey> unclaimed;
  for (const auto& [fk, fe] : frontends_) {
    if (fe.service.empty()) unclaimed.push_back(fk);
  }
  for (const FrontendKey& fk : unclaimed) RETURN_IF_ERROR(RemoveFrontendLocked(fk));
  for (auto it = stale_slots_.begin(); it != stale_slots_.end();) {
    const auto& [fk, slot] = *it;
    const auto [addr, port, proto, scope] = fk;
    RETURN_IF_ERROR(Count(maps_.DeleteService(MapKey(addr, port, proto, scope, slot)), true));
    it = stale_slots_.erase(it);
    ++room_.svc;
  }
  for (auto it = stale_rnat_.begin(); it != stale_rnat_.end();) {
    RETURN_IF_ERROR(Count(maps_.DeleteRevNat(*it), true));
    it = stale_rnat_.erase(it);
    ++room_.rnat;
  }
  for (auto it = stale_ranges_.begin(); it != stale_ranges_.end();) {
    RETURN_IF_ERROR(Count(
        maps_.DeleteSourceRange(RangeMapKey(std::get<0>(*it), std::get<1>(*it), std::get<2>(*it))),
        true));
    it = stale_ranges_.erase(it);
    ++room_.srcr;
  }
  // Maglev tables of no frontend that has one (left by a frontend gone while the agent was
  // down), deleted before the backends they may name.
  std::vector<sluice_lb4_key> stale_tables;
  RETURN_IF_ERROR(maps_.ForEachMaglevTable([&](const sluice_lb4_key& k) {
    auto it = frontends_.find(FrontendKey{k.addr, ntohs(k.dport), k.proto, k.scope});
    if (it == frontends_.end() || !it->second.maglev_table) stale_tables.push_back(k);
  }));
  for (const sluice_lb4_key& k : stale_tables) {
    RETURN_IF_ERROR(Count(maps_.DeleteMaglevTable(k), true));
  }
  RETURN_IF_ERROR(DeleteOrphanBackendsLocked(/*all=*/true));
  RETURN_IF_ERROR(SyncWildcardsLocked(/*prune=*/true));
  if (!unclaimed.empty()) {
    spdlog::info("services: pruned {} stale frontends", unclaimed.size());
  }
  // What was stale made room for what waits.
  absl::Status st = AdmitPendingLocked();
  if (!st.ok()) ForgetWrittenLocked();
  absl::Status flushed = FlushLocked();
  if (st.ok()) st = flushed;
  // The maps now hold every Service and only those: vouch for the ports no backend is on.
  if (st.ok()) {
    st = maps_.VouchNonBackendPorts();
    if (!st.ok()) ++stats_.errors;
  }
  return st;
}

void ServiceReconciler::SetMaglevTableSize(uint32_t m) {
  absl::MutexLock l(&mu_);
  maglev_m_ = m;
}

uint32_t ServiceReconciler::RevNatId(const IpAddress& addr, uint16_t port, uint8_t proto,
                                     uint8_t scope) const {
  absl::MutexLock l(&mu_);
  auto it = frontends_.find(FrontendKey{AddrBe(addr), port, proto, scope});
  return it == frontends_.end() ? 0 : it->second.rev_nat_id;
}

uint32_t ServiceReconciler::BackendId(const IpAddress& addr, uint16_t port, uint8_t proto) const {
  absl::MutexLock l(&mu_);
  auto it = backend_ids_.find(BackendKey{AddrBe(addr), port, proto});
  return it == backend_ids_.end() ? 0 : it->second;
}

std::vector<std::string> ServiceReconciler::Services() const {
  absl::MutexLock l(&mu_);
  std::vector<std::string> out;
  for (const auto& [s, keys] : by_service_) out.push_back(s);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> ServiceReconciler::BlockedServices() const {
  absl::MutexLock l(&mu_);
  return std::vector<std::string>(blocked_.begin(), blocked_.end());
}

std::vector<UnprogrammedFrontend> ServiceReconciler::Unprogrammed(size_t limit,
                                                                  size_t* total) const {
  absl::MutexLock l(&mu_);
  std::vector<UnprogrammedFrontend> out;
  size_t n = 0;
  for (const auto& [service, p] : pending_) {
    for (const auto& [fk, u] : p.refused) {
      if (u.map.empty()) continue;  // undecided (a failed pass): listed once decided
      if (out.size() < limit) out.push_back(u);
      ++n;
    }
  }
  if (total != nullptr) *total = n;
  return out;
}

std::map<std::string, ServiceReconciler::UnprogrammedCount> ServiceReconciler::UnprogrammedByMap()
    const {
  absl::MutexLock l(&mu_);
  std::map<std::string, UnprogrammedCount> out;
  for (const char* m : {maps::name::sluice_lb4_svc, maps::name::sluice_lb4_be,
                        maps::name::sluice_lb4_rnat, maps::name::sluice_lb4_srcr}) {
    out[m];
  }
  for (const auto& [service, p] : pending_) {
    for (const auto& [fk, u] : p.refused) {
      if (u.map.empty()) continue;  // undecided (a failed pass): counted once decided
      UnprogrammedCount& c = out[u.map];
      ++(u.truncated ? c.truncated : c.refused);
    }
  }
  return out;
}

uint64_t ServiceReconciler::FrontendsRemoved() const {
  absl::MutexLock l(&mu_);
  return stats_.frontends_removed;
}

ServiceReconcilerStats ServiceReconciler::stats() const {
  absl::MutexLock l(&mu_);
  ServiceReconcilerStats s = stats_;
  s.frontends = 0;
  int64_t slots = 0, ranges = 0, missing = 0;
  for (const auto& [fk, fe] : frontends_) {
    if (!fe.service.empty()) ++s.frontends;
    slots += static_cast<int64_t>(fe.slots.size());
    ranges += static_cast<int64_t>(fe.ranges.size());
  }
  for (const auto& [addr, n] : cluster_ip_refs_) missing += wildcards_.contains(addr) ? 0 : 1;
  if (slots != slots_total_ || ranges != ranges_total_ || missing != wildcards_missing_) {
    // FreeRoomLocked's counters are a broken invariant: count it where every test looks.
    spdlog::error(
        "services: room counters drifted: slots {} / {}, ranges {} / {}, wildcards {} / {}",
        slots_total_, slots, ranges_total_, ranges, wildcards_missing_, missing);
    ++s.errors;
  }
  s.backends = backends_.size();
  for (const auto& [service, p] : pending_) {
    for (const auto& [fk, u] : p.refused) ++(u.truncated ? s.truncated : s.unprogrammed);
  }
  return s;
}

}  // namespace sluice::agent
