// sluice_lb4_mag (maps/lb.h): frontends' Maglev tables, each an array map of its own swapped in
// whole under the frontend's master key. A table is written once, into a fresh array, and never
// changed after it is in the outer map; replacing it is one update of the outer map, so a
// packet reads a whole old table or a whole new one.
#pragma once

#include <bpf/bpf.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "maps/lb.h"
#include "maps/map.h"
#include "maps/sluice_maps.h"

namespace sluice::maps {

class MaglevTables {
 public:
  using Spec = spec::sluice_lb4_mag;

  MaglevTables() = default;
  // Borrows the outer map's fd (from a loaded skeleton or a pin): duplicates it.
  static absl::StatusOr<MaglevTables> FromFd(int fd) {
    int dup = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup < 0) return ErrnoStatus(errno, "dup map fd");
    MaglevTables t;
    t.fd_ = MapFd(dup);
    return t;
  }
  static absl::StatusOr<MaglevTables> Open(const std::string& pin_path) {
    int fd = bpf_obj_get(pin_path.c_str());
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open pinned map ", pin_path));
    MaglevTables t;
    t.fd_ = MapFd(fd);
    return t;
  }
  int fd() const { return fd_.get(); }

  // A new table array holding `backend_ids` (slot s -> backend_ids[s]; M = its size), not yet
  // in the outer map: Swap puts it there (under as many keys as share it).
  [[nodiscard]] static absl::StatusOr<MapFd> Create(const std::vector<uint32_t>& backend_ids) {
    const uint32_t m = static_cast<uint32_t>(backend_ids.size());
    LIBBPF_OPTS(bpf_map_create_opts, opts, .map_flags = Spec::kInnerMapFlags);
    int fd = bpf_map_create(static_cast<enum bpf_map_type>(Spec::kInnerType), "sluice_lb4_magt",
                            sizeof(uint32_t), sizeof(Spec::Value), m + 1, &opts);
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("create Maglev table of ", m, " slots"));
    MapFd table(fd);
    std::vector<uint32_t> keys(m + 1), values(m + 1);
    for (uint32_t i = 0; i <= m; ++i) keys[i] = i;
    values[SLUICE_LB4_MAGLEV_SIZE_INDEX] = m;
    for (uint32_t s = 0; s < m; ++s) values[1 + s] = backend_ids[s];
    uint32_t count = m + 1;
    if (bpf_map_update_batch(fd, keys.data(), values.data(), &count, nullptr) != 0)
      return ErrnoStatus(errno, absl::StrCat("fill Maglev table of ", m, " slots"));
    return table;
  }
  // Puts `table` under `key` in one update (replacing what was there).
  [[nodiscard]] absl::Status Swap(const sluice_lb4_key& key, const MapFd& table) {
    uint32_t fd = static_cast<uint32_t>(table.get());
    if (bpf_map_update_elem(fd_.get(), &key, &fd, BPF_ANY) != 0)
      return UpdateFailed(fd_.get(), "swap in Maglev table");
    return absl::OkStatus();
  }
  [[nodiscard]] absl::Status Delete(const sluice_lb4_key& key) {
    if (bpf_map_delete_elem(fd_.get(), &key) != 0 && errno != ENOENT)
      return ErrnoStatus(errno, "delete Maglev table");
    return absl::OkStatus();
  }
  // Every key with a table.
  [[nodiscard]] absl::Status ForEachKey(const std::function<void(const sluice_lb4_key&)>& fn) const {
    sluice_lb4_key key{}, next{};
    const sluice_lb4_key* cur = nullptr;
    while (bpf_map_get_next_key(fd_.get(), cur, &next) == 0) {
      fn(next);
      key = next;
      cur = &key;
    }
    if (errno != ENOENT) return ErrnoStatus(errno, "walk Maglev tables");
    return absl::OkStatus();
  }
  // The table under `key` (slot s -> backend id), as the datapath reads it.
  [[nodiscard]] absl::StatusOr<std::vector<uint32_t>> Read(const sluice_lb4_key& key) const {
    uint32_t id = 0;
    if (bpf_map_lookup_elem(fd_.get(), &key, &id) != 0)
      return ErrnoStatus(errno, "look up Maglev table");
    int fd = bpf_map_get_fd_by_id(id);
    if (fd < 0) return ErrnoStatus(errno, "open Maglev table by id");
    MapFd table(fd);
    uint32_t index = SLUICE_LB4_MAGLEV_SIZE_INDEX, m = 0;
    if (bpf_map_lookup_elem(fd, &index, &m) != 0) return ErrnoStatus(errno, "read Maglev size");
    std::vector<uint32_t> ids(m);
    for (uint32_t s = 0; s < m; ++s) {
      index = 1 + s;
      if (bpf_map_lookup_elem(fd, &index, &ids[s]) != 0)
        return ErrnoStatus(errno, "read Maglev slot");
    }
    return ids;
  }

 private:
  MapFd fd_;
};

}  // namespace sluice::maps
