// One real sluice-agent against a large cluster's state (issue 34, "Scale, simulated with the
// lab's apiserver"): the lab apiserver, in this process, holds at --scale=1
//   5,000 Nodes (pod CIDR, InternalIP, Hostname, zone labels, a Ready condition),
//   150,070 Pods (30 on each other node, 100 on the measured node), labels of a Deployment's pods
//     (app, app.kubernetes.io/name and part-of, tier, version, team, pod-template-hash),
//   10,000 Services (a fifth with a second port) over 100,000 endpoints, EndpointSlices of at
//     most 100 endpoints (Service sizes 1..134, mean 10: the larger split in several slices),
//   5,000 NetworkPolicies (ingress from pods, from namespaces, from both, from ipBlocks; a fifth
//     with an egress rule too), 2,000 Namespaces (team and env labels),
// and the objects scale with --scale (the measured node keeps its 100 pods). The agent is the
// real binary (build/agent/sluice-agent), in a network namespace of its own with a veth to this
// process's private namespace, on a bpffs, state dir and cgroup of its own. Steps:
//   0. baseline: the same agent against the same apiserver holding only its Node (an empty
//      cluster): ready, then 5 s idle -> VmRSS and VmHWM, CPU. Stopped, its namespace deleted.
//   1. the cluster is created in the store (untimed), a fresh node namespace and bpffs, the
//      agent started: start -> /readyz 200 (every watch listed, datapath loaded, the first full
//      Service and policy batches in the maps), then -> every map holds the cluster (the Service
//      frontends and backends, a tunnel entry per other node, an ipcache entry per pod address),
//      the agent's CPU seconds and VmHWM over that, bytes the veth carried to the agent.
//   2. the 100 pods of the measured node get their network through sluice-cni (each in a
//      namespace of its own; the pod's status then gets its address, as a kubelet writes it).
//   3. idle for --idle seconds: CPU, VmRSS; map entries per map.
//   4. --rate changes/s of mixed kinds for --seconds, written to the store (every write a watch
//      event to the agent): EndpointSlice endpoint removed / added back, Pod deleted / created on
//      another node, Pod relabelled (version), Node heartbeat, Node added / deleted, Service
//      created (with its slice) / deleted, NetworkPolicy port changed, Namespace relabelled.
//      The agent's CPU over the window, and per tracked change the time from the store's commit
//      to the maps showing it (a prober polls every 200 us): slice -> the frontend's backend set;
//      pod created / deleted / relabelled -> its ipcache identity; node -> its tunnel entry;
//      Service -> its frontend. p50 / p99 / max per kind and over all.
//   5. restart: SIGTERM, the agent started again on its maps and state: start -> /readyz 200.
// Prints the load average beside each figure (the machine is shared).
//
// usage: cluster_scale_bench BUILD_DIR [--scale=0.1|0.5|1] [--rate=50] [--seconds=30]
//                            [--idle=10] [--keep-logs] [--dump]
//   SLUICE_SCALE_PERF=FILE  perf record the agent over the churn into FILE
//   --dump       print one object of each kind (and its size) and exit
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "agent/lab/apiserver/apiserver.h"
#include "agent/lab/store/object_store.h"
#include "agent/lab/tools/kubeconfig.h"
#include "bench/tcp_nodelay.h"
#include "loader/bpffs.h"
#include "maps/lb.h"
#include "maps/node.h"
#include "maps/policy.h"
#include "maps/tunnel.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;
using sluice::lab::Resource;

[[noreturn]] void Die(const std::string& msg);

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string LoadAvg() {
  std::ifstream f("/proc/loadavg");
  std::string a;
  f >> a;
  return a;
}

// ---- the cluster -----------------------------------------------------------------------------

struct Sizes {
  int nodes, services, policies, namespaces;
  int pods_per_node = 30;
  int local_pods = 100;  // on the measured node, whatever the scale
};

Sizes SizesFor(double scale) {
  auto n = [&](int full) { return std::max(1, static_cast<int>(std::lround(full * scale))); };
  return {n(5000), n(10000), n(5000), n(2000)};
}

// Service sizes cycle through this pattern: 200 endpoints per 20 Services (mean 10, 1..134).
constexpr int kSizePattern[20] = {1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 5, 5, 6, 8, 10, 134};
constexpr int kSliceMax = 100;
constexpr int kLocalWorkloads = 10;
const char* const kTiers[] = {"web", "api", "worker", "cache", "db"};

uint32_t Ip(int a, int b, int c, int d) {
  return (static_cast<uint32_t>(a) << 24) | (b << 16) | (c << 8) | d;
}
std::string Dotted(uint32_t h) {
  return absl::StrCat(h >> 24, ".", (h >> 16) & 255, ".", (h >> 8) & 255, ".", h & 255);
}
uint32_t PodCidrBase(int node) { return Ip(10, 128, 0, 0) + static_cast<uint32_t>(node) * 256; }
constexpr uint32_t kAgentIp = (10u << 24) | (199u << 16) | 2;   // 10.199.0.2, the measured node
constexpr uint32_t kServerIp = (10u << 24) | (199u << 16) | 1;  // 10.199.0.1, the apiserver
uint32_t NodeIp(int node) { return node == 0 ? kAgentIp : Ip(100, 64, 0, 0) + node; }
std::string NodeName(int node) { return absl::StrFormat("node-%05d", node); }
std::string NsName(int ns) { return absl::StrFormat("ns-%04d", ns); }

struct Workload {
  std::string name, ns;
  int index;
  int service = -1;  // the Service selecting it
};

struct PodRec {
  int workload;
  int node;     // 0 = the measured node
  uint32_t ip;  // 0 until known (the measured node's pods: after CNI ADD)
  std::string name;
  bool v2 = false;
  bool alive = true;
};

struct ServiceRec {
  int workload;
  std::vector<int> pods;  // endpoints, in slice order
  bool two_ports;
  uint32_t cluster_ip = 0;
  std::vector<int> removed;  // endpoints the churn took out (added back later)
};

struct Cluster {
  Sizes sz;
  std::vector<Workload> workloads;
  std::vector<PodRec> pods;
  std::vector<ServiceRec> services;
};

std::string Hash10(uint64_t x) {
  static const char* a = "bcdfghjklmnpqrstvwxz2456789";
  std::string s;
  for (int i = 0; i < 10; ++i) {
    s.push_back(a[x % 27]);
    x = x / 27 + 0x9e3779b97f4a7c15ull * (i + 1);
  }
  return s;
}

Cluster Plan(const Sizes& sz) {
  Cluster c;
  c.sz = sz;
  std::mt19937_64 rng(34);
  int remote_slots = (sz.nodes - 1) * sz.pods_per_node;
  int endpoints = 0;
  for (int s = 0; s < sz.services; ++s) endpoints += kSizePattern[s % 20];
  if (endpoints > remote_slots) Die("more endpoints than pods");
  auto add_workload = [&](std::string name, int ns) {
    Workload w{std::move(name), NsName(ns % sz.namespaces), static_cast<int>(c.workloads.size())};
    c.workloads.push_back(w);
    return w.index;
  };
  std::vector<int> pod_workload;
  for (int s = 0; s < sz.services; ++s) {
    int w = add_workload(absl::StrFormat("svc-%05d", s), s);
    c.workloads[w].service = s;
    c.services.push_back({w, {}, s % 5 == 0});
    for (int k = 0; k < kSizePattern[s % 20]; ++k) pod_workload.push_back(w);
  }
  for (int j = 0; static_cast<int>(pod_workload.size()) < remote_slots; ++j) {
    int w = add_workload(absl::StrFormat("job-%05d", j), j * 7 + 3);
    for (int k = 0; k < 10 && static_cast<int>(pod_workload.size()) < remote_slots; ++k)
      pod_workload.push_back(w);
  }
  std::vector<int> slots(remote_slots);
  for (int i = 0; i < remote_slots; ++i) slots[i] = i;
  std::shuffle(slots.begin(), slots.end(), rng);
  for (int i = 0; i < remote_slots; ++i) {
    int node = 1 + slots[i] / sz.pods_per_node, idx = slots[i] % sz.pods_per_node;
    int w = pod_workload[i];
    c.pods.push_back({w, node, PodCidrBase(node) + 10 + idx, ""});
  }
  for (int l = 0; l < kLocalWorkloads; ++l) {
    int w = add_workload(absl::StrFormat("local-%d", l), l * 13 + 1);
    for (int k = 0; k < sz.local_pods / kLocalWorkloads; ++k) c.pods.push_back({w, 0, 0, ""});
  }
  for (size_t p = 0; p < c.pods.size(); ++p) {
    PodRec& r = c.pods[p];
    r.name = absl::StrCat(c.workloads[r.workload].name, "-", Hash10(r.workload).substr(0, 9), "-",
                          Hash10(p * 7919 + 1).substr(0, 5));
    r.v2 = (p % 10) == 0;
    int w = r.workload;
    if (c.workloads[w].service >= 0) c.services[c.workloads[w].service].pods.push_back(p);
  }
  return c;
}

