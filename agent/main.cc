// sluice-agent: owns this node's datapath. Loads the BPF programs (reusing pinned maps), sets up
// the node, restores the endpoints of an earlier run, serves the endpoint API, and installs the
// CNI plugin once it can serve ADD. On SIGTERM it stops serving and leaves the datapath in place:
// pods keep their traffic while the agent is down.
#include <signal.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "agent/base/cli.h"
#include "agent/base/config_dir.h"
#include "agent/base/files.h"
#include "agent/bgp/start.h"
#include "agent/conntrack/start.h"
#include "agent/endpoint/cni_install.h"
#include "agent/endpoint/start.h"
#include "agent/k8s/watches.h"
#include "agent/kernel/netlink.h"
#include "agent/kernel/netns.h"
#include "agent/metrics/datapath_metrics.h"
#include "agent/metrics/start.h"
#include "agent/monitor/start.h"
#include "agent/policy/start.h"
#include "agent/routing/overlay.h"
#include "agent/routing/start.h"
#include "agent/service/start.h"
#include "agent/start/pieces.h"
#include "loader/datapath.h"
#include "loader/stage_pins.h"
#include "loader/uninstall.h"
#include "maps/types.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, pod_cidr, "",
          "this node's pod CIDR, e.g. 10.244.1.0/24 (ipam_mode=static); with ipam_mode=kubernetes "
          "it comes from the Node object");
ABSL_FLAG(std::string, ipam_mode, "",
          "kubernetes (pod CIDR from this node's Node object) or static (--pod_cidr); "
          "default: static when --pod_cidr is given, else kubernetes");
ABSL_FLAG(std::string, kubeconfig, "", "kubeconfig to reach the apiserver (default: in-cluster)");
ABSL_FLAG(std::string, k8s_service_host, "",
          "apiserver address, overriding kubeconfig and in-cluster (a kube-proxy replacement "
          "cannot rely on the kubernetes Service before its own datapath is up)");
ABSL_FLAG(std::string, k8s_service_port, "", "apiserver port, with --k8s_service_host");
ABSL_FLAG(std::string, node_name, "", "this node's Node name (default: $NODE_NAME, hostname)");
ABSL_FLAG(std::string, native_device, "",
          "node device for traffic leaving the node "
          "(default: the IPv4 default route's device)");
ABSL_FLAG(std::string, node_ip, "",
          "address pod traffic is masqueraded to "
          "(default: the native device's first IPv4 address)");
ABSL_FLAG(bool, masquerade, true, "masquerade pod traffic leaving the node");
ABSL_FLAG(std::vector<std::string>, non_masquerade_cidrs, {},
          "comma-separated destinations reached without masquerade (the pod CIDR always is)");
ABSL_FLAG(std::string, nat_port_range, "61000-65535",
          "source ports for masquerade; keep it apart from net.ipv4.ip_local_port_range");
ABSL_FLAG(std::string, service_cidr, "",
          "the cluster's ClusterIP range (kube-apiserver --service-cluster-ip-range); addresses "
          "in it that are no Service's are dropped");
ABSL_FLAG(bool, kube_proxy_replacement, true,
          "program Service load balancing (ClusterIP, NodePort, ExternalIP, LoadBalancer) from "
          "the Kubernetes Services and EndpointSlices, replacing kube-proxy; needs Kubernetes");
ABSL_FLAG(bool, network_policy, true,
          "enforce Kubernetes NetworkPolicies in the datapath (sluice_ipcache4, sluice_policy4, "
          "sluice_policy_ep); needs Kubernetes. false leaves every pod open (the maps are then "
          "not written)");
ABSL_FLAG(int, mtu, 0,
          "pod MTU (default: the native device's MTU, less 50 bytes of VXLAN in tunnel mode)");
ABSL_FLAG(std::string, routing_mode, "tunnel",
          "how pods reach other nodes' pods: tunnel (VXLAN between node addresses, "
          "docs/routing.md) or native (pod addresses on the underlay, BPF FIB routing)");
ABSL_FLAG(int, tunnel_port, 8472, "UDP port of the VXLAN overlay (routing_mode=tunnel)");
ABSL_FLAG(bool, auto_direct_node_routes, false,
          "routing_mode=native: route every other node's pod CIDR via its InternalIP (nodes on "
          "one L2); otherwise the network must route pod CIDRs");
ABSL_FLAG(std::string, ipv4_native_routing_cidr, "",
          "routing_mode=native: destinations reached without masquerade (the range the network "
          "routes natively, e.g. the cluster's pod range)");
