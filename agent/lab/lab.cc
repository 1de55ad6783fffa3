#include "agent/lab/lab.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agent/base/errno.h"
#include "agent/base/files.h"
#include "agent/lab/apiserver/apiserver.h"
#include "agent/lab/network/probe.h"
#include "agent/lab/network/router.h"
#include "agent/lab/node/kubelet.h"
#include "agent/lab/tools/process.h"
#include "agent/lab/workloads/supervisor.h"
#include "agent/lab/workloads/workloads.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "yaml-cpp/yaml.h"

namespace sluice::lab {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The lab's own files (controlplane.pid, status.json, ready, agent.hold), replaced whole so a
// reader never sees half of one. They live under /run, which a reboot clears: no fsync.
absl::Status WriteLabFile(const std::string& path, const std::string& content) {
  const fs::path p(path);
  return agent::WriteFileAtomically(p.parent_path().string(), p.filename().string(), content, 0644,
                                    agent::Durability::kProcessCrash);
}

std::string Tail(const std::string& path, size_t bytes = 3000) {
  std::string s = ReadFile(path);
  return s.size() > bytes ? s.substr(s.size() - bytes) : s;
}

pid_t ReadPid(const std::string& path) {
  int pid = 0;
  std::string s = ReadFile(path);
  return absl::SimpleAtoi(absl::StripAsciiWhitespace(s), &pid) ? pid : 0;
}

// Makes the API served inside the underlay namespace reachable from the root namespace: listens
// on 127.0.0.1 (where this object is created) and connects every accepted connection, from a
// thread that joined the underlay namespace, to the apiserver's underlay address.
class TcpForwarder {
 public:
  ~TcpForwarder() { Stop(); }

  absl::Status Start(const std::string& target_netns_path, const std::string& target_ip,
                     int target_port) {
    netns_fd_ = open(target_netns_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (netns_fd_ < 0) return ErrnoStatus(errno, absl::StrCat("open ", target_netns_path));
    target_ = {};
    target_.sin_family = AF_INET;
    target_.sin_port = htons(target_port);
    inet_pton(AF_INET, target_ip.c_str(), &target_.sin_addr);
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(listen_fd_, 128) != 0 ||
        getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return ErrnoStatus(errno, "listen on 127.0.0.1");
    }
    port_ = ntohs(addr.sin_port);
    if (pipe2(stop_pipe_, O_CLOEXEC) != 0) return ErrnoStatus(errno, "pipe");
    thread_ = std::thread([this] { AcceptLoop(); });
    return absl::OkStatus();
  }

  void Stop() {
    if (stop_pipe_[1] >= 0 && !stopping_.exchange(true)) {
      char c = 0;
      [[maybe_unused]] ssize_t n = write(stop_pipe_[1], &c, 1);
    }
    if (thread_.joinable()) thread_.join();
    for (int* fd : {&listen_fd_, &netns_fd_}) {
      if (*fd >= 0) close(*fd);
      *fd = -1;
    }
  }

  int port() const { return port_; }