json NamespaceObject(int ns, bool alt = false) {
  return {{"apiVersion", "v1"},
          {"kind", "Namespace"},
          {"metadata",
           {{"name", NsName(ns)},
            {"labels",
             {{"kubernetes.io/metadata.name", NsName(ns)},
              {"team", absl::StrFormat("team-%02d", ns % 40)},
              {"env", ns % 10 < 6   ? "prod"
                      : ns % 10 < 9 ? "staging"
                                    : "dev"},
              {"owner", alt ? "platform" : absl::StrFormat("owner-%03d", ns % 300)}}}}},
          {"spec", {{"finalizers", {"kubernetes"}}}},
          {"status", {{"phase", "Active"}}}};
}

json NodeObject(int node, const std::string& heartbeat = "2026-12-07T00:00:00Z") {
  std::string cidr = absl::StrCat(Dotted(PodCidrBase(node)), "/24");
  std::string name = NodeName(node);
  return {{"apiVersion", "v1"},
          {"kind", "Node"},
          {"metadata",
           {{"name", name},
            {"labels",
             {{"kubernetes.io/hostname", name},
              {"kubernetes.io/os", "linux"},
              {"kubernetes.io/arch", "amd64"},
              {"node.kubernetes.io/instance-type", node % 3 ? "m6i.2xlarge" : "m6i.4xlarge"},
              {"topology.kubernetes.io/region", "eu-west-1"},
              {"topology.kubernetes.io/zone", std::string("eu-west-1") + "abc"[node % 3]}}},
            {"annotations", {{"node.alpha.kubernetes.io/ttl", "0"}}}}},
          {"spec", {{"podCIDR", cidr}, {"podCIDRs", {cidr}}, {"providerID", "aws:///" + name}}},
          {"status",
           {{"addresses",
             {{{"type", "InternalIP"}, {"address", Dotted(NodeIp(node))}},
              {{"type", "Hostname"}, {"address", name}}}},
            {"capacity", {{"cpu", "8"}, {"memory", "32386532Ki"}, {"pods", "110"}}},
            {"allocatable", {{"cpu", "7910m"}, {"memory", "31371748Ki"}, {"pods", "110"}}},
            {"conditions",
             {{{"type", "MemoryPressure"},
               {"status", "False"},
               {"reason", "KubeletHasSufficientMemory"},
               {"lastHeartbeatTime", heartbeat},
               {"lastTransitionTime", "2026-12-01T00:00:00Z"}},
              {{"type", "DiskPressure"},
               {"status", "False"},
               {"reason", "KubeletHasNoDiskPressure"},
               {"lastHeartbeatTime", heartbeat},
               {"lastTransitionTime", "2026-12-01T00:00:00Z"}},
              {{"type", "Ready"},
               {"status", "True"},
               {"reason", "KubeletReady"},
               {"lastHeartbeatTime", heartbeat},
               {"lastTransitionTime", "2026-12-01T00:00:00Z"}}}},
            {"nodeInfo",
             {{"kubeletVersion", "v1.31.4"},
              {"containerRuntimeVersion", "containerd://1.7.24"},
              {"kernelVersion", "6.1.0-28-cloud-amd64"},
              {"osImage", "Debian GNU/Linux 12 (bookworm)"},
              {"architecture", "amd64"},
              {"operatingSystem", "linux"}}}}}};
}

json PodLabels(const Cluster& c, const PodRec& p) {
  const Workload& w = c.workloads[p.workload];
  int ns = std::atoi(w.ns.c_str() + 3);
  return {{"app", w.name},
          {"app.kubernetes.io/name", w.name},
          {"app.kubernetes.io/part-of", absl::StrFormat("product-%03d", w.index % 300)},
          {"tier", kTiers[w.index % 5]},
          {"version", p.v2 ? "v2" : "v1"},
          {"team", absl::StrFormat("team-%02d", ns % 40)},
          {"pod-template-hash", Hash10(p.workload).substr(0, 9)}};
}

json PodObject(const Cluster& c, const PodRec& p) {
  const Workload& w = c.workloads[p.workload];
  json status = {{"phase", "Pending"}, {"qosClass", "Burstable"}};
  if (p.ip != 0) {
    status = {{"phase", "Running"},
              {"qosClass", "Burstable"},
              {"hostIP", Dotted(NodeIp(p.node))},
              {"hostIPs", {{{"ip", Dotted(NodeIp(p.node))}}}},
              {"podIP", Dotted(p.ip)},
              {"podIPs", {{{"ip", Dotted(p.ip)}}}},
              {"startTime", "2026-12-01T00:00:00Z"},
              {"conditions",
               {{{"type", "Initialized"}, {"status", "True"}},
                {{"type", "Ready"}, {"status", "True"}},
                {{"type", "ContainersReady"}, {"status", "True"}},
                {{"type", "PodScheduled"}, {"status", "True"}}}},
              {"containerStatuses",
               {{{"name", "main"},
                 {"ready", true},
                 {"started", true},
                 {"restartCount", 0},
                 {"image", "registry.example/" + w.name + ":1.4.2"},
                 {"imageID", "registry.example/" + w.name + "@sha256:" + Hash10(p.workload) +
                                 Hash10(p.workload + 1) + Hash10(p.workload + 2)},
                 {"containerID", "containerd://" + Hash10(p.ip) + Hash10(p.ip + 1)},
                 {"state", {{"running", {{"startedAt", "2026-12-01T00:00:03Z"}}}}}}}}};
  }
  return {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata",
       {{"name", p.name},
        {"namespace", w.ns},
        {"labels", PodLabels(c, p)},
        {"annotations", {{"kubectl.kubernetes.io/restartedAt", "2026-11-30T12:00:00Z"}}},
        {"ownerReferences",
         {{{"apiVersion", "apps/v1"},
           {"kind", "ReplicaSet"},
           {"name", w.name + "-" + Hash10(p.workload).substr(0, 9)},
           {"uid", "6f1c1b2e-0000-4000-8000-" + absl::StrFormat("%012d", p.workload)},
           {"controller", true},
           {"blockOwnerDeletion", true}}}}}},
      {"spec",
       {{"nodeName", NodeName(p.node)},
        {"serviceAccountName", "default"},
        {"restartPolicy", "Always"},
        {"terminationGracePeriodSeconds", 30},
        {"containers",
         {{{"name", "main"},
           {"image", "registry.example/" + w.name + ":1.4.2"},
           {"ports",
            {{{"name", "http"}, {"containerPort", 8080}, {"protocol", "TCP"}},
             {{"name", "metrics"}, {"containerPort", 9090}, {"protocol", "TCP"}}}},
           {"env",
            {{{"name", "LOG_LEVEL"}, {"value", "info"}},
             {{"name", "POD_NAME"},
              {"valueFrom", {{"fieldRef", {{"fieldPath", "metadata.name"}}}}}}}},
           {"resources",
            {{"requests", {{"cpu", "100m"}, {"memory", "128Mi"}}},
             {"limits", {{"memory", "256Mi"}}}}},
           {"readinessProbe",
            {{"httpGet", {{"path", "/healthz"}, {"port", 8080}}}, {"periodSeconds", 10}}},
           {"volumeMounts",
            {{{"name", "kube-api-access"},
              {"readOnly", true},
              {"mountPath", "/var/run/secrets/kubernetes.io/serviceaccount"}}}}}}},
        {"volumes",
         {{{"name", "kube-api-access"},
           {"projected",
            {{"sources",
              {{{"serviceAccountToken", {{"path", "token"}, {"expirationSeconds", 3607}}}}}}}}}}},
        {"tolerations",
         {{{"key", "node.kubernetes.io/not-ready"},
           {"operator", "Exists"},
           {"effect", "NoExecute"},
           {"tolerationSeconds", 300}}}}}},
      {"status", status}};
}

json ServiceObject(const Cluster& c, int s) {
  const ServiceRec& r = c.services[s];
  const Workload& w = c.workloads[r.workload];
  json ports = {{{"name", "http"}, {"protocol", "TCP"}, {"port", 80}, {"targetPort", 8080}}};
  if (r.two_ports)
    ports.push_back(
        {{"name", "metrics"}, {"protocol", "TCP"}, {"port", 9090}, {"targetPort", 9090}});
  return {{"apiVersion", "v1"},
          {"kind", "Service"},
          {"metadata", {{"name", w.name}, {"namespace", w.ns}, {"labels", {{"app", w.name}}}}},
          {"spec",
           {{"type", "ClusterIP"},
            {"selector", {{"app", w.name}}},
            {"ports", ports},
            {"sessionAffinity", "None"},
            {"internalTrafficPolicy", "Cluster"}}}};
}

