#include "agent/lab/node/kubelet.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agent/base/deadline.h"
#include "agent/base/errno.h"
#include "agent/lab/store/json_path.h"
#include "agent/lab/tools/process.h"
#include "agent/lab/workloads/workloads.h"
#include "spdlog/spdlog.h"

extern char** environ;

namespace sluice::lab {
namespace {

using json = nlohmann::json;

std::string Key(const json& pod) {
  return absl::StrCat(JsonStr(pod, {"metadata", "namespace"}), "/",
                      JsonStr(pod, {"metadata", "name"}));
}

bool WantsReady(const json& pod) {
  return JsonStr(pod, {"metadata", "annotations", kReadyAnnotation}) != "false";
}

bool HostNetwork(const json& pod) {
  const json* spec = pod.is_object() && pod.contains("spec") ? &pod["spec"] : nullptr;
  return spec != nullptr && spec->is_object() && spec->value("hostNetwork", false);
}

bool Terminating(const json& pod) {
  return !JsonStr(pod, {"metadata", "deletionTimestamp"}).empty();
}

std::string Now() { return ObjectStore::FormatTimestamp(absl::Now()); }

// A pod's conditions: `wanted` (type, status) in order, each keeping the lastTransitionTime of the
// old condition with the same type and status (a repeated status write is no transition). Ready
// and ContainersReady that are False say why, as the kubelet does.
json PodConditions(const json& old_status,
                   const std::vector<std::pair<std::string, std::string>>& wanted,
                   const std::string& now) {
  json conditions = json::array();
  for (const auto& [type, status] : wanted) {
    std::string since = now;
    for (const auto& old : old_status.value("conditions", json::array())) {
      if (old.value("type", "") == type && old.value("status", "") == status) {
        since = old.value("lastTransitionTime", now);
      }
    }
    json c = {{"type", type}, {"status", status}, {"lastTransitionTime", since}};
    if (status == "False" && (type == "Ready" || type == "ContainersReady")) {
      c["reason"] = "ContainersNotReady";
    }
    conditions.push_back(c);
  }
  return conditions;
}

// One containerStatuses entry per container of the pod's spec, all in `state` (running or
// waiting); a started container has a containerID.
json ContainerStatuses(const json& spec_pod, const json& state, bool ready, bool started,
                       const std::string& uid) {
  json statuses = json::array();
  for (const auto& c : spec_pod["spec"].value("containers", json::array())) {
    json cs = {{"name", c.value("name", "")},
               {"image", c.value("image", "")},
               {"imageID", ""},
               {"ready", ready},
               {"started", started},
               {"restartCount", 0},
               {"state", state}};
    if (started) cs["containerID"] = "lab://" + uid;
    statuses.push_back(cs);
  }
  return statuses;
}

// How long a pod's netexec servers may take to bind their ports before the start counts as failed.
constexpr absl::Duration kServingTimeout = absl::Seconds(10);

// The socket a pod's netexec servers report "READY=1" to once their ports are bound (the
// sd_notify protocol, $NOTIFY_SOCKET), with SO_PASSCRED so each message names its sender.
class NotifySocket {
 public:
  static absl::StatusOr<std::unique_ptr<NotifySocket>> Bind(const std::string& path) {
    std::unique_ptr<NotifySocket> s(new NotifySocket(path));
    sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof(addr.sun_path)) {
      return absl::InvalidArgumentError(absl::StrCat("notify socket path too long: ", path));
    }
    memcpy(addr.sun_path, path.data(), path.size());
    s->fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s->fd_ < 0) return ErrnoStatus(errno, "socket unix");
    int one = 1;
    if (setsockopt(s->fd_, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)) != 0) {
      return ErrnoStatus(errno, "SO_PASSCRED");
    }
    unlink(path.c_str());  // left by a controlplane that died mid-start
    if (bind(s->fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      return ErrnoStatus(errno, absl::StrCat("bind ", path));
    }
    s->bound_ = true;
    return s;
  }
  ~NotifySocket() {
    if (fd_ >= 0) close(fd_);
    if (bound_) unlink(path_.c_str());
  }
  NotifySocket(const NotifySocket&) = delete;
  NotifySocket& operator=(const NotifySocket&) = delete;

  const std::string& path() const { return path_; }