 private:
  void AcceptLoop() {
    while (true) {
      pollfd p[2] = {{listen_fd_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
      if (poll(p, 2, -1) < 0) continue;
      if (p[1].revents) return;
      int client = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      // Detached: each pump ends when either side closes; the daemon exits right after Stop().
      std::thread([this, client] { Pump(client); }).detach();
    }
  }

  void Pump(int client) {
    int upstream = -1;
    if (setns(netns_fd_, CLONE_NEWNET) == 0) {
      upstream = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (upstream >= 0 &&
          connect(upstream, reinterpret_cast<sockaddr*>(&target_), sizeof(target_)) != 0) {
        close(upstream);
        upstream = -1;
      }
    }
    if (upstream < 0) {
      close(client);
      return;
    }
    int fds[2] = {client, upstream};
    bool open[2] = {true, true};  // reading side still open
    char buf[65536];
    while (open[0] || open[1]) {
      pollfd p[3] = {{open[0] ? fds[0] : -1, POLLIN, 0},
                     {open[1] ? fds[1] : -1, POLLIN, 0},
                     {stop_pipe_[0], POLLIN, 0}};
      if (poll(p, 3, -1) < 0) continue;
      if (p[2].revents) break;
      for (int i = 0; i < 2; ++i) {
        if (!open[i] || !p[i].revents) continue;
        ssize_t n = read(fds[i], buf, sizeof(buf));
        if (n <= 0) {
          open[i] = false;
          shutdown(fds[1 - i], SHUT_WR);
          if (n < 0) open[0] = open[1] = false;
          continue;
        }
        size_t off = 0;
        while (off < static_cast<size_t>(n)) {
          ssize_t w = send(fds[1 - i], buf + off, n - off, MSG_NOSIGNAL);
          if (w <= 0) {
            open[0] = open[1] = false;
            break;
          }
          off += w;
        }
      }
    }
    close(client);
    close(upstream);
  }

  int listen_fd_ = -1;
  int netns_fd_ = -1;
  int stop_pipe_[2] = {-1, -1};
  std::atomic<bool> stopping_{false};
  sockaddr_in target_ = {};
  int port_ = 0;
  std::thread thread_;
};

struct AgentProcess {
  const LabNode* node;
  std::string pod_cidr;
  pid_t pid = 0;
  bool exited = false;
  RestartBackoff backoff;
  absl::Time restart_at = absl::InfiniteFuture();  // while exited: when the supervisor starts it
  bool held = false;                               // exited and kept down by the hold file
};

json NodeObject(const LabNode& node, bool ready) {
  std::string now = ObjectStore::FormatTimestamp(absl::Now());
  return {{"apiVersion", "v1"},
          {"kind", "Node"},
          {"metadata",
           {{"name", node.name},
            {"labels",
             {{"kubernetes.io/hostname", node.name},
              {"kubernetes.io/os", "linux"},
              {"kubernetes.io/arch", "amd64"}}}}},
          {"spec", json::object()},
          {"status",
           {{"addresses", json::array({{{"type", "InternalIP"}, {"address", node.ip}},
                                       {{"type", "Hostname"}, {"address", node.name}}})},
            {"conditions", json::array({{{"type", "Ready"},
                                         {"status", ready ? "True" : "False"},
                                         {"reason", ready ? "KubeletReady" : "KubeletNotReady"},
                                         {"lastHeartbeatTime", now},
                                         {"lastTransitionTime", now}}})}}}};
}

std::string SiblingBinary(const char* env, const std::string& relative) {
  if (const char* v = getenv(env); v != nullptr && *v) return v;
  return fs::weakly_canonical(fs::path(SelfExeDir()) / relative).string();
}

}  // namespace

std::string AgentBinary() { return SiblingBinary("SLUICE_LAB_AGENT", "../sluice-agent"); }
std::string CniBinary() { return SiblingBinary("SLUICE_LAB_CNI", "../../cni/sluice-cni"); }
std::string SluicectlBinary() { return SiblingBinary("SLUICE_LAB_SLUICECTL", "../sluicectl"); }
std::string KubeconfigPath(const std::string& lab) { return LabDir(lab) + "/kubeconfig"; }

std::vector<std::string> AgentCommand(const Topology& t, const LabNode& node,
                                      const std::string& pod_cidr) {
  // Like a DaemonSet pod: the agent finds its pod CIDR on its Node object and watches the API
  // (routes to the other nodes follow their Node objects). SLUICE_LAB_AGENT_STATIC=1 starts it
  // with --pod_cidr and no apiserver instead.
  std::vector<std::string> argv = {"ip", "netns", "exec", node.netns, AgentBinary()};
  const char* static_mode = getenv("SLUICE_LAB_AGENT_STATIC");
  if (static_mode != nullptr && std::string(static_mode) == "1") {
    argv.push_back(absl::StrCat("--pod_cidr=", pod_cidr));
  } else {
    argv.push_back(absl::StrCat("--kubeconfig=", t.dir, "/kubeconfig-nodes"));
    argv.push_back(absl::StrCat("--node_name=", node.name));
  }
  for (const std::string& f : {
           absl::StrCat("--native_device=eth0"),
           absl::StrCat("--node_ip=", node.ip),
           std::string("--service_cidr=10.96.0.0/16"),
           absl::StrCat("--bpffs_root=", node.bpffs()),
           absl::StrCat("--state_dir=", node.state_dir()),
           absl::StrCat("--socket=", node.socket()),
           absl::StrCat("--observe_socket=", node.observe_socket()),
           absl::StrCat("--cni_conf_dir=", node.cni_conf_dir()),
           absl::StrCat("--cni_bin_dir=", node.cni_bin_dir()),
           absl::StrCat("--cni_plugin=", CniBinary()),
       }) {
    argv.push_back(f);
  }
  if (t.bgp) {  // every node peers with the lab's router (docs/routing.md, "BGP")
    argv.push_back("--bgp_control_plane");
    argv.push_back(absl::StrCat("--bgp_local_asn=", kNodeAsn));
    argv.push_back(absl::StrCat("--bgp_peers=", t.router_ip, ":", kRouterAsn));
    // The client's network is routed to the pods, not masqueraded: the datapath masquerades
    // every pod packet to a destination outside sluice_nomasq4, the replies of connections
    // that came in from there too (docs/routing.md, "BGP", "Not yet").
    argv.push_back(absl::StrCat("--non_masquerade_cidrs=", t.client_net));
  }
  if (const char* extra = getenv("SLUICE_LAB_AGENT_ARGS"); extra != nullptr) {
    for (absl::string_view a : absl::StrSplit(extra, ' ', absl::SkipWhitespace())) {
      argv.emplace_back(a);
    }
  }
  return argv;
}

absl::StatusOr<std::string> ResolveLab(const std::string& flag) {
  if (!flag.empty()) {
    if (auto st = ValidateLabName(flag); !st.ok()) return st;
    return flag;
  }
  std::vector<std::string> labs = ListLabs();
  if (labs.empty()) return absl::NotFoundError("no lab is running (sluice-lab up)");
  if (labs.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("several labs are running (", absl::StrJoin(labs, ", "), "): pass --name"));
  }
  return labs[0];
}

absl::StatusOr<std::string> ResolveNetns(const Topology& t, const std::string& from) {
  std::string netns;
  if (from == "external") {
    netns = t.external_netns;
  } else if (from == "client" && t.bgp) {
    netns = t.client_netns;
  } else if (from.rfind("node/", 0) == 0) {
    const LabNode* n = t.FindNode(from.substr(5));
    if (n == nullptr) return absl::NotFoundError(absl::StrCat("no node ", from.substr(5)));
    netns = n->netns;
  } else {
    std::vector<std::string> parts = absl::StrSplit(from, absl::MaxSplits('/', 1));
    if (parts.size() == 1) parts.insert(parts.begin(), "default");
    if (parts[0].empty() || parts[1].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--from: want external, node/NODE or NAMESPACE/POD, got ", from));
    }
    netns = t.PodNetns(parts[0], parts[1]);
    if (!fs::exists(t.netns_path(netns))) {
      // A hostNetwork pod runs in its node's namespace, which the status file names.
      json s = json::parse(ReadFile(t.dir + "/status.json"), nullptr, false);
      if (s.is_object() && s.contains("pods") && s["pods"].is_array()) {
        for (const auto& p : s["pods"]) {
          if (p.value("namespace", "") == parts[0] && p.value("name", "") == parts[1]) {
            netns = p.value("netns", netns);
          }
        }
      }
    }
  }
  std::string path = t.netns_path(netns);
  if (!fs::exists(path)) {
    return absl::NotFoundError(absl::StrCat(from, ": no network namespace ", netns));
  }
  return path;
}

absl::StatusOr<std::string> Up(const UpOptions& options, const std::string& self_exe) {
  for (const auto& bin : {AgentBinary(), CniBinary()}) {
    if (access(bin.c_str(), X_OK) != 0) return absl::NotFoundError(absl::StrCat(bin, " not found"));
  }
  auto topology = CreateTopology(options.name, options.nodes, options.bgp);
  if (!topology.ok()) return topology.status();
  std::string log = topology->dir + "/controlplane.log";
  std::vector<std::string> argv = {self_exe, "controlplane", "--name", options.name};
  if (options.no_agents) argv.push_back("--no_agents");
  auto pid = StartProcess({.argv = argv, .log_path = log});
  auto fail = [&](absl::Status st) -> absl::Status {
    std::string tail = Tail(log);
    if (pid.ok()) StopProcess(*pid, absl::Seconds(20));
    DestroyTopology(*topology).IgnoreError();
    return absl::Status(st.code(),
                        absl::StrCat(st.message(), "\n--- controlplane.log ---\n", tail));
  };
  if (!pid.ok()) return fail(pid.status());
  if (auto st = WriteLabFile(topology->dir + "/controlplane.pid", absl::StrCat(*pid, "\n"));
      !st.ok()) {
    return fail(st);
  }
  absl::Time deadline = absl::Now() + options.timeout;
  std::string ready = topology->dir + "/ready";
  while (!fs::exists(ready)) {
    if (auto code = ReapIfExited(*pid)) {
      pid = absl::InternalError("exited");
      return fail(absl::InternalError(absl::StrCat("control plane exited with ", *code)));
    }
    if (absl::Now() > deadline) {
      return fail(absl::DeadlineExceededError("the lab did not come up in time"));
    }
    usleep(50'000);
  }
  return KubeconfigPath(options.name);
}

int RunControlPlane(const std::string& name, bool no_agents) {
  auto topology = LoadTopology(name);
  if (!topology.ok()) {
    spdlog::critical("{}", topology.status().ToString());
    return 1;
  }
  const Topology& t = *topology;
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  ApiServerOptions api_options;
  api_options.address = t.gateway_ip;
  api_options.port = kUnderlayApiPort;
  api_options.extra_sans = {"127.0.0.1", "localhost"};
  api_options.pod_log_dir = t.dir + "/logs";  // the kubelet's (kubectl logs)
  // Without agents, Sluice comes from the chart, and with cluster-pool IPAM its operator
  // assigns the pod CIDRs (kube-controller-manager --allocate-node-cidrs=false).
  api_options.controllers.allocate_node_cidrs = !no_agents;
  ApiServer api(api_options);
  TcpForwarder forwarder;
  std::vector<AgentProcess> agents;
  std::vector<pid_t> router;  // FRR's zebra and bgpd (up --bgp)
  std::unique_ptr<Kubelet> kubelet;
  std::unique_ptr<Workloads> workloads;
  std::mutex status_mu;

  auto write_status = [&] {
    std::lock_guard<std::mutex> lock(status_mu);
    json nodes = json::array();
    for (const auto& a : agents) {
      nodes.push_back({{"name", a.node->name},
                       {"ip", a.node->ip},
                       {"netns", a.node->netns},
                       {"podCIDR", a.pod_cidr},
                       {"agentPid", a.exited ? 0 : a.pid},
                       {"agentRestarts", a.backoff.restarts()},
                       {"agentHeld", a.held}});
    }
    if (no_agents) {  // the agents are the chart's DaemonSet pods (kubectl -n kube-system)
      for (const auto& n : t.nodes) {
        auto node = api.store().Get(Resource("nodes"), "", n.name);
        std::string cidr =
            node.ok() ? node->value("spec", json::object()).value("podCIDR", "") : "";
        nodes.push_back({{"name", n.name},
                         {"ip", n.ip},
                         {"netns", n.netns},
                         {"podCIDR", cidr},
                         {"agentPid", 0},
                         {"agentFromChart", true}});
      }
    }
    json pods = json::array();
    if (kubelet) {
      for (const auto& p : kubelet->Pods()) {
        pods.push_back({{"namespace", p.namespace_name},
                        {"name", p.name},
                        {"node", p.node},
                        {"ip", p.ip},
                        {"ready", p.ready},
                        {"netns", p.netns}});
      }
    }
    json status = {{"lab", t.lab},
                   {"controlplanePid", getpid()},
                   {"noAgents", no_agents},
                   {"apiserver", absl::StrCat("https://127.0.0.1:", forwarder.port())},
                   {"apiserverUnderlay", api.url()},
                   {"nodes", nodes},
                   {"pods", pods}};
    WriteLabFile(t.dir + "/status.json", status.dump(2) + "\n").IgnoreError();
  };

  auto run = [&]() -> absl::Status {
    // The apiserver binds its address inside the underlay namespace: start it from a thread
    // that joined it (its server threads inherit the namespace).
    absl::Status started;
    std::thread([&] {
      if (auto st = EnterNetns(t.netns_path(t.underlay_netns)); !st.ok()) {
        started = st;
        return;
      }
      started = api.Start();
    }).join();
    if (!started.ok()) return started;
    if (auto st = forwarder.Start(t.netns_path(t.underlay_netns), t.gateway_ip, api.port());
        !st.ok()) {
      return st;
    }
    KubeconfigParams root = api.kubeconfig();
    root.server = absl::StrCat("https://127.0.0.1:", forwarder.port());
    root.cluster_name = root.context_name = absl::StrCat("sluice-lab-", t.lab);
    if (auto st = WriteKubeconfig(KubeconfigPath(t.lab), root); !st.ok()) return st;
    KubeconfigParams nodes = api.kubeconfig();
    nodes.server = api.url();
    nodes.cluster_name = nodes.context_name = root.cluster_name;
    if (auto st = WriteKubeconfig(t.dir + "/kubeconfig-nodes", nodes); !st.ok()) return st;
    spdlog::info("apiserver at {} (underlay) and {} (root namespace)", api.url(), root.server);

    if (t.bgp) {
      auto pids = StartRouter(t);
      if (!pids.ok()) return pids.status();
      router = *pids;
      spdlog::info("router {} (FRR, AS {}) at {}: vtysh --vty_socket {}", t.router_netns,
                   kRouterAsn, t.router_ip, t.router_dir());
    }
    ObjectStore& store = api.store();
    for (const auto& n : t.nodes) {
      auto created = store.Create(Resource("nodes"), NodeObject(n, !no_agents));
      if (!created.ok() && !absl::IsAlreadyExists(created.status())) return created.status();
    }
    for (const auto& n : t.nodes) {
      if (no_agents) break;
      AgentProcess agent{.node = &n};
      absl::Time deadline = absl::Now() + absl::Seconds(10);
      while (agent.pod_cidr.empty()) {
        auto node = store.Get(Resource("nodes"), "", n.name);
        if (node.ok()) agent.pod_cidr = node->value("spec", json::object()).value("podCIDR", "");
        if (!agent.pod_cidr.empty()) break;
        if (absl::Now() > deadline) {
          return absl::DeadlineExceededError(absl::StrCat("no podCIDR allocated to ", n.name));
        }
        usleep(20'000);
      }
      fs::remove(AgentHoldPath(n.dir));
      auto pid = StartProcess(
          {.argv = AgentCommand(t, n, agent.pod_cidr), .log_path = n.log_dir() + "/agent.log"});
      if (!pid.ok()) return pid.status();
      agent.pid = *pid;
      agent.backoff.Started(absl::Now());
      spdlog::info("agent of {} (pod CIDR {}) started: pid {}", n.name, agent.pod_cidr, *pid);
      agents.push_back(agent);
    }
    absl::Time deadline = absl::Now() + absl::Seconds(60);
    for (auto& a : agents) {
      std::string conflist = a.node->cni_conf_dir() + "/05-sluice.conflist";
      while (!fs::exists(conflist)) {
        if (auto code = ReapIfExited(a.pid)) {
          a.exited = true;
          return absl::InternalError(absl::StrCat("agent of ", a.node->name, " exited with ", *code,
                                                  ":\n", Tail(a.node->log_dir() + "/agent.log")));
        }
        if (absl::Now() > deadline) {
          return absl::DeadlineExceededError(absl::StrCat("agent of ", a.node->name, " not ready"));
        }
        usleep(20'000);
      }
    }
    if (no_agents) {
      KubeconfigParams creds = api.kubeconfig();
      std::string bin = fs::path(AgentBinary()).parent_path().string();
      workloads = std::make_unique<Workloads>(
          &store, t,
          WorkloadOptions{.self_exe = SelfExe(),
                          .image_files = {{"sluice-agent", AgentBinary()},
                                          {"sluice-cni", CniBinary()},
                                          {"sluice-operator", bin + "/sluice-operator"},
                                          {"sluicectl", bin + "/sluicectl"}},
                          .token = creds.token,
                          .ca_pem = creds.ca_cert_pem,
                          .on_change = write_status});
      if (auto st = workloads->Start(); !st.ok()) return st;
    }
    kubelet = std::make_unique<Kubelet>(
        &store, t, KubeletOptions{.netexec_binary = SelfExe(), .on_change = write_status});
    if (auto st = kubelet->Start(); !st.ok()) return st;
    write_status();
    return WriteLabFile(t.dir + "/ready", KubeconfigPath(t.lab) + "\n");
  };

  absl::Status st = run();
  int exit_code = 0;
  if (!st.ok()) {
    spdlog::critical("lab {}: {}", t.lab, st.ToString());
    exit_code = 1;
  } else {
    spdlog::info("lab {} is up with {} nodes", t.lab, t.nodes.size());
    absl::Time next_status = absl::Now();
    while (true) {
      timespec tick = {0, 50'000'000};  // how soon an exited agent is noticed
      int sig = sigtimedwait(&stop_signals, nullptr, &tick);
      if (sig > 0) {
        spdlog::info("signal {}: tearing lab {} down", sig, t.lab);
        break;
      }
      bool changed = false;
      if (no_agents) SyncNodeReady(&api.store(), t);
      for (auto& a : agents) {
        absl::Time now = absl::Now();
        if (!a.exited) {
          if (auto code = ReapIfExited(a.pid)) {
            std::lock_guard<std::mutex> lock(status_mu);
            a.exited = true;
            a.held = fs::exists(AgentHoldPath(a.node->dir));
            a.restart_at = a.backoff.Exited(now);
            changed = true;
            spdlog::error(
                "agent of {} (pid {}) exited with {}: {}", a.node->name, a.pid, *code,
                a.held ? "held down (agent.hold)"
                       : absl::StrCat("restarting in ", absl::FormatDuration(a.restart_at - now)));
          }
          continue;
        }
        // Exited: restart once due, unless `sluice-lab agent stop` holds it down.
        bool held = fs::exists(AgentHoldPath(a.node->dir));
        if (held != a.held) {
          std::lock_guard<std::mutex> lock(status_mu);
          a.held = held;
          changed = true;
          if (!held) a.restart_at = std::min(a.restart_at, now);
        }
        if (held || now < a.restart_at) continue;
        auto pid = StartProcess({.argv = AgentCommand(t, *a.node, a.pod_cidr),
                                 .log_path = a.node->log_dir() + "/agent.log"});
        if (!pid.ok()) {
          spdlog::error("restart agent of {}: {}", a.node->name, pid.status().ToString());
          a.restart_at = a.backoff.Exited(now);
          continue;
        }
        std::lock_guard<std::mutex> lock(status_mu);
        a.pid = *pid;
        a.exited = false;
        a.backoff.Started(now);
        changed = true;
        spdlog::info("agent of {} restarted (restart {}): pid {}", a.node->name,
                     a.backoff.restarts(), *pid);
      }
      if (changed || absl::Now() >= next_status) {
        write_status();
        next_status = absl::Now() + absl::Seconds(2);
      }
    }
  }
  // Pods first (CNI DEL needs the agents), then agents, then the API, then the network.
  if (kubelet) kubelet->Stop();
  if (workloads) workloads->Stop();
  for (auto& a : agents) {
    if (!a.exited) StopProcess(a.pid, absl::Seconds(10));
  }
  for (pid_t p : router) StopProcess(p, absl::Seconds(5));
  forwarder.Stop();
  api.Stop();
  if (auto d = DestroyTopology(t); !d.ok()) {
    spdlog::error("teardown: {}", d.ToString());
    exit_code = 1;
  }
  return exit_code;
}

absl::Status Down(const std::string& name) {
  auto t = LoadTopology(name);
  if (!t.ok()) return t.status();
  pid_t pid = ReadPid(t->dir + "/controlplane.pid");
  if (ProcessAlive(pid)) {
    kill(pid, SIGTERM);
    absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (ProcessAlive(pid) && absl::Now() < deadline) usleep(20'000);
    if (ProcessAlive(pid)) {
      spdlog::warn("control plane {} did not stop: killing it", pid);
      kill(pid, SIGKILL);
    }
  }
  // Whatever the daemon left (or everything, if it had died).
  return DestroyTopology(*t);
}

absl::StatusOr<std::string> Status(const std::string& name) {
  auto t = LoadTopology(name);
  if (!t.ok()) return t.status();
  json s = json::parse(ReadFile(t->dir + "/status.json"), nullptr, false);
  pid_t cp = ReadPid(t->dir + "/controlplane.pid");
  std::string out =
      absl::StrFormat("lab %s: control plane %s (pid %d), underlay 172.30.%d.0/24\n", t->lab,
                      ProcessAlive(cp) ? "running" : "NOT RUNNING", cp, t->index);
  if (s.is_discarded()) return out + "(no status yet)\n";
  absl::StrAppend(&out, "apiserver: ", s.value("apiserver", ""),
                  " (agents: ", s.value("apiserverUnderlay", ""),
                  ")\nkubeconfig: ", KubeconfigPath(name), "\n\n");
  absl::StrAppend(&out,
                  absl::StrFormat("%-10s %-15s %-18s %s\n", "NODE", "IP", "POD CIDR", "AGENT"));
  for (const auto& n : s.value("nodes", json::array())) {
    pid_t pid = n.value("agentPid", 0);
    absl::StrAppend(
        &out, absl::StrFormat("%-10s %-15s %-18s %s\n", n.value("name", ""), n.value("ip", ""),
                              n.value("podCIDR", ""),
                              n.value("agentFromChart", false)
                                  ? std::string("DaemonSet pod (up --no-agents)")
                              : ProcessAlive(pid) ? absl::StrCat("running (pid ", pid, ")")
                                                  : std::string("DOWN")));
  }
  absl::StrAppend(&out, "\n",
                  absl::StrFormat("%-30s %-10s %-15s %s\n", "POD", "NODE", "IP", "READY"));
  for (const auto& p : s.value("pods", json::array())) {
    absl::StrAppend(&out, absl::StrFormat("%-30s %-10s %-15s %s\n",
                                          p.value("namespace", "") + "/" + p.value("name", ""),
                                          p.value("node", ""), p.value("ip", ""),
                                          p.value("ready", false) ? "true" : "false"));
  }
  absl::StrAppend(&out, "external: ", t->external_ip, " (--from external)\n");
  if (t->bgp) {
    absl::StrAppend(&out, "router: ", t->router_ip, " (FRR, AS ", kRouterAsn,
                    "; vtysh --vty_socket ", t->router_dir(), ")\nclient: ", t->client_ip,
                    " behind the router (--from client)\n");
  }
  return out;
}

absl::StatusOr<std::string> Fault(const std::string& kubeconfig, const nlohmann::json& body) {
  // The kubeconfig has all it takes: server, CA, token.
  YAML::Node kc;
  try {
    kc = YAML::LoadFile(kubeconfig);
  } catch (const std::exception& e) {
    return absl::NotFoundError(absl::StrCat("read ", kubeconfig, ": ", e.what()));
  }
  std::string server = kc["clusters"][0]["cluster"]["server"].as<std::string>("");
  std::string ca;
  absl::Base64Unescape(
      kc["clusters"][0]["cluster"]["certificate-authority-data"].as<std::string>(""), &ca);
  std::string token = kc["users"][0]["user"]["token"].as<std::string>("");
  std::string hostport =
      server.substr(server.find("://") == std::string::npos ? 0 : server.find("://") + 3);
  int port = 0;
  if (hostport.rfind(':') == std::string::npos ||
      !absl::SimpleAtoi(hostport.substr(hostport.rfind(':') + 1), &port)) {
    return absl::DataLossError(absl::StrCat("unexpected server ", server));
  }
  httplib::SSLClient cli(hostport.substr(0, hostport.rfind(':')), port);
  BIO* bio = BIO_new_mem_buf(ca.data(), static_cast<int>(ca.size()));
  X509_STORE* store = X509_STORE_new();
  while (X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) {
    X509_STORE_add_cert(store, cert);
    X509_free(cert);
  }
  BIO_free(bio);
  cli.set_ca_cert_store(store);
  cli.set_bearer_token_auth(token);
  cli.set_connection_timeout(5);
  cli.set_read_timeout(30);
  auto res = cli.Post("/lab/faults", body.dump(), "application/json");
  if (!res) {
    return absl::UnavailableError(
        absl::StrCat("POST /lab/faults: ", httplib::to_string(res.error())));
  }
  if (res->status != 200) {
    return absl::FailedPreconditionError(absl::StrCat("HTTP ", res->status, ": ", res->body));
  }
  return res->body;
}

namespace {
// The agent pid status.json records for `node` (0: down or unknown).
pid_t RecordedAgentPid(const Topology& t, const std::string& node) {
  json s = json::parse(ReadFile(t.dir + "/status.json"), nullptr, false);
  if (s.is_discarded()) return 0;
  for (const auto& n : s.value("nodes", json::array())) {
    if (n.value("name", "") == node) return n.value("agentPid", 0);
  }
  return 0;
}
}  // namespace

absl::StatusOr<std::string> AgentAction(const std::string& lab, const std::string& node,
                                        const std::string& action, bool wait) {
  auto t = LoadTopology(lab);
  if (!t.ok()) return t.status();
  const LabNode* n = t->FindNode(node);
  if (n == nullptr) return absl::NotFoundError(absl::StrCat("no node ", node, " in lab ", lab));
  if (!ProcessAlive(ReadPid(t->dir + "/controlplane.pid"))) {
    return absl::FailedPreconditionError(absl::StrCat("lab ", lab, ": control plane not running"));
  }
  pid_t old = RecordedAgentPid(*t, node);
  if (action == "start") {
    fs::remove(AgentHoldPath(n->dir));
  } else if (action == "kill" || action == "restart" || action == "stop") {
    if (action == "stop") {
      if (auto st = WriteLabFile(AgentHoldPath(n->dir), "held by sluice-lab agent stop\n");
          !st.ok()) {
        return st;
      }
    }
    if (old <= 0 || !ProcessAlive(old)) {
      if (action == "stop") return absl::StrCat(old, " -> 0");
      return absl::FailedPreconditionError(absl::StrCat("agent of ", node, " is not running"));
    }
    kill(old, action == "kill" ? SIGKILL : SIGTERM);
    if (action == "stop") {
      absl::Time deadline = absl::Now() + absl::Seconds(30);
      while (ProcessAlive(old)) {
        if (absl::Now() > deadline) {
          return absl::DeadlineExceededError(absl::StrCat("agent ", old, " did not stop"));
        }
        usleep(20'000);
      }
      return absl::StrCat(old, " -> 0");
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("agent: unknown action ", action, " (kill, restart, stop, start)"));
  }
  if (!wait) return absl::StrCat(old, " -> ?");
  absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (true) {
    pid_t now = RecordedAgentPid(*t, node);
    if (now > 0 && now != old && ProcessAlive(now)) return absl::StrCat(old, " -> ", now);
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("agent of ", node, " was not started again within 60 s"));
    }
    usleep(20'000);
  }
}

}  // namespace sluice::lab
