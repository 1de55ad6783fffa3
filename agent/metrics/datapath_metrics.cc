#include "agent/metrics/datapath_metrics.h"

#include <bpf/bpf.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "agent/base/errno.h"
#include "loader/datapath.h"
#include "maps/sluice_maps.h"
#include "spdlog/spdlog.h"

namespace sluice::metrics {
namespace {

bool IsArray(uint32_t type) {
  return type == BPF_MAP_TYPE_ARRAY || type == BPF_MAP_TYPE_PERCPU_ARRAY;
}

// Keys counted with get_next_key: one syscall per entry, no values copied.
absl::StatusOr<uint64_t> CountEntries(int fd, uint32_t key_size, const std::atomic<bool>* stop) {
  std::vector<uint8_t> cur(key_size), next(key_size);
  uint64_t n = 0;
  void* prev = nullptr;
  while (bpf_map_get_next_key(fd, prev, next.data()) == 0) {
    if (++n % 4096 == 0 && stop != nullptr && stop->load(std::memory_order_relaxed)) {
      return absl::CancelledError("map count cancelled");
    }
    cur.swap(next);
    prev = cur.data();
  }
  if (errno != ENOENT) return ErrnoStatus(errno, "map iterate");
  return n;
}

void OnUpdateFailure(int fd, int err) {
  bpf_map_info info{};
  uint32_t len = sizeof(info);
  std::string name = "unknown";
  if (bpf_obj_get_info_by_fd(fd, &info, &len) == 0) name = MapNameOf(info.name);
  const char* e = strerrorname_np(err);
  Default()
      .GetCounter("sluice_bpf_map_update_errors_total",
                  "Map writes by the agent the kernel refused (E2BIG: the map is full), per map "
                  "and errno",
                  {{"map_name", name}, {"errno", e != nullptr ? e : absl::StrCat(err)}})
      .Inc();
}

}  // namespace

std::string MapNameOf(const char* kernel_name) {
  const size_t n = strnlen(kernel_name, BPF_OBJ_NAME_LEN);
  for (const char* full : maps::kAllMapNames) {
    if (strlen(full) == n ? strncmp(full, kernel_name, n) == 0
                          : (n == BPF_OBJ_NAME_LEN - 1 && strncmp(full, kernel_name, n) == 0)) {
      return full;
    }
  }
  return std::string(kernel_name, n);
}

void CountMapUpdateFailures() { maps::update_failure_hook.store(&OnUpdateFailure); }

absl::StatusOr<std::vector<MapFill>> ReadMapFill(const std::string& bpffs_root,
                                                 const std::atomic<bool>* stop) {
  std::vector<MapFill> out;
  for (const char* name : maps::kAllMapNames) {
    std::string path = maps::PinPath(bpffs_root, name);
    int fd = bpf_obj_get(path.c_str());
    if (fd < 0) {
      if (errno == ENOENT) continue;
      return ErrnoStatus(errno, absl::StrCat("open pinned map ", path));
    }
    bpf_map_info info{};
    uint32_t len = sizeof(info);
    MapFill f{.name = name};
    absl::Status st;
    if (bpf_obj_get_info_by_fd(fd, &info, &len) != 0) {
      st = ErrnoStatus(errno, absl::StrCat("map info of ", path));
    } else if (info.type == BPF_MAP_TYPE_RINGBUF) {
      // A ring buffer has bytes, not entries, and no keys to count: the flow monitor reports
      // what it loses (docs/observe.md).
      ::close(fd);
      continue;
    } else {
      f.type = info.type;
      f.capacity = info.max_entries;
      // A slot array (maps/slot_array.h, an mmapable array) counts its used slots.
      const bool slots = maps::IsSlotArray(info.type, info.map_flags);
      f.is_array = IsArray(info.type) && !slots;
      if (slots) {
        if (auto n = maps::CountUsedSlots(fd); n.ok()) {
          f.entries = *n;
        } else {
          st = n.status();
        }
      } else if (f.is_array) {
        f.entries = info.max_entries;
      } else if (auto n = CountEntries(fd, info.key_size, stop); n.ok()) {
        f.entries = *n;
      } else {
        st = n.status();
      }
    }
    ::close(fd);
    if (!st.ok()) return st;
    out.push_back(f);
  }
  return out;
}

MapFillCounter::MapFillCounter(Options options)
    : options_(std::move(options)), thread_([this] { Run(); }) {}

MapFillCounter::~MapFillCounter() {
  stop_ = true;
  {
    absl::MutexLock l(&mu_);
    wanted_ = true;  // wakes the thread
  }
  thread_.join();
}

void MapFillCounter::Run() {
  while (true) {
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(&wanted_));
      if (stop_) return;
      wanted_ = false;
      running_ = true;
    }
    const absl::Time start = options_.clock->Now();
    auto fill = ReadMapFill(options_.bpffs_root, &stop_);
    const absl::Time end = options_.clock->Now();
    absl::MutexLock l(&mu_);
    running_ = false;
    ++walks_;
    last_end_ = end;
    last_took_ = end - start;
    if (fill.ok()) {
      latest_ = Count{.fill = *std::move(fill), .finished = end, .took = end - start};
    } else if (!stop_) {
      spdlog::warn("count map entries for /metrics: {}", fill.status().ToString());
    }
  }
}