  // Waits for READY=1 from every server in `pending` (pid -> port). A server that exits first is
  // reaped, and its pid in `pids` set to -1, and fails the wait, as does the deadline.
  absl::Status AwaitReady(std::map<pid_t, int> pending, std::vector<pid_t>& pids,
                          absl::Time deadline) {
    std::map<pid_t, int> pidfds;  // pid -> pidfd: readable once the process has exited
    auto close_pidfds = [&] {
      for (const auto& [pid, fd] : pidfds) close(fd);
    };
    for (const auto& [pid, port] : pending) {
      // syscall(): the pidfd_open() of glibc 2.36 (bookworm) is declared without extern "C".
      int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
      if (fd < 0) {
        close_pidfds();
        return ErrnoStatus(errno, absl::StrCat("pidfd_open netexec ", pid));
      }
      pidfds[pid] = fd;
    }
    absl::Status status = absl::OkStatus();
    while (!pending.empty() && status.ok()) {
      const int ms = PollTimeoutMs(deadline, absl::Now());
      if (ms == 0) {
        status = absl::DeadlineExceededError(
            absl::StrCat("netexec on port ", pending.begin()->second, " not serving after ",
                         absl::FormatDuration(kServingTimeout)));
        break;
      }
      std::vector<pollfd> p = {{fd_, POLLIN, 0}};
      std::vector<pid_t> polled;
      for (const auto& [pid, port] : pending) {
        p.push_back({pidfds[pid], POLLIN, 0});
        polled.push_back(pid);
      }
      if (poll(p.data(), p.size(), ms) < 0) {
        if (errno != EINTR) status = ErrnoStatus(errno, "poll notify socket");
        continue;
      }
      Receive(pending);  // before the exits: a READY=1 sent just before exiting still counts
      for (size_t i = 0; i < polled.size() && status.ok(); ++i) {
        if (!p[i + 1].revents || !pending.contains(polled[i])) continue;
        std::optional<int> code = ReapIfExited(polled[i]);
        for (pid_t& pid : pids) pid = pid == polled[i] ? -1 : pid;
        status = absl::UnavailableError(absl::StrCat("netexec on port ", pending[polled[i]],
                                                     " exited with ", code.value_or(-1),
                                                     " before serving"));
      }
    }
    close_pidfds();
    return status;
  }

 private:
  explicit NotifySocket(std::string path) : path_(std::move(path)) {}

  // Drains the socket, crossing off the senders of READY=1.
  void Receive(std::map<pid_t, int>& pending) {
    while (true) {
      char buf[256];
      char control[CMSG_SPACE(sizeof(ucred))] = {};
      iovec iov = {buf, sizeof(buf)};
      msghdr msg = {};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      ssize_t n = recvmsg(fd_, &msg, MSG_DONTWAIT);
      if (n < 0) return;
      std::optional<pid_t> sender;
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
          ucred cred;
          memcpy(&cred, CMSG_DATA(c), sizeof(cred));
          sender = cred.pid;
        }
      }
      for (absl::string_view line : absl::StrSplit(absl::string_view(buf, n), '\n')) {
        if (sender && line == "READY=1") pending.erase(*sender);
      }
    }
  }

  std::string path_;
  int fd_ = -1;
  bool bound_ = false;
};

// Our environment with NOTIFY_SOCKET pointing at `path`.
std::vector<std::string> EnvWithNotifySocket(const std::string& path) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!absl::StartsWith(*e, "NOTIFY_SOCKET=")) env.push_back(*e);
  }
  env.push_back("NOTIFY_SOCKET=" + path);
  return env;
}

}  // namespace

absl::StatusOr<uint64_t> ParseBandwidthQuantity(const std::string& text) {
  // Decimal and binary suffixes of a Kubernetes quantity; a fraction of a bit rounds down.
  static const std::pair<const char*, long double> kSuffixes[] = {{"Ki", 1024.0L},
                                                                  {"Mi", 1048576.0L},
                                                                  {"Gi", 1073741824.0L},
                                                                  {"Ti", 1099511627776.0L},
                                                                  {"Pi", 1125899906842624.0L},
                                                                  {"k", 1e3L},
                                                                  {"M", 1e6L},
                                                                  {"G", 1e9L},
                                                                  {"T", 1e12L},
                                                                  {"P", 1e15L},
                                                                  {"", 1.0L}};
  for (const auto& [suffix, scale] : kSuffixes) {
    if (!absl::EndsWith(text, suffix)) continue;
    std::string number = text.substr(0, text.size() - std::strlen(suffix));
    if (number.empty() || number.find_first_not_of("0123456789.") != std::string::npos ||
        std::count(number.begin(), number.end(), '.') > 1 || number.front() == '.' ||
        number.back() == '.') {
      break;
    }
    long double value = std::strtold(number.c_str(), nullptr) * scale;
    if (value < 1000.0L) {
      return absl::InvalidArgumentError(
          absl::StrCat("resource is unreasonably small (< 1kbit): ", text));
    }
    if (value > 1e15L) {
      return absl::InvalidArgumentError(
          absl::StrCat("resource is unreasonably large (> 1Pbit): ", text));
    }
    return static_cast<uint64_t>(value);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("quantities must match the regular expression "
                   "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': ",
                   text));
}

