#include "loader/datapath.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "loader/bpffs.h"
#include "loader/cgroup.h"
#include "spdlog/spdlog.h"

namespace sluice::loader {
namespace {

template <typename M>
absl::Status Adopt(M& out, const struct bpf_map* map) {
  auto m = M::FromFd(bpf_map__fd(map));
  if (!m.ok()) return m.status();
  out = std::move(*m);
  return absl::OkStatus();
}

// Every BPF object defines every map of maps/map_list.h under its name there (bpf/lib/maps.h),
// and no other but its own (never pinned by name): an object with stages has its program array,
// the scratch entry the stages hand over in (bpf/lib/stages.h) and its load-time constants
// (.rodata). Checked here for each skeleton, so a BPF map name and its C++ constant
// cannot drift apart.
template <typename Skel>
constexpr bool HasExactlyTheListedMaps(size_t own_maps = 0) {
  using SkelMaps = decltype(std::declval<Skel&>().maps);
#define SLUICE_SKEL_HAS_MAP(name_, ...)                                                       \
  static_assert(std::is_same_v<decltype(std::declval<SkelMaps&>().name_), struct bpf_map*>, \
                "BPF object lacks map " #name_);
  SLUICE_MAPS(SLUICE_SKEL_HAS_MAP)
  SLUICE_MAPS_OF_MAPS(SLUICE_SKEL_HAS_MAP)
#undef SLUICE_SKEL_HAS_MAP
  return sizeof(SkelMaps) == (maps::kMapCount + own_maps) * sizeof(struct bpf_map*);
}
static_assert(HasExactlyTheListedMaps<sluice_pod_egress>(3), "sluice_pod_egress has unlisted maps");
static_assert(HasExactlyTheListedMaps<sluice_netdev>(2), "sluice_netdev has unlisted maps");
static_assert(HasExactlyTheListedMaps<sluice_sock_lb>(), "sluice_sock_lb has unlisted maps");
static_assert(HasExactlyTheListedMaps<sluice_overlay>(2), "sluice_overlay has unlisted maps");
// sluice_xdp has the scratch entry of lib/netdev.h, unused: it runs no stages.
static_assert(HasExactlyTheListedMaps<sluice_xdp>(1), "sluice_xdp has unlisted maps");

// Every object gets the same sizes: they share each map through its pin, and an object with
// another size would replace the pin the previous one made.
template <typename Skel>
typename Skeleton<Skel>::Configure SizeMaps(const MapSizes& sizes) {
  return [&sizes](Skel* skel) -> absl::Status {
    struct bpf_map* map;
    bpf_object__for_each_map(map, skel->obj) {
      auto it = sizes.find(bpf_map__name(map));
      if (it == sizes.end()) continue;
      if (int err = bpf_map__set_max_entries(map, it->second); err != 0) {
        return ErrnoStatus(-err, absl::StrCat("size map ", it->first, " to ", it->second));
      }
    }
    return absl::OkStatus();
  };
}

uint32_t ObjectId(int fd) {
  struct bpf_map_info info = {};
  uint32_t len = sizeof(info);
  return bpf_obj_get_info_by_fd(fd, &info, &len) == 0 ? info.id : 0;
}

// Pins `map` (a program array) at <root>/stages/<name>_<map id> (bpffs refuses names with a
// dot); returns the path.
absl::StatusOr<std::string> PinStages(const std::string& root, const struct bpf_map* map) {
  std::string dir = absl::StrCat(root, "/", kStagesDir);
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, absl::StrCat("mkdir ", dir));
  }
  const int fd = bpf_map__fd(map);
  std::string path = absl::StrCat(dir, "/", bpf_map__name(map), "_", ObjectId(fd));
  if (bpf_obj_pin(fd, path.c_str()) != 0) return ErrnoStatus(errno, absl::StrCat("pin ", path));
  return path;
}

// The ids of the maps every live program uses, leaving out the programs in `skip`.
absl::StatusOr<std::set<uint32_t>> MapsInUse(const std::set<uint32_t>& skip) {
  std::set<uint32_t> used;
  uint32_t id = 0;
  while (bpf_prog_get_next_id(id, &id) == 0) {
    if (skip.count(id) != 0) continue;
    int fd = bpf_prog_get_fd_by_id(id);
    if (fd < 0) continue;  // gone since
    uint32_t ids[64];
    struct bpf_prog_info info = {};
    info.nr_map_ids = sizeof(ids) / sizeof(ids[0]);
    info.map_ids = reinterpret_cast<uint64_t>(ids);
    uint32_t len = sizeof(info);
    int err = bpf_obj_get_info_by_fd(fd, &info, &len);
    close(fd);
    if (err != 0) continue;
    used.insert(ids, ids + std::min<uint32_t>(info.nr_map_ids, sizeof(ids) / sizeof(ids[0])));
  }
  if (errno != ENOENT) return ErrnoStatus(errno, "list BPF programs");
  return used;
}

}  // namespace

