// Typed C++ access to Sluice's BPF maps over an fd (usually opened from a bpffs pin).
// The key and value types are the structs of the map ABI headers in this directory.
#pragma once

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "agent/base/errno.h"

namespace sluice::maps {

// Owns a BPF map fd.
class MapFd {
 public:
  MapFd() = default;
  explicit MapFd(int fd) : fd_(fd) {}
  MapFd(const MapFd&) = delete;
  MapFd& operator=(const MapFd&) = delete;
  MapFd(MapFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  MapFd& operator=(MapFd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~MapFd() { Reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// Opens the map pinned at `path` and checks that its key and value sizes match the ABI.
inline absl::StatusOr<MapFd> OpenPinned(const std::string& path, size_t key_size,
                                        size_t value_size) {
  int fd = bpf_obj_get(path.c_str());
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open pinned map ", path));
  MapFd map(fd);
  bpf_map_info info{};
  uint32_t len = sizeof(info);
  if (bpf_obj_get_info_by_fd(fd, &info, &len) != 0)
    return ErrnoStatus(errno, absl::StrCat("map info of ", path));
  if (info.key_size != key_size || info.value_size != value_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "map ", path, " has key/value size ", info.key_size, "/", info.value_size,
        ", this build expects ", key_size, "/", value_size));
  }
  return map;
}

// Failed writes are map pressure the agent sees first-hand: when set (the agent sets it; tools
// leave it null) this is called on the failure path of every Update with the map's fd and errno.
using UpdateFailureHook = void (*)(int map_fd, int err);
inline std::atomic<UpdateFailureHook> update_failure_hook{nullptr};

inline absl::Status UpdateFailed(int fd, const char* what) {
  const int err = errno;
  if (UpdateFailureHook hook = update_failure_hook.load(std::memory_order_relaxed)) hook(fd, err);
  return ErrnoStatus(err, what);
}

// A hash, LRU or array map with one value per key.
template <typename Key, typename Value>
class Map {
 public:
  Map() = default;
  explicit Map(MapFd fd) : fd_(std::move(fd)) {}

  static absl::StatusOr<Map> Open(const std::string& pin_path) {
    auto fd = OpenPinned(pin_path, sizeof(Key), sizeof(Value));
    if (!fd.ok()) return fd.status();
    return Map(std::move(*fd));
  }
  // Borrows an fd (e.g. from a loaded skeleton): duplicates it so both owners may close.
  static absl::StatusOr<Map> FromFd(int fd) {
    int dup = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup < 0) return ErrnoStatus(errno, "dup map fd");
    return Map(MapFd(dup));
  }

  int fd() const { return fd_.get(); }

  [[nodiscard]] absl::StatusOr<Value> Lookup(const Key& key) const {
    Value v{};
    if (bpf_map_lookup_elem(fd_.get(), &key, &v) != 0) return ErrnoStatus(errno, "map lookup");
    return v;
  }
  [[nodiscard]] absl::Status Update(const Key& key, const Value& value,
                                    uint64_t flags = BPF_ANY) {
    if (bpf_map_update_elem(fd_.get(), &key, &value, flags) != 0)
      return UpdateFailed(fd_.get(), "map update");
    return absl::OkStatus();
  }
  // Writes keys[i] -> values[i] for i < n with BPF_MAP_UPDATE_BATCH: one syscall for many
  // entries, applied by the kernel one after another in this order (a reader never sees entry
  // i + 1 without entry i). *done says how many were written, also on error (the entries before
  // the failing one are in the map).
  [[nodiscard]] absl::Status UpdateBatch(const Key* keys, const Value* values, size_t n,
                                         size_t* done, uint64_t flags = BPF_ANY) {
    *done = 0;
    while (*done < n) {
      __u32 count = static_cast<__u32>(n - *done);
      LIBBPF_OPTS(bpf_map_batch_opts, opts, .elem_flags = flags);
      int rc = bpf_map_update_batch(fd_.get(), keys + *done, values + *done, &count, &opts);
      *done += count;
      if (rc != 0) return ErrnoStatus(errno, "map batch update");
      if (count == 0) return absl::InternalError("map batch update wrote nothing");
    }
    return absl::OkStatus();
  }
  // Deleting an absent key is not an error: callers reconcile toward absence.
  [[nodiscard]] absl::Status Delete(const Key& key) {
    if (bpf_map_delete_elem(fd_.get(), &key) != 0 && errno != ENOENT)
      return ErrnoStatus(errno, "map delete");
    return absl::OkStatus();
  }
  // Visits every entry. Entries may change concurrently (the datapath writes too); a key deleted
  // between iteration and lookup is skipped.
  [[nodiscard]] absl::Status ForEach(
      const std::function<void(const Key&, const Value&)>& fn) const {
    Key key{}, next{};
    const Key* cur = nullptr;
    while (bpf_map_get_next_key(fd_.get(), cur, &next) == 0) {
      Value v{};
      if (bpf_map_lookup_elem(fd_.get(), &next, &v) == 0) fn(next, v);
      key = next;
      cur = &key;
    }
    if (errno != ENOENT) return ErrnoStatus(errno, "map iterate");
    return absl::OkStatus();
  }
  // Visits every entry with BPF_MAP_LOOKUP_BATCH: a few syscalls for the whole map, where
  // ForEach makes two per entry (hash and array maps; an LPM trie has no batch lookup). Entries
  // the datapath adds or deletes meanwhile may be missed or seen.
  [[nodiscard]] absl::Status ForEachBatch(const std::function<void(const Key&, const Value&)>& fn,
                                          uint32_t batch = 4096) const {
    // The batch token: a hash map's bucket or an array's index (4 bytes); a key has room for it.
    static_assert(sizeof(Key) >= sizeof(__u32));
    std::vector<Key> keys(batch);
    std::vector<Value> values(batch);
    Key in{}, next{};
    void* in_batch = nullptr;
    while (true) {
      uint32_t count = batch;
      int rc = bpf_map_lookup_batch(fd_.get(), in_batch, &next, keys.data(), values.data(), &count,
                                    nullptr);
      const int err = rc != 0 ? errno : 0;
      for (uint32_t i = 0; i < count; ++i) fn(keys[i], values[i]);
      if (rc != 0) {
        if (err == ENOENT) return absl::OkStatus();  // the end of the map
        return ErrnoStatus(err, "map batch lookup");
      }
      in = next;
      in_batch = &in;
    }
  }
  // The keys present, walked without reading a value (one syscall per entry, not two).
  [[nodiscard]] absl::StatusOr<size_t> Count() const {
    Key key{}, next{};
    const Key* cur = nullptr;
    size_t n = 0;
    while (bpf_map_get_next_key(fd_.get(), cur, &next) == 0) {
      ++n;
      key = next;
      cur = &key;
    }
    if (errno != ENOENT) return ErrnoStatus(errno, "map count");
    return n;
  }

 private:
  MapFd fd_;
};

// A per-CPU map: lookups return one value per possible CPU.
template <typename Key, typename Value>
class PerCpuMap {
 public:
  PerCpuMap() = default;
  explicit PerCpuMap(MapFd fd) : fd_(std::move(fd)), ncpus_(libbpf_num_possible_cpus()) {}