absl::StatusOr<json> RuntimeBandwidth(const RunningPod& pod) {
  json bw;
  for (auto [text, rate_key, burst_key] :
       {std::tuple{&pod.ingress_bandwidth, "ingressRate", "ingressBurst"},
        std::tuple{&pod.egress_bandwidth, "egressRate", "egressBurst"}}) {
    if (text->empty()) continue;
    auto rate = ParseBandwidthQuantity(*text);
    if (!rate.ok()) return rate.status();
    bw[rate_key] = *rate;
    bw[burst_key] = uint64_t{UINT32_MAX};
  }
  return bw;
}

absl::StatusOr<json> PluginConfFromConflist(const std::string& conflist_path) {
  std::ifstream in(conflist_path);
  if (!in) return absl::UnavailableError(absl::StrCat(conflist_path, " not installed yet"));
  json list = json::parse(in, nullptr, false);
  if (list.is_discarded() || !list.contains("plugins") || !list["plugins"].is_array() ||
      list["plugins"].empty()) {
    return absl::DataLossError(absl::StrCat(conflist_path, ": no plugins"));
  }
  json conf = list["plugins"][0];
  conf["cniVersion"] = list.value("cniVersion", "1.0.0");
  conf["name"] = list.value("name", "");
  return conf;
}

absl::StatusOr<std::string> PodIpFromCniResult(const std::string& result) {
  json r = json::parse(result, nullptr, false);
  if (r.is_discarded() || !r.contains("ips") || !r["ips"].is_array() || r["ips"].empty()) {
    return absl::DataLossError(absl::StrCat("CNI result without ips: ", result));
  }
  std::string address = r["ips"][0].value("address", "");
  return address.substr(0, address.find('/'));
}

Kubelet::Kubelet(ObjectStore* store, Topology topology, KubeletOptions options)
    : store_(store), topology_(std::move(topology)), options_(std::move(options)) {}

Kubelet::~Kubelet() { Stop(); }

absl::Status Kubelet::Start() {
  auto watch = store_->Watch(Resource("pods"), WatchOptions());
  if (!watch.ok()) return watch.status();
  watch_ = std::move(*watch);
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void Kubelet::Stop() {
  if (stopping_.exchange(true)) return;
  if (watch_) watch_->Interrupt();
  if (thread_.joinable()) thread_.join();
  std::map<std::string, RunningPod> pods;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pods.swap(pods_);
  }
  for (const auto& [key, pod] : pods) TearDown(pod);
  RetryDels(/*last_chance=*/true);
  watch_.reset();
}

std::vector<RunningPod> Kubelet::Pods() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<RunningPod> out;
  for (const auto& [k, p] : pods_) out.push_back(p);
  return out;
}

void Kubelet::Run() {
  while (!stopping_) {
    Event event;
    switch (watch_->Next(absl::Now() + absl::Seconds(1), &event)) {
      case WatchStream::Result::kEvent:
        Handle(event.type, *event.object);
        break;
      case WatchStream::Result::kTimeout:
        break;
      case WatchStream::Result::kInterrupted:
        if (stopping_) return;
        break;
      case WatchStream::Result::kExpired:
        Resync();
        break;
    }
    RetryFailed();
    RetryDels(/*last_chance=*/false);
    // Pod processes that died are reaped here (a zombie would look alive to `status`).
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, pod] : pods_) {
      for (pid_t& pid : pod.pids) {
        if (pid > 0) {
          if (auto code = ReapIfExited(pid)) {
            spdlog::warn("pod {}: process {} exited with {}", key, pid, *code);
            pid = -1;
          }
        }
      }
    }
  }
}

