// The node's loaded datapath: every Sluice BPF object loaded against one bpffs root (maps
// pinned and shared by name), the programs ready to attach, and typed handles on the maps.
#pragma once

#include <netinet/in.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "loader/endpoint_table.h"
#include "loader/skeleton.h"
#include "loader/tc.h"
#include "loader/xdp.h"
#include "maps/maglev_tables.h"
#include "maps/sluice_maps.h"
#include "sluice_netdev.skel.h"
#include "sluice_netdev_compat.skel.h"
#include "sluice_overlay.skel.h"
#include "sluice_overlay_compat.skel.h"
#include "sluice_pod_egress.skel.h"
#include "sluice_pod_egress_compat.skel.h"
#include "sluice_sock_lb.skel.h"
#include "sluice_xdp.skel.h"

namespace sluice::loader {

SLUICE_SKELETON_OPS_KERN_CTX(sluice_pod_egress);
SLUICE_SKELETON_OPS_KERN_CTX(sluice_netdev);
SLUICE_SKELETON_OPS(sluice_sock_lb);
SLUICE_SKELETON_OPS_KERN_CTX(sluice_overlay);
SLUICE_SKELETON_OPS(sluice_xdp);

// Program arrays of objects with stages (bpf/lib/stages.h) are pinned under <bpffs root>/stages/,
// one pin per load, named <array>_<map id>: unpinned, the kernel would empty an array once the
// agent that loaded it exits, and every packet of its entry program would be a missing_stage
// drop. A load's array is its own and never reused, so an entry program only ever calls stages
// of its own build.
inline constexpr char kStagesDir[] = "stages";

// The pin (under <bpffs root>/links/) of the native device's XDP link.
inline constexpr char kXdpLinkName[] = "sluice_xdp_net";

// Sizes from configuration: max_entries per map name (maps/map_list.h). A map not named keeps its
// compiled-in size. Only the maps in kSizableMaps may be sized.
using MapSizes = std::map<std::string, uint32_t>;
inline constexpr const char* kSizableMaps[] = {
    maps::name::sluice_lb4_svc, maps::name::sluice_lb4_be,  maps::name::sluice_lb4_rnat,
    maps::name::sluice_ct4,     maps::name::sluice_ct4_any, maps::name::sluice_snat4,
    maps::name::sluice_rnat4,   maps::name::sluice_frag4,   maps::name::sluice_ep4,
    maps::name::sluice_policy4};
// Checks names (sizable maps only) and sizes (1 .. 2^28).
[[nodiscard]] absl::Status ValidateMapSizes(const MapSizes& sizes);

// One drop reason's counters summed over CPUs: in total and per direction (enum
// sluice_drop_dir, maps/drop.h).
struct DropTotal {
  unsigned reason;
  const char* name;
  uint64_t packets;
  uint64_t bytes;
  uint64_t dir_packets[SLUICE_DROP_DIR_MAX] = {};
  uint64_t dir_bytes[SLUICE_DROP_DIR_MAX] = {};
};

// One forwarding direction's counters (enum sluice_fwd_dir, maps/forward.h) summed over CPUs.
struct ForwardTotal {
  unsigned dir;
  const char* name;
  uint64_t packets;
  uint64_t bytes;
};

class Datapath {
 public:
  // Mounts bpffs at `bpffs_root` if needed and loads every program. Maps pinned by an earlier
  // run (an agent restart) are reused with their contents; `sizes` sets max_entries before load.
  // A pin of another size (the configuration changed) is replaced by an empty map of the new
  // size: the agent repopulates the maps it writes (Services) on its first sync; flows in a
  // replaced conntrack or NAT map are lost (docs/operating.md, "Map sizes").
  // XdpProgram::kSkip leaves sluice_xdp out (--lb_acceleration=disabled): its verification
  // is about a sixth of the objects' (bench/README.md), for a program never attached; AttachXdp
  // then fails and xdp_net_fd() is -1.
  enum class XdpProgram { kLoad, kSkip };
  static absl::StatusOr<std::unique_ptr<Datapath>> Load(const std::string& bpffs_root,
                                                        const MapSizes& sizes = {},
                                                        XdpProgram xdp = XdpProgram::kLoad);

  const std::string& bpffs_root() const { return root_; }

  int from_pod_fd() const;
  int to_pod_fd() const;
  int from_net_fd() const;
  int to_net_fd() const;
  int from_overlay_fd() const;
  int xdp_net_fd() const;

