// Control-plane time to program N Services x E endpoints through the agent's ServiceReconciler
// (agent/service/reconciler.h) on a freshly loaded Datapath: the same synthetic cluster as
// lb_cluster.h, given to the reconciler as translator output (ServiceTranslation per Service);
// the translations are built before the clock starts, so the figure is ApplyAll: id allocation,
// the diff against the (empty) maps and the hitless-ordered map writes.
//
// With --floor, the same process then loads a second Datapath (on DIR-floor) and writes the
// entries the reconciler wrote (backends, reverse NAT, slot records, slots, masters, wildcard
// masters), built before the clock starts, straight through the maps' UpdateBatch: stores into
// sluice_lb4_be's mapped slots, one BPF_MAP_UPDATE_BATCH per map and per kMaxPending entries, as
// BpfLbMaps issues them. That is the physical limit of the reconciler's writes on this kernel; the
// ratio reconciler / floor is printed. It also writes the backends into a hash map made as
// sluice_lb4_be was before it became a slot array (BPF_F_NO_PREALLOC): old_layout_floor_ms is
// the limit the earlier layout put on the same programming, measured in the same run.
//
// usage: sluice_reconcile_setup --bpffs=DIR --services=N --per-service=E [--floor]
#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/service/reconciler.h"
#include "lb_cluster.h"
#include "loader/datapath.h"

namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "sluice_reconcile_setup: %s\n", what.c_str());
  std::exit(1);
}

sluice::agent::IpAddress Addr(uint32_t be) {
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &be, buf, sizeof(buf));
  auto a = sluice::agent::IpAddress::Parse(buf);
  if (!a.ok()) Die(a.status().ToString());
  return *a;
}

// Reads every entry of `from` and writes them into a fresh Datapath on `dir` with
// BPF_MAP_UPDATE_BATCH (backends and reverse NAT before the service entries, in chunks of
// BpfLbMaps::kMaxPending); returns the time of the writes alone.
template <typename M, typename K, typename V>
void Collect(M& map, std::vector<K>* keys, std::vector<V>* values) {
  if (auto st = map.ForEach([&](const K& k, const V& v) {
        keys->push_back(k);
        values->push_back(v);
      });
      !st.ok()) {
    Die(st.ToString());
  }
}

template <typename M, typename K, typename V>
void WriteBatches(M& map, const std::vector<K>& keys, const std::vector<V>& values) {
  constexpr size_t kChunk = sluice::agent::BpfLbMaps::kMaxPending;
  for (size_t at = 0; at < keys.size(); at += kChunk) {
    size_t n = std::min(kChunk, keys.size() - at), done = 0;
    if (auto st = map.UpdateBatch(keys.data() + at, values.data() + at, n, &done); !st.ok())
      Die(absl::StrCat("floor: ", st.ToString()));
  }
}

struct Floor {
  double ms = 0;             // this layout
  double old_layout_ms = 0;  // backends in a hash map instead of the slot array
};

Floor FloorMs(const std::string& dir, sluice::loader::Datapath& from) {
  std::vector<uint32_t> be_ids, rnat_ids;
  std::vector<sluice_lb4_backend> be_values;
  std::vector<sluice_lb4_revnat> rnat_values;
  std::vector<sluice_lb4_key> svc_keys;
  std::vector<sluice_lb4_service> svc_values;
  Collect(from.lb4_backends(), &be_ids, &be_values);
  Collect(from.lb4_revnat(), &rnat_ids, &rnat_values);
  Collect(from.lb4_services(), &svc_keys, &svc_values);
  // The slot records the masters name (agent/service/slot_records.h), written before them.
  std::vector<uint32_t> rec_ids;
  std::vector<sluice_lb4_slot_record> rec_values;
  for (size_t i = 0; i < svc_keys.size(); ++i) {
    if (svc_keys[i].backend_slot != 0 || svc_values[i].backend_id == 0) continue;
    auto rec = from.lb4_slot_records().Lookup(svc_values[i].backend_id);
    if (!rec.ok()) Die(absl::StrCat("floor: slot record: ", rec.status().ToString()));
    rec_ids.push_back(svc_values[i].backend_id);
    rec_values.push_back(*rec);
  }
  auto dp = sluice::loader::Datapath::Load(dir);
  if (!dp.ok()) Die(absl::StrCat("Datapath::Load (floor): ", dp.status().ToString()));
  LIBBPF_OPTS(bpf_map_create_opts, opts, .map_flags = BPF_F_NO_PREALLOC);
  int fd = bpf_map_create(BPF_MAP_TYPE_HASH, "old_lb4_be", sizeof(uint32_t),
                          sizeof(sluice_lb4_backend), (*dp)->lb4_backends().size(), &opts);
  if (fd < 0) Die(absl::StrCat("create the old layout's backend map: ", std::strerror(errno)));
  sluice::maps::Map<uint32_t, sluice_lb4_backend> old_be{sluice::maps::MapFd(fd)};
  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  auto t0 = Clock::now();
  WriteBatches((*dp)->lb4_backends(), be_ids, be_values);
  auto t1 = Clock::now();
  WriteBatches((*dp)->lb4_revnat(), rnat_ids, rnat_values);
  WriteBatches((*dp)->lb4_slot_records(), rec_ids, rec_values);
  WriteBatches((*dp)->lb4_services(), svc_keys, svc_values);
  auto t2 = Clock::now();
  WriteBatches(old_be, be_ids, be_values);
  auto t3 = Clock::now();
  return Floor{.ms = ms(t2 - t0), .old_layout_ms = ms(t2 - t1) + ms(t3 - t2)};
}

}  // namespace