ABSL_FLAG(bool, bgp_control_plane, false,
          "announce this node's pod CIDR over BGP to --bgp_peers and route by what they announce "
          "(BIRD, run and supervised by the agent; docs/routing.md, \"BGP\")");
ABSL_FLAG(uint32_t, bgp_local_asn, 64512, "bgp_control_plane: this node's autonomous system");
ABSL_FLAG(std::vector<std::string>, bgp_peers, {},
          "bgp_control_plane: peers as ADDRESS:ASN[:HOLD_SECONDS[:KEEPALIVE_SECONDS]] (default "
          "hold 9 s, keepalive 3 s), comma-separated");
ABSL_FLAG(uint32_t, bgp_graceful_restart_time, 120,
          "bgp_control_plane: seconds the peers keep this node's routes while BIRD restarts");
ABSL_FLAG(std::string, bgp_password_file, "",
          "bgp_control_plane: a file holding the TCP MD5 password of every session");
ABSL_FLAG(std::string, bgp_speaker_binary, "bird", "bgp_control_plane: BIRD 2's binary");
ABSL_FLAG(std::string, bpffs_root, SLUICE_DEFAULT_BPFFS_ROOT, "where maps are pinned");
ABSL_FLAG(std::string, state_dir, "/var/lib/sluice", "IPAM and endpoint records");
ABSL_FLAG(std::string, socket, "/run/sluice/sluice.sock", "endpoint API socket");
ABSL_FLAG(bool, install_cni, true, "install the CNI plugin and conflist once ready");
ABSL_FLAG(std::string, cni_conf_dir, "/etc/cni/net.d", "where 05-sluice.conflist goes");
ABSL_FLAG(std::string, cni_bin_dir, "/opt/cni/bin", "where the plugin binary goes");
ABSL_FLAG(std::string, cni_plugin, "", "sluice-cni binary to install (default: next to this one)");
ABSL_FLAG(std::string, cni_version, "1.0.0", "cniVersion of the installed conflist");
ABSL_FLAG(bool, cni_exclusive, false,
          "rename other plugins' configurations in --cni_conf_dir to *.sluice_bak");
ABSL_FLAG(bool, socket_lb, true,
          "socket-level Service load balancing for the node's own (host-network) processes: "
          "cgroup connect4/sendmsg4/recvmsg4/getpeername4 programs");
ABSL_FLAG(std::string, lb_acceleration, "disabled",
          "NodePort acceleration: native (XDP on the native device; generic XDP where the driver "
          "lacks native XDP) or disabled (TC only; detaches Sluice's XDP program)");
ABSL_FLAG(std::string, lb_algorithm, "random",
          "default backend selection for new flows to NodePort, ExternalIP and LoadBalancer "
          "frontends: random, or maglev (consistent hashing: every node picks the same backend "
          "for the same flow); a Service's service.sluice.dev/lb-algorithm or "
          "service.cilium.io/lb-algorithm annotation overrides it for all its frontends");
ABSL_FLAG(uint32_t, maglev_table_size, sluice::agent::kDefaultMaglevTableSize,
          "slots of each Maglev table: a prime from 251 to 131071 (4 bytes a slot per frontend)");
ABSL_FLAG(std::string, cgroup_root, "",
          "cgroup v2 directory the socket-LB programs attach to (default: the cgroup2 mount in "
          "/proc/mounts, else one mounted at /run/sluice/cgroupv2)");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error, critical, off");
ABSL_FLAG(bool, uninstall, false,
          "remove 05-sluice.conflist and the plugin binary (restoring configurations that "
          "--cni_exclusive moved aside), then exit; the datapath stays");
ABSL_FLAG(bool, uninstall_datapath, false,
          "with --uninstall: also detach Sluice's programs from every interface and remove "
          "every pin under --bpffs_root (pods lose their network)");
ABSL_FLAG(std::string, config_dir, "",
          "a directory of flag files (a mounted ConfigMap): file name = flag name, content = "
          "value; flags on the command line win");
ABSL_FLAG(bool, monitor, true,
          "run the flow monitor: datapath events for `sluicectl observe` (docs/observe.md)");
ABSL_FLAG(std::string, observe_socket, sluice::monitor::kDefaultObserveSocket,
          "unix socket `sluicectl observe` connects to (root only)");
ABSL_FLAG(std::string, monitor_events, "all",
          "events the datapath emits while someone observes: all, none, or a list of drops, "
          "policy, translate, close");
ABSL_FLAG(std::string, monitor_idle_events, "none",
          "events the datapath emits (and the agent keeps for --last) while nobody observes; "
          "none costs each packet one map lookup");
