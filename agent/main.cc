// sluice-agent: owns this node's datapath. Loads the BPF programs (reusing pinned maps), sets up
// the node, restores the endpoints of an earlier run, serves the endpoint API, and installs the
// CNI plugin once it can serve ADD. On SIGTERM it stops serving and leaves the datapath in place:
// pods keep their traffic while the agent is down.
#include <net/if.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agent/base/cli.h"
#include "agent/base/config_dir.h"
#include "agent/base/files.h"
#include "agent/conntrack/gc.h"
#include "agent/endpoint/api_server.h"
#include "agent/endpoint/cni_install.h"
#include "agent/endpoint/endpoint_service.h"
#include "agent/endpoint/endpoint_store.h"
#include "agent/endpoint/ipam.h"
#include "agent/k8s/watches.h"
#include "agent/kernel/netlink.h"
#include "agent/kernel/netns.h"
#include "agent/kernel/sock_destroy.h"
#include "agent/metrics/agent_endpoints.h"
#include "agent/metrics/agent_metrics.h"
#include "agent/metrics/datapath_metrics.h"
#include "agent/metrics/drop_window.h"
#include "agent/monitor/monitor.h"
#include "agent/monitor/names.h"
#include "agent/monitor/observe_server.h"
#include "agent/monitor/ui.h"
#include "agent/policy/reconciler.h"
#include "agent/policy/sync.h"
#include "agent/routing/node_setup.h"
#include "agent/routing/peer_route_sync.h"
#include "agent/service/explain.h"
#include "agent/service/health_check.h"
#include "agent/service/reconciler.h"
#include "agent/service/sync.h"
#include "loader/cgroup.h"
#include "loader/datapath.h"
#include "loader/uninstall.h"
#include "maps/types.h"
#include "nlohmann/json.hpp"
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