// After a lost watch: start over with a fresh one (synthetic ADDED for every pod) and tear down
// what is no longer there.
void Kubelet::Resync() {
  auto watch = store_->Watch(Resource("pods"), WatchOptions());
  if (!watch.ok()) {
    spdlog::error("kubelet: re-watch pods: {}", watch.status().ToString());
    return;
  }
  watch_ = std::move(*watch);
  auto list = store_->List(Resource("pods"), ListOptions());
  if (!list.ok()) return;
  std::set<std::string> present;
  for (const auto& p : list->items)
    present.insert(Key(*p) + "|" + JsonStr(*p, {"metadata", "uid"}));
  std::vector<RunningPod> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = pods_.begin(); it != pods_.end();) {
      if (!present.contains(it->first + "|" + it->second.uid)) {
        gone.push_back(it->second);
        it = pods_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& p : gone) TearDown(p);
  if (!gone.empty() && options_.on_change) options_.on_change();
}

void Kubelet::RetryFailed() {
  if (failed_.empty() || absl::Now() < next_retry_) return;
  next_retry_ = absl::Now() + options_.retry_interval;
  std::map<std::string, json> failed;
  failed.swap(failed_);
  for (const auto& [key, pod] : failed) {
    auto current = store_->Get(Resource("pods"), JsonStr(pod, {"metadata", "namespace"}),
                               JsonStr(pod, {"metadata", "name"}));
    if (current.ok()) Handle(EventType::kModified, *current);
  }
}

void Kubelet::Handle(EventType type, const json& pod) {
  // Pods of the Sluice image (the chart's DaemonSet and operator) are the workload runtime's.
  if (RunsSluiceImage(pod)) return;
  std::string key = Key(pod);
  std::string uid = JsonStr(pod, {"metadata", "uid"});
  if (type == EventType::kDeleted) {
    failed_.erase(key);
    std::optional<RunningPod> running;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = pods_.find(key);
      if (it != pods_.end() && it->second.uid == uid) {
        running = it->second;
        pods_.erase(it);
      }
    }
    if (running) {
      TearDown(*running);
      if (options_.on_change) options_.on_change();
    }
    return;
  }
  std::string node_name = JsonStr(pod, {"spec", "nodeName"});
  std::string phase = JsonStr(pod, {"status", "phase"});
  if (node_name.empty()) {
    if (!Terminating(pod) && phase != "Succeeded" && phase != "Failed") Schedule(pod);
    return;
  }
  const LabNode* node = topology_.FindNode(node_name);
  if (node == nullptr) {
    spdlog::warn("pod {}: node {} is not a node of lab {}", key, node_name, topology_.lab);
    return;
  }
  std::optional<RunningPod> running;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = pods_.find(key); it != pods_.end()) running = it->second;
  }
  if (running && running->uid != uid) {  // replaced under the same name
    {
      std::lock_guard<std::mutex> lock(mu_);
      pods_.erase(key);
    }
    TearDown(*running);
    running.reset();
  }
  if (running) {
    // Readiness follows the annotation while the pod runs; terminating pods keep serving.
    bool ready = WantsReady(pod);
    bool reported = false;
    if (const auto* conds = &pod["status"]["conditions"]; conds->is_array()) {
      for (const auto& c : *conds) {
        if (c.value("type", "") == "Ready") reported = c.value("status", "") == "True";
      }
    }
    if (ready != reported || JsonStr(pod, {"status", "podIP"}) != running->ip) {
      running->ready = ready;
      {
        std::lock_guard<std::mutex> lock(mu_);
        pods_[key].ready = ready;
      }
      if (auto st = WriteStatus(*running, pod); !st.ok()) {
        spdlog::warn("pod {}: status: {}", key, st.ToString());
      }
    }
    return;
  }
  if (Terminating(pod) || phase == "Succeeded" || phase == "Failed") return;
  if (auto it = failed_.find(key);
      it != failed_.end() && it->second["metadata"].value("uid", "") == uid) {
    it->second = pod;  // retried by RetryFailed (this is often our own Pending status write)
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (bound_[node_name] > 0) --bound_[node_name];
  }
  if (auto st = StartPod(pod, *node); !st.ok()) {
    spdlog::warn("pod {} on {}: {} (retrying)", key, node_name, st.ToString());
    failed_[key] = pod;
    WritePendingStatus(pod);
  } else if (options_.on_change) {
    options_.on_change();
  }
}