  static absl::StatusOr<PerCpuMap> Open(const std::string& pin_path) {
    auto fd = OpenPinned(pin_path, sizeof(Key), sizeof(Value));
    if (!fd.ok()) return fd.status();
    return PerCpuMap(std::move(*fd));
  }
  static absl::StatusOr<PerCpuMap> FromFd(int fd) {
    int dup = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup < 0) return ErrnoStatus(errno, "dup map fd");
    return PerCpuMap(MapFd(dup));
  }

  int fd() const { return fd_.get(); }
  int ncpus() const { return ncpus_; }

  [[nodiscard]] absl::StatusOr<std::vector<Value>> Lookup(const Key& key) const {
    // The kernel copies values in 8-byte-aligned slots.
    static_assert(sizeof(Value) % 8 == 0, "per-CPU values must be 8-byte multiples");
    std::vector<Value> v(ncpus_);
    if (bpf_map_lookup_elem(fd_.get(), &key, v.data()) != 0)
      return ErrnoStatus(errno, "percpu map lookup");
    return v;
  }
  [[nodiscard]] absl::Status Update(const Key& key, const std::vector<Value>& values) {
    if (values.size() != static_cast<size_t>(ncpus_))
      return absl::InvalidArgumentError("per-CPU update needs one value per possible CPU");
    if (bpf_map_update_elem(fd_.get(), &key, values.data(), BPF_ANY) != 0)
      return UpdateFailed(fd_.get(), "percpu map update");
    return absl::OkStatus();
  }

 private:
  MapFd fd_;
  int ncpus_ = 0;
};

}  // namespace sluice::maps
