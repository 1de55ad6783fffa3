// A BPF array map used as a table of slots: index -> value, where an all-zero value is a free
// slot. The map is created with BPF_F_MMAPABLE and mapped into this process, so a write is one
// store into the map's memory (no syscall) and a walk reads memory. It presents the calls of a
// hash map (maps/map.h): Lookup of a free slot is NOT_FOUND, Delete zeroes, ForEach and Count see
// the used slots only, an index beyond the array fails like a full map.
//
// A value is 8 bytes, written with one aligned 64-bit store: a BPF program reading the slot sees
// the old value or the new one, never a mix.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <utility>

#include "maps/map.h"

namespace sluice::maps {

// The one rule for which maps are slot arrays: an array made mmapable.
constexpr bool IsSlotArray(uint32_t type, uint32_t map_flags) {
  return type == BPF_MAP_TYPE_ARRAY && (map_flags & BPF_F_MMAPABLE) != 0;
}

template <typename Value>
class SlotArray {
  static_assert(sizeof(Value) == sizeof(uint64_t), "a slot is one 64-bit store");

 public:
  using Key = uint32_t;

  SlotArray() = default;
  SlotArray(const SlotArray&) = delete;
  SlotArray& operator=(const SlotArray&) = delete;
  SlotArray(SlotArray&& o) noexcept { *this = std::move(o); }
  SlotArray& operator=(SlotArray&& o) noexcept {
    if (this != &o) {
      Unmap();
      fd_ = std::move(o.fd_);
      slots_ = std::exchange(o.slots_, nullptr);
      size_ = std::exchange(o.size_, 0);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  ~SlotArray() { Unmap(); }

  static absl::StatusOr<SlotArray> Open(const std::string& pin_path) {
    auto fd = OpenPinned(pin_path, sizeof(Key), sizeof(Value));
    if (!fd.ok()) return fd.status();
    return Mapped(std::move(*fd), pin_path);
  }
  // Borrows an fd (e.g. from a loaded skeleton): duplicates it so both owners may close.
  static absl::StatusOr<SlotArray> FromFd(int fd) {
    int dup = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup < 0) return ErrnoStatus(errno, "dup map fd");
    return Mapped(MapFd(dup), "");
  }
  // Maps an fd this takes over (one of an mmapable array of 8-byte values).
  static absl::StatusOr<SlotArray> Mapped(MapFd fd, const std::string& what) {
    bpf_map_info info{};
    uint32_t len = sizeof(info);
    if (bpf_obj_get_info_by_fd(fd.get(), &info, &len) != 0)
      return ErrnoStatus(errno, absl::StrCat("map info of ", what));
    if (!IsSlotArray(info.type, info.map_flags) || info.key_size != sizeof(Key) ||
        info.value_size != sizeof(Value)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "map ", what, " (", info.name, ") is not an mmapable array of ", sizeof(Value),
          "-byte values (type ", info.type, ", flags ", info.map_flags, ")"));
    }
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const size_t bytes = (size_t{info.max_entries} * sizeof(Value) + page - 1) / page * page;
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) return ErrnoStatus(errno, absl::StrCat("mmap map ", what));
    SlotArray a;
    a.fd_ = std::move(fd);
    a.slots_ = static_cast<uint64_t*>(p);
    a.size_ = info.max_entries;
    a.bytes_ = bytes;
    return a;
  }

  int fd() const { return fd_.get(); }
  // Slots in the array, the free index 0 included.
  uint32_t size() const { return size_; }

  [[nodiscard]] absl::StatusOr<Value> Lookup(Key key) const {
    if (key >= size_) return absl::NotFoundError("map lookup: index beyond the array");
    uint64_t bits = Load(key);
    if (bits == 0) return absl::NotFoundError("map lookup: free slot");
    Value v;
    std::memcpy(&v, &bits, sizeof(v));
    return v;
  }
  // A write of the all-zero value frees the slot.
  [[nodiscard]] absl::Status Update(Key key, const Value& value) {
    if (key >= size_) {
      errno = E2BIG;
      return UpdateFailed(fd_.get(), "map update: index beyond the array");
    }
    uint64_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    __atomic_store_n(&slots_[key], bits, __ATOMIC_RELEASE);
    return absl::OkStatus();
  }
  // Writes keys[i] -> values[i] for i < n in this order; *done says how many were written.
  [[nodiscard]] absl::Status UpdateBatch(const Key* keys, const Value* values, size_t n,
                                         size_t* done) {
    for (*done = 0; *done < n; ++*done) {
      if (auto st = Update(keys[*done], values[*done]); !st.ok()) return st;
    }
    return absl::OkStatus();
  }
  // Freeing a free slot (or one beyond the array) is not an error, as for a hash map's delete.
  [[nodiscard]] absl::Status Delete(Key key) {
    if (key < size_) __atomic_store_n(&slots_[key], uint64_t{0}, __ATOMIC_RELEASE);
    return absl::OkStatus();
  }
  // Visits every used slot, in index order.
  [[nodiscard]] absl::Status ForEach(const std::function<void(Key, const Value&)>& fn) const {
    for (Key k = 0; k < size_; ++k) {
      uint64_t bits = Load(k);
      if (bits == 0) continue;
      Value v;
      std::memcpy(&v, &bits, sizeof(v));
      fn(k, v);
    }
    return absl::OkStatus();
  }
  // The used slots.
  [[nodiscard]] absl::StatusOr<size_t> Count() const {
    size_t n = 0;
    for (Key k = 0; k < size_; ++k) n += Load(k) != 0;
    return n;
  }

 private:
  uint64_t Load(Key k) const { return __atomic_load_n(&slots_[k], __ATOMIC_ACQUIRE); }
  void Unmap() {
    if (slots_ != nullptr) ::munmap(slots_, bytes_);
    slots_ = nullptr;
    size_ = 0;
    bytes_ = 0;
  }

  MapFd fd_;
  uint64_t* slots_ = nullptr;
  uint32_t size_ = 0;
  size_t bytes_ = 0;  // of the mapping: size_ values, rounded up to pages
};

// The used slots of an mmapable array map open at fd (for tools that know only the fd).
inline absl::StatusOr<size_t> CountUsedSlots(int fd) {
  int dup = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) return ErrnoStatus(errno, "dup map fd");
  auto a = SlotArray<uint64_t>::Mapped(MapFd(dup), "");
  if (!a.ok()) return a.status();
  return a->Count();
}

}  // namespace sluice::maps