void Kubelet::Schedule(const json& pod) {
  std::map<std::string, int> load;
  for (const auto& n : topology_.nodes) load[n.name] = 0;
  if (auto list = store_->List(Resource("pods"), ListOptions()); list.ok()) {
    for (const auto& p : list->items) {
      std::string n = JsonStr(*p, {"spec", "nodeName"});
      if (load.contains(n)) ++load[n];
    }
  }
  std::string best;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& n : topology_.nodes) {  // ties go to the lowest node number
      if (best.empty() || load[n.name] < load[best]) best = n.name;
    }
  }
  auto st = store_->Update(Resource("pods"), JsonStr(pod, {"metadata", "namespace"}),
                           JsonStr(pod, {"metadata", "name"}), [&](json& p) {
                             if (!JsonStr(p, {"spec", "nodeName"}).empty()) return absl::OkStatus();
                             p["spec"]["nodeName"] = best;
                             return absl::OkStatus();
                           });
  if (!st.ok()) {
    spdlog::warn("schedule pod {}: {}", Key(pod), st.status().ToString());
  } else {
    spdlog::info("scheduled pod {} on {}", Key(pod), best);
    if (JsonStr(pod, {"spec", "nodeName"}).empty()) {
      (void)events_.Record(*st, "Normal", "Scheduled",
                           absl::StrCat("Successfully assigned ", Key(pod), " to ", best),
                           {.component = "default-scheduler"});
    }
  }
}

absl::StatusOr<std::string> Kubelet::Cni(const std::string& command, const RunningPod& pod,
                                         const LabNode& node) {
  auto conf = PluginConfFromConflist(node.cni_conf_dir() + "/05-sluice.conflist");
  if (!conf.ok()) return conf.status();
  std::string type = conf->value("type", "sluice");
  ProcessSpec spec;
  spec.argv = {node.cni_bin_dir() + "/" + type};
  std::string cni_path = node.cni_bin_dir();
  if (std::filesystem::exists(NodeViewSpecPath(node))) {
    // Sluice installed from the chart: the conflist names the node's host paths (the agent's
    // socket under /run/sluice), so the plugin runs where they exist, as on a real node.
    cni_path = "/opt/cni/bin";
    spec.argv = {options_.netexec_binary, "container", "--spec",
                 NodeViewSpecPath(node),  "--",        cni_path + "/" + type};
  }
  spec.env = std::vector<std::string>{
      "CNI_COMMAND=" + command,
      "CNI_CONTAINERID=" + pod.uid,
      "CNI_NETNS=" + topology_.netns_path(pod.netns),
      "CNI_IFNAME=eth0",
      "CNI_PATH=" + cni_path,
      absl::StrCat("CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=", pod.namespace_name,
                   ";K8S_POD_NAME=", pod.name, ";K8S_POD_UID=", pod.uid),
      "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"};
  // A plugin that declares the capability gets the pod's bandwidth annotations (libcni's
  // runtimeConfig, as containerd fills it).
  if (conf->contains("capabilities") && (*conf)["capabilities"].is_object() &&
      (*conf)["capabilities"].value("bandwidth", false)) {
    auto bw = RuntimeBandwidth(pod);
    if (!bw.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "failed to ", command == "ADD" ? "setup" : "destroy", " network for sandbox \"", pod.uid,
          "\": failed to get bandwidth info from annotations: ", bw.status().message()));
    }
    if (!bw->is_null()) (*conf)["runtimeConfig"]["bandwidth"] = *bw;
  }
  spec.stdin_data = conf->dump();
  auto r = RunProcess(spec, absl::Seconds(60));
  if (!r.ok()) return r.status();
  if (r->exit_code != 0) {
    spdlog::warn("pod {}/{}: CNI {} exit {}: {}{}", pod.namespace_name, pod.name, command,
                 r->exit_code, r->out, r->err);
    // The runtime's words (containerd's), so the pod's Event reads as on a real node.
    return absl::InternalError(absl::StrCat(
        "failed to ", command == "ADD" ? "setup" : "destroy", " network for sandbox \"", pod.uid,
        "\": plugin type=\"", type, "\" name=\"", conf->value("name", ""), "\" failed (",
        command == "ADD" ? "add" : "delete", "): ", CniErrorText(r->out, r->err)));
  }
  return r->out;
}

std::string CniErrorText(const std::string& out, const std::string& err) {
  json e = json::parse(out, nullptr, false);
  if (e.is_object() && e.contains("msg") && e["msg"].is_string()) {
    std::string text = e["msg"];
    if (e.contains("details") && e["details"].is_string() && !e["details"].empty()) {
      absl::StrAppend(&text, "; ", e["details"].get<std::string>());
    }
    return text;
  }
  std::string text = absl::StrCat(out, err);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text.empty() ? "no output" : text;
}