  // Pod programs on a pod's host-side veth: what the pod sends (TC ingress) and what the node's
  // stack delivers to it (TC egress, the pod's ingress policy).
  [[nodiscard]] absl::Status AttachPod(int host_ifindex);
  // Unpins the program arrays of earlier loads (kStagesDir) that no entry program uses any more
  // (every device that ran it now runs this load's). Called by Load and after each Attach* of a
  // TC program with stages, so the arrays of a replaced build go once its last entry program is
  // gone. A replaced filter lets its program go after an RCU grace period, too late for the
  // last attach's own call: the agent's start waits for it (AwaitReplacedStagesReleased,
  // loader/stage_pins.h). Returns how many went.
  [[nodiscard]] absl::StatusOr<int> ReleaseReplacedStages();
  // Masquerade programs on the native device (egress) and their reverse (ingress).
  [[nodiscard]] absl::Status AttachNative(int ifindex);
  [[nodiscard]] absl::Status DetachNative(int ifindex);
  // NodePort acceleration (--lb_acceleration=native): sluice_xdp_net on the native device
  // through a link pinned at LinkPinPath(kXdpLinkName), native mode or generic where the driver
  // lacks it; kNone when another program holds the device's XDP hook (it is left alone).
  [[nodiscard]] absl::StatusOr<XdpMode> AttachXdp(int ifindex);
  // Unpins the XDP link (--lb_acceleration=disabled), which detaches Sluice's program; none is
  // not an error. Another program's XDP stays.
  [[nodiscard]] absl::Status DetachXdp();
  // Tunnel mode: the receive program on the node's VXLAN device (TC ingress).
  [[nodiscard]] absl::Status AttachOverlay(int ifindex);
  // Socket-level load balancing (cgroup connect4/sendmsg4/recvmsg4/getpeername4) for the
  // sockets of the calling thread's network namespace in the cgroup v2 subtree at `cgroup_path`.
  // The links are pinned under <bpffs root>/links/: they outlive the agent, a second call (or a
  // restarted agent) swaps the programs in place, and removing the pins or the bpffs detaches.
  [[nodiscard]] absl::Status AttachSocketLb(const std::string& cgroup_path);
  // Unpins socket-LB links of an earlier run (--socket_lb=false); none is not an error.
  [[nodiscard]] absl::Status DetachSocketLb();
  // Where AttachSocketLb pins the link of `link_name` (SLUICE_LINK_SOCK_*).
  std::string LinkPinPath(const char* link_name) const;
  int sock_connect4_fd() const;
  int sock_sendmsg4_fd() const;
  int sock_recvmsg4_fd() const;
  int sock_getpeername4_fd() const;

  // sluice_ep4 as tools read it; every write of an endpoint goes through endpoint_table(), which
  // keeps the datapath's index of it (loader/endpoint_table.h) in step.
  maps::EndpointMap& endpoints() { return endpoints_; }
  EndpointTable& endpoint_table() { return *endpoint_table_; }
  maps::Ep4SlotMap& ep4_slots() { return ep4_slot_; }
  maps::Ep4RecordMap& ep4_records() { return ep4_rec_; }
  maps::NodeConfigMap& node_config() { return node_; }
  maps::NoMasqMap& nomasq() { return nomasq_; }
  maps::NatMap& snat() { return snat_; }
  maps::NatMap& rnat() { return rnat_; }
  maps::DropMap& drops() { return drops_; }
  maps::ForwardMap& forwards() { return forward_; }
  // Service load balancing: services (master + slots), backends, reverse NAT, conntrack.
  maps::Lb4ServiceMap& lb4_services() { return lb4_svc_; }
  maps::Lb4BackendMap& lb4_backends() { return lb4_be_; }
  // Slot records of frontends (maps/lb.h), written with their masters (agent/service/).
  maps::Lb4SlotRecordMap& lb4_slot_records() { return lb4_rec_; }
  // Maglev tables of frontends with SLUICE_SVC_F_MAGLEV (maps/maglev_tables.h).
  maps::MaglevTables& lb4_maglev() { return lb4_mag_; }
  maps::Lb4RevNatMap& lb4_revnat() { return lb4_rnat_; }
  // Conntrack: TCP in ct4() (never evicted), every other protocol in ct4_any() (LRU);
  // ct4_of(proto) is the one a tuple's entries live in. Datapath counters in ct_stats().
  maps::Ct4Map& ct4() { return ct4_; }
  maps::Ct4Map& ct4_any() { return ct4_any_; }
  maps::Ct4Map& ct4_of(uint8_t proto) { return proto == IPPROTO_TCP ? ct4_ : ct4_any_; }
  maps::CtStatsMap& ct_stats() { return ct_stats_; }
  // Whether flows with a forward and a reply entry may exist (maps/conntrack.h).
  maps::CtPairsMap& ct_pairs() { return ct_pairs_; }
  // Later IPv4 fragments: a datagram's first fragment's L4 fields (maps/frag.h).
  maps::Frag4Map& frag4() { return frag4_; }
  maps::Lb4SourceRangeMap& lb4_source_ranges() { return lb4_srcr_; }
  maps::Lb4AffinityMap& lb4_affinity() { return lb4_aff_; }
  maps::Lb4NonBackendPortMap& lb4_non_backend_ports() { return lb4_nbport_; }
  // Socket-level LB: the namespace it acts in, and per-socket reverse translation.
  maps::SockConfigMap& sock_config() { return sock_cfg_; }
  maps::Sock4RevNatMap& sock4_revnat() { return sock4_rnat_; }
  // NetworkPolicy: ipcache, allow entries, per-endpoint enforcement, per-endpoint drops.
  maps::Ipcache4Map& ipcache4() { return ipcache4_; }
  maps::Policy4Map& policy4() { return policy4_; }
  maps::PolicyEndpointMap& policy_ep() { return policy_ep_; }
  maps::PolicyDropMap& policy_drops() { return pol_drops_; }
  // Other nodes: pod CIDR or node address -> node address (docs/routing.md).
  maps::Tunnel4Map& tunnel4() { return tunnel4_; }
  // The flow monitor (maps/events.h): its switch and per-CPU counters; the ring buffer's fd.
  maps::MonitorConfigMap& monitor_config() { return monitor_; }
  maps::MonitorCpuMap& monitor_cpu() { return mon_cpu_; }
  int events_fd() const;