absl::StatusOr<int> Datapath::ReleaseReplacedStages() {
  const std::string dir = absl::StrCat(root_, "/", kStagesDir);
  std::vector<std::string> replaced;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (std::find(stage_pins_.begin(), stage_pins_.end(), e.path().string()) == stage_pins_.end())
      replaced.push_back(e.path().string());
  }
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return absl::InternalError(absl::StrCat("list ", dir, ": ", ec.message()));
  }
  if (replaced.empty()) return 0;
  // An array's own stages use it (they call the next stage through it): only a program outside
  // the array keeps it, which is an entry program still attached somewhere.
  struct Pinned {
    std::string path;
    uint32_t id;
  };
  std::vector<Pinned> pinned;
  std::set<uint32_t> stages;
  for (const std::string& path : replaced) {
    int fd = bpf_obj_get(path.c_str());
    if (fd < 0) continue;
    pinned.push_back({path, ObjectId(fd)});
    uint32_t key = 0, next = 0, prog_id = 0;
    const uint32_t* cur = nullptr;
    while (bpf_map_get_next_key(fd, cur, &next) == 0) {
      // From user space, a program array's lookup answers the program's id.
      if (bpf_map_lookup_elem(fd, &next, &prog_id) == 0) stages.insert(prog_id);
      key = next;
      cur = &key;
    }
    close(fd);
  }
  auto used = MapsInUse(stages);
  if (!used.ok()) return used.status();
  int released = 0;
  for (const Pinned& p : pinned) {
    if (used->count(p.id) != 0) continue;
    if (unlink(p.path.c_str()) != 0) return ErrnoStatus(errno, absl::StrCat("unpin ", p.path));
    ++released;
  }
  if (released > 0) spdlog::info("released {} program arrays of replaced programs", released);
  return released;
}