absl::Status Kubelet::StartPod(const json& spec_pod, const LabNode& node) {
  RunningPod pod;
  pod.namespace_name = JsonStr(spec_pod, {"metadata", "namespace"});
  pod.name = JsonStr(spec_pod, {"metadata", "name"});
  pod.uid = JsonStr(spec_pod, {"metadata", "uid"});
  pod.node = node.name;
  pod.host_network = HostNetwork(spec_pod);
  pod.netns = pod.host_network ? node.netns : topology_.PodNetns(pod.namespace_name, pod.name);
  pod.ready = WantsReady(spec_pod);
  pod.ingress_bandwidth =
      JsonStr(spec_pod, {"metadata", "annotations", "kubernetes.io/ingress-bandwidth"});
  pod.egress_bandwidth =
      JsonStr(spec_pod, {"metadata", "annotations", "kubernetes.io/egress-bandwidth"});
  std::string key = absl::StrCat(pod.namespace_name, "/", pod.name);
  const EventSource kubelet{.component = "kubelet", .host = node.name};
  if (!std::filesystem::exists(node.cni_conf_dir() + "/05-sluice.conflist")) {
    (void)events_.Record(spec_pod, "Warning", "NetworkNotReady",
                         "network is not ready: container runtime network not ready: "
                         "NetworkReady=false reason:NetworkPluginNotReady message:Network "
                         "plugin returns error: cni plugin not initialized",
                         kubelet);
    return absl::UnavailableError(absl::StrCat("the agent of ", node.name, " is not ready"));
  }
  auto undo = [&](absl::Status st) {
    for (pid_t pid : pod.pids) StopProcess(pid, absl::Seconds(1));
    ReleaseSandbox(pod, node);
    return st;
  };
  auto failed = [&](absl::Status st) {
    (void)events_.Record(spec_pod, "Warning", "Failed", absl::StrCat("Error: ", st.message()),
                         kubelet);
    return undo(st);
  };
  if (pod.host_network) {
    // The node's namespace and address; the network plugin is not involved.
    pod.ip = node.ip;
  } else {
    if (auto st = CreatePodNetns(topology_, pod.netns); !st.ok()) return st;
    auto result = Cni("ADD", pod, node);
    if (!result.ok()) {
      (void)events_.Record(
          spec_pod, "Warning", "FailedCreatePodSandBox",
          absl::StrCat("Failed to create pod sandbox: ", result.status().message()), kubelet);
      return undo(result.status());
    }
    auto ip = PodIpFromCniResult(*result);
    if (!ip.ok()) return failed(ip.status());
    pod.ip = *ip;
  }

  std::string log_dir = topology_.dir + "/logs";
  std::filesystem::create_directories(log_dir);
  std::string log = absl::StrCat(log_dir, "/", pod.namespace_name, "_", pod.name, ".log");
  std::filesystem::remove(log);  // a new pod of the same name starts a new log
  std::string netns_path = topology_.netns_path(pod.netns);
  std::map<int, std::set<std::string>> ports;  // containerPort -> protocols
  const json& containers = spec_pod["spec"].value("containers", json::array());
  for (const auto& c : containers) {
    for (const auto& p : c.value("ports", json::array())) {
      if (p.contains("containerPort") && p["containerPort"].is_number_integer()) {
        ports[p["containerPort"].get<int>()].insert(p.value("protocol", "TCP"));
      }
    }
  }
  // The pod's IP and Ready condition are reported once every server has bound its ports, so no
  // Service sends a connection to a port nobody listens on yet.
  std::string notify_dir = topology_.dir + "/notify";
  std::filesystem::create_directories(notify_dir);
  auto notify = NotifySocket::Bind(absl::StrCat(notify_dir, "/", pod.uid));
  if (!notify.ok()) return failed(notify.status());
  std::vector<std::string> netexec_env = EnvWithNotifySocket((*notify)->path());
  std::map<pid_t, int> starting;  // netexec pid -> port
  for (const auto& [port, protocols] : ports) {
    std::vector<std::string> argv = {options_.netexec_binary, "netexec", "--port",
                                     std::to_string(port),    "--name",  pod.name};
    if (protocols.contains("TCP")) argv.push_back("--tcp");
    if (protocols.contains("UDP")) argv.push_back("--udp");
    if (!protocols.contains("TCP") && !protocols.contains("UDP")) continue;  // SCTP
    auto pid =
        StartProcess({.argv = argv, .env = netexec_env, .netns_path = netns_path, .log_path = log});
    if (!pid.ok()) return failed(pid.status());
    pod.pids.push_back(*pid);
    starting[*pid] = port;
  }
  if (auto st = (*notify)->AwaitReady(starting, pod.pids, absl::Now() + kServingTimeout);
      !st.ok()) {
    return failed(absl::Status(st.code(), absl::StrCat(st.message(), " (see ", log, ")")));
  }
  notify->reset();
  for (const auto& c : containers) {
    std::vector<std::string> argv;
    for (const char* field : {"command", "args"}) {
      for (const auto& a : c.value(field, json::array())) {
        if (a.is_string()) argv.push_back(a.get<std::string>());
      }
    }
    if (argv.empty() || !c.contains("command")) continue;
    auto pid = StartProcess({.argv = argv, .netns_path = netns_path, .log_path = log});
    if (!pid.ok()) return failed(pid.status());
    pod.pids.push_back(*pid);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    pods_[key] = pod;
  }
  spdlog::info("pod {} running on {} at {}", key, node.name, pod.ip);
  for (const auto& c : containers) {
    std::string name = c.value("name", "");
    (void)events_.Record(spec_pod, "Normal", "Started", absl::StrCat("Started container ", name),
                         kubelet, absl::StrCat("spec.containers{", name, "}"));
  }
  if (auto st = WriteStatus(pod, spec_pod); !st.ok()) {
    spdlog::warn("pod {}: status: {}", key, st.ToString());
  }
  return absl::OkStatus();
}