// Slice k of Service s: its endpoints [k*100, k*100+100) less the removed ones.
json SliceObject(const Cluster& c, int s, int k) {
  const ServiceRec& r = c.services[s];
  const Workload& w = c.workloads[r.workload];
  json endpoints = json::array();
  for (int i = k * kSliceMax; i < std::min<int>(r.pods.size(), (k + 1) * kSliceMax); ++i) {
    int p = r.pods[i];
    if (std::find(r.removed.begin(), r.removed.end(), p) != r.removed.end()) continue;
    const PodRec& pod = c.pods[p];
    endpoints.push_back(
        {{"addresses", {Dotted(pod.ip)}},
         {"conditions", {{"ready", true}, {"serving", true}, {"terminating", false}}},
         {"nodeName", NodeName(pod.node)},
         {"zone", std::string("eu-west-1") + "abc"[pod.node % 3]},
         {"targetRef",
          {{"kind", "Pod"},
           {"namespace", w.ns},
           {"name", pod.name},
           {"uid", absl::StrFormat("00000000-0000-4000-8000-%012d", p)}}}});
  }
  json ports = {{{"name", "http"}, {"protocol", "TCP"}, {"port", 8080}}};
  if (r.two_ports) ports.push_back({{"name", "metrics"}, {"protocol", "TCP"}, {"port", 9090}});
  return {{"apiVersion", "discovery.k8s.io/v1"},
          {"kind", "EndpointSlice"},
          {"metadata",
           {{"name", absl::StrCat(w.name, "-", Hash10(s).substr(0, 5), k)},
            {"namespace", w.ns},
            {"labels",
             {{"kubernetes.io/service-name", w.name},
              {"endpointslice.kubernetes.io/managed-by", "endpointslice-controller.k8s.io"}}}}},
          {"addressType", "IPv4"},
          {"endpoints", endpoints},
          {"ports", ports}};
}
int Slices(const ServiceRec& r) {
  return (static_cast<int>(r.pods.size()) + kSliceMax - 1) / kSliceMax;
}

json PolicyObject(const Cluster& c, int p, int port = 8080) {
  // Policy p selects a workload: the local ones first (their endpoints get policy state), then
  // every third workload.
  int w = p < kLocalWorkloads ? static_cast<int>(c.workloads.size()) - kLocalWorkloads + p
                              : (p * 3) % (static_cast<int>(c.workloads.size()) - kLocalWorkloads);
  const Workload& wl = c.workloads[w];
  json from;
  switch (p % 4) {
    case 0:
      from = {{{"podSelector", {{"matchLabels", {{"tier", "web"}}}}}}};
      break;
    case 1:
      from = {{{"namespaceSelector",
                {{"matchLabels", {{"team", absl::StrFormat("team-%02d", p % 40)}}}}}}};
      break;
    case 2:
      from = {{{"namespaceSelector", {{"matchLabels", {{"env", "prod"}}}}},
               {"podSelector",
                {{"matchExpressions",
                  {{{"key", "tier"},
                    {"operator", "In"},
                    {"values", json::array({"api", "worker"})}}}}}}}};
      break;
    default:
      from = {{{"ipBlock",
                {{"cidr", absl::StrFormat("192.168.%d.0/24", p % 256)},
                 {"except", {absl::StrFormat("192.168.%d.128/25", p % 256)}}}}},
              {{"podSelector", {{"matchLabels", {{"app", wl.name}}}}}}};
  }
  json ports = json::array(
      {json{{"protocol", "TCP"}, {"port", port}}, json{{"protocol", "TCP"}, {"port", 9090}}});
  json rule = {{"from", from}, {"ports", ports}};
  json spec = {{"podSelector", {{"matchLabels", {{"app", wl.name}}}}},
               {"ingress", json::array({rule})},
               {"policyTypes", json::array({"Ingress"})}};
  if (p % 5 == 0) {
    spec["policyTypes"].push_back("Egress");
    spec["egress"] = {
        {{"to", {{{"podSelector", {{"matchLabels", {{"tier", "db"}}}}}}}},
         {"ports", {{{"protocol", "TCP"}, {"port", 5432}}}}},
        {{"to",
          {{{"namespaceSelector",
             {{"matchLabels", {{"kubernetes.io/metadata.name", "kube-system"}}}}}}}},
         {"ports", {{{"protocol", "UDP"}, {"port", 53}}, {{"protocol", "TCP"}, {"port", 53}}}}}};
  }
  return {{"apiVersion", "networking.k8s.io/v1"},
          {"kind", "NetworkPolicy"},
          {"metadata", {{"name", absl::StrFormat("np-%05d", p)}, {"namespace", wl.ns}}},
          {"spec", spec}};
}

// ---- processes and namespaces ----------------------------------------------------------------

std::vector<pid_t> g_children;  // the agent (while it runs)
std::vector<std::string> g_netns;
std::string g_bpffs, g_cgroup, g_cgroup_mount;

int Run(const std::vector<std::string>& argv, bool quiet = true) {
  pid_t pid = fork();
  if (pid < 0) Die("fork");
  if (pid == 0) {
    if (quiet) {
      int null = open("/dev/null", O_WRONLY);
      dup2(null, 1);
      dup2(null, 2);
    }
    std::vector<char*> a;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    execvp(a[0], a.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void Must(const std::vector<std::string>& argv) {
  if (Run(argv, false) != 0) {
    std::string s;
    for (const auto& a : argv) absl::StrAppend(&s, a, " ");
    Die("failed: " + s);
  }
}

void Cleanup() {
  for (pid_t p : g_children) {
    if (p > 0) {
      kill(p, SIGKILL);
      waitpid(p, nullptr, 0);
    }
  }
  g_children.clear();
  for (const auto& ns : g_netns) Run({"ip", "netns", "del", ns});
  g_netns.clear();
  if (!g_bpffs.empty()) {
    umount2(g_bpffs.c_str(), MNT_DETACH);
    std::error_code ec;
    fs::remove(g_bpffs, ec);
  }
  if (!g_cgroup.empty()) rmdir(g_cgroup.c_str());
  if (!g_cgroup_mount.empty()) umount2(g_cgroup_mount.c_str(), MNT_DETACH);
}

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "cluster_scale_bench: %s\n", msg.c_str());
  Cleanup();
  std::_Exit(2);
}

int64_t StatusKiB(pid_t pid, const char* field) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  size_t n = std::strlen(field);
  while (std::getline(f, line)) {
    if (line.compare(0, n, field) == 0) return std::strtoll(line.c_str() + n, nullptr, 10);
  }
  return -1;
}
double Mib(int64_t kib) { return kib / 1024.0; }

// utime + stime of every thread of `pid`, seconds.
double CpuSeconds(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t close = s.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream in(s.substr(close + 2));
  std::string field;
  std::vector<std::string> v;
  while (in >> field) v.push_back(field);
  // Fields from 3 (state) on: utime is field 14, stime 15 -> indices 11, 12.
  if (v.size() < 13) return -1;
  return (std::stod(v[11]) + std::stod(v[12])) / sysconf(_SC_CLK_TCK);
}

// Bytes sent by this namespace's device `dev` (its peer is the agent's eth0).
uint64_t TxBytes(const std::string& dev) {
  std::ifstream f("/proc/self/net/dev");
  std::string line;
  while (std::getline(f, line)) {
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    if (name != dev) continue;
    std::istringstream in(line.substr(colon + 1));
    uint64_t v[16] = {};
    for (auto& x : v) in >> x;
    return v[8];
  }
  return 0;
}

// A node: network namespace with eth0 (10.199.0.2) whose peer is this process's `sa0`.
struct Node {
  std::string netns, dir, bpffs, log;
  pid_t agent = -1;
};

void MakeNodeNetns(Node* n) {
  Must({"ip", "netns", "add", n->netns});
  g_netns.push_back(n->netns);
  Must({"ip", "link", "add", "sa0", "type", "veth", "peer", "name", "eth0", "netns", n->netns});
  Must({"ip", "addr", "add", "10.199.0.1/24", "dev", "sa0"});
  Must({"ip", "link", "set", "sa0", "up"});
  Must({"ip", "-n", n->netns, "addr", "add", "10.199.0.2/24", "dev", "eth0"});
  Must({"ip", "-n", n->netns, "link", "set", "eth0", "up"});
  Must({"ip", "-n", n->netns, "link", "set", "lo", "up"});
}