ABSL_FLAG(uint32_t, monitor_rate, 5000, "flow monitor: events per second per CPU (0: no limit)");
ABSL_FLAG(uint32_t, monitor_burst, 10000, "flow monitor: events a CPU may emit back to back");
ABSL_FLAG(uint32_t, monitor_sample, 1,
          "flow monitor: emit 1 in N events other than drops (1: every event)");
ABSL_FLAG(uint32_t, monitor_history, 4096, "flow monitor: flows kept for `observe --last`");
ABSL_FLAG(std::string, relay_address, "",
          "HOST:PORT on which other nodes' `sluicectl observe --nodes` reach this node's flows "
          "(docs/observe.md); empty: off. Needs --relay_token_file");
ABSL_FLAG(std::string, relay_token_file, "",
          "file whose first line is the token every relay request must carry");
ABSL_FLAG(std::string, ui_address, "",
          "HOST:PORT of the service map page (docs/observe.md); empty: off. No authentication: "
          "give it a loopback address");
ABSL_FLAG(std::string, health_address, "127.0.0.1:9879",
          "HOST:PORT serving GET /healthz (liveness), /readyz (readiness: watches synced, "
          "datapath loaded, CNI installed, state dir writable) and /config (the running "
          "configuration); empty: off");
ABSL_FLAG(std::string, metrics_address, "",
          "HOST:PORT serving GET /metrics (Prometheus text format), e.g. 0.0.0.0:9962; empty: "
          "off. Keep it off the pod network");
// Conntrack (docs/operating.md, "Conntrack"): timeouts applied by the GC, and the maps' sizes.
ABSL_FLAG(absl::Duration, ct_tcp_syn_timeout, absl::Seconds(60),
          "conntrack: a TCP flow no reply has been seen for is deleted after this idle time");
ABSL_FLAG(absl::Duration, ct_tcp_established_timeout, absl::Hours(6),
          "conntrack: idle time after which an established TCP flow is deleted");
ABSL_FLAG(absl::Duration, ct_tcp_closing_timeout, absl::Seconds(30),
          "conntrack: idle time after which a TCP flow that saw a FIN or RST is deleted");
ABSL_FLAG(absl::Duration, ct_udp_timeout, absl::Seconds(60),
          "conntrack: idle time after which a UDP flow is deleted");
ABSL_FLAG(absl::Duration, ct_other_timeout, absl::Seconds(60),
          "conntrack: idle time after which a flow of another protocol is deleted");
ABSL_FLAG(absl::Duration, ct_gc_interval, absl::Seconds(10),
          "conntrack: time between GC passes over sluice_ct4 and sluice_ct4_any");
// Map sizes (max_entries; 0: the compiled-in size). A change replaces the pinned map on the next
// start (empty; the agent rewrites the Service maps, flows in conntrack/NAT are lost).
ABSL_FLAG(uint32_t, bpf_ct_tcp_max, 0, "entries of sluice_ct4 (TCP conntrack); 0: 262144");
ABSL_FLAG(uint32_t, bpf_ct_any_max, 0, "entries of sluice_ct4_any (UDP conntrack); 0: 262144");
ABSL_FLAG(uint32_t, bpf_nat_max, 0, "entries of sluice_snat4 and sluice_rnat4; 0: compiled-in");
ABSL_FLAG(uint32_t, bpf_lb_service_max, 0,
          "entries of sluice_lb4_svc (frontends and their backend slots); 0: compiled-in");
ABSL_FLAG(uint32_t, bpf_lb_backend_max, 0, "entries of sluice_lb4_be; 0: compiled-in");
ABSL_FLAG(uint32_t, bpf_lb_revnat_max, 0,
          "entries of sluice_lb4_rnat (one per frontend); 0: compiled-in");
ABSL_FLAG(uint32_t, bpf_ep_max, 0, "entries of sluice_ep4 (this node's pod endpoints); 0: 65536");
ABSL_FLAG(uint32_t, bpf_frag_max, 0,
          "entries of sluice_frag4 (fragmented datagrams in flight); 0: 8192");
ABSL_FLAG(uint32_t, bpf_policy_max, 0,
          "entries of sluice_policy4 (NetworkPolicy allows of all this node's endpoints together); "
          "0: 1048576");

