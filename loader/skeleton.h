// RAII ownership of a bpftool-generated skeleton, opened with Sluice's pin root so every map is
// pinned by name (and reused when a pin from an earlier run exists).
#pragma once

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "maps/map.h"
#include "spdlog/spdlog.h"

namespace sluice::loader {

// Specialised per skeleton (see SLUICE_SKELETON_OPS) to reach the generated functions.
template <typename Skel>
struct SkeletonOps;

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
    DropIncompatiblePins(raw->obj);
    if (int err = SkeletonOps<Skel>::Load(raw); err != 0) {
      return ErrnoStatus(-err, absl::StrCat("load BPF object ", SkeletonOps<Skel>::kName,
                                                  " (pins under ", pin_root,
                                                  "; libbpf logs the verifier output)"));
    }
    return skel;
  }

  // A pin left by an agent whose map layout differs (an upgrade that changed the ABI) cannot be
  // reused, and libbpf would refuse to load: such a pin is removed, with a warning, so this load
  // creates the map afresh (its old contents are lost; everything else keeps its state).
  static void DropIncompatiblePins(struct bpf_object* obj) {
    struct bpf_map* map;
    bpf_object__for_each_map(map, obj) {
      const char* path = bpf_map__pin_path(map);
      if (path == nullptr) continue;
      int fd = bpf_obj_get(path);
      if (fd < 0) continue;
      struct bpf_map_info info = {};
      __u32 len = sizeof(info);
      int rc = bpf_obj_get_info_by_fd(fd, &info, &len);
      close(fd);
      if (rc != 0) continue;
      if (info.type == bpf_map__type(map) && info.key_size == bpf_map__key_size(map) &&
          info.value_size == bpf_map__value_size(map) &&
          info.max_entries == bpf_map__max_entries(map) &&
          info.map_flags == bpf_map__map_flags(map)) {
        continue;
      }
      spdlog::warn(
          "map {}: the pinned map's layout differs from this build's (key {} -> {}, value {} -> "
          "{}, max {} -> {}): replacing it, its contents are lost",
          path, info.key_size, bpf_map__key_size(map), info.value_size,
          bpf_map__value_size(map), info.max_entries, bpf_map__max_entries(map));
      unlink(path);
    }
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