absl::Status ValidateMapSizes(const MapSizes& sizes) {
  for (const auto& [name, n] : sizes) {
    bool sizable = false;
    for (const char* s : kSizableMaps) sizable |= name == s;
    if (!sizable) return absl::InvalidArgumentError(absl::StrCat("map ", name, " is not sizable"));
    if (n == 0 || n > (1u << 28)) {
      return absl::InvalidArgumentError(
          absl::StrCat("map ", name, ": want 1 .. 268435456 entries, not ", n));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Datapath>> Datapath::Load(const std::string& bpffs_root,
                                                         const MapSizes& sizes,
                                                         XdpProgram xdp_program) {
  if (auto st = ValidateMapSizes(sizes); !st.ok()) return st;
  if (auto st = EnsureBpffs(bpffs_root); !st.ok()) return st;
  std::unique_ptr<Datapath> dp(new Datapath());
  dp->root_ = bpffs_root;

  // sluice_sock_lb first and alone: the smallest object, it makes every shared pin (or reuses
  // it, or replaces one of another layout), so the objects after it only reuse pins. Those load
  // at once, each on a thread of its own: the kernel verifies a program in the thread that loads
  // it, and the objects' verification is most of an agent's start (bench/README.md, "Start-up does
  // not grow").
  auto sock = Skeleton<sluice_sock_lb>::OpenAndLoad(bpffs_root, SizeMaps<sluice_sock_lb>(sizes));
  if (!sock.ok()) return sock.status();
  dp->sock_lb_ = std::move(*sock);
  absl::StatusOr<std::unique_ptr<Skeleton<sluice_pod_egress>>> pod = absl::UnknownError("");
  absl::StatusOr<std::unique_ptr<Skeleton<sluice_netdev>>> netdev = absl::UnknownError("");
  absl::StatusOr<std::unique_ptr<Skeleton<sluice_overlay>>> overlay = absl::UnknownError("");
  absl::StatusOr<std::unique_ptr<Skeleton<sluice_xdp>>> xdp = nullptr;
  {
    std::vector<std::thread> loads;
    loads.emplace_back([&] {
      pod =
          Skeleton<sluice_pod_egress>::OpenAndLoad(bpffs_root, SizeMaps<sluice_pod_egress>(sizes));
    });
    loads.emplace_back([&] {
      netdev = Skeleton<sluice_netdev>::OpenAndLoad(bpffs_root, SizeMaps<sluice_netdev>(sizes));
    });
    loads.emplace_back([&] {
      overlay = Skeleton<sluice_overlay>::OpenAndLoad(bpffs_root, SizeMaps<sluice_overlay>(sizes));
    });
    if (xdp_program == XdpProgram::kLoad) {
      loads.emplace_back([&] {
        xdp = Skeleton<sluice_xdp>::OpenAndLoad(bpffs_root, SizeMaps<sluice_xdp>(sizes));
      });
    }
    for (std::thread& t : loads) t.join();
  }
  if (!pod.ok()) return pod.status();
  dp->pod_egress_ = std::move(*pod);
  if (!netdev.ok()) return netdev.status();
  dp->netdev_ = std::move(*netdev);
  if (!overlay.ok()) return overlay.status();
  dp->overlay_ = std::move(*overlay);
  if (!xdp.ok()) return xdp.status();
  dp->xdp_ = std::move(*xdp);
  for (const struct bpf_map* stages :
       {(*dp->pod_egress_)->maps.sluice_pod_stages, (*dp->netdev_)->maps.sluice_net_stages,
        (*dp->overlay_)->maps.sluice_net_stages}) {
    auto pinned = PinStages(bpffs_root, stages);
    if (!pinned.ok()) return pinned.status();
    dp->stage_pins_.push_back(*pinned);
  }

  // All objects share every map through its pin; take the handles from the first one.
  auto* m = &(*dp->pod_egress_)->maps;
  for (auto st :
       {Adopt(dp->endpoints_, m->sluice_ep4),       Adopt(dp->ep4_slot_, m->sluice_ep4_slot),
        Adopt(dp->ep4_rec_, m->sluice_ep4_rec),     Adopt(dp->node_, m->sluice_node),
        Adopt(dp->nomasq_, m->sluice_nomasq4),      Adopt(dp->snat_, m->sluice_snat4),
        Adopt(dp->rnat_, m->sluice_rnat4),          Adopt(dp->drops_, m->sluice_drops),
        Adopt(dp->forward_, m->sluice_forward),     Adopt(dp->lb4_svc_, m->sluice_lb4_svc),
        Adopt(dp->lb4_be_, m->sluice_lb4_be),       Adopt(dp->lb4_rec_, m->sluice_lb4_rec),
        Adopt(dp->lb4_mag_, m->sluice_lb4_mag),
        Adopt(dp->lb4_rnat_, m->sluice_lb4_rnat),   Adopt(dp->ct4_, m->sluice_ct4),
        Adopt(dp->ct4_any_, m->sluice_ct4_any),     Adopt(dp->ct_stats_, m->sluice_ct_stats),
        Adopt(dp->frag4_, m->sluice_frag4),         Adopt(dp->lb4_srcr_, m->sluice_lb4_srcr),
        Adopt(dp->lb4_aff_, m->sluice_lb4_aff),     Adopt(dp->lb4_nbport_, m->sluice_lb4_nbport),
        Adopt(dp->sock_cfg_, m->sluice_sock_cfg),   Adopt(dp->sock4_rnat_, m->sluice_sock4_rnat),
        Adopt(dp->ipcache4_, m->sluice_ipcache4),   Adopt(dp->policy4_, m->sluice_policy4),
        Adopt(dp->policy_ep_, m->sluice_policy_ep), Adopt(dp->pol_drops_, m->sluice_pol_drops),
        Adopt(dp->tunnel4_, m->sluice_tunnel4),     Adopt(dp->ct_pairs_, m->sluice_ct_pairs),

        Adopt(dp->monitor_, m->sluice_monitor),     Adopt(dp->mon_cpu_, m->sluice_mon_cpu)}) {
    if (!st.ok()) return st;
  }
  // The endpoints' index as the last run left it (or empty, from programs without it).
  dp->endpoint_table_ =
      std::make_unique<EndpointTable>(dp->endpoints_, dp->ep4_slot_, dp->ep4_rec_);
  if (auto st = dp->endpoint_table_->Rebuild(); !st.ok()) return st;
  if (auto released = dp->ReleaseReplacedStages(); !released.ok()) return released.status();
  return dp;
}

int Datapath::events_fd() const { return bpf_map__fd((*pod_egress_)->maps.sluice_events); }

int Datapath::from_pod_fd() const {
  return bpf_program__fd((*pod_egress_)->progs.sluice_from_pod);
}
int Datapath::to_pod_fd() const { return bpf_program__fd((*pod_egress_)->progs.sluice_to_pod); }
int Datapath::from_net_fd() const { return bpf_program__fd((*netdev_)->progs.sluice_from_net); }
int Datapath::to_net_fd() const { return bpf_program__fd((*netdev_)->progs.sluice_to_net); }
int Datapath::from_overlay_fd() const {
  return bpf_program__fd((*overlay_)->progs.sluice_from_overlay);
}

int Datapath::xdp_net_fd() const {
  return xdp_ ? bpf_program__fd((*xdp_)->progs.sluice_xdp_net) : -1;
}

absl::StatusOr<XdpMode> Datapath::AttachXdp(int ifindex) {
  if (!xdp_) {
    return absl::FailedPreconditionError(
        "attach XDP: sluice_xdp was not loaded (XdpProgram::kSkip)");
  }
  std::string dir = absl::StrCat(root_, "/", SLUICE_LINKS_DIR);
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, absl::StrCat("mkdir ", dir));
  }
  return AttachXdpLink((*xdp_)->progs.sluice_xdp_net, ifindex, LinkPinPath(kXdpLinkName));
}

absl::Status Datapath::DetachXdp() { return DetachXdpLink(LinkPinPath(kXdpLinkName)); }

absl::Status Datapath::AttachPod(int host_ifindex) {
  // The pod's ingress policy point first: the pod sends nothing before both are in place.
  if (auto st = AttachTc(host_ifindex, TcDirection::kEgress, to_pod_fd()); !st.ok()) return st;
  if (auto st = AttachTc(host_ifindex, TcDirection::kIngress, from_pod_fd()); !st.ok()) return st;
  ReleaseAfterAttach();
  return absl::OkStatus();
}

void Datapath::ReleaseAfterAttach() {
  // The device's earlier entry program may have been the last user of an older build's stages.
  if (auto released = ReleaseReplacedStages(); !released.ok()) {
    spdlog::warn("release replaced stages: {}", released.status().ToString());
  }
}

absl::Status Datapath::AttachNative(int ifindex) {
  if (auto st = AttachTc(ifindex, TcDirection::kIngress, from_net_fd()); !st.ok()) return st;
  if (auto st = AttachTc(ifindex, TcDirection::kEgress, to_net_fd()); !st.ok()) return st;
  ReleaseAfterAttach();
  return absl::OkStatus();
}

absl::Status Datapath::DetachNative(int ifindex) {
  if (auto st = DetachTc(ifindex, TcDirection::kIngress); !st.ok()) return st;
  return DetachTc(ifindex, TcDirection::kEgress);
}

absl::Status Datapath::AttachOverlay(int ifindex) {
  if (auto st = AttachTc(ifindex, TcDirection::kIngress, from_overlay_fd()); !st.ok()) return st;
  ReleaseAfterAttach();
  return absl::OkStatus();
}

std::string Datapath::LinkPinPath(const char* link_name) const {
  return absl::StrCat(root_, "/", SLUICE_LINKS_DIR, "/", link_name);
}

int Datapath::sock_connect4_fd() const {
  return bpf_program__fd((*sock_lb_)->progs.sluice_connect4);
}
int Datapath::sock_sendmsg4_fd() const {
  return bpf_program__fd((*sock_lb_)->progs.sluice_sendmsg4);
}
int Datapath::sock_recvmsg4_fd() const {
  return bpf_program__fd((*sock_lb_)->progs.sluice_recvmsg4);
}
int Datapath::sock_getpeername4_fd() const {
  return bpf_program__fd((*sock_lb_)->progs.sluice_getpeer4);
}

absl::Status Datapath::AttachSocketLb(const std::string& cgroup_path) {
  // The namespace filter is in place before any program can run with it.
  auto cookie = CurrentNetnsCookie();
  if (!cookie.ok()) return cookie.status();
  sluice_sock_config cfg{};
  cfg.netns_cookie = *cookie;
  if (auto st = sock_cfg_.Update(0, cfg); !st.ok()) return st;

  std::string dir = absl::StrCat(root_, "/", SLUICE_LINKS_DIR);
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, absl::StrCat("mkdir ", dir));
  }
  int cg = open(cgroup_path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (cg < 0) return ErrnoStatus(errno, absl::StrCat("open cgroup ", cgroup_path));
  auto* p = &(*sock_lb_)->progs;
  const std::pair<struct bpf_program*, const char*> links[] = {
      // Reverse translation first: a translated socket never misses its way back.
      {p->sluice_recvmsg4, SLUICE_LINK_SOCK_RECVMSG4},
      {p->sluice_getpeer4, SLUICE_LINK_SOCK_GETPEERNAME4},
      {p->sluice_connect4, SLUICE_LINK_SOCK_CONNECT4},
      {p->sluice_sendmsg4, SLUICE_LINK_SOCK_SENDMSG4},
  };
  absl::Status status;
  for (const auto& [prog, name] : links) {
    status = AttachCgroupLink(prog, cg, LinkPinPath(name));
    if (!status.ok()) {
      status = absl::Status(
          status.code(), absl::StrCat("socket LB on cgroup ", cgroup_path, ": ", status.message()));
      break;
    }
  }
  close(cg);
  return status;
}

