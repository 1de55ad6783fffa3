#include "loader/tc.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <net/if.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "maps/map.h"

namespace sluice::loader {
namespace {

// Sluice's slot on every hook. A fixed handle/priority is what makes re-attach a replace.
constexpr uint32_t kHandle = 1;
constexpr uint32_t kPriority = 1;

const char* Name(TcDirection dir) { return dir == TcDirection::kIngress ? "ingress" : "egress"; }

std::string IfName(int ifindex) {
  char buf[IF_NAMESIZE] = {};
  if (if_indextoname(ifindex, buf) == nullptr) return absl::StrCat("ifindex ", ifindex);
  return buf;
}

bpf_tc_attach_point Point(TcDirection dir) {
  return dir == TcDirection::kIngress ? BPF_TC_INGRESS : BPF_TC_EGRESS;
}

}  // namespace

absl::Status AttachTc(int ifindex, TcDirection dir, int prog_fd) {
  LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = ifindex, .attach_point = Point(dir));
  int err = bpf_tc_hook_create(&hook);
  if (err != 0 && err != -EEXIST) {
    return ErrnoStatus(-err, absl::StrCat("create clsact on ", IfName(ifindex)));
  }
  LIBBPF_OPTS(bpf_tc_opts, opts, .prog_fd = prog_fd,
              .flags = BPF_TC_F_REPLACE, .handle = kHandle, .priority = kPriority);
  err = bpf_tc_attach(&hook, &opts);
  if (err != 0) {
    return ErrnoStatus(-err,
                             absl::StrCat("attach tc ", Name(dir), " on ", IfName(ifindex)));
  }
  return absl::OkStatus();
}

absl::Status DetachTc(int ifindex, TcDirection dir) {
  LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = ifindex, .attach_point = Point(dir));
  LIBBPF_OPTS(bpf_tc_opts, opts, .handle = kHandle, .priority = kPriority);
  int err = bpf_tc_detach(&hook, &opts);
  if (err != 0 && err != -ENOENT && err != -ENODEV && err != -EINVAL) {
    return ErrnoStatus(-err,
                             absl::StrCat("detach tc ", Name(dir), " on ", IfName(ifindex)));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> AttachedTcProgram(int ifindex, TcDirection dir) {
  LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = ifindex, .attach_point = Point(dir));
  LIBBPF_OPTS(bpf_tc_opts, opts, .handle = kHandle, .priority = kPriority);
  int err = bpf_tc_query(&hook, &opts);
  if (err != 0) {
    return ErrnoStatus(-err, absl::StrCat("query tc ", Name(dir), " on ", IfName(ifindex)));
  }
  return opts.prog_id;
}

absl::StatusOr<uint32_t> ProgramId(int prog_fd) {
  bpf_prog_info info{};
  uint32_t len = sizeof(info);
  if (bpf_obj_get_info_by_fd(prog_fd, &info, &len) != 0) {
    return ErrnoStatus(errno, "program info");
  }
  return info.id;
}

}  // namespace sluice::loader
