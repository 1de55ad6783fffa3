// RAII ownership of a bpftool-generated skeleton, opened with Sluice's pin root so every map is
// pinned by name (and reused when a pin from an earlier run exists).
#pragma once

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "maps/map.h"
#include "spdlog/spdlog.h"

namespace sluice::loader {

namespace skeleton_internal {
// Whether this process has not said `what` yet (and now has): every BPF object checks the shared
// pins, so a fact about one pin would otherwise be logged once per object.
inline bool FirstTimeSaid(const std::string& what) {
  static std::mutex mu;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(mu);
  return said.insert(what).second;
}
}  // namespace skeleton_internal

// Specialised per skeleton (see SLUICE_SKELETON_OPS) to reach the generated functions.
template <typename Skel>
struct SkeletonOps;

// Whether the TC programs load in their main build, which reads the kernel's skb through the
// kfunc bpf_cast_to_kern_ctx (Linux 6.2 with BTF) and updates L4 checksums inline; otherwise the
// loader loads their SLUICE_NO_KERN_CTX build (bpf/CMakeLists.txt), which leaves those updates
// to bpf_l4_csum_replace. Probed once per process in the kernel's BTF.
bool UseKernCtx();
// Tests: load the SLUICE_NO_KERN_CTX builds whatever the kernel has (true), or as it allows
// again (false).
void ForceNoKernCtxForTesting(bool force);

// A skeleton opened on other ELF bytes than its own (elf: a generated *__elf_bytes, or nullptr
// for its own): the same source built with other flags, whose maps, programs and global data
// are those of the skeleton's build.
template <typename Skel>
Skel* OpenSkeletonOn(const struct bpf_object_open_opts* opts, const void* (*elf)(size_t*),
                     int (*create)(Skel*), void (*destroy)(Skel*)) {
  auto* obj = static_cast<Skel*>(calloc(1, sizeof(Skel)));
  if (obj == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  int err = create(obj);
  if (err == 0 && elf != nullptr)
    obj->skeleton->data = const_cast<void*>(elf(&obj->skeleton->data_sz));
  if (err == 0) err = bpf_object__open_skeleton(obj->skeleton, opts);
  if (err != 0) {
    destroy(obj);
    errno = -err;
    return nullptr;
  }
  return obj;
}

#define SLUICE_SKELETON_OPS(name)                                                       \
  template <>                                                                           \
  struct SkeletonOps<struct name> {                                                     \
    static constexpr const char* kName = #name;                                         \
    static struct name* Open(const struct bpf_object_open_opts* o) {                     \
      return name##__open_opts(o);                                                      \
    }                                                                                   \
    static int Load(struct name* s) { return name##__load(s); }                         \
    static void Destroy(struct name* s) { name##__destroy(s); }                         \
  }

// A TC skeleton that has a SLUICE_NO_KERN_CTX build, name_compat (UseKernCtx).
#define SLUICE_SKELETON_OPS_KERN_CTX(name)                                                     \
  static_assert(sizeof(struct name) == sizeof(struct name##_compat),                           \
                #name " and its compat build differ");                                         \
  template <>                                                                                  \
  struct SkeletonOps<struct name> {                                                            \
    static constexpr const char* kName = #name;                                                \
    static struct name* Open(const struct bpf_object_open_opts* o) {                           \
      return OpenSkeletonOn<struct name>(o, UseKernCtx() ? nullptr : name##_compat__elf_bytes, \
                                         name##__create_skeleton, name##__destroy);            \
    }                                                                                          \
    static int Load(struct name* s) { return name##__load(s); }                                \
    static void Destroy(struct name* s) { name##__destroy(s); }                                \
  }

template <typename Skel>
class Skeleton {
 public:
  using Configure = std::function<absl::Status(Skel*)>;

  // Opens the embedded object, lets `configure` set rodata and map sizes, then loads it.
  // Maps are pinned under `pin_root`; existing pins with a matching definition are reused.
  static absl::StatusOr<std::unique_ptr<Skeleton>> OpenAndLoad(const std::string& pin_root,
                                                               Configure configure = nullptr) {
    LIBBPF_OPTS(bpf_object_open_opts, opts, .pin_root_path = pin_root.c_str());
    errno = 0;
    Skel* raw = SkeletonOps<Skel>::Open(&opts);
    if (raw == nullptr) {
      return ErrnoStatus(errno ? errno : EINVAL,
                               absl::StrCat("open BPF object ", SkeletonOps<Skel>::kName));
    }
    std::unique_ptr<Skeleton> skel(new Skeleton(raw));
    if (configure) {
      if (auto st = configure(raw); !st.ok()) return st;
    }
    std::vector<CarryOver> carried = DropIncompatiblePins(raw->obj);
    if (int err = SkeletonOps<Skel>::Load(raw); err != 0) {
      return ErrnoStatus(-err, absl::StrCat("load BPF object ", SkeletonOps<Skel>::kName,
                                                  " (pins under ", pin_root,
                                                  "; libbpf logs the verifier output)"));
    }
    for (const CarryOver& c : carried) c.WriteInto(raw->obj);
    return skel;
  }

  // The entries of a replaced hash map (u32 keys) that its successor, an array with the same
  // value size, takes over: an upgrade that turned sluice_lb4_be into a slot array keeps every
  // backend whose id fits.
  struct CarryOver {
    std::string name;
    uint32_t value_size = 0;
    std::vector<uint32_t> keys;
    std::vector<char> values;

    static bool Applies(const bpf_map_info& old, const struct bpf_map* map) {
      return old.type == BPF_MAP_TYPE_HASH && bpf_map__type(map) == BPF_MAP_TYPE_ARRAY &&
             old.key_size == sizeof(uint32_t) && bpf_map__key_size(map) == sizeof(uint32_t) &&
             old.value_size == bpf_map__value_size(map);
    }
    // Reads the old map's entries (before its pin goes).
    static CarryOver Read(int fd, const bpf_map_info& old, const char* name) {
      CarryOver c{.name = name, .value_size = old.value_size};
      uint32_t key = 0, next = 0;
      const uint32_t* cur = nullptr;
      std::vector<char> value(old.value_size);
      while (bpf_map_get_next_key(fd, cur, &next) == 0) {
        if (bpf_map_lookup_elem(fd, &next, value.data()) == 0) {
          c.keys.push_back(next);
          c.values.insert(c.values.end(), value.begin(), value.end());
        }
        key = next;
        cur = &key;
      }
      return c;
    }
    void WriteInto(struct bpf_object* obj) const {
      struct bpf_map* map = bpf_object__find_map_by_name(obj, name.c_str());
      if (map == nullptr) return;
      const uint32_t max = bpf_map__max_entries(map);
      size_t kept = 0;
      for (size_t i = 0; i < keys.size(); ++i) {
        if (keys[i] < max && bpf_map_update_elem(bpf_map__fd(map), &keys[i],
                                                 values.data() + i * value_size, BPF_ANY) == 0)
          ++kept;
      }
      spdlog::warn("map {}: {} of {} entries carried over from the replaced map", name, kept,
                   keys.size());
    }
  };

  // A pin left by an agent whose map layout differs (an upgrade that changed the ABI) cannot be
  // reused, and libbpf would refuse to load: such a pin is removed, with a warning, so this load
  // creates the map afresh (its old contents are lost, but for a CarryOver; everything else keeps
  // its state).
  static std::vector<CarryOver> DropIncompatiblePins(struct bpf_object* obj) {
    std::vector<CarryOver> carried;
    struct bpf_map* map;
    bpf_object__for_each_map(map, obj) {
      const char* path = bpf_map__pin_path(map);
      if (path == nullptr) continue;
      int fd = bpf_obj_get(path);
      if (fd < 0) continue;
      struct bpf_map_info info = {};
      __u32 len = sizeof(info);
      int rc = bpf_obj_get_info_by_fd(fd, &info, &len);
      const bool same_layout = rc == 0 && info.type == bpf_map__type(map) &&
                               info.key_size == bpf_map__key_size(map) &&
                               info.value_size == bpf_map__value_size(map) &&
                               info.max_entries == bpf_map__max_entries(map);
      if (same_layout && (info.map_flags ^ bpf_map__map_flags(map)) == BPF_F_NO_PREALLOC) {
        // Only how the kernel allocates entries differs (sluice_ct4 was preallocated before
        // its entries were taken as flows come): the pinned map, with every live flow in it,
        // is kept as it is, so the upgrade is hitless; a map created afresh (a drained node,
        // a resize) gets this build's flags.
        if (skeleton_internal::FirstTimeSaid(absl::StrCat("keep ", path)))
          spdlog::info(
              "map {}: keeping the pinned map and its entries (map flags {:#x}; this "
              "build creates it with {:#x})",
              path, info.map_flags, bpf_map__map_flags(map));
        bpf_map__set_map_flags(map, info.map_flags);
      }
      if (rc != 0 || (same_layout && info.map_flags == bpf_map__map_flags(map))) {
        close(fd);
        continue;
      }
      if (CarryOver::Applies(info, map))
        carried.push_back(CarryOver::Read(fd, info, bpf_map__name(map)));
      close(fd);
      spdlog::warn(
          "map {}: the pinned map's layout differs from this build's (type {} -> {}, key {} -> "
          "{}, value {} -> {}, max {} -> {}, flags {:#x} -> {:#x}): replacing it, {}",
          path, info.type, static_cast<int>(bpf_map__type(map)), info.key_size,
          bpf_map__key_size(map), info.value_size, bpf_map__value_size(map), info.max_entries,
          bpf_map__max_entries(map), info.map_flags, bpf_map__map_flags(map),
          CarryOver::Applies(info, map) ? "its entries are carried over" : "its contents are lost");
      unlink(path);
    }
    return carried;
  }

  Skeleton(const Skeleton&) = delete;
  Skeleton& operator=(const Skeleton&) = delete;
  ~Skeleton() { SkeletonOps<Skel>::Destroy(skel_); }

  Skel* get() const { return skel_; }
  Skel* operator->() const { return skel_; }

 private:
  explicit Skeleton(Skel* s) : skel_(s) {}
  Skel* skel_;
};

}  // namespace sluice::loader
