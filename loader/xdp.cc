#include "loader/xdp.h"

#include <bpf/bpf.h>
#include <linux/if_link.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "maps/map.h"

namespace sluice::loader {
namespace {

// Closes a descriptor; a pinned link stays attached.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

XdpMode ModeOf(__u8 attach_mode) {
  switch (attach_mode) {
    case XDP_ATTACHED_DRV:
    case XDP_ATTACHED_HW:
      return XdpMode::kNative;
    case XDP_ATTACHED_SKB:
      return XdpMode::kGeneric;
    default:
      return XdpMode::kNone;
  }
}

// The pin holds a live XDP link on `ifindex`: its program is replaced, true. False when the pin
// must be replaced (absent, not a link, another device, defunct).
absl::StatusOr<bool> UpdatePinnedXdpLink(struct bpf_program* prog, int ifindex,
                                         const std::string& pin_path) {
  if (access(pin_path.c_str(), F_OK) != 0 && errno == ENOENT) return false;
  Fd link{bpf_obj_get(pin_path.c_str())};
  if (link.fd < 0) {
    if (errno == ENOENT || errno == EINVAL || errno == EPERM) return false;
    return ErrnoStatus(errno, absl::StrCat("open pinned link ", pin_path));
  }
  struct bpf_link_info info = {};
  __u32 len = sizeof(info);
  if (bpf_obj_get_info_by_fd(link.fd, &info, &len) != 0) {
    if (errno == EINVAL) return false;  // a pinned map or program
    return ErrnoStatus(errno, absl::StrCat("link info of ", pin_path));
  }
  // A link whose device went away reports ifindex 0.
  if (info.type != BPF_LINK_TYPE_XDP || info.xdp.ifindex != static_cast<__u32>(ifindex)) {
    return false;
  }
  if (bpf_link_update(link.fd, bpf_program__fd(prog), nullptr) != 0) {
    if (errno == ENOLINK) return false;
    return ErrnoStatus(errno, absl::StrCat("update program of link ", pin_path));
  }
  return true;
}

}  // namespace

const char* XdpModeName(XdpMode mode) {
  switch (mode) {
    case XdpMode::kNone:
      return "none";
    case XdpMode::kNative:
      return "native";
    case XdpMode::kGeneric:
      return "generic";
  }
  return "?";
}

absl::Status DetachXdpLink(const std::string& pin_path) {
  Fd link{bpf_obj_get(pin_path.c_str())};
  if (link.fd < 0 && errno != ENOENT) {
    return ErrnoStatus(errno, absl::StrCat("open pinned link ", pin_path));
  }
  struct bpf_link_info info = {};
  __u32 len = sizeof(info);
  if (link.fd >= 0 && bpf_obj_get_info_by_fd(link.fd, &info, &len) == 0 &&
      info.type == BPF_LINK_TYPE_XDP && bpf_link_detach(link.fd) != 0 && errno != ENOLINK) {
    return ErrnoStatus(errno, absl::StrCat("detach link ", pin_path));
  }
  if (unlink(pin_path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus(errno, absl::StrCat("unpin link ", pin_path));
  }
  return absl::OkStatus();
}

absl::StatusOr<XdpMode> AttachedXdpMode(int ifindex) {
  LIBBPF_OPTS(bpf_xdp_query_opts, q);
  if (int err = bpf_xdp_query(ifindex, 0, &q); err != 0) {
    return ErrnoStatus(-err, absl::StrCat("query XDP on ifindex ", ifindex));
  }
  return ModeOf(q.attach_mode);
}

absl::StatusOr<uint32_t> AttachedXdpProgram(int ifindex) {
  LIBBPF_OPTS(bpf_xdp_query_opts, q);
  if (int err = bpf_xdp_query(ifindex, 0, &q); err != 0) {
    return ErrnoStatus(-err, absl::StrCat("query XDP on ifindex ", ifindex));
  }
  switch (q.attach_mode) {
    case XDP_ATTACHED_DRV:
      return q.drv_prog_id;
    case XDP_ATTACHED_SKB:
      return q.skb_prog_id;
    case XDP_ATTACHED_HW:
      return q.hw_prog_id;
    case XDP_ATTACHED_MULTI:
      return q.drv_prog_id ? q.drv_prog_id : q.skb_prog_id;
  }
  return 0u;
}

absl::StatusOr<XdpMode> AttachXdpLink(struct bpf_program* prog, int ifindex,
                                      const std::string& pin_path) {
  auto updated = UpdatePinnedXdpLink(prog, ifindex, pin_path);
  if (!updated.ok()) return updated.status();
  if (*updated) return AttachedXdpMode(ifindex);

  // No live link of Sluice's for the device: a stale pin goes (detaching it from a device it no
  // longer serves); a program already on the device is someone else's.
  if (auto st = DetachXdpLink(pin_path); !st.ok()) return st;
  auto existing = AttachedXdpMode(ifindex);
  if (!existing.ok()) return existing.status();
  if (*existing != XdpMode::kNone) return XdpMode::kNone;

  XdpMode mode = XdpMode::kNative;
  LIBBPF_OPTS(bpf_link_create_opts, opts);
  opts.flags = XDP_FLAGS_DRV_MODE;
  int fd = bpf_link_create(bpf_program__fd(prog), ifindex, BPF_XDP, &opts);
  if (fd < 0 && (errno == EOPNOTSUPP || errno == EINVAL)) {
    mode = XdpMode::kGeneric;
    opts.flags = XDP_FLAGS_SKB_MODE;
    fd = bpf_link_create(bpf_program__fd(prog), ifindex, BPF_XDP, &opts);
  }
  if (fd < 0) {
    return ErrnoStatus(
        errno, absl::StrCat("attach ", bpf_program__name(prog), " to XDP of ifindex ", ifindex));
  }
  Fd link{fd};
  if (bpf_obj_pin(link.fd, pin_path.c_str()) != 0) {
    // Closing the only reference detaches the program again.
    return ErrnoStatus(errno, absl::StrCat("pin link ", pin_path));
  }
  return mode;
}

}  // namespace sluice::loader