absl::Status Kubelet::WriteStatus(const RunningPod& pod, const json& spec_pod) {
  const LabNode* node = topology_.FindNode(pod.node);
  std::string host_ip = node ? node->ip : "";
  std::string ready = pod.ready ? "True" : "False";
  auto result = store_->Update(
      Resource("pods"), pod.namespace_name, pod.name,
      [&](json& p) {
        if (JsonStr(p, {"metadata", "uid"}) != pod.uid) return absl::NotFoundError("pod replaced");
        json& s = p["status"];
        std::string now = Now();
        std::string started = s.value("startTime", now);
        s["phase"] = "Running";
        s["podIP"] = pod.ip;
        s["podIPs"] = json::array({{{"ip", pod.ip}}});
        s["hostIP"] = host_ip;
        s["hostIPs"] = json::array({{{"ip", host_ip}}});
        s["startTime"] = started;
        s["conditions"] = PodConditions(s,
                                        {{"Initialized", "True"},
                                         {"Ready", ready},
                                         {"ContainersReady", ready},
                                         {"PodScheduled", "True"}},
                                        now);
        s["containerStatuses"] =
            ContainerStatuses(spec_pod, {{"running", {{"startedAt", started}}}}, pod.ready,
                              /*started=*/true, pod.uid);
        return absl::OkStatus();
      },
      ObjectStore::Subresource::kStatus);
  return result.status();
}

void Kubelet::WritePendingStatus(const json& spec_pod) {
  const std::string uid = JsonStr(spec_pod, {"metadata", "uid"});
  const LabNode* node = topology_.FindNode(JsonStr(spec_pod, {"spec", "nodeName"}));
  auto result = store_->Update(
      Resource("pods"), JsonStr(spec_pod, {"metadata", "namespace"}),
      JsonStr(spec_pod, {"metadata", "name"}),
      [&](json& p) {
        if (JsonStr(p, {"metadata", "uid"}) != uid) return absl::NotFoundError("pod replaced");
        json& s = p["status"];
        if (s.value("phase", "") == "Running") return absl::OkStatus();  // started meanwhile
        s["phase"] = "Pending";
        if (node != nullptr) {
          s["hostIP"] = node->ip;
          s["hostIPs"] = json::array({{{"ip", node->ip}}});
        }
        if (!s.contains("startTime")) s["startTime"] = Now();
        s["conditions"] = PodConditions(s,
                                        {{"PodReadyToStartContainers", "False"},
                                         {"Initialized", "True"},
                                         {"Ready", "False"},
                                         {"ContainersReady", "False"},
                                         {"PodScheduled", "True"}},
                                        Now());
        s["containerStatuses"] =
            ContainerStatuses(spec_pod, {{"waiting", {{"reason", "ContainerCreating"}}}},
                              /*ready=*/false, /*started=*/false, uid);
        return absl::OkStatus();
      },
      ObjectStore::Subresource::kStatus);
  if (!result.ok() && result.status().code() != absl::StatusCode::kNotFound) {
    spdlog::warn("pod {}: pending status: {}", Key(spec_pod), result.status().ToString());
  }
}