absl::Status Datapath::DetachSocketLb() {
  for (const char* name : {SLUICE_LINK_SOCK_CONNECT4, SLUICE_LINK_SOCK_SENDMSG4,
                           SLUICE_LINK_SOCK_RECVMSG4, SLUICE_LINK_SOCK_GETPEERNAME4}) {
    if (auto st = DetachPinnedLink(LinkPinPath(name)); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<DropTotal>> ReadDropTotals(maps::DropMap& drops) {
  std::vector<DropTotal> out;
  for (unsigned reason = 0; reason < SLUICE_DROP_MAX; ++reason) {
    const char* name = sluice_drop_reason_name(reason);
    if (name == nullptr) continue;
    DropTotal t{reason, name, 0, 0};
    for (unsigned dir = 0; dir < SLUICE_DROP_DIR_MAX; ++dir) {
      auto per_cpu = drops.Lookup(SLUICE_DROP_KEY(reason, dir));
      if (!per_cpu.ok()) return per_cpu.status();
      for (const auto& c : *per_cpu) {
        t.dir_packets[dir] += c.packets;
        t.dir_bytes[dir] += c.bytes;
      }
      t.packets += t.dir_packets[dir];
      t.bytes += t.dir_bytes[dir];
    }
    out.push_back(t);
  }
  return out;
}

absl::StatusOr<std::vector<ForwardTotal>> ReadForwardTotals(maps::ForwardMap& fwd) {
  std::vector<ForwardTotal> out;
  for (unsigned dir = 0; dir < SLUICE_FWD_DIR_MAX; ++dir) {
    auto per_cpu = fwd.Lookup(dir);
    if (!per_cpu.ok()) return per_cpu.status();
    ForwardTotal t{dir, sluice_fwd_dir_name(dir), 0, 0};
    for (const auto& c : *per_cpu) {
      t.packets += c.packets;
      t.bytes += c.bytes;
    }
    out.push_back(t);
  }
  return out;
}

absl::StatusOr<std::vector<ForwardTotal>> Datapath::ForwardTotals() const {
  return ReadForwardTotals(const_cast<maps::ForwardMap&>(forward_));
}

absl::StatusOr<std::vector<DropTotal>> Datapath::DropTotals() const {
  return ReadDropTotals(const_cast<maps::DropMap&>(drops_));
}

}  // namespace sluice::loader