  // Per-reason drop counts summed over CPUs (reasons with a name only).
  [[nodiscard]] absl::StatusOr<std::vector<DropTotal>> DropTotals() const;
  // Per-direction forward counts summed over CPUs.
  [[nodiscard]] absl::StatusOr<std::vector<ForwardTotal>> ForwardTotals() const;

 private:
  Datapath() = default;
  void ReleaseAfterAttach();  // ReleaseReplacedStages, a failure logged

  std::string root_;
  std::vector<std::string> stage_pins_;  // this load's program arrays (kStagesDir)
  std::unique_ptr<Skeleton<sluice_pod_egress>> pod_egress_;
  std::unique_ptr<Skeleton<sluice_netdev>> netdev_;
  std::unique_ptr<Skeleton<sluice_sock_lb>> sock_lb_;
  std::unique_ptr<Skeleton<sluice_overlay>> overlay_;
  std::unique_ptr<Skeleton<sluice_xdp>> xdp_;
  maps::EndpointMap endpoints_;
  maps::Ep4SlotMap ep4_slot_;
  maps::Ep4RecordMap ep4_rec_;
  std::unique_ptr<EndpointTable> endpoint_table_;
  maps::NodeConfigMap node_;
  maps::NoMasqMap nomasq_;
  maps::NatMap snat_;
  maps::NatMap rnat_;
  maps::DropMap drops_;
  maps::ForwardMap forward_;
  maps::Lb4ServiceMap lb4_svc_;
  maps::Lb4BackendMap lb4_be_;
  maps::Lb4SlotRecordMap lb4_rec_;
  maps::MaglevTables lb4_mag_;
  maps::Lb4RevNatMap lb4_rnat_;
  maps::Ct4Map ct4_;
  maps::Ct4Map ct4_any_;
  maps::Frag4Map frag4_;
  maps::CtStatsMap ct_stats_;
  maps::CtPairsMap ct_pairs_;
  maps::Lb4SourceRangeMap lb4_srcr_;
  maps::Lb4AffinityMap lb4_aff_;
  maps::Lb4NonBackendPortMap lb4_nbport_;
  maps::SockConfigMap sock_cfg_;
  maps::Sock4RevNatMap sock4_rnat_;
  maps::Ipcache4Map ipcache4_;
  maps::Policy4Map policy4_;
  maps::PolicyEndpointMap policy_ep_;
  maps::PolicyDropMap pol_drops_;
  maps::Tunnel4Map tunnel4_;
  maps::MonitorConfigMap monitor_;
  maps::MonitorCpuMap mon_cpu_;
};

// Drop totals read straight from the pin (for sluicectl and tests without a loaded Datapath).
[[nodiscard]] absl::StatusOr<std::vector<DropTotal>> ReadDropTotals(maps::DropMap& drops);
[[nodiscard]] absl::StatusOr<std::vector<ForwardTotal>> ReadForwardTotals(maps::ForwardMap& fwd);

}  // namespace sluice::loader