std::optional<MapFillCounter::Count> MapFillCounter::Latest() {
  absl::MutexLock l(&mu_);
  if (!running_ && !wanted_ &&
      options_.clock->Now() - last_end_ >= options_.idle_factor * last_took_) {
    wanted_ = true;
  }
  if (running_ || wanted_) {
    const uint64_t target = walks_ + 1;
    auto done = [this, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return walks_ >= target; };
    mu_.AwaitWithTimeout(absl::Condition(&done), options_.scrape_wait);
  }
  return latest_;
}

int AddDatapathCollector(Registry& registry, const std::string& bpffs_root) {
  auto counter =
      std::make_shared<MapFillCounter>(MapFillCounter::Options{.bpffs_root = bpffs_root});
  return registry.AddCollector([bpffs_root, counter](ScrapeSink& out) {
    if (auto drops = maps::DropMap::Open(maps::PinPath(bpffs_root, maps::name::sluice_drops));
        drops.ok()) {
      if (auto totals = loader::ReadDropTotals(*drops); totals.ok()) {
        for (const auto& t : *totals) {
          for (unsigned dir = 0; dir < SLUICE_DROP_DIR_MAX; ++dir) {
            Labels l = {{"reason", t.name}, {"direction", sluice_drop_dir_name(dir)}};
            out.Counter("sluice_drop_count_total",
                        "Packets dropped by the datapath, per reason and direction", l,
                        static_cast<double>(t.dir_packets[dir]));
            out.Counter("sluice_drop_bytes_total",
                        "Bytes dropped by the datapath, per reason and direction", l,
                        static_cast<double>(t.dir_bytes[dir]));
          }
        }
      }
    }
    if (auto fwd = maps::ForwardMap::Open(maps::PinPath(bpffs_root, maps::name::sluice_forward));
        fwd.ok()) {
      if (auto totals = loader::ReadForwardTotals(*fwd); totals.ok()) {
        for (const auto& t : *totals) {
          Labels l = {{"direction", t.name}};
          out.Counter("sluice_forward_packets_total",
                      "Packets the datapath forwarded (passed on or redirected), per direction", l,
                      static_cast<double>(t.packets));
          out.Counter("sluice_forward_bytes_total", "Bytes the datapath forwarded, per direction",
                      l, static_cast<double>(t.bytes));
        }
      }
    }
    if (auto pol =
            maps::PolicyDropMap::Open(maps::PinPath(bpffs_root, maps::name::sluice_pol_drops));
        pol.ok()) {
      uint64_t packets[2] = {0, 0};
      sluice_policy_drop_key key{}, next{};
      const void* prev = nullptr;
      while (bpf_map_get_next_key(pol->fd(), prev, &next) == 0) {
        if (auto v = pol->Lookup(next); v.ok() && next.direction < 2) {
          for (const auto& c : *v) packets[next.direction] += c.packets;
        }
        key = next;
        prev = &key;
      }
      out.Counter("sluice_policy_drop_count_total",
                  "Packets NetworkPolicy denied, per direction of the endpoint that denied them "
                  "(endpoints evicted from sluice_pol_drops are no longer counted)",
                  {{"direction", "ingress"}}, static_cast<double>(packets[SLUICE_POLICY_INGRESS]));
      out.Counter("sluice_policy_drop_count_total", "", {{"direction", "egress"}},
                  static_cast<double>(packets[SLUICE_POLICY_EGRESS]));
    }
    if (auto stats = maps::CtStatsMap::Open(maps::PinPath(bpffs_root, maps::name::sluice_ct_stats));
        stats.ok()) {
      auto sum = [&](uint32_t slot) {
        uint64_t n = 0;
        if (auto v = stats->Lookup(slot); v.ok())
          for (uint64_t c : *v) n += c;
        return static_cast<double>(n);
      };
      for (const auto& [map, created, failed, crossed] :
           {std::tuple{maps::name::sluice_ct4, SLUICE_CT_STAT_TCP_CREATED,
                       SLUICE_CT_STAT_TCP_INSERT_FAILED, SLUICE_CT_STAT_TCP_CROSSED},
            std::tuple{maps::name::sluice_ct4_any, SLUICE_CT_STAT_ANY_CREATED,
                       SLUICE_CT_STAT_ANY_INSERT_FAILED, SLUICE_CT_STAT_ANY_CROSSED}}) {
        out.Counter("sluice_ct_created_total", "Conntrack entries the datapath created, per map",
                    {{"map_name", map}}, sum(created));
        out.Counter("sluice_ct_insert_failures_total",
                    "Conntrack entries the datapath could not store (the map was full; the "
                    "packet was dropped as ct_map_full), per map",
                    {{"map_name", map}}, sum(failed));
        out.Counter("sluice_ct_crossed_deleted_total",
                    "Conntrack entries of a stale translated flow the datapath deleted because a "
                    "direct flow between the same addresses and ports began, per map",
                    {{"map_name", map}}, sum(crossed));
      }
    }
    std::optional<MapFillCounter::Count> count = counter->Latest();
    if (!count) return;
    out.Gauge("sluice_bpf_map_count_timestamp_seconds",
              "When the map entries reported (sluice_bpf_map_entries, sluice_bpf_map_pressure, "
              "sluice_datapath_conntrack_entries) were counted, in seconds since the epoch",
              {}, absl::ToDoubleSeconds(count->finished - absl::UnixEpoch()));
    out.Gauge("sluice_bpf_map_count_duration_seconds",
              "How long that count of every map's entries took", {},
              absl::ToDoubleSeconds(count->took));
    for (const MapFill& f : count->fill) {
      Labels l = {{"map_name", f.name}};
      out.Gauge("sluice_bpf_map_capacity", "Maximum entries of each pinned BPF map", l, f.capacity);
      if (f.is_array) continue;  // full by construction: no pressure to report
      out.Gauge("sluice_bpf_map_entries",
                "Entries in each pinned BPF map (arrays left out), as of the last count "
                "(sluice_bpf_map_count_timestamp_seconds)",
                l, static_cast<double>(f.entries));
      out.Gauge("sluice_bpf_map_pressure",
                "Fill level of each pinned BPF map, entries / capacity (0..1), as of the last "
                "count (sluice_bpf_map_count_timestamp_seconds)",
                l, f.capacity == 0 ? 0 : static_cast<double>(f.entries) / f.capacity);
    }
    uint64_t ct_entries = 0;
    for (const MapFill& f : count->fill) {
      if (f.name == maps::name::sluice_ct4 || f.name == maps::name::sluice_ct4_any)
        ct_entries += f.entries;
    }
    out.Gauge("sluice_datapath_conntrack_entries",
              "Conntrack entries (sluice_ct4 and sluice_ct4_any: one per direction of each "
              "balanced or policy-tracked flow), as of the last count "
              "(sluice_bpf_map_count_timestamp_seconds)",
              {}, static_cast<double>(ct_entries));
  });
}

}  // namespace sluice::metrics