void DeleteNodeNetns(Node* n) {
  Run({"ip", "netns", "del", n->netns});
  g_netns.erase(std::remove(g_netns.begin(), g_netns.end(), n->netns), g_netns.end());
}

pid_t StartAgent(const std::string& build, const Node& n, const std::string& kubeconfig) {
  std::vector<std::string> argv = {
      "ip",
      "netns",
      "exec",
      n.netns,
      build + "/agent/sluice-agent",
      "--kubeconfig=" + kubeconfig,
      "--node_name=" + NodeName(0),
      "--native_device=eth0",
      "--node_ip=" + Dotted(kAgentIp),
      "--service_cidr=10.96.0.0/16",
      "--bpffs_root=" + n.bpffs,
      "--state_dir=" + n.dir + "/state",
      "--socket=" + n.dir + "/sluice.sock",
      "--observe_socket=" + n.dir + "/observe.sock",
      "--cni_conf_dir=" + n.dir + "/cni-conf",
      "--cni_bin_dir=" + n.dir + "/cni-bin",
      "--cni_plugin=" + build + "/cni/sluice-cni",
      "--cgroup_root=" + g_cgroup,
      "--health_address=127.0.0.1:9879",
  };
  pid_t pid = fork();
  if (pid < 0) Die("fork");
  if (pid == 0) {
    int fd = open(n.log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> a;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    execvp(a[0], a.data());  // `ip netns exec` execs the agent: the pid is the agent's
    _exit(127);
  }
  g_children.push_back(pid);
  return pid;
}

void StopAgent(pid_t pid) {
  kill(pid, SIGTERM);
  waitpid(pid, nullptr, 0);
  g_children.erase(std::remove(g_children.begin(), g_children.end(), pid), g_children.end());
}

// GET /readyz on the agent's health address, from inside its namespace (a thread of its own:
// setns moves only the calling thread). True on 200.
bool ReadyzOnce() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(9879);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{1, 0};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  bool ok = false;
  if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const char req[] = "GET /readyz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(s, req, sizeof req - 1) == static_cast<ssize_t>(sizeof req - 1)) {
      char buf[64] = {};
      ssize_t n = read(s, buf, sizeof buf - 1);
      ok = n > 12 && std::strncmp(buf + 9, "200", 3) == 0;
    }
  }
  close(s);
  return ok;
}

// Seconds from `t0` to the agent's /readyz answering 200 (polled every 10 ms), or < 0.
double WaitReady(const Node& n, pid_t pid, Clock::time_point t0, double timeout_s) {
  double out = -1;
  std::thread t([&] {
    int fd = open(absl::StrCat("/run/netns/", n.netns).c_str(), O_RDONLY);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) return;
    close(fd);
    while (Since(t0) < timeout_s) {
      if (ReadyzOnce()) {
        out = Since(t0);
        return;
      }
      if (waitpid(pid, nullptr, WNOHANG) == pid) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  t.join();
  return out;
}

// ---- the maps --------------------------------------------------------------------------------

struct MapInfo {
  std::string name;
  int fd = -1;
  uint32_t type = 0, key_size = 0, max_entries = 0;
};

std::map<std::string, MapInfo> OpenMaps(const std::string& root) {
  std::map<std::string, MapInfo> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec || !it->is_regular_file(ec)) continue;
    int fd = bpf_obj_get(it->path().c_str());
    if (fd < 0) continue;
    bpf_map_info info{};
    uint32_t len = sizeof info;
    if (bpf_obj_get_info_by_fd(fd, &info, &len) != 0 || out.count(info.name)) {
      close(fd);
      continue;
    }
    out[info.name] = {info.name, fd, info.type, info.key_size, info.max_entries};
  }
  return out;
}

void CloseMaps(std::map<std::string, MapInfo>* maps) {
  for (auto& [_, m] : *maps) close(m.fd);
  maps->clear();
}

bool IsArray(uint32_t type) {
  return type == BPF_MAP_TYPE_ARRAY || type == BPF_MAP_TYPE_PERCPU_ARRAY ||
         type == BPF_MAP_TYPE_PROG_ARRAY || type == BPF_MAP_TYPE_RINGBUF ||
         type == BPF_MAP_TYPE_PERF_EVENT_ARRAY || type == BPF_MAP_TYPE_ARRAY_OF_MAPS;
}

// Entries of a non-array map (-1 for arrays); the lb4 backend array counts its used slots.
int64_t CountEntries(const MapInfo& m) {
  if (m.name == "sluice_lb4_be") {
    int64_t n = 0;
    sluice_lb4_backend be{};
    for (uint32_t i = 1; i < m.max_entries; ++i) {
      if (bpf_map_lookup_elem(m.fd, &i, &be) == 0 && be.addr != 0) ++n;
    }
    return n;
  }
  if (IsArray(m.type)) return -1;
  std::vector<uint8_t> key(m.key_size), next(m.key_size);
  int64_t n = 0;
  void* prev = nullptr;
  while (bpf_map_get_next_key(m.fd, prev, next.data()) == 0) {
    ++n;
    key.swap(next);
    prev = key.data();
  }
  return n;
}

// ---- the churn -------------------------------------------------------------------------------

enum Kind {
  kSlice,
  kPodCreate,
  kPodDelete,
  kPodRelabel,
  kNodeAdd,
  kNodeDelete,
  kSvcCreate,
  kSvcDelete,
  kKinds
};
const char* const kKindNames[] = {"EndpointSlice endpoint -/+",
                                  "Pod created (ipcache)",
                                  "Pod deleted (ipcache)",
                                  "Pod relabelled (identity)",
                                  "Node added (tunnel)",
                                  "Node deleted (tunnel)",
                                  "Service created",
                                  "Service deleted"};

struct Probe {
  Kind kind;
  std::function<bool()> done;
  Clock::time_point committed;
};

struct Maps {
  int svc = -1, be = -1, ipcache = -1, tunnel = -1, nomasq = -1;
};

std::optional<std::vector<uint32_t>> Served(const Maps& m, uint32_t addr, uint16_t port) {
  sluice_lb4_key k{};
  k.addr = htonl(addr);
  k.dport = htons(port);
  k.proto = IPPROTO_TCP;
  k.scope = SLUICE_LB_SCOPE_EXTERNAL;
  sluice_lb4_service master{};
  if (bpf_map_lookup_elem(m.svc, &k, &master) != 0) return std::nullopt;
  std::vector<uint32_t> out;
  for (uint16_t s = 1; s <= master.count; ++s) {
    k.backend_slot = s;
    sluice_lb4_service slot{};
    if (bpf_map_lookup_elem(m.svc, &k, &slot) != 0) return std::nullopt;
    sluice_lb4_backend be{};
    if (bpf_map_lookup_elem(m.be, &slot.backend_id, &be) != 0) return std::nullopt;
    out.push_back(ntohl(be.addr));
  }
  std::sort(out.begin(), out.end());
  return out;
}

uint32_t Identity(const Maps& m, uint32_t addr) {
  sluice_lpm4_key k{32, htonl(addr)};
  sluice_ipcache4_entry e{};
  if (bpf_map_lookup_elem(m.ipcache, &k, &e) != 0) return 0;
  return e.identity;
}

bool NeverMasqueraded(const Maps& m, uint32_t addr) {
  sluice_lpm4_key k{32, htonl(addr)};
  uint8_t v = 0;
  return bpf_map_lookup_elem(m.nomasq, &k, &v) == 0;
}

uint32_t TunnelTo(const Maps& m, uint32_t addr) {
  sluice_lpm4_key k{32, htonl(addr)};
  sluice_tunnel4_entry e{};
  if (bpf_map_lookup_elem(m.tunnel, &k, &e) != 0) return 0;
  return ntohl(e.node_ip4);
}

std::vector<uint32_t> WantServed(const Cluster& c, int s) {
  std::vector<uint32_t> v;
  for (int p : c.services[s].pods) {
    const auto& rm = c.services[s].removed;
    if (std::find(rm.begin(), rm.end(), p) == rm.end()) v.push_back(c.pods[p].ip);
  }
  std::sort(v.begin(), v.end());
  return v;
}

double Pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(std::ceil(p / 100.0 * v.size()));
  return v[std::min(v.size() - 1, i == 0 ? 0 : i - 1)];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') {
    std::fprintf(stderr,
                 "usage: %s BUILD_DIR [--scale=0.1|0.5|1] [--rate=50] [--seconds=30] [--idle=10] "
                 "[--keep-logs]\n",
                 argv[0]);
    return 2;
  }
  std::string build = fs::canonical(argv[1]).string();
  double scale = 1, rate = 50, seconds = 30, idle = 10;
  bool keep_logs = false, dump = false;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--scale=", 0) == 0)
      scale = std::atof(a.c_str() + 8);
    else if (a.rfind("--rate=", 0) == 0)
      rate = std::atof(a.c_str() + 7);
    else if (a.rfind("--seconds=", 0) == 0)
      seconds = std::atof(a.c_str() + 10);
    else if (a.rfind("--idle=", 0) == 0)
      idle = std::atof(a.c_str() + 7);
    else if (a == "--keep-logs")
      keep_logs = true;
    else if (a == "--dump")
      dump = true;
    else
      Die("unknown argument " + a);
  }
  if (scale <= 0 || scale > 1.5 || rate <= 0 || seconds <= 0 || idle < 1) Die("bad arguments");
  if (dump) {  // one object of each kind as the store gets it, with its size; nothing started
    Cluster c = Plan(SizesFor(scale));
    c.services[0].cluster_ip = Ip(10, 96, 0, 10);
    for (const json& o : {NamespaceObject(0), NodeObject(1), PodObject(c, c.pods[0]),
                          ServiceObject(c, 0), SliceObject(c, 19, 1), PolicyObject(c, 10),
                          PolicyObject(c, 11), PolicyObject(c, 15), PolicyObject(c, 23)}) {
      std::printf("%s (%zu bytes)\n%s\n", o["kind"].get<std::string>().c_str(), o.dump().size(),
                  o.dump(1).c_str());
    }
    return 0;
  }
  if (getuid() != 0) Die("needs root (BPF, network namespaces)");
  for (const char* b : {"/agent/sluice-agent", "/cni/sluice-cni"}) {
    if (access((build + b).c_str(), X_OK) != 0) Die(build + b + " missing: build it first");
  }
  spdlog::set_level(spdlog::level::warn);
  signal(SIGPIPE, SIG_IGN);

  // This process in a network namespace of its own: the apiserver listens on its side of the
  // agent's veth, and nothing of the machine's own namespace is touched.
  if (unshare(CLONE_NEWNET) != 0) Die("unshare(CLONE_NEWNET)");
  Must({"ip", "link", "set", "lo", "up"});
  const std::string tag = absl::StrCat("scale", getpid());
  const std::string work = "/run/sluice-test/" + tag;
  fs::create_directories(work);
  g_bpffs = work + "/bpffs";
  // Socket LB on a cgroup of its own, under a cgroup2 mount outside /sys (`ip netns exec`
  // mounts a fresh /sys for the agent): without --cgroup_root the agent attaches to the root
  // cgroup, every process of the machine.
  g_cgroup_mount = work + "/cgroup2";
  fs::create_directories(g_cgroup_mount);
  if (mount("none", g_cgroup_mount.c_str(), "cgroup2", 0, nullptr) != 0)
    Die("mount cgroup2 at " + g_cgroup_mount + ": " + std::strerror(errno));
  g_cgroup = g_cgroup_mount + "/" + tag;
  if (mkdir(g_cgroup.c_str(), 0755) != 0) Die("mkdir " + g_cgroup + ": " + std::strerror(errno));

  const Sizes sz = SizesFor(scale);
  Cluster c = Plan(sz);
  size_t endpoints = 0;
  int frontends = 0;
  for (const auto& s : c.services) {
    endpoints += s.pods.size();
    frontends += s.two_ports ? 2 : 1;
  }
  std::printf(
      "cluster_scale_bench --scale=%g: %d Nodes, %zu Pods (%d on the measured node), %d Services "
      "(%d frontends) over %zu endpoints in slices of <= %d, %d NetworkPolicies, %d Namespaces; "
      "%ld CPUs, load %s\n",
      scale, sz.nodes, c.pods.size(), sz.local_pods, sz.services, frontends, endpoints, kSliceMax,
      sz.policies, sz.namespaces, sysconf(_SC_NPROCESSORS_ONLN), LoadAvg().c_str());
  std::fflush(stdout);

  // The apiserver on 10.199.0.1 (on lo; the agent reaches it through its veth).
  Must({"ip", "addr", "add", Dotted(kServerIp) + "/32", "dev", "lo"});
  sluice::lab::ApiServerOptions o;
  o.address = Dotted(kServerIp);
  o.run_controllers = false;  // the benchmark writes every object, slices and pod status included
  o.history_limit = 50'000;
  o.worker_threads = 64;
  sluice::lab::ApiServer server(o);
  if (absl::Status s = server.Start(); !s.ok()) Die("apiserver: " + s.ToString());
  auto& store = server.store();
  auto create = [&](const char* plural, json obj) {
    auto r = store.Create(Resource(plural), std::move(obj));
    if (!r.ok()) Die(absl::StrCat("create ", plural, ": ", r.status().ToString()));
    return *r;
  };
  create("nodes", NodeObject(0));
  const std::string kubeconfig = work + "/kubeconfig";
  {
    sluice::lab::KubeconfigParams kp;
    kp.server = server.url();
    kp.ca_cert_pem = server.ca_cert_pem();
    kp.token = server.token();
    if (auto st = sluice::lab::WriteKubeconfig(kubeconfig, kp); !st.ok()) Die(st.ToString());
  }
  if (auto st = sluice::loader::EnsureBpffs(g_bpffs); !st.ok()) Die(st.ToString());

  auto make_node = [&](const std::string& name) {
    Node n;
    n.netns = tag + "-" + name;
    n.dir = work + "/" + name;
    n.bpffs = g_bpffs + "/" + name;
    n.log = n.dir + "/agent.log";
    fs::create_directories(n.dir);
    fs::create_directories(n.bpffs);
    // The runtime's loopback plugin, which the agent waits for before it installs its conflist
    // (Debian's containernetworking-plugins).
    fs::create_directories(n.dir + "/cni-bin");
    std::error_code ec;
    for (const char* src : {"/usr/lib/cni/loopback", "/opt/cni/bin/loopback"}) {
      if (fs::copy_file(src, n.dir + "/cni-bin/loopback", fs::copy_options::overwrite_existing, ec))
        break;
    }
    MakeNodeNetns(&n);
    Must({"ip", "route", "replace", Dotted(kAgentIp) + "/32", "dev", "sa0"});
    return n;
  };

  // ---- 0. the baseline: the same agent, an empty cluster (its own Node only) ----
  double base_rss = 0, base_hwm = 0, base_ready = 0, base_idle_cpu = 0;
  {
    Node n = make_node("empty");
    auto t0 = Clock::now();
    pid_t pid = StartAgent(build, n, kubeconfig);
    base_ready = WaitReady(n, pid, t0, 120);
    if (base_ready < 0) Die("baseline agent not ready in 120 s; log: " + n.log);
    double cpu0 = CpuSeconds(pid);
    std::this_thread::sleep_for(std::chrono::duration<double>(idle / 2));  // an idle window
    base_idle_cpu = (CpuSeconds(pid) - cpu0) / (idle / 2);
    base_rss = Mib(StatusKiB(pid, "VmRSS:"));
    base_hwm = Mib(StatusKiB(pid, "VmHWM:"));
    StopAgent(pid);
    DeleteNodeNetns(&n);
    std::error_code ec;
    fs::remove_all(n.bpffs, ec);
    std::printf(
        "baseline (empty cluster): ready %.2f s, VmRSS %.1f MiB, VmHWM %.1f MiB, idle CPU "
        "%.2f%% of a core (load %s)\n",
        base_ready, base_rss, base_hwm, 100 * base_idle_cpu, LoadAvg().c_str());
    std::fflush(stdout);
  }

  // ---- 1. the cluster in the store, then the agent from a cold start ----
  {
    auto t0 = Clock::now();
    for (int ns = 0; ns < sz.namespaces; ++ns) create("namespaces", NamespaceObject(ns));
    for (int i = 1; i < sz.nodes; ++i) create("nodes", NodeObject(i));
    for (const auto& p : c.pods) create("pods", PodObject(c, p));
    for (int s = 0; s < sz.services; ++s) {
      json svc = create("services", ServiceObject(c, s));
      in_addr a{};
      if (inet_pton(AF_INET, svc["spec"]["clusterIP"].get<std::string>().c_str(), &a) != 1)
        Die("no ClusterIP");
      c.services[s].cluster_ip = ntohl(a.s_addr);
      for (int k = 0; k < Slices(c.services[s]); ++k)
        create("endpointslices", SliceObject(c, s, k));
    }
    for (int p = 0; p < sz.policies; ++p) create("networkpolicies", PolicyObject(c, p));
    std::printf("the store holds the cluster (created in %.1f s, untimed)\n", Since(t0));
    std::fflush(stdout);
  }
  Node n = make_node("full");
  const uint64_t bytes0 = TxBytes("sa0");
  auto t0 = Clock::now();
  pid_t pid = StartAgent(build, n, kubeconfig);
  const double ready_s = WaitReady(n, pid, t0, 600);
  if (ready_s < 0) Die("agent not ready in 600 s; log: " + n.log);
  const double ready_cpu = CpuSeconds(pid);
  const std::string ready_load = LoadAvg();
  auto maps = OpenMaps(n.bpffs);
  for (const char* m :
       {"sluice_lb4_svc", "sluice_lb4_be", "sluice_ipcache4", "sluice_tunnel4", "sluice_nomasq4"})
    if (!maps.count(m)) Die(absl::StrCat("no pinned map ", m, " under ", n.bpffs));
  Maps mp{maps["sluice_lb4_svc"].fd, maps["sluice_lb4_be"].fd, maps["sluice_ipcache4"].fd,
          maps["sluice_tunnel4"].fd, maps["sluice_nomasq4"].fd};
  // Every map holds the cluster: checked in passes from /readyz on (each pass resumes where the
  // last stopped: the initial sync only adds).
  size_t svc_done = 0, pod_done = 0;
  int node_done = 1;
  double programmed_s = -1;
  while (Since(t0) < 600) {
    while (svc_done < c.services.size()) {
      const ServiceRec& r = c.services[svc_done];
      auto got = Served(mp, r.cluster_ip, 80);
      if (!got || *got != WantServed(c, svc_done)) break;
      if (r.two_ports && !Served(mp, r.cluster_ip, 9090)) break;
      ++svc_done;
    }
    while (pod_done < c.pods.size() &&
           (c.pods[pod_done].ip == 0 || Identity(mp, c.pods[pod_done].ip) >= 256))
      ++pod_done;
    while (node_done < sz.nodes && TunnelTo(mp, PodCidrBase(node_done) + 1) == NodeIp(node_done) &&
           NeverMasqueraded(mp, PodCidrBase(node_done) + 1) &&
           NeverMasqueraded(mp, NodeIp(node_done)))
      ++node_done;
    if (svc_done == c.services.size() && pod_done == c.pods.size() && node_done == sz.nodes) {
      programmed_s = Since(t0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (programmed_s < 0)
    Die(absl::StrFormat("maps incomplete after 600 s: %zu/%zu Services, %zu/%zu pods, %d/%d nodes",
                        svc_done, c.services.size(), pod_done, c.pods.size(), node_done, sz.nodes));
  // The never-masqueraded set is no wider than the nodes: the next addresses after them are out.
  if (NeverMasqueraded(mp, PodCidrBase(sz.nodes + 5) + 1) ||
      NeverMasqueraded(mp, NodeIp(sz.nodes + 5)))
    Die("sluice_nomasq4 covers addresses of no node");
  const double programmed_cpu = CpuSeconds(pid);
  const double sync_hwm = Mib(StatusKiB(pid, "VmHWM:"));
  const double sync_rss = Mib(StatusKiB(pid, "VmRSS:"));
  const uint64_t sync_bytes = TxBytes("sa0") - bytes0;
  std::printf("\n#### 1. cold start against the cluster (agent pid %d, load %s at ready)\n",
              static_cast<int>(pid), ready_load.c_str());
  std::printf("%-60s %10.2f s   (target <= 10 s; empty cluster %.2f s)\n",
              "start -> /readyz 200 (watches listed, first batches applied)", ready_s, base_ready);
  std::printf("%-60s %10.2f s\n", "start -> every map holds the cluster (checked)", programmed_s);
  std::printf("%-60s %10.2f s\n", "agent CPU, start -> /readyz", ready_cpu);
  std::printf("%-60s %10.2f s\n", "agent CPU, start -> maps complete", programmed_cpu);
  std::printf("%-60s %10.1f MiB\n", "bytes received from the apiserver (veth, with headers)",
              sync_bytes / 1048576.0);
  std::printf("%-60s %10.1f MiB  (%.1f over idle)\n", "VmHWM after the sync", sync_hwm,
              sync_hwm - base_rss);
  std::printf("%-60s %10.1f MiB  (%.1f over idle)\n", "VmRSS after the sync", sync_rss,
              sync_rss - base_rss);
  std::fflush(stdout);

  // ---- 2. the measured node's pods through sluice-cni, their status as a kubelet writes it ----
  {
    json conflist;
    {
      std::ifstream f(n.dir + "/cni-conf/05-sluice.conflist");
      conflist = json::parse(f, nullptr, false);
    }
    if (!conflist.is_object() || !conflist.contains("plugins")) Die("no conflist installed");
    json conf = conflist["plugins"][0];
    conf["cniVersion"] = conflist["cniVersion"];
    conf["name"] = conflist["name"];
    const std::string conf_path = n.dir + "/cni-conf.json";
    std::ofstream(conf_path) << conf.dump();
    auto t1 = Clock::now();
    int k = 0;
    for (size_t p = 0; p < c.pods.size(); ++p) {
      PodRec& pod = c.pods[p];
      if (pod.node != 0) continue;
      const Workload& w = c.workloads[pod.workload];
      std::string netns = absl::StrCat(tag, "-p", k++);
      Must({"ip", "netns", "add", netns});
      g_netns.push_back(netns);
      int out[2];
      if (pipe(out) != 0) Die("pipe");
      pid_t cni = fork();
      if (cni == 0) {
        int in = open(conf_path.c_str(), O_RDONLY);
        dup2(in, 0);
        dup2(out[1], 1);
        close(out[0]);
        std::string args = absl::StrCat("CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=", w.ns,
                                        ";K8S_POD_NAME=", pod.name, ";K8S_POD_UID=uid-", p);
        std::string cmd = "CNI_COMMAND=ADD", id = absl::StrCat("CNI_CONTAINERID=scale", p),
                    ns = "CNI_NETNS=/run/netns/" + netns, ifn = "CNI_IFNAME=eth0",
                    path = "CNI_PATH=" + build + "/cni",
                    env_path = "PATH=/usr/sbin:/usr/bin:/sbin:/bin";
        char* envp[] = {cmd.data(),  id.data(),   ns.data(),       ifn.data(),
                        path.data(), args.data(), env_path.data(), nullptr};
        std::string bin = build + "/cni/sluice-cni";
        char* av[] = {bin.data(), nullptr};
        execve(av[0], av, envp);
        _exit(127);
      }
      close(out[1]);
      std::string result;
      char buf[4096];
      for (ssize_t r; (r = read(out[0], buf, sizeof buf)) > 0;) result.append(buf, r);
      close(out[0]);
      int status = 0;
      waitpid(cni, &status, 0);
      json res = json::parse(result, nullptr, false);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !res.contains("ips"))
        Die("CNI ADD of " + pod.name + ": " + result);
      std::string addr = res["ips"][0]["address"];
      in_addr a{};
      inet_pton(AF_INET, addr.substr(0, addr.find('/')).c_str(), &a);
      pod.ip = ntohl(a.s_addr);
      json status_obj = PodObject(c, pod)["status"];
      auto u = store.Update(
          Resource("pods"), w.ns, pod.name,
          [&](json& o) {
            o["status"] = status_obj;
            return absl::OkStatus();
          },
          sluice::lab::ObjectStore::Subresource::kStatus);
      if (!u.ok()) Die("pod status: " + u.status().ToString());
    }
    std::printf("\n#### 2. %d pods on the measured node through sluice-cni: %.2f s (load %s)\n", k,
                Since(t1), LoadAvg().c_str());
    std::fflush(stdout);
  }

  // ---- 3. idle: CPU, memory, map entries ----
  double idle_cpu;
  {
    double cpu0 = CpuSeconds(pid);
    std::this_thread::sleep_for(std::chrono::duration<double>(idle));  // the idle window
    idle_cpu = (CpuSeconds(pid) - cpu0) / idle;
  }
  const double idle_rss = Mib(StatusKiB(pid, "VmRSS:"));
  const double idle_hwm = Mib(StatusKiB(pid, "VmHWM:"));
  std::printf("\n#### 3. idle %.0f s with the cluster (load %s)\n", idle, LoadAvg().c_str());
  std::printf("%-60s %10.2f %% of a core (empty cluster %.2f %%)\n", "agent CPU", 100 * idle_cpu,
              100 * base_idle_cpu);
  std::printf("%-60s %10.1f MiB  (empty cluster %.1f MiB)\n", "VmRSS", idle_rss, base_rss);
  std::printf("%-60s %10.1f MiB  (target <= 150 MiB)\n",
              "VmRSS over idle (- empty cluster's VmRSS)", idle_rss - base_rss);
  std::printf("%-60s %10.1f MiB  (empty cluster %.1f MiB)\n", "VmHWM (peak since start)", idle_hwm,
              base_hwm);
  std::printf("%-60s %10.1f MiB\n", "peak over idle (VmHWM - empty cluster's VmRSS)",
              idle_hwm - base_rss);
  std::printf(
      "map entries (arrays are full by construction: -, except sluice_lb4_be's used slots):\n");
  {
    auto t1 = Clock::now();
    for (const auto& [name, m] : maps) {
      int64_t e = CountEntries(m);
      if (e < 0) continue;
      std::printf("  %-28s %10lld / %u\n", name.c_str(), static_cast<long long>(e), m.max_entries);
    }
    std::printf("  (counted in %.2f s)\n", Since(t1));
  }
  std::fflush(stdout);

  // ---- 4. churn: --rate changes/s of mixed kinds ----
  std::mt19937_64 rng(3434);
  std::mutex mu;
  std::vector<Probe> pending;
  std::vector<double> lat[kKinds];
  int missed[kKinds] = {}, writes[kKinds + 4] = {};
  std::vector<char> busy(c.services.size() + 1024, 0);
  std::atomic<bool> writer_done{false};
  std::thread prober([&] {
    while (true) {
      {
        std::lock_guard<std::mutex> l(mu);
        if (writer_done && pending.empty()) return;
        for (size_t i = 0; i < pending.size();) {
          Probe& p = pending[i];
          double ms = std::chrono::duration<double, std::milli>(Clock::now() - p.committed).count();
          if (p.done()) {
            lat[p.kind].push_back(ms);
          } else if (ms > 5000) {
            ++missed[p.kind];
          } else {
            ++i;
            continue;
          }
          pending[i] = std::move(pending.back());
          pending.pop_back();
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  std::vector<std::vector<int>> workload_pods(c.workloads.size());
  for (size_t p = 0; p < c.pods.size(); ++p) workload_pods[c.pods[p].workload].push_back(p);
  std::vector<int> deleted_pods, extra_services;
  int extra_nodes = 0;
  bool svc_create_next = true, node_add_next = true;
  auto random_remote_pod = [&](bool job_only) {
    while (true) {
      int p = static_cast<int>(rng() % c.pods.size());
      const PodRec& r = c.pods[p];
      if (r.node == 0 || !r.alive) continue;
      if (job_only && c.workloads[r.workload].service >= 0) continue;
      return p;
    }
  };
  auto track = [&](Kind k, std::function<bool()> done) {
    std::lock_guard<std::mutex> l(mu);
    pending.push_back({k, std::move(done), Clock::now()});
  };
  // kube-apiserver (Go) sets TCP_NODELAY on its connections; the lab's leaves Nagle on, which
  // holds a watch event back for the agent's delayed ACK (service_churn_bench, --nagle).
  const int32_t nodelay = sluice::bench::SetNoDelayOnOpenSockets();
  // SLUICE_SCALE_PERF=FILE: the agent sampled by perf over the churn (where its CPU goes).
  pid_t perf = -1;
  if (const char* out = getenv("SLUICE_SCALE_PERF"); out != nullptr && *out != '\0') {
    perf = fork();
    if (perf == 0) {
      std::string p = std::to_string(pid), secs = std::to_string(static_cast<int>(seconds));
      execlp("perf", "perf", "record", "-q", "-F", "499", "-g", "-p", p.c_str(), "-o", out, "--",
             "sleep", secs.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  const double churn_cpu0 = CpuSeconds(pid);
  const uint64_t churn_bytes0 = TxBytes("sa0");
  const auto c0 = Clock::now();
  const int total = static_cast<int>(std::lround(rate * seconds));
  int done_writes = 0;
  for (int i = 0; done_writes < total; ++i) {
    std::this_thread::sleep_until(
        c0 + std::chrono::microseconds(static_cast<int64_t>(done_writes * 1e6 / rate)));
    switch (i % 20) {
      case 0:
      case 2:
      case 5:
      case 7:
      case 11:
      case 14: {  // EndpointSlice: one endpoint -/+
        int s;
        {
          std::lock_guard<std::mutex> l(mu);
          do {
            s = static_cast<int>(rng() % sz.services);
          } while (busy[s] || c.services[s].pods.size() < 2);
          busy[s] = 1;
        }
        ServiceRec& r = c.services[s];
        int p;
        if (!r.removed.empty() && ((rng() & 1) || r.removed.size() + 1 >= r.pods.size())) {
          p = r.removed.back();
          r.removed.pop_back();
        } else {
          do {
            p = r.pods[rng() % r.pods.size()];
          } while (std::find(r.removed.begin(), r.removed.end(), p) != r.removed.end());
          r.removed.push_back(p);
        }
        int k = static_cast<int>(std::find(r.pods.begin(), r.pods.end(), p) - r.pods.begin()) /
                kSliceMax;
        json slice = SliceObject(c, s, k);
        auto u = store.Update(Resource("endpointslices"), c.workloads[r.workload].ns,
                              slice["metadata"]["name"].get<std::string>(), [&](json& o) {
                                o["endpoints"] = slice["endpoints"];
                                return absl::OkStatus();
                              });
        if (!u.ok()) Die("slice update: " + u.status().ToString());
        std::vector<uint32_t> want = WantServed(c, s);
        uint32_t ip = r.cluster_ip;
        track(kSlice, [&mp, &busy, want, ip, s] {
          auto got = Served(mp, ip, 80);
          if (!got || *got != want) return false;
          busy[s] = 0;
          return true;
        });
        ++writes[kSlice];
        ++done_writes;
        break;
      }
      case 1:
      case 8: {  // a Pod deleted (a job's pod on another node)
        int p = random_remote_pod(true);
        PodRec& r = c.pods[p];
        sluice::lab::ObjectStore::DeleteOptions d;
        d.grace_period_seconds = 0;
        auto del = store.Delete(Resource("pods"), c.workloads[r.workload].ns, r.name, d);
        if (!del.ok()) Die("pod delete: " + del.status().ToString());
        r.alive = false;
        deleted_pods.push_back(p);
        uint32_t ip = r.ip;
        track(kPodDelete, [&mp, ip] { return Identity(mp, ip) < 256; });
        ++writes[kPodDelete];
        ++done_writes;
        break;
      }
      case 3:
      case 12: {  // a Pod created: one deleted 15 cycles (6 s at 50/s) before, again (one
                  // created right after its delete could hide the delete from the prober)
        if (deleted_pods.size() <= 30) break;
        int p = deleted_pods.front();
        deleted_pods.erase(deleted_pods.begin());
        PodRec& r = c.pods[p];
        r.alive = true;
        create("pods", PodObject(c, r));
        uint32_t ip = r.ip;
        track(kPodCreate, [&mp, ip] { return Identity(mp, ip) >= 256; });
        ++writes[kPodCreate];
        ++done_writes;
        break;
      }
      case 4:
      case 10:
      case 16: {  // a Pod relabelled: version v1 <-> v2
        int p = random_remote_pod(false);
        PodRec& r = c.pods[p];
        uint32_t old = Identity(mp, r.ip);
        r.v2 = !r.v2;
        json labels = PodLabels(c, r);
        auto u = store.Update(Resource("pods"), c.workloads[r.workload].ns, r.name, [&](json& o) {
          o["metadata"]["labels"] = labels;
          return absl::OkStatus();
        });
        if (!u.ok()) Die("pod relabel: " + u.status().ToString());
        uint32_t ip = r.ip;
        track(kPodRelabel, [&mp, ip, old] {
          uint32_t id = Identity(mp, ip);
          return id >= 256 && id != old;
        });
        ++writes[kPodRelabel];
        ++done_writes;
        break;
      }
      case 6:
      case 18: {  // a Node heartbeat (status only)
        int node = 1 + static_cast<int>(rng() % (sz.nodes - 1));
        std::string hb = absl::StrFormat("2026-12-07T01:%02d:%02dZ", (i / 60) % 60, i % 60);
        auto u = store.Update(
            Resource("nodes"), "", NodeName(node),
            [&](json& o) {
              for (auto& cond : o["status"]["conditions"]) cond["lastHeartbeatTime"] = hb;
              return absl::OkStatus();
            },
            sluice::lab::ObjectStore::Subresource::kStatus);
        if (!u.ok()) Die("node heartbeat: " + u.status().ToString());
        ++writes[kKinds];
        ++done_writes;
        break;
      }
      case 13: {  // a Node added, or the last one added deleted
        if (node_add_next) {
          int node = sz.nodes + extra_nodes++;
          create("nodes", NodeObject(node));
          uint32_t probe = PodCidrBase(node) + 1, want = NodeIp(node);
          track(kNodeAdd, [&mp, probe, want] { return TunnelTo(mp, probe) == want; });
          ++writes[kNodeAdd];
        } else {
          int node = sz.nodes + --extra_nodes;
          auto del = store.Delete(Resource("nodes"), "", NodeName(node), {});
          if (!del.ok()) Die("node delete: " + del.status().ToString());
          uint32_t probe = PodCidrBase(node) + 1, gone = NodeIp(node);
          track(kNodeDelete, [&mp, probe, gone] { return TunnelTo(mp, probe) != gone; });
          ++writes[kNodeDelete];
        }
        node_add_next = !node_add_next;
        ++done_writes;
        break;
      }
      case 9: {  // a Service created with its slice (2 writes), or the last one deleted (2)
        if (svc_create_next) {
          int w;
          do {
            w = static_cast<int>(rng() % c.workloads.size());
          } while (c.workloads[w].service >= 0 || c.workloads[w].name.rfind("job-", 0) != 0);
          ServiceRec r{w, {}, false};
          for (int p : workload_pods[w])
            if (c.pods[p].alive) r.pods.push_back(p);
          if (r.pods.empty()) break;
          int s = static_cast<int>(c.services.size());
          c.services.push_back(r);
          c.workloads[w].service = s;
          json svc = create("services", ServiceObject(c, s));
          in_addr a{};
          inet_pton(AF_INET, svc["spec"]["clusterIP"].get<std::string>().c_str(), &a);
          c.services[s].cluster_ip = ntohl(a.s_addr);
          create("endpointslices", SliceObject(c, s, 0));
          extra_services.push_back(s);
          std::vector<uint32_t> want = WantServed(c, s);
          uint32_t ip = c.services[s].cluster_ip;
          track(kSvcCreate, [&mp, want, ip] {
            auto got = Served(mp, ip, 80);
            return got && *got == want;
          });
          ++writes[kSvcCreate];
        } else {
          if (extra_services.empty()) break;
          int s = extra_services.back();
          extra_services.pop_back();
          const Workload& w = c.workloads[c.services[s].workload];
          auto del = store.Delete(Resource("services"), w.ns, w.name, {});
          if (!del.ok()) Die("service delete: " + del.status().ToString());
          json slice = SliceObject(c, s, 0);
          del = store.Delete(Resource("endpointslices"), w.ns,
                             slice["metadata"]["name"].get<std::string>(), {});
          if (!del.ok()) Die("slice delete: " + del.status().ToString());
          c.workloads[c.services[s].workload].service = -1;
          uint32_t ip = c.services[s].cluster_ip;
          track(kSvcDelete, [&mp, ip] { return !Served(mp, ip, 80).has_value(); });
          ++writes[kSvcDelete];
        }
        svc_create_next = !svc_create_next;
        done_writes += 2;
        break;
      }
      case 15: {  // a NetworkPolicy's port changed
        int p = static_cast<int>(rng() % sz.policies);
        json pol = PolicyObject(c, p, (i / 20) % 2 ? 8081 : 8080);
        auto u = store.Update(Resource("networkpolicies"),
                              pol["metadata"]["namespace"].get<std::string>(),
                              pol["metadata"]["name"].get<std::string>(), [&](json& o) {
                                o["spec"] = pol["spec"];
                                return absl::OkStatus();
                              });
        if (!u.ok()) Die("policy update: " + u.status().ToString());
        ++writes[kKinds + 1];
        ++done_writes;
        break;
      }
      case 19: {  // a Namespace relabelled (a label no policy selects on)
        int ns = static_cast<int>(rng() % sz.namespaces);
        json obj = NamespaceObject(ns, (i / 20) % 2);
        auto u = store.Update(Resource("namespaces"), "", NsName(ns), [&](json& o) {
          o["metadata"]["labels"] = obj["metadata"]["labels"];
          return absl::OkStatus();
        });
        if (!u.ok()) Die("namespace relabel: " + u.status().ToString());
        ++writes[kKinds + 2];
        ++done_writes;
        break;
      }
      default:
        break;
    }
  }
  const double churn_s = Since(c0);
  const double churn_cpu = (CpuSeconds(pid) - churn_cpu0) / churn_s;
  const uint64_t churn_bytes = TxBytes("sa0") - churn_bytes0;
  writer_done = true;
  prober.join();
  if (perf > 0) waitpid(perf, nullptr, 0);
  std::printf(
      "\n#### 4. %d changes in %.1f s (%.1f/s asked) of mixed kinds; apiserver sockets "
      "TCP_NODELAY (%d); load %s\n",
      done_writes, churn_s, rate, nodelay, LoadAvg().c_str());
  std::printf(
      "writes: %d slices, %d pod deletes, %d pod creates, %d pod relabels, %d node "
      "heartbeats, %d node adds, %d node deletes, %d Service creates (+slice), %d Service "
      "deletes (+slice), %d policy updates, %d namespace relabels\n",
      writes[kSlice], writes[kPodDelete], writes[kPodCreate], writes[kPodRelabel], writes[kKinds],
      writes[kNodeAdd], writes[kNodeDelete], writes[kSvcCreate], writes[kSvcDelete],
      writes[kKinds + 1], writes[kKinds + 2]);
  std::printf("%-60s %10.2f %% of a core (target <= 5 %%; idle %.2f %%)\n", "agent CPU",
              100 * churn_cpu, 100 * idle_cpu);
  std::printf("%-60s %10.1f KiB/s\n", "bytes received from the apiserver",
              churn_bytes / 1024.0 / churn_s);
  std::printf("%-36s %6s %8s %8s %8s %8s %7s\n", "change -> datapath, ms", "n", "p50", "p90", "p99",
              "max", "missed");
  std::vector<double> all;
  int all_missed = 0;
  for (int k = 0; k < kKinds; ++k) {
    std::printf("%-36s %6zu %8.2f %8.2f %8.2f %8.2f %7d\n", kKindNames[k], lat[k].size(),
                Pct(lat[k], 50), Pct(lat[k], 90), Pct(lat[k], 99), Pct(lat[k], 100), missed[k]);
    all.insert(all.end(), lat[k].begin(), lat[k].end());
    all_missed += missed[k];
  }
  std::printf("%-36s %6zu %8.2f %8.2f %8.2f %8.2f %7d   (target p99 <= 50 ms)\n", "all tracked",
              all.size(), Pct(all, 50), Pct(all, 90), Pct(all, 99), Pct(all, 100), all_missed);
  std::printf("%-60s %10.1f MiB  (%.1f over idle)\n", "VmRSS after the churn",
              Mib(StatusKiB(pid, "VmRSS:")), Mib(StatusKiB(pid, "VmRSS:")) - base_rss);
  std::printf("%-60s %10.1f MiB  (%.1f over idle)\n", "VmHWM after the churn",
              Mib(StatusKiB(pid, "VmHWM:")), Mib(StatusKiB(pid, "VmHWM:")) - base_rss);
  std::fflush(stdout);

  // ---- 5. restart on its own maps and state ----
  CloseMaps(&maps);
  StopAgent(pid);
  auto r0 = Clock::now();
  pid = StartAgent(build, n, kubeconfig);
  double restart_s = WaitReady(n, pid, r0, 600);
  std::printf(
      "\n#### 5. restart (SIGTERM, started again on its maps and state): -> /readyz 200 "
      "%.2f s, CPU %.2f s, VmHWM %.1f MiB (load %s)\n",
      restart_s, CpuSeconds(pid), Mib(StatusKiB(pid, "VmHWM:")), LoadAvg().c_str());

  std::printf(
      "\nsummary --scale=%g: ready %.2f s (maps complete %.2f s), sync CPU %.2f s, %.1f MiB "
      "received, VmRSS over idle %.1f MiB, peak over idle %.1f MiB, churn CPU %.2f %%, change p99 "
      "%.2f ms (%d missed), restart -> ready %.2f s\n",
      scale, ready_s, programmed_s, programmed_cpu, sync_bytes / 1048576.0, idle_rss - base_rss,
      idle_hwm - base_rss, 100 * churn_cpu, Pct(all, 99), all_missed, restart_s);
  std::fflush(stdout);
  StopAgent(pid);
  Cleanup();
  if (!keep_logs) {
    std::error_code ec;
    fs::remove_all(work, ec);
  } else {
    std::printf("logs kept under %s\n", work.c_str());
  }
  const bool ok = restart_s > 0;  // missed changes are a figure (printed), not a failed run
  std::fflush(stdout);
  std::_Exit(ok ? 0 : 1);  // the apiserver's watch threads are not joined
}