namespace sluice::agent {
namespace {

int Fail(const absl::Status& st, const char* what) {
  spdlog::critical("{}: {}", what, st.ToString());
  return 1;
}

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
bool WaitOrStop(const sigset_t& stop, const char* what,
                const std::function<absl::Status()>& check) {
  absl::Time next_log = absl::InfinitePast();
  for (absl::Status st = check(); !st.ok(); st = check()) {
    if (absl::Now() >= next_log) {
      // At info first (a start waits a moment for its first sync), at warn while it lasts.
      spdlog::log(next_log == absl::InfinitePast() ? spdlog::level::info : spdlog::level::warn,
                  "not ready, waiting for {}: {}", what, std::string(st.message()));
      next_log = absl::Now() + absl::Seconds(10);
    }
    const timespec poll = {0, 100 * 1000 * 1000};
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

// Every Service with the reason a port serves nothing (`sluicectl services`).
metrics::HttpReply ServicesRoute(KubernetesState* kube) {
  if (kube == nullptr) return {.status = 404, .body = "no Kubernetes\n"};
  return {.content_type = "application/json",
          .body = DiagnoseServicesJson(kube->services().List(), kube->endpoint_slices().List(),
                                       kube->pods().List())};
}

int Run() {
  if (auto st = cli::SetLogLevel(absl::GetFlag(FLAGS_log_level)); !st.ok()) {
    std::fprintf(stderr, "sluice-agent: %s\n", std::string(st.message()).c_str());
    return 2;
  }

  // Kubernetes: used whenever the agent can reach an apiserver; required for ipam_mode=kubernetes.
  std::string ipam_mode = absl::GetFlag(FLAGS_ipam_mode);
  if (ipam_mode.empty())
    ipam_mode = absl::GetFlag(FLAGS_pod_cidr).empty() ? "kubernetes" : "static";
  if (ipam_mode != "kubernetes" && ipam_mode != "static") {
    return Fail(absl::InvalidArgumentError("want kubernetes or static"), "--ipam_mode");
  }
  const bool want_k8s = ipam_mode == "kubernetes" || !absl::GetFlag(FLAGS_kubeconfig).empty() ||
                        !absl::GetFlag(FLAGS_k8s_service_host).empty() ||
                        std::getenv("KUBERNETES_SERVICE_HOST") != nullptr;
  std::unique_ptr<KubernetesState> k8s;
  // Probes and metrics are served from here on: alive while waiting, ready once every step is.
  metrics::AgentReadiness ready(want_k8s);
  metrics::DropWindow recent_drops({.bpffs_root = absl::GetFlag(FLAGS_bpffs_root)});
  auto endpoints = metrics::AgentEndpoints::Start(
      {.health_address = absl::GetFlag(FLAGS_health_address),
       .metrics_address = absl::GetFlag(FLAGS_metrics_address),
       .config_json = metrics::RunningConfigJson,
       .recent_drops = &recent_drops,
       .extra_routes = {{"/v1/services", [&ready] { return ServicesRoute(ready.kubernetes()); }}}},
      ready.readiness());
  if (!endpoints.ok()) return Fail(endpoints.status(), "serve health and metrics");
  if (want_k8s) {
    KubernetesOptions k8s_opts;
    k8s_opts.config.kubeconfig = absl::GetFlag(FLAGS_kubeconfig);
    k8s_opts.config.k8s_service_host = absl::GetFlag(FLAGS_k8s_service_host);
    k8s_opts.config.k8s_service_port = absl::GetFlag(FLAGS_k8s_service_port);
    k8s_opts.node_name = NodeName();
    auto started = KubernetesState::Start(k8s_opts);
    if (!started.ok()) return Fail(started.status(), "kubernetes client");
    k8s = std::move(*started);
    ready.SetKubernetes(k8s.get());
  }
  std::optional<metrics::ScopedCollector> watch_metrics;
  if (k8s) {
    watch_metrics.emplace(metrics::Default(),
                          metrics::AddKubernetesCollector(metrics::Default(), k8s.get()));
  }
  absl::StatusOr<IpPrefix> cidr = ipam_mode == "kubernetes"
                                      ? k8s->WaitForPodCidr(absl::Minutes(10))
                                      : IpPrefix::Parse(absl::GetFlag(FLAGS_pod_cidr));
  if (!cidr.ok()) return Fail(cidr.status(), "pod CIDR");
  NodeOptions node_opts;
  node_opts.pod_cidr = *cidr;
  node_opts.native_device = absl::GetFlag(FLAGS_native_device);
  node_opts.node_ip = absl::GetFlag(FLAGS_node_ip);
  node_opts.masquerade = absl::GetFlag(FLAGS_masquerade);
  for (const auto& c : absl::GetFlag(FLAGS_non_masquerade_cidrs)) {
    auto p = IpPrefix::Parse(c);
    if (!p.ok()) return Fail(p.status(), "--non_masquerade_cidrs");
    node_opts.non_masquerade_cidrs.push_back(*p);
  }
  if (!absl::GetFlag(FLAGS_service_cidr).empty()) {
    auto p = IpPrefix::Parse(absl::GetFlag(FLAGS_service_cidr));
    if (!p.ok()) return Fail(p.status(), "--service_cidr");
    node_opts.service_cidr = *p;
  }
  auto routing_mode = ParseRoutingMode(absl::GetFlag(FLAGS_routing_mode));
  if (!routing_mode.ok()) return Fail(routing_mode.status(), "--routing_mode");
  node_opts.routing_mode = *routing_mode;
  if (absl::GetFlag(FLAGS_tunnel_port) < 1 || absl::GetFlag(FLAGS_tunnel_port) > 65535) {
    return Fail(absl::InvalidArgumentError("want 1-65535"), "--tunnel_port");
  }
  node_opts.tunnel_port = static_cast<uint16_t>(absl::GetFlag(FLAGS_tunnel_port));
  if (!absl::GetFlag(FLAGS_ipv4_native_routing_cidr).empty()) {
    auto p = IpPrefix::Parse(absl::GetFlag(FLAGS_ipv4_native_routing_cidr));
    if (!p.ok()) return Fail(p.status(), "--ipv4_native_routing_cidr");
    node_opts.non_masquerade_cidrs.push_back(*p);
  }
  if (auto st = ParsePortRange(absl::GetFlag(FLAGS_nat_port_range), &node_opts.nat_port_min,
                               &node_opts.nat_port_max);
      !st.ok()) {
    return Fail(st, "--nat_port_range");
  }

  const std::string acceleration = absl::GetFlag(FLAGS_lb_acceleration);
  if (acceleration != "native" && acceleration != "disabled") {
    return Fail(absl::InvalidArgumentError("want native or disabled"), "--lb_acceleration");
  }
  const bool lb_acceleration = acceleration == "native";

  // Signals are taken synchronously by the main thread once serving.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // A container's /proc/sys is read-only; the node's and the pods' net sysctls need it writable.
  if (auto rw = MakeProcSysWritable(); !rw.ok()) {
    return Fail(rw.status(), "make /proc/sys writable");
  } else if (*rw) {
    spdlog::info("remounted /proc/sys read-write (it was a container's read-only mount)");
  }
  LibnlNetlink netlink;
  loader::MapSizes map_sizes;
  for (const auto& [name, flag] : {std::pair{maps::name::sluice_ct4, &FLAGS_bpf_ct_tcp_max},
                                   {maps::name::sluice_ct4_any, &FLAGS_bpf_ct_any_max},
                                   {maps::name::sluice_snat4, &FLAGS_bpf_nat_max},
                                   {maps::name::sluice_rnat4, &FLAGS_bpf_nat_max},
                                   {maps::name::sluice_lb4_svc, &FLAGS_bpf_lb_service_max},
                                   {maps::name::sluice_lb4_be, &FLAGS_bpf_lb_backend_max},
                                   {maps::name::sluice_lb4_rnat, &FLAGS_bpf_lb_revnat_max},
                                   {maps::name::sluice_frag4, &FLAGS_bpf_frag_max},
                                   {maps::name::sluice_ep4, &FLAGS_bpf_ep_max}}) {
    if (uint32_t n = absl::GetFlag(*flag); n != 0) map_sizes[name] = n;
  }
  auto dp = loader::Datapath::Load(absl::GetFlag(FLAGS_bpffs_root), map_sizes);
  if (!dp.ok()) return Fail(dp.status(), "load datapath");
  metrics::CountMapUpdateFailures();
  // Conntrack GC: expiry per protocol and state, headroom in the TCP map, eviction estimate.
  conntrack::GcOptions gc_opts;
  gc_opts.timeouts = {.tcp_syn = absl::GetFlag(FLAGS_ct_tcp_syn_timeout),
                      .tcp_established = absl::GetFlag(FLAGS_ct_tcp_established_timeout),
                      .tcp_closing = absl::GetFlag(FLAGS_ct_tcp_closing_timeout),
                      .udp = absl::GetFlag(FLAGS_ct_udp_timeout),
                      .other = absl::GetFlag(FLAGS_ct_other_timeout)};
  gc_opts.interval = absl::GetFlag(FLAGS_ct_gc_interval);
  gc_opts.nat_ports = node_opts.nat_port_max - node_opts.nat_port_min + 1u;
  if (gc_opts.interval <= absl::ZeroDuration()) {
    return Fail(absl::InvalidArgumentError("want a positive duration"), "--ct_gc_interval");
  }
  conntrack::ConntrackGc ct_gc((*dp)->ct4(), (*dp)->ct4_any(), &(*dp)->ct_stats(), gc_opts);
  ct_gc.TrackPairs(&(*dp)->ct_pairs());
  ct_gc.CollectNat(&(*dp)->snat(), &(*dp)->rnat());
  ct_gc.Start();
  metrics::ScopedCollector ct_gc_metrics(
      metrics::Default(), conntrack::AddConntrackGcCollector(metrics::Default(), &ct_gc));
  metrics::ScopedCollector datapath_metrics(
      metrics::Default(),
      metrics::AddDatapathCollector(metrics::Default(), absl::GetFlag(FLAGS_bpffs_root)));
  auto ipam = Ipam::Open(absl::GetFlag(FLAGS_state_dir), *cidr);
  if (!ipam.ok()) return Fail(ipam.status(), "open IPAM");
  auto store = EndpointStore::Open(absl::GetFlag(FLAGS_state_dir));
  if (!store.ok()) return Fail(store.status(), "open endpoint store");
  // Every ADD writes there: a full or read-only file system makes the node not ready.
  ready.RequireWritableStateDir(absl::GetFlag(FLAGS_state_dir));
  metrics::ScopedCollector endpoint_metrics(
      metrics::Default(), metrics::AddEndpointCountCollector(
                              metrics::Default(), [s = store->get()] { return s->size(); }));
  auto node = SetUpNode(netlink, **dp, node_opts, (*ipam)->gateway(), /*prune_nomasq=*/!k8s);
  if (!node.ok()) return Fail(node.status(), "set up node");
  // Host-network clients reach Services through their sockets; links pinned in the bpffs keep
  // the programs attached across agent restarts (a restart swaps them in place).
  if (absl::GetFlag(FLAGS_socket_lb)) {
    std::string cgroup = absl::GetFlag(FLAGS_cgroup_root);
    if (cgroup.empty()) {
      auto found = loader::FindOrMountCgroup2("/run/sluice/cgroupv2");
      if (!found.ok()) return Fail(found.status(), "find the cgroup2 mount for socket LB");
      cgroup = *found;
    }
    if (auto st = (*dp)->AttachSocketLb(cgroup); !st.ok()) return Fail(st, "attach socket LB");
    spdlog::info("socket LB attached to cgroup {}", cgroup);
  } else if (auto st = (*dp)->DetachSocketLb(); !st.ok()) {
    return Fail(st, "detach socket LB");
  }

  // NodePort acceleration: the XDP link is pinned like socket LB's (a restart swaps the program
  // in place); disabled unpins it. Another program's XDP on the device is never replaced.
  std::atomic<int> xdp_mode{static_cast<int>(loader::XdpMode::kNone)};
  std::atomic<uint64_t> xdp_refused{0};
  if (lb_acceleration) {
    auto mode = (*dp)->AttachXdp(node->native_ifindex);
    if (!mode.ok()) return Fail(mode.status(), "attach XDP");
    xdp_mode = static_cast<int>(*mode);
    if (*mode == loader::XdpMode::kNone) {
      xdp_refused++;
      auto other = loader::AttachedXdpProgram(node->native_ifindex);
      spdlog::warn(
          "lb_acceleration=native: {} already runs XDP program id {} that is not "
          "Sluice's; left in place, NodePorts are balanced at TC only",
          node->native_device, other.ok() ? *other : 0u);
    } else {
      spdlog::info("lb_acceleration=native: sluice_xdp_net attached to {} in {} XDP mode",
                   node->native_device, loader::XdpModeName(*mode));
    }
  } else if (auto st = (*dp)->DetachXdp(); !st.ok()) {
    return Fail(st, "detach XDP");
  }
  metrics::ScopedCollector xdp_metrics(
      metrics::Default(),
      metrics::Default().AddCollector([&xdp_mode, &xdp_refused](metrics::ScrapeSink& out) {
        for (auto m : {loader::XdpMode::kNative, loader::XdpMode::kGeneric}) {
          out.Gauge("sluice_lb_acceleration_attached",
                    "1 when sluice_xdp_net runs on the native device in this XDP mode",
                    {{"mode", loader::XdpModeName(m)}},
                    xdp_mode.load() == static_cast<int>(m) ? 1.0 : 0.0);
        }
        out.Counter("sluice_lb_acceleration_refused_total",
                    "XDP attaches not made because the native device runs another program's XDP",
                    {}, static_cast<double>(xdp_refused.load()));
      }));

  int mtu = static_cast<int>(
      PodMtu(node_opts.routing_mode, node->native_mtu,
             absl::GetFlag(FLAGS_mtu) > 0 ? static_cast<uint32_t>(absl::GetFlag(FLAGS_mtu)) : 0));
  BpfEndpointDatapath endpoint_dp(**dp);
  EndpointService service(netlink, **ipam, **store, endpoint_dp, {.default_mtu = mtu});
  metrics::ScopedCollector veth_metrics(
      metrics::Default(), metrics::Default().AddCollector([&service](metrics::ScrapeSink& out) {
        const LinkReaperStats s = service.link_reaper().stats();
        out.Gauge("sluice_endpoint_veths_pending_delete",
                  "Host veths of removed pods, down and waiting for the agent to delete them", {},
                  static_cast<double>(service.link_reaper().pending()));
        for (const auto& [result, n] : {std::pair{"deleted", s.deleted}, std::pair{"gone", s.gone},
                                        std::pair{"failed", s.failed}}) {
          out.Counter("sluice_endpoint_veth_deletes_total",
                      "Host veths of removed pods the agent deleted after DEL answered "
                      "(gone: already deleted or the name taken since; failed: left for the next "
                      "start)",
                      {{"result", result}}, static_cast<double>(n));
        }
        const EndpointServiceStats es = service.stats();
        for (const auto& [reason, n] :
             {std::pair{"bad_netns", es.bad_netns},
              std::pair{"other_network", es.other_network_requests},
              std::pair{"lock_timeout", es.lock_timeouts}}) {
          out.Counter("sluice_endpoint_requests_refused_total",
                      "CNI requests the agent refused before acting, per reason (bad_netns: the "
                      "pod's network namespace descriptor missing, undeclared or not a network "
                      "namespace; other_network: an interface another network attached; "
                      "lock_timeout: the node or attachment stayed busy past the lock timeout)",
                      {{"reason", reason}}, static_cast<double>(n));
        }
        out.Counter("sluice_endpoint_netns_paths_opened_total",
                    "ADD and CHECK requests of an older plugin, without a namespace descriptor: "
                    "the agent opened CNI_NETNS itself",
                    {}, static_cast<double>(es.netns_paths_opened));
      }));
  if (auto st = service.Restore(); !st.ok()) return Fail(st, "restore endpoints");
  spdlog::info("restored {} endpoints", (*store)->size());
  ready.datapath_loaded.Reach();

  // NetworkPolicy follows Pods, Namespaces, Nodes and NetworkPolicies; CNI ADD writes a new
  // pod's policy state before it answers (EndpointPolicyHook), so it is in place before serving.
  std::unique_ptr<BpfPolicyMaps> policy_maps;
  std::unique_ptr<PolicyReconciler> policy_reconciler;
  std::unique_ptr<PolicySync> policy_sync;
  if (k8s && absl::GetFlag(FLAGS_network_policy)) {
    policy_maps =
        std::make_unique<BpfPolicyMaps>((*dp)->ipcache4(), (*dp)->policy4(), (*dp)->policy_ep());
    policy_reconciler = std::make_unique<PolicyReconciler>(*policy_maps);
    KubernetesState* kube = k8s.get();
    policy_sync = std::make_unique<PolicySync>(
        PolicySources{kube->pods(), kube->namespaces(), kube->network_policies(), kube->nodes(),
                      **store},
        [kube] {
          return kube->pods().HasSynced() && kube->namespaces().HasSynced() &&
                 kube->network_policies().HasSynced() && kube->nodes().HasSynced();
        },
        *policy_reconciler, k8s->node_name(), absl::GetFlag(FLAGS_state_dir));
    service.SetPolicyHook(policy_sync.get());
  }
  std::optional<metrics::ScopedCollector> policy_metrics;  // reads policy_sync: after it
  if (policy_sync) {
    policy_metrics.emplace(
        metrics::Default(),
        metrics::Default().AddCollector([s = policy_sync.get(),
                                         r = policy_reconciler.get()](metrics::ScrapeSink& out) {
          PolicySyncStats st = s->stats();
          PolicyApplyStats ap = r->stats();
          out.Counter("sluice_policy_applies_total",
                      "NetworkPolicy translations written to the policy maps", {},
                      static_cast<double>(st.applies));
          out.Counter("sluice_policy_problems_total",
                      "Rejected NetworkPolicy parts (they allow nothing), counted once each "
                      "time they appear",
                      {}, static_cast<double>(st.problems));
          out.Counter("sluice_policy_skipped_updates_total",
                      "Pod, Namespace and Node updates that change nothing policy reads (no "
                      "translation run)",
                      {}, static_cast<double>(st.skipped_updates));
          out.Counter("sluice_policy_identity_saves_total", "Writes of identities.json",
                      {{"result", "ok"}}, static_cast<double>(st.identity_saves));
          out.Counter("sluice_policy_identity_saves_total", "Writes of identities.json",
                      {{"result", "error"}}, static_cast<double>(st.identity_save_failures));
          out.Gauge("sluice_policy_identities", "Label-set identities numbered on this node", {},
                    static_cast<double>(s->identity_count()));
          const std::pair<const char*, uint64_t> writes[] = {
              {"ipcache_upsert", ap.ipcache_writes},   {"ipcache_delete", ap.ipcache_deletes},
              {"allow_upsert", ap.allow_writes},       {"allow_delete", ap.allow_deletes},
              {"endpoint_upsert", ap.endpoint_writes}, {"endpoint_delete", ap.endpoint_deletes}};
          for (const auto& [op, n] : writes) {
            out.Counter("sluice_policy_map_writes_total",
                        "Policy map entries written or deleted by the agent", {{"op", op}},
                        static_cast<double>(n));
          }
        }));
  }

  api::EndpointApiServerOptions server_opts;
  server_opts.socket_path = absl::GetFlag(FLAGS_socket);
  api::EndpointApiServer server(server_opts);
  // The request's descriptor (the pod's netns) goes to the service beside the instrumented call.
  if (auto st = server.Start(metrics::InstrumentEndpointApi(
          [&service](const cni::EndpointRequest& req, int netns_fd) {
            return service.Handle(req, netns_fd);
          }));
      !st.ok()) {
    return Fail(st, "start endpoint API");
  }
  // The peer map (and, natively with direct routes, routes to the other nodes' pod CIDRs)
  // follow the Node objects.
  std::unique_ptr<PeerRouteSync> peer_routes;
  if (k8s) {
    std::vector<IpPrefix> base = node_opts.non_masquerade_cidrs;
    base.push_back(node_opts.pod_cidr);
    peer_routes =
        std::make_unique<PeerRouteSync>(*k8s, netlink, (*dp)->nomasq(), (*dp)->tunnel4(), base,
                                        node_opts.routing_mode == RoutingMode::kNative &&
                                            absl::GetFlag(FLAGS_auto_direct_node_routes));
  }
  // Service load balancing follows the Services and EndpointSlices (kube-proxy replacement).
  // Declared after everything it uses, so it stops first.
  std::unique_ptr<BpfLbMaps> lb_maps;
  std::unique_ptr<ServiceReconciler> lb_reconciler;
  std::unique_ptr<HealthCheckServers> health_checks;
  std::unique_ptr<ServiceSync> service_sync;
  if (k8s && absl::GetFlag(FLAGS_kube_proxy_replacement)) {
    lb_maps = std::make_unique<BpfLbMaps>(
        (*dp)->lb4_services(), (*dp)->lb4_backends(), (*dp)->lb4_revnat(),
        (*dp)->lb4_source_ranges(), (*dp)->ct4_any(), &(*dp)->lb4_affinity(), &(*dp)->ct4(),
        &(*dp)->lb4_non_backend_ports(), &(*dp)->lb4_slot_records());
    lb_maps->OnPairsWritten([&ct_gc] { return ct_gc.PairsWritten(); });
    // A connected UDP socket socket LB sent to a backend that goes is closed: its send() runs
    // no hook that could send it elsewhere (agent/kernel/sock_destroy.h).
    if (absl::GetFlag(FLAGS_socket_lb)) {
      lb_maps->CloseSocketLbUdpWith(&(*dp)->sock4_revnat(), DestroyConnectedUdp4Sockets);
    }
    auto reconciler = ServiceReconciler::Create(*lb_maps);
    if (!reconciler.ok()) return Fail(reconciler.status(), "restore service maps");
    lb_reconciler = std::move(*reconciler);
    health_checks = std::make_unique<HealthCheckServers>(node->node_ip.ToString());
    KubernetesState* kube = k8s.get();
    service_sync = std::make_unique<ServiceSync>(
        k8s->services(), k8s->endpoint_slices(),
        // Services depend on these two kinds only: no need to wait for Pods and Nodes.
        [kube] { return kube->services().HasSynced() && kube->endpoint_slices().HasSynced(); },
        *lb_reconciler, health_checks.get(), NodeContext{k8s->node_name(), {node->node_ip}},
        absl::GetFlag(FLAGS_state_dir));
  }
  std::optional<metrics::ScopedCollector> refusal_metrics;  // reads service_sync: after it
  if (service_sync) {
    refusal_metrics.emplace(
        metrics::Default(),
        metrics::Default().AddCollector([s = service_sync.get()](metrics::ScrapeSink& out) {
          RefusalCounts counts = s->refusals();
          for (size_t r = 0; r < static_cast<size_t>(RefusalReason::kCount); ++r) {
            out.Counter("sluice_service_refusals_total",
                        "Parts of Services and EndpointSlices not programmed (an invalid or "
                        "special backend address, port or protocol, external or LoadBalancer "
                        "IP), counted once per object when first refused, per reason",
                        {{"reason", std::string(RefusalReasonName(static_cast<RefusalReason>(r)))}},
                        static_cast<double>(counts.by_reason[r]));
          }
        }));
  }
  // The flow monitor: the datapath emits events only while someone observes (and
  // --monitor_idle_events otherwise). Declared last: it stops before what it names flows from.
  std::unique_ptr<monitor::FlowNames> flow_names;
  std::unique_ptr<monitor::FlowMonitor> flow_monitor;
  std::unique_ptr<monitor::ObserveServer> observe_server;
  std::unique_ptr<monitor::FlowUi> flow_ui;  // observes flow_monitor: declared after it
  std::optional<metrics::ScopedCollector> monitor_metrics;  // reads flow_monitor: declared after it
  if (!absl::GetFlag(FLAGS_monitor) && !absl::GetFlag(FLAGS_ui_address).empty()) {
    return Fail(absl::InvalidArgumentError("the service map page draws the flow monitor's flows"),
                "--ui_address with --monitor=false");
  }
  if (absl::GetFlag(FLAGS_monitor)) {
    monitor::NameSources names;
    if (k8s) {
      names.pods = &k8s->pods();
      names.services = &k8s->services();
    }
    names.endpoints = store->get();
    maps::Lb4RevNatMap* rnat = &(*dp)->lb4_revnat();
    names.rev_nat = [rnat](uint32_t id) -> std::optional<sluice_lb4_revnat> {
      auto v = rnat->Lookup(id);
      if (!v.ok()) return std::nullopt;
      return *v;
    };
    names.interface_name = [](uint32_t ifindex) {
      char buf[IF_NAMESIZE] = {};
      return std::string(if_indextoname(ifindex, buf) ? buf : "");
    };
    flow_names = std::make_unique<monitor::FlowNames>(std::move(names));
    monitor::MonitorOptions mon;
    mon.node_name = k8s ? k8s->node_name() : NodeName();
    auto events = monitor::ParseEventTypes(absl::GetFlag(FLAGS_monitor_events));
    if (!events.ok()) return Fail(events.status(), "--monitor_events");
    auto idle = monitor::ParseEventTypes(absl::GetFlag(FLAGS_monitor_idle_events));
    if (!idle.ok()) return Fail(idle.status(), "--monitor_idle_events");
    mon.events = *events;
    mon.idle_events = *idle;
    mon.rate = absl::GetFlag(FLAGS_monitor_rate);
    mon.burst = absl::GetFlag(FLAGS_monitor_burst);
    mon.sample = absl::GetFlag(FLAGS_monitor_sample);
    mon.history = absl::GetFlag(FLAGS_monitor_history);
    auto started = monitor::FlowMonitor::Start((*dp)->events_fd(), (*dp)->monitor_config(),
                                               (*dp)->monitor_cpu(), flow_names.get(), mon);
    if (!started.ok()) return Fail(started.status(), "start the flow monitor");
    flow_monitor = std::move(*started);
    monitor_metrics.emplace(
        metrics::Default(),
        metrics::Default().AddCollector([m = flow_monitor.get()](metrics::ScrapeSink& out) {
          out.Counter("sluice_flow_events_lost_total",
                      "Flow monitor events lost: not emitted by the datapath (rate limit, full "
                      "ring buffer) or dropped for an observer that fell behind",
                      {}, static_cast<double>(m->EventsLost()));
        }));
    monitor::ObserveServerOptions observe_opts;
    observe_opts.socket_path = absl::GetFlag(FLAGS_observe_socket);
    observe_opts.relay_address = absl::GetFlag(FLAGS_relay_address);
    if (!observe_opts.relay_address.empty()) {
      auto token = agent::ReadSmallFile(absl::GetFlag(FLAGS_relay_token_file));
      if (absl::GetFlag(FLAGS_relay_token_file).empty() || !token.ok()) {
        return Fail(
            token.ok() ? absl::InvalidArgumentError("the relay needs a token") : token.status(),
            "--relay_address without a readable --relay_token_file");
      }
      std::string t = token->substr(0, token->find_first_of("\r\n"));
      if (t.size() < 16) {
        return Fail(absl::InvalidArgumentError("a relay token has at least 16 characters"),
                    "--relay_token_file");
      }
      observe_opts.relay_token = t;
    }
    observe_server = std::make_unique<monitor::ObserveServer>(*flow_monitor, observe_opts);
    // The datapath does not depend on it: without the socket the agent runs on, unobserved.
    if (auto st = observe_server->Start(); !st.ok()) {
      spdlog::error("--observe_socket: {}; `sluicectl observe` cannot reach this agent",
                    st.ToString());
      observe_server.reset();
    }
    if (const std::string ui = absl::GetFlag(FLAGS_ui_address); !ui.empty()) {
      auto started_ui = monitor::FlowUi::Start(ui, flow_monitor.get(), mon.node_name);
      if (!started_ui.ok()) return Fail(started_ui.status(), "--ui_address");
      flow_ui = std::move(*started_ui);
    }
  } else {
    // Nobody will read: make sure a previous agent's setting does not keep events coming.
    if (auto st = (*dp)->monitor_config().Update(0, sluice_monitor_config{}); !st.ok()) {
      return Fail(st, "switch the flow monitor off");
    }
  }
  // The conflist tells the runtime, and so the kubelet (node Ready), that pods can start here:
  // it is written once a new pod gets everything right (the watches listed, the first full
  // Service and policy batches in the maps) and every binary it names is there.
  if (absl::GetFlag(FLAGS_install_cni)) {
    CniInstallOptions cni = CniOptionsFromFlags();
    auto synced = [&]() -> absl::Status {
      if (service_sync && !service_sync->pruned()) return absl::UnavailableError("Services");
      if (policy_sync && !policy_sync->pruned()) return absl::UnavailableError("NetworkPolicies");
      return absl::OkStatus();
    };
    if (!WaitOrStop(stop_signals, "first sync", synced) ||
        !WaitOrStop(stop_signals, "CNI binaries", [&] { return CheckCniBinaries(cni); })) {
      server.Stop();
      return 0;
    }
    if (auto st = InstallCni(cni); !st.ok()) return Fail(st.status(), "install CNI");
  }
  ready.cni_installed.Reach();
  spdlog::info("sluice-agent ready: serving {}", server_opts.socket_path);

  int sig = 0;
  sigwait(&stop_signals, &sig);
  spdlog::info("signal {}: stopping; the datapath stays in place", sig);
  if (observe_server) observe_server->Stop();
  server.Stop();
  return 0;
}

}  // namespace
}  // namespace sluice::agent

int main(int argc, char** argv) {
  sluice::cli::ParseCommandLine(
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