int main(int argc, char** argv) {
  using namespace sluice;
  std::string bpffs;
  uint32_t services = 0, per_service = 10;
  bool floor = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--bpffs=", 0) == 0)
      bpffs = a.substr(8);
    else if (a.rfind("--services=", 0) == 0)
      services = std::strtoul(a.c_str() + 11, nullptr, 10);
    else if (a.rfind("--per-service=", 0) == 0)
      per_service = std::strtoul(a.c_str() + 14, nullptr, 10);
    else if (a == "--floor")
      floor = true;
    else
      Die(absl::StrCat("unknown argument ", a));
  }
  if (bpffs.empty() || services == 0) Die("need --bpffs and --services");

  auto dp = loader::Datapath::Load(bpffs);
  if (!dp.ok()) Die(absl::StrCat("Datapath::Load: ", dp.status().ToString()));
  auto& d = **dp;
  agent::BpfLbMaps maps(d.lb4_services(), d.lb4_backends(), d.lb4_revnat(), d.lb4_source_ranges(),
                        d.ct4_any(), &d.lb4_affinity(), &d.ct4(), &d.lb4_non_backend_ports(),
                        &d.lb4_slot_records());

  std::vector<std::pair<std::string, std::optional<agent::ServiceTranslation>>> changes;
  changes.reserve(services);
  for (uint32_t i = 0; i < services; ++i) {
    agent::LbFrontend f;
    f.service = absl::StrCat("ns", i, "/svc", i);
    f.port_name = "p80";
    f.addr = Addr(bench::ClusterIp(i));
    f.port = bench::kServicePort;
    f.proto = IPPROTO_TCP;
    f.scope = SLUICE_LB_SCOPE_EXTERNAL;
    for (uint32_t j = 0; j < per_service; ++j) {
      agent::LbBackend b;
      b.addr = Addr(bench::BackendIp(i, j, per_service));
      b.port = bench::kBackendPort;
      b.proto = IPPROTO_TCP;
      f.backends.push_back(b);
    }
    agent::ServiceTranslation t;
    t.frontends.push_back(std::move(f));
    changes.emplace_back(absl::StrCat("ns", i, "/svc", i), std::move(t));
  }

  auto t0 = std::chrono::steady_clock::now();
  auto rec = agent::ServiceReconciler::Create(maps);
  if (!rec.ok()) Die(rec.status().ToString());
  if (auto st = (*rec)->ApplyAll(changes); !st.ok()) Die(st.ToString());
  auto t1 = std::chrono::steady_clock::now();
  auto stats = (*rec)->stats();
  auto svc_entries = d.lb4_services().Count();
  const double reconcile_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  std::printf(
      "reconcile_ms=%.1f services=%u per_service=%u map_updates=%llu errors=%llu "
      "frontends=%zu backends=%zu svc_entries=%zu\n",
      reconcile_ms, services, per_service, static_cast<unsigned long long>(stats.map_updates),
      static_cast<unsigned long long>(stats.errors), stats.frontends, stats.backends,
      svc_entries.ok() ? *svc_entries : 0);
  if (stats.errors != 0) return 1;
  if (floor) {
    const Floor f = FloorMs(bpffs + "-floor", d);
    std::printf(
        "floor_ms=%.1f reconcile_x_floor=%.2f old_layout_floor_ms=%.1f "
        "reconcile_x_old_layout_floor=%.2f\n",
        f.ms, reconcile_ms / f.ms, f.old_layout_ms, reconcile_ms / f.old_layout_ms);
  }
  return 0;
}