void Kubelet::TearDown(const RunningPod& pod) {
  std::string key = absl::StrCat(pod.namespace_name, "/", pod.name);
  for (pid_t pid : pod.pids) {
    if (pid > 0) StopProcess(pid, absl::Seconds(2));
  }
  const LabNode* node = topology_.FindNode(pod.node);
  if (node != nullptr) {
    ReleaseSandbox(pod, *node);
  } else if (auto st = DeletePodNetns(topology_, pod.netns); !st.ok()) {
    spdlog::warn("pod {}: {}", key, st.ToString());
  }
  spdlog::info("pod {} torn down", key);
}

void Kubelet::ReleaseSandbox(const RunningPod& pod, const LabNode& node) {
  const std::string key = absl::StrCat(pod.namespace_name, "/", pod.name);
  if (pod.host_network) return;  // no sandbox: the node's namespace stays
  if (auto r = Cni("DEL", pod, node); !r.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (del_retries_.Failed(pod.uid, absl::Now())) {
      spdlog::warn("pod {}: CNI DEL: {}; will retry", key, r.status().ToString());
      del_pending_[pod.uid] = pod;
      return;  // the sandbox stays until DEL succeeds
    }
    spdlog::error("pod {}: CNI DEL still failing after {} attempts; giving up: {}", key,
                  del_retries_.attempts(pod.uid), r.status().ToString());
    del_retries_.Done(pod.uid);
    del_pending_.erase(pod.uid);
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    if (del_pending_.erase(pod.uid) > 0) {
      spdlog::info("pod {}: CNI DEL succeeded after {} failed attempts", key,
                   del_retries_.attempts(pod.uid));
    }
    del_retries_.Done(pod.uid);
  }
  if (auto st = DeletePodNetns(topology_, pod.netns); !st.ok()) {
    spdlog::warn("pod {}: {}", key, st.ToString());
  }
}

void Kubelet::RetryDels(bool last_chance) {
  std::vector<RunningPod> due;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (del_pending_.empty()) return;
    std::vector<std::string> keys =
        last_chance ? std::vector<std::string>{} : del_retries_.Due(absl::Now());
    if (last_chance) {
      for (const auto& [uid, pod] : del_pending_) keys.push_back(uid);
    }
    for (const std::string& uid : keys) {
      auto it = del_pending_.find(uid);
      if (it != del_pending_.end()) due.push_back(it->second);
    }
  }
  for (const RunningPod& pod : due) {
    const LabNode* node = topology_.FindNode(pod.node);
    if (node == nullptr || !std::filesystem::exists(topology_.netns_path(pod.netns))) {
      // The sandbox is gone: nothing left to release.
      std::lock_guard<std::mutex> lock(mu_);
      del_pending_.erase(pod.uid);
      del_retries_.Done(pod.uid);
      continue;
    }
    ReleaseSandbox(pod, *node);
  }
  if (last_chance) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [uid, pod] : del_pending_) {
      spdlog::error("pod {}/{}: CNI DEL never succeeded; its sandbox {} is left",
                    pod.namespace_name, pod.name, pod.netns);
    }
  }
}

size_t Kubelet::PendingDels() const {
  std::lock_guard<std::mutex> lock(mu_);
  return del_pending_.size();
}

bool CniDelRetries::Failed(const std::string& key, absl::Time now) {
  auto [it, inserted] = entries_.try_emplace(key);
  Entry& e = it->second;
  if (inserted) {
    e.first_failure = now;
    e.delay = initial_;
  } else {
    e.delay = std::min(e.delay * 2, cap_);
  }
  ++e.attempts;
  e.next = now + e.delay;
  return now - e.first_failure < give_up_;
}

std::vector<std::string> CniDelRetries::Due(absl::Time now) const {
  std::vector<std::string> out;
  for (const auto& [key, e] : entries_) {
    if (e.next <= now) out.push_back(key);
  }
  return out;
}

int CniDelRetries::attempts(const std::string& key) const {
  auto it = entries_.find(key);
  return it == entries_.end() ? 0 : it->second.attempts;
}

}  // namespace sluice::lab