namespace sluice::agent {
namespace {

// Logs a start step's failure ("<what>: <status>", agent/start/pieces.h); the exit code.
// A refusal by the kernel (EPERM, EACCES) names what the agent needs.
int Fail(const absl::Status& st) {
  spdlog::critical("{}", cli::ExplainPermission(
                             st,
                             "sluice-agent loads BPF programs, pins maps under --bpffs_root, "
                             "writes --state_dir and configures links and routes: run it as root "
                             "(or with CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN and CAP_PERFMON, and "
                             "write access to those directories)"));
  return 1;
}

int Fail(const absl::Status& st, const char* what) { return Fail(StartError(st, what)); }

std::string NodeName() {
  if (!absl::GetFlag(FLAGS_node_name).empty()) return absl::GetFlag(FLAGS_node_name);
  if (const char* env = std::getenv("NODE_NAME"); env != nullptr && *env != '\0') return env;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

std::string SelfDir() {
  char buf[PATH_MAX] = {};
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  return std::filesystem::path(std::string(buf, n)).parent_path();
}

CniInstallOptions CniOptionsFromFlags() {
  CniInstallOptions cni;
  cni.conf_dir = absl::GetFlag(FLAGS_cni_conf_dir);
  cni.bin_dir = absl::GetFlag(FLAGS_cni_bin_dir);
  cni.plugin_source = absl::GetFlag(FLAGS_cni_plugin);
  if (cni.plugin_source.empty()) cni.plugin_source = SelfDir() + "/sluice-cni";
  cni.cni_version = absl::GetFlag(FLAGS_cni_version);
  cni.socket_path = absl::GetFlag(FLAGS_socket);
  cni.exclusive = absl::GetFlag(FLAGS_cni_exclusive);
  return cni;
}

// Polls `check` until it is OK; logs why not at once and every 10 s. False when a stop signal
// came first.
bool WaitOrStop(const Clock& clock, const sigset_t& stop, const char* what,
                const std::function<absl::Status()>& check) {
  absl::Time next_log = absl::InfinitePast();
  for (absl::Status st = check(); !st.ok(); st = check()) {
    if (clock.Now() >= next_log) {
      // At info first (a start waits a moment for its first sync), at warn while it lasts.
      spdlog::log(next_log == absl::InfinitePast() ? spdlog::level::info : spdlog::level::warn,
                  "not ready, waiting for {}: {}", what, std::string(st.message()));
      next_log = clock.Now() + absl::Seconds(10);
    }
    // Every check is a few atomic reads and stats; a restarted agent is ready as soon as it
    // passes (a 100 ms poll cost a restart 50-100 ms).
    const timespec poll = {0, 10 * 1000 * 1000};
    if (int sig = sigtimedwait(&stop, nullptr, &poll); sig > 0) {
      spdlog::info("signal {} while waiting for {}: stopping", sig, what);
      return false;
    }
  }
  return true;
}

// --uninstall: what a chart's preStop (cni.uninstall) runs; with --uninstall_datapath, what
// removing Sluice from a node runs.
int Uninstall() {
  if (auto st = UninstallCni(CniOptionsFromFlags()); !st.ok()) return Fail(st, "uninstall CNI");
  if (absl::GetFlag(FLAGS_uninstall_datapath)) {
    if (auto st = loader::RemoveDatapath(absl::GetFlag(FLAGS_bpffs_root)); !st.ok()) {
      return Fail(st, "uninstall datapath");
    }
  }
  return 0;
}

// --ipam_mode, or its default: static when --pod_cidr is given, else kubernetes.
absl::StatusOr<std::string> IpamModeFromFlags() {
  std::string mode = absl::GetFlag(FLAGS_ipam_mode);
  if (mode.empty()) mode = absl::GetFlag(FLAGS_pod_cidr).empty() ? "kubernetes" : "static";
  if (mode != "kubernetes" && mode != "static") {
    return StartError(absl::InvalidArgumentError("want kubernetes or static"), "--ipam_mode");
  }
  return mode;
}

// Kubernetes: used whenever the agent can reach an apiserver; required for ipam_mode=kubernetes.
bool WantKubernetes(const std::string& ipam_mode) {
  return ipam_mode == "kubernetes" || !absl::GetFlag(FLAGS_kubeconfig).empty() ||
         !absl::GetFlag(FLAGS_k8s_service_host).empty() ||
         std::getenv("KUBERNETES_SERVICE_HOST") != nullptr;
}

metrics::MetricsStartOptions MetricsOptionsFromFlags(bool with_kubernetes) {
  return {.with_kubernetes = with_kubernetes,
          .bpffs_root = absl::GetFlag(FLAGS_bpffs_root),
          .health_address = absl::GetFlag(FLAGS_health_address),
          .metrics_address = absl::GetFlag(FLAGS_metrics_address),
          .services_route = ServicesRoute};
}

KubernetesOptions KubernetesOptionsFromFlags(const Clock* clock) {
  KubernetesOptions options;
  options.clock = clock;
  options.config.kubeconfig = absl::GetFlag(FLAGS_kubeconfig);
  options.config.k8s_service_host = absl::GetFlag(FLAGS_k8s_service_host);
  options.config.k8s_service_port = absl::GetFlag(FLAGS_k8s_service_port);
  options.node_name = NodeName();
  return options;
}

// The node's options from the flags, checked in the order they are listed.
absl::StatusOr<NodeOptions> NodeOptionsFromFlags(const IpPrefix& pod_cidr) {
  NodeOptions node_opts;
  node_opts.pod_cidr = pod_cidr;
  node_opts.native_device = absl::GetFlag(FLAGS_native_device);
  node_opts.node_ip = absl::GetFlag(FLAGS_node_ip);
  node_opts.masquerade = absl::GetFlag(FLAGS_masquerade);
  for (const auto& c : absl::GetFlag(FLAGS_non_masquerade_cidrs)) {
    auto p = IpPrefix::Parse(c);
    if (!p.ok()) return StartError(p.status(), "--non_masquerade_cidrs");
    node_opts.non_masquerade_cidrs.push_back(*p);
  }
  if (!absl::GetFlag(FLAGS_service_cidr).empty()) {
    auto p = IpPrefix::Parse(absl::GetFlag(FLAGS_service_cidr));
    if (!p.ok()) return StartError(p.status(), "--service_cidr");
    node_opts.service_cidr = *p;
  }
  auto routing_mode = ParseRoutingMode(absl::GetFlag(FLAGS_routing_mode));
  if (!routing_mode.ok()) return StartError(routing_mode.status(), "--routing_mode");
  node_opts.routing_mode = *routing_mode;
  if (absl::GetFlag(FLAGS_tunnel_port) < 1 || absl::GetFlag(FLAGS_tunnel_port) > 65535) {
    return StartError(absl::InvalidArgumentError("want 1-65535"), "--tunnel_port");
  }
  node_opts.tunnel_port = static_cast<uint16_t>(absl::GetFlag(FLAGS_tunnel_port));
  if (!absl::GetFlag(FLAGS_ipv4_native_routing_cidr).empty()) {
    auto p = IpPrefix::Parse(absl::GetFlag(FLAGS_ipv4_native_routing_cidr));
    if (!p.ok()) return StartError(p.status(), "--ipv4_native_routing_cidr");
    node_opts.non_masquerade_cidrs.push_back(*p);
  }
  if (auto st = ParsePortRange(absl::GetFlag(FLAGS_nat_port_range), &node_opts.nat_port_min,
                               &node_opts.nat_port_max);
      !st.ok()) {
    return StartError(st, "--nat_port_range");
  }
  return node_opts;
}

// --lb_acceleration: whether NodePorts are accelerated natively (XDP).
absl::StatusOr<bool> LbAccelerationFromFlags() {
  const std::string acceleration = absl::GetFlag(FLAGS_lb_acceleration);
  if (acceleration != "native" && acceleration != "disabled") {
    return StartError(absl::InvalidArgumentError("want native or disabled"), "--lb_acceleration");
  }
  return acceleration == "native";
}

// --lb_algorithm and --maglev_table_size.
absl::StatusOr<LbAlgorithmOptions> LbAlgorithmFromFlags() {
  const std::string algorithm = absl::GetFlag(FLAGS_lb_algorithm);
  if (algorithm != "random" && algorithm != "maglev") {
    return StartError(absl::InvalidArgumentError("want random or maglev"), "--lb_algorithm");
  }
  LbAlgorithmOptions o{.maglev_default = algorithm == "maglev",
                       .maglev_table_size = absl::GetFlag(FLAGS_maglev_table_size)};
  if (auto st = ValidateMaglevTableSize(o.maglev_table_size); !st.ok()) {
    return StartError(st, "--maglev_table_size");
  }
  return o;
}

// Signals are taken synchronously by the main thread once serving: SIGTERM and SIGINT blocked
// (the set returned), SIGPIPE ignored.
sigset_t BlockStopSignals() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return stop_signals;
}

// A container's /proc/sys is read-only; the node's and the pods' net sysctls need it writable.
absl::Status MakeNodeSysctlsWritable() {
  auto rw = MakeProcSysWritable();
  if (!rw.ok()) return StartError(rw.status(), "make /proc/sys writable");
  if (*rw) spdlog::info("remounted /proc/sys read-write (it was a container's read-only mount)");
  return absl::OkStatus();
}

loader::MapSizes MapSizesFromFlags() {
  loader::MapSizes map_sizes;
  for (const auto& [name, flag] : {std::pair{maps::name::sluice_ct4, &FLAGS_bpf_ct_tcp_max},
                                   {maps::name::sluice_ct4_any, &FLAGS_bpf_ct_any_max},
                                   {maps::name::sluice_snat4, &FLAGS_bpf_nat_max},
                                   {maps::name::sluice_rnat4, &FLAGS_bpf_nat_max},
                                   {maps::name::sluice_lb4_svc, &FLAGS_bpf_lb_service_max},
                                   {maps::name::sluice_lb4_be, &FLAGS_bpf_lb_backend_max},
                                   {maps::name::sluice_lb4_rnat, &FLAGS_bpf_lb_revnat_max},
                                   {maps::name::sluice_frag4, &FLAGS_bpf_frag_max},
                                   {maps::name::sluice_ep4, &FLAGS_bpf_ep_max},
                                   {maps::name::sluice_policy4, &FLAGS_bpf_policy_max}}) {
    if (uint32_t n = absl::GetFlag(*flag); n != 0) map_sizes[name] = n;
  }
  return map_sizes;
}

// Conntrack GC: expiry per protocol and state, headroom in the TCP map, eviction estimate.
conntrack::GcOptions GcOptionsFromFlags(const NodeOptions& node_opts) {
  conntrack::GcOptions gc_opts;
  gc_opts.timeouts = {.tcp_syn = absl::GetFlag(FLAGS_ct_tcp_syn_timeout),
                      .tcp_established = absl::GetFlag(FLAGS_ct_tcp_established_timeout),
                      .tcp_closing = absl::GetFlag(FLAGS_ct_tcp_closing_timeout),
                      .udp = absl::GetFlag(FLAGS_ct_udp_timeout),
                      .other = absl::GetFlag(FLAGS_ct_other_timeout)};
  gc_opts.interval = absl::GetFlag(FLAGS_ct_gc_interval);
  gc_opts.nat_ports = node_opts.nat_port_max - node_opts.nat_port_min + 1u;
  return gc_opts;
}

int PodMtuFromFlags(const NodeOptions& node_opts, const Node& node) {
  return static_cast<int>(
      PodMtu(node_opts.routing_mode, node.native_mtu,
             absl::GetFlag(FLAGS_mtu) > 0 ? static_cast<uint32_t>(absl::GetFlag(FLAGS_mtu)) : 0));
}

monitor::MonitorStartOptions MonitorOptionsFromFlags() {
  return {.enabled = absl::GetFlag(FLAGS_monitor),
          .events = absl::GetFlag(FLAGS_monitor_events),
          .idle_events = absl::GetFlag(FLAGS_monitor_idle_events),
          .rate = absl::GetFlag(FLAGS_monitor_rate),
          .burst = absl::GetFlag(FLAGS_monitor_burst),
          .sample = absl::GetFlag(FLAGS_monitor_sample),
          .history = absl::GetFlag(FLAGS_monitor_history),
          .observe_socket = absl::GetFlag(FLAGS_observe_socket),
          .relay_address = absl::GetFlag(FLAGS_relay_address),
          .relay_token_file = absl::GetFlag(FLAGS_relay_token_file),
          .ui_address = absl::GetFlag(FLAGS_ui_address)};
}

// The conflist tells the runtime, and so the kubelet (node Ready), that pods can start here: it
// is written once a new pod gets everything right (the watches listed, the first full Service and
// policy batches in the maps) and every binary it names is there. False when a stop signal came
// first.
absl::StatusOr<bool> InstallCniOnceSynced(const Clock& clock, const sigset_t& stop_signals,
                                          const RunningServices* services,
                                          const RunningPolicy* policy) {
  CniInstallOptions cni = CniOptionsFromFlags();
  auto synced = [&]() -> absl::Status {
    if (services && !services->sync->pruned()) return absl::UnavailableError("Services");
    if (policy && !policy->sync->pruned()) return absl::UnavailableError("NetworkPolicies");
    return absl::OkStatus();
  };
  if (!WaitOrStop(clock, stop_signals, "first sync", synced) ||
      !WaitOrStop(clock, stop_signals, "CNI binaries", [&] { return CheckCniBinaries(cni); })) {
    return false;
  }
  if (auto st = InstallCni(cni); !st.ok()) return StartError(st.status(), "install CNI");
  return true;
}

absl::StatusOr<bgp::BgpOptions> BgpOptionsFromFlags() {
  bgp::BgpOptions options{.local_asn = absl::GetFlag(FLAGS_bgp_local_asn),
                          .graceful_restart_time = absl::GetFlag(FLAGS_bgp_graceful_restart_time)};
  for (const auto& text : absl::GetFlag(FLAGS_bgp_peers)) {
    auto peer = bgp::ParseBgpPeer(text);
    if (!peer.ok()) return StartError(peer.status(), "--bgp_peers");
    options.peers.push_back(*peer);
  }
  if (options.peers.empty()) {
    return absl::InvalidArgumentError("--bgp_control_plane needs --bgp_peers");
  }
  if (std::string file = absl::GetFlag(FLAGS_bgp_password_file); !file.empty()) {
    auto password = ReadSmallFile(file);
    if (!password.ok()) return StartError(password.status(), "--bgp_password_file");
    options.password = std::string(absl::StripTrailingAsciiWhitespace(*password));
  }
  return options;
}

// Starts the features in order, each with the pieces built before it. Each handle is declared
// in start order, so that the agent stops in the reverse order: what serves stops before what
// it reads.
// Without NodePort acceleration the XDP program is never attached: not loaded either.
absl::StatusOr<std::unique_ptr<loader::Datapath>> LoadDatapath(bool xdp) {
  return loader::Datapath::Load(
      absl::GetFlag(FLAGS_bpffs_root), MapSizesFromFlags(),
      xdp ? loader::Datapath::XdpProgram::kLoad : loader::Datapath::XdpProgram::kSkip);
}

// Every device runs this load's entry programs once the endpoints are restored: the stage arrays
// of the programs they replaced go once the kernel has freed those (loader/stage_pins.h).
void ReleaseStagesOfEarlierLoads(loader::Datapath& dp, const Clock* clock) {
  auto left = loader::AwaitReplacedStagesReleased(dp, absl::Seconds(1), clock);
  if (!left.ok()) {
    spdlog::warn("release replaced stages: {}", left.status().ToString());
  } else if (*left > 0) {
    spdlog::warn(
        "{} program arrays of an earlier load are still called by attached programs "
        "(devices this agent did not replace); released at the next attach or start",
        *left);
  }
}

int Run() {
  if (auto st = cli::SetLogLevel(absl::GetFlag(FLAGS_log_level)); !st.ok()) {
    std::fprintf(stderr, "sluice-agent: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  auto ipam_mode = IpamModeFromFlags();
  if (!ipam_mode.ok()) return Fail(ipam_mode.status());
  const bool want_k8s = WantKubernetes(*ipam_mode);
  StartPieces pieces{.registry = &metrics::Default(), .state_dir = absl::GetFlag(FLAGS_state_dir)};
  std::unique_ptr<KubernetesState> k8s;
  // Probes and metrics are served from here on: alive while waiting, ready once every step is.
  auto probes = metrics::StartMetrics(pieces, MetricsOptionsFromFlags(want_k8s));
  if (!probes.ok()) return Fail(probes.status());
  pieces.ready = &(*probes)->ready;
  if (want_k8s) {
    auto started = KubernetesState::Start(KubernetesOptionsFromFlags(pieces.clock));
    if (!started.ok()) return Fail(started.status(), "kubernetes client");
    k8s = std::move(*started);
    (*probes)->WatchKubernetes(k8s.get(), *pieces.registry);
  }
  pieces.k8s = k8s.get();
  pieces.node_name = k8s ? k8s->node_name() : NodeName();
  absl::StatusOr<IpPrefix> cidr = *ipam_mode == "kubernetes"
                                      ? k8s->WaitForPodCidr(absl::Minutes(10))
                                      : IpPrefix::Parse(absl::GetFlag(FLAGS_pod_cidr));
  if (!cidr.ok()) return Fail(cidr.status(), "pod CIDR");
  auto node_opts = NodeOptionsFromFlags(*cidr);
  if (!node_opts.ok()) return Fail(node_opts.status());
  auto lb_acceleration = LbAccelerationFromFlags();
  if (!lb_acceleration.ok()) return Fail(lb_acceleration.status());
  auto lb_algorithm = LbAlgorithmFromFlags();
  if (!lb_algorithm.ok()) return Fail(lb_algorithm.status());

  const sigset_t stop_signals = BlockStopSignals();
  if (auto st = MakeNodeSysctlsWritable(); !st.ok()) return Fail(st);
  LibnlNetlink netlink;
  auto dp = LoadDatapath(/*xdp=*/*lb_acceleration);
  if (!dp.ok()) return Fail(dp.status(), "load datapath");
  metrics::CountMapUpdateFailures();
  pieces.netlink = &netlink;
  pieces.datapath = dp->get();
  auto ct = conntrack::StartConntrackGc(pieces, GcOptionsFromFlags(*node_opts));
  if (!ct.ok()) return Fail(ct.status());
  metrics::ScopedCollector datapath_metrics(
      *pieces.registry,
      metrics::AddDatapathCollector(*pieces.registry, absl::GetFlag(FLAGS_bpffs_root)));
  auto endpoint_state = OpenEndpointState(pieces, *cidr);
  if (!endpoint_state.ok()) return Fail(endpoint_state.status());
  EndpointStore& store = *(*endpoint_state)->store;
  auto node = StartNode(pieces, *node_opts, (*endpoint_state)->ipam->gateway());
  if (!node.ok()) return Fail(node.status());
  const bool socket_lb = absl::GetFlag(FLAGS_socket_lb);
  if (auto st = StartSocketLb(pieces, socket_lb, absl::GetFlag(FLAGS_cgroup_root)); !st.ok()) {
    return Fail(st);
  }
  auto acceleration = StartLbAcceleration(pieces, *lb_acceleration, *node);
  if (!acceleration.ok()) return Fail(acceleration.status());
  const int mtu = PodMtuFromFlags(*node_opts, *node);
  auto endpoints = StartEndpointService(pieces, **endpoint_state, mtu);
  if (!endpoints.ok()) return Fail(endpoints.status());
  ReleaseStagesOfEarlierLoads(**dp, pieces.clock);
  (*probes)->ready.datapath_loaded.Reach();
  // CNI ADD writes a new pod's policy state before it answers: in place before serving.
  std::unique_ptr<RunningPolicy> policy;
  if (k8s && absl::GetFlag(FLAGS_network_policy)) {
    policy = StartPolicy(pieces, store, (*endpoints)->service);
  }
  auto server = ServeEndpointApi(pieces, (*endpoints)->service, absl::GetFlag(FLAGS_socket));
  if (!server.ok()) return Fail(server.status());
  std::unique_ptr<PeerRouteSync> peer_routes;
  if (k8s) {
    peer_routes = StartPeerRoutes(pieces, *node_opts, absl::GetFlag(FLAGS_auto_direct_node_routes));
  }
  std::unique_ptr<RunningBgp> bgp;
  if (absl::GetFlag(FLAGS_bgp_control_plane)) {
    auto options = BgpOptionsFromFlags();
    if (!options.ok()) return Fail(options.status());
    auto started = StartBgp(pieces, *options, *node, absl::GetFlag(FLAGS_bgp_speaker_binary));
    if (!started.ok()) return Fail(started.status());
    bgp = std::move(*started);
  }
  std::unique_ptr<RunningServices> services;
  if (k8s && absl::GetFlag(FLAGS_kube_proxy_replacement)) {
    auto started = StartServices(pieces, (*ct)->gc, socket_lb, *node, *lb_algorithm);
    if (!started.ok()) return Fail(started.status());
    services = std::move(*started);
  }
  // Declared last: the monitor stops before what it names flows from.
  auto monitor = monitor::StartMonitor(pieces, store, MonitorOptionsFromFlags());
  if (!monitor.ok()) return Fail(monitor.status());
  if (absl::GetFlag(FLAGS_install_cni)) {
    auto installed =
        InstallCniOnceSynced(*pieces.clock, stop_signals, services.get(), policy.get());
    if (!installed.ok()) return Fail(installed.status());
    if (!*installed) {
      (*server)->server->Stop();
      return 0;
    }
  }
  (*probes)->ready.cni_installed.Reach();
  spdlog::info("sluice-agent ready: serving {}", (*server)->server->socket_path());

  int sig = 0;
  sigwait(&stop_signals, &sig);
  spdlog::info("signal {}: stopping; the datapath stays in place", sig);
  if (*monitor) (*monitor)->StopServing();
  (*server)->server->Stop();
  return 0;
}

}  // namespace
}  // namespace sluice::agent

int main(int argc, char** argv) {
  sluice::cli::ParseFlagsOnly(
      argc, argv, "sluice-agent",
      "sluice-agent [--kubeconfig=FILE --node_name=NAME | --pod_cidr=CIDR] [flags]: Sluice's node "
      "agent");
  if (std::string dir = absl::GetFlag(FLAGS_config_dir); !dir.empty()) {
    auto applied =
        sluice::agent::ApplyConfigDir(dir, sluice::agent::FlagsOnCommandLine(argc, argv));
    if (!applied.ok()) return sluice::agent::Fail(applied.status(), "--config_dir");
    spdlog::info("configuration from {}: {}", dir, absl::StrJoin(*applied, ", "));
  }
  if (absl::GetFlag(FLAGS_uninstall)) return sluice::agent::Uninstall();
  return sluice::agent::Run();
}
