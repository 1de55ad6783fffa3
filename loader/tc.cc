#include "loader/tc.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <net/if.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "maps/map.h"
#include "spdlog/spdlog.h"

namespace sluice::loader {
namespace {

// A fixed handle/priority is what makes re-attach a replace.
constexpr uint32_t kHandle = kTcHandle;
constexpr uint32_t kPriority = kTcPriority;
constexpr char kSluiceProgramPrefix[] = "sluice_";

const char* Name(TcDirection dir) { return dir == TcDirection::kIngress ? "ingress" : "egress"; }

std::string IfName(int ifindex) {
  char buf[IF_NAMESIZE] = {};
  if (if_indextoname(ifindex, buf) == nullptr) return absl::StrCat("ifindex ", ifindex);
  return buf;
}

bpf_tc_attach_point Point(TcDirection dir) {
  return dir == TcDirection::kIngress ? BPF_TC_INGRESS : BPF_TC_EGRESS;
}

// The name of the loaded program `id` ("" if it is gone).
std::string ProgramName(uint32_t id) {
  int fd = bpf_prog_get_fd_by_id(id);
  if (fd < 0) return "";
  bpf_prog_info info{};
  uint32_t len = sizeof(info);
  std::string name;
  if (bpf_obj_get_info_by_fd(fd, &info, &len) == 0) name = info.name;
  close(fd);
  return name;
}

// Removes the filter at the legacy slot 1/1 when it runs a Sluice program (an agent from before
// Sluice had a slot of its own attached it). A filter of another kind there (u32, matchall: the
// query asks for kind "bpf" and the kernel answers EINVAL) or a bpf program of someone else's is
// left alone.
absl::Status RemoveLegacySluiceFilter(bpf_tc_hook* hook, TcDirection dir, int ifindex) {
  LIBBPF_OPTS(bpf_tc_opts, query, .handle = kLegacyTcHandle, .priority = kLegacyTcPriority);
  int err = bpf_tc_query(hook, &query);
  if (err == -ENOENT || err == -EINVAL || err == -ENODEV) return absl::OkStatus();
  if (err != 0) {
    return ErrnoStatus(-err,
                       absl::StrCat("query legacy tc ", Name(dir), " slot on ", IfName(ifindex)));
  }
  const std::string name = ProgramName(query.prog_id);
  if (!absl::StartsWith(name, kSluiceProgramPrefix)) {
    spdlog::info("tc {} on {}: pref {} handle {} runs program {} \"{}\", not Sluice's; leaving it",
                 Name(dir), IfName(ifindex), kLegacyTcPriority, kLegacyTcHandle, query.prog_id,
                 name);
    return absl::OkStatus();
  }
  LIBBPF_OPTS(bpf_tc_opts, legacy, .handle = kLegacyTcHandle, .priority = kLegacyTcPriority);
  err = bpf_tc_detach(hook, &legacy);
  if (err != 0 && err != -ENOENT && err != -EINVAL) {
    return ErrnoStatus(-err,
                       absl::StrCat("detach legacy tc ", Name(dir), " slot on ", IfName(ifindex)));
  }
  spdlog::info("tc {} on {}: removed Sluice's {} from the legacy slot pref {} handle {}", Name(dir),
               IfName(ifindex), name, kLegacyTcPriority, kLegacyTcHandle);
  return absl::OkStatus();
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
  return RemoveLegacySluiceFilter(&hook, dir, ifindex);
}

absl::Status DetachTc(int ifindex, TcDirection dir) {
  LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = ifindex, .attach_point = Point(dir));
  LIBBPF_OPTS(bpf_tc_opts, opts, .handle = kHandle, .priority = kPriority);
  int err = bpf_tc_detach(&hook, &opts);
  if (err != 0 && err != -ENOENT && err != -ENODEV && err != -EINVAL) {
    return ErrnoStatus(-err,
                             absl::StrCat("detach tc ", Name(dir), " on ", IfName(ifindex)));
  }
  return RemoveLegacySluiceFilter(&hook, dir, ifindex);
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
