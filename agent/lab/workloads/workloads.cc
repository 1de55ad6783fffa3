#include "agent/lab/workloads/workloads.h"

#include <grp.h>
#include <linux/capability.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agent/base/errno.h"
#include "agent/base/files.h"
#include "agent/lab/network/probe.h"
#include "agent/lab/store/json_path.h"
#include "agent/lab/tools/process.h"
#include "agent/lab/workloads/supervisor.h"
#include "httplib.h"
#include "spdlog/spdlog.h"

namespace sluice::lab {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The image's default PATH (debian:bookworm-slim).
constexpr char kImagePath[] = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
constexpr char kServiceAccountDir[] = "/var/run/secrets/kubernetes.io/serviceaccount";

// The status of an init container that ran to completion, or that the lab skipped (message).
json CompletedInitStatus(const std::string& name, const json& container,
                         const std::string& message = "") {
  json terminated = {{"exitCode", 0}, {"reason", "Completed"}};
  if (!message.empty()) terminated["message"] = message;
  return {{"name", name},      {"ready", true},
          {"restartCount", 0}, {"image", container.value("image", "")},
          {"imageID", ""},     {"state", {{"terminated", terminated}}}};
}

std::string PodKey(const json& pod) {
  return absl::StrCat(JsonStr(pod, {"metadata", "namespace"}), "/",
                      JsonStr(pod, {"metadata", "name"}));
}

bool Terminating(const json& pod) {
  return !JsonStr(pod, {"metadata", "deletionTimestamp"}).empty();
}

bool PodReady(const json& pod) {
  const json& conds = JsonAt(pod, {"status", "conditions"});
  if (!conds.is_array()) return false;
  for (const auto& c : conds) {
    if (c.value("type", "") == "Ready") return c.value("status", "") == "True";
  }
  return false;
}

absl::Status WriteFile(const std::string& path, const std::string& content, mode_t mode = 0644) {
  std::error_code ec;
  const fs::path p(path);
  fs::create_directories(p.parent_path(), ec);
  // The lab's files live under /run (or a container's overlay): no fsync.
  return agent::WriteFileAtomically(p.parent_path().string(), p.filename().string(), content, mode,
                                    agent::Durability::kProcessCrash);
}

// The cgroup2 mount of the machine (where the chart's mount-cgroup container would mount one).
std::string Cgroup2Mount() {
  std::ifstream in("/proc/self/mounts");
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    if (f.size() > 2 && f[2] == "cgroup2") return f[1];
  }
  return "/sys/fs/cgroup";
}

// A short, stable hash of a pod template (the role of controller-revision-hash and
// pod-template-hash).
std::string TemplateHash(const json& tmpl) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (unsigned char c : tmpl.dump()) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return absl::StrFormat("%010x", h & 0xffffffffffULL);
}

std::string RandomSuffix() {
  static constexpr char kAlphabet[] = "bcdfghjklmnpqrstvwxz2456789";
  static uint64_t state = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())) ^ getpid();
  std::string s;
  for (int i = 0; i < 5; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    s.push_back(kAlphabet[(state >> 33) % 27]);
  }
  return s;
}

// maxUnavailable: an integer or "N%" of `total` (rounded up, at least 1 as the controllers do
// for a non-zero percentage).
int ScaledValue(const json& v, int total, int def) {
  if (v.is_number_integer()) return v.get<int>();
  if (v.is_string()) {
    std::string s = v.get<std::string>();
    int n = 0;
    if (absl::EndsWith(s, "%") && absl::SimpleAtoi(s.substr(0, s.size() - 1), &n)) {
      return (n * total + 99) / 100;
    }
    if (absl::SimpleAtoi(s, &n)) return n;
  }
  return def;
}

bool NodeSelected(const json& node, const json& pod_spec) {
  const json& sel = JsonAt(pod_spec, {"nodeSelector"});
  if (!sel.is_object()) return true;
  for (const auto& [k, v] : sel.items()) {
    if (!v.is_string() ||
        JsonStr(node, {"metadata", "labels", k.c_str()}) != v.get<std::string>()) {
      return false;
    }
  }
  return true;
}

bool OwnedBy(const json& pod, const std::string& uid) {
  const json& refs = JsonAt(pod, {"metadata", "ownerReferences"});
  if (!refs.is_array()) return false;
  for (const auto& r : refs) {
    if (r.value("uid", "") == uid) return true;
  }
  return false;
}

std::string Cap(std::string name) {
  name = absl::AsciiStrToUpper(name);
  if (absl::StartsWith(name, "CAP_")) name = name.substr(4);
  return name;
}

const std::map<std::string, int>& CapNumbers() {
  static const auto* kCaps = new std::map<std::string, int>{
      {"CHOWN", CAP_CHOWN},
      {"DAC_OVERRIDE", CAP_DAC_OVERRIDE},
      {"DAC_READ_SEARCH", CAP_DAC_READ_SEARCH},
      {"FOWNER", CAP_FOWNER},
      {"FSETID", CAP_FSETID},
      {"KILL", CAP_KILL},
      {"SETGID", CAP_SETGID},
      {"SETUID", CAP_SETUID},
      {"SETPCAP", CAP_SETPCAP},
      {"LINUX_IMMUTABLE", CAP_LINUX_IMMUTABLE},
      {"NET_BIND_SERVICE", CAP_NET_BIND_SERVICE},
      {"NET_BROADCAST", CAP_NET_BROADCAST},
      {"NET_ADMIN", CAP_NET_ADMIN},
      {"NET_RAW", CAP_NET_RAW},
      {"IPC_LOCK", CAP_IPC_LOCK},
      {"IPC_OWNER", CAP_IPC_OWNER},
      {"SYS_MODULE", CAP_SYS_MODULE},
      {"SYS_RAWIO", CAP_SYS_RAWIO},
      {"SYS_CHROOT", CAP_SYS_CHROOT},
      {"SYS_PTRACE", CAP_SYS_PTRACE},
      {"SYS_PACCT", CAP_SYS_PACCT},
      {"SYS_ADMIN", CAP_SYS_ADMIN},
      {"SYS_BOOT", CAP_SYS_BOOT},
      {"SYS_NICE", CAP_SYS_NICE},
      {"SYS_RESOURCE", CAP_SYS_RESOURCE},
      {"SYS_TIME", CAP_SYS_TIME},
      {"SYS_TTY_CONFIG", CAP_SYS_TTY_CONFIG},
      {"MKNOD", CAP_MKNOD},
      {"LEASE", CAP_LEASE},
      {"AUDIT_WRITE", CAP_AUDIT_WRITE},
      {"AUDIT_CONTROL", CAP_AUDIT_CONTROL},
      {"SETFCAP", CAP_SETFCAP},
      {"MAC_OVERRIDE", CAP_MAC_OVERRIDE},
      {"MAC_ADMIN", CAP_MAC_ADMIN},
      {"SYSLOG", CAP_SYSLOG},
      {"WAKE_ALARM", CAP_WAKE_ALARM},
      {"BLOCK_SUSPEND", CAP_BLOCK_SUSPEND},
      {"AUDIT_READ", CAP_AUDIT_READ},
      {"PERFMON", 38},
      {"BPF", 39},
      {"CHECKPOINT_RESTORE", 40},
  };
  return *kCaps;
}

// The container runtime's default capability set (containerd's and Docker's), which a
// securityContext adds to and drops from.
const std::vector<std::string>& DefaultCaps() {
  static const auto* kDefault =
      new std::vector<std::string>{"CHOWN",   "DAC_OVERRIDE", "FSETID",           "FOWNER",
                                   "MKNOD",   "NET_RAW",      "SETGID",           "SETUID",
                                   "SETFCAP", "SETPCAP",      "NET_BIND_SERVICE", "SYS_CHROOT",
                                   "KILL",    "AUDIT_WRITE"};
  return *kDefault;
}

absl::Status MkdirP(const std::string& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec && !fs::is_directory(path)) {
    return absl::InternalError(absl::StrCat("mkdir ", path, ": ", ec.message()));
  }
  return absl::OkStatus();
}

absl::Status BindMount(const std::string& source, const std::string& target, bool read_only) {
  struct stat st = {};
  if (stat(source.c_str(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", source));
  if (S_ISDIR(st.st_mode)) {
    if (auto s = MkdirP(target); !s.ok()) return s;
  } else {
    if (auto s = MkdirP(fs::path(target).parent_path().string()); !s.ok()) return s;
    if (!fs::exists(target)) std::ofstream(target).close();
  }
  if (mount(source.c_str(), target.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) {
    return ErrnoStatus(errno, absl::StrCat("bind ", source, " on ", target));
  }
  if (read_only && mount(nullptr, target.c_str(), nullptr,
                         MS_BIND | MS_REMOUNT | MS_RDONLY | MS_REC, nullptr) != 0) {
    return ErrnoStatus(errno, absl::StrCat("remount ", target, " read-only"));
  }
  return absl::OkStatus();
}

absl::Status BuildRoot(const ContainerSpec& spec, std::string* root_out) {
  if (unshare(CLONE_NEWNS) != 0) return ErrnoStatus(errno, "unshare(CLONE_NEWNS)");
  // rslave: the host's mounts keep arriving (a new pod's /run/netns entry), ours stay here.
  if (mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0) {
    return ErrnoStatus(errno, "make / rslave");
  }
  std::string upper = spec.scratch_dir + "/upper", work = spec.scratch_dir + "/work",
              root = spec.scratch_dir + "/root";
  // A fresh upper layer per start: the container's writes do not survive it, as with an image.
  std::error_code ec;
  fs::remove_all(upper, ec);
  fs::remove_all(work, ec);
  for (const auto& d : {upper, work, root}) {
    if (auto s = MkdirP(d); !s.ok()) return s;
  }
  // The image's filesystem stands in as the machine's / (the same Debian libraries the image
  // installs), read-only below a private upper layer; overlayfs does not descend into the
  // mounts under /, so /proc, /sys, /run ... are mounted afresh below.
  std::string opts = absl::StrCat("lowerdir=/,upperdir=", upper, ",workdir=", work);
  if (mount("overlay", root.c_str(), "overlay", 0, opts.c_str()) != 0) {
    return ErrnoStatus(errno, absl::StrCat("mount overlay on ", root));
  }
  struct Fresh {
    const char* target;
    const char* type;
  };
  for (const Fresh& f : {Fresh{"/proc", "proc"}, Fresh{"/sys", "sysfs"}, Fresh{"/run", "tmpfs"},
                         Fresh{"/tmp", "tmpfs"}}) {
    auto in_root = ResolveInRoot(root, f.target);
    if (!in_root.ok()) return in_root.status();
    std::string t = *in_root;
    if (auto s = MkdirP(t); !s.ok()) return s;
    if (mount(f.type, t.c_str(), f.type, 0, nullptr) != 0) {
      return ErrnoStatus(errno, absl::StrCat("mount ", f.type, " on ", t));
    }
  }
  for (const char* host : {"/dev", "/run/netns"}) {
    if (!fs::is_directory(host)) continue;
    auto t = ResolveInRoot(root, host);
    if (!t.ok()) return t.status();
    if (auto s = BindMount(host, *t, false); !s.ok()) return s;
  }
  // Parents before children, as runtimes order mounts: /run/sluice must not hide
  // /run/sluice/cgroupv2 mounted before it.
  std::vector<ContainerMount> mounts = spec.mounts;
  std::stable_sort(mounts.begin(), mounts.end(), [](const auto& a, const auto& b) {
    return std::count(a.target.begin(), a.target.end(), '/') <
           std::count(b.target.begin(), b.target.end(), '/');
  });
  for (const ContainerMount& m : mounts) {
    auto in_root = ResolveInRoot(root, m.target);
    if (!in_root.ok()) return in_root.status();
    std::string target = *in_root;
    if (m.kind == "proc") {
      if (auto s = MkdirP(target); !s.ok()) return s;
      if (mount("proc", target.c_str(), "proc", m.read_only ? MS_RDONLY : 0, nullptr) != 0) {
        return ErrnoStatus(errno, absl::StrCat("mount proc on ", target));
      }
      continue;
    }
    if (auto s = BindMount(m.source, target, m.read_only); !s.ok()) return s;
  }
  *root_out = root;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ResolveInRoot(const std::string& root, const std::string& path) {
  std::vector<std::string> todo = absl::StrSplit(path, '/', absl::SkipEmpty());
  std::reverse(todo.begin(), todo.end());
  std::vector<std::string> done;
  int links = 0;
  while (!todo.empty()) {
    std::string part = todo.back();
    todo.pop_back();
    if (part == ".") continue;
    if (part == "..") {
      if (!done.empty()) done.pop_back();
      continue;
    }
    std::string candidate =
        root + "/" + absl::StrJoin(done, "/") + (done.empty() ? "" : "/") + part;
    struct stat st = {};
    if (lstat(candidate.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      if (++links > 40) return absl::InvalidArgumentError(absl::StrCat(path, ": symlink loop"));
      char buf[4096];
      ssize_t n = readlink(candidate.c_str(), buf, sizeof(buf) - 1);
      if (n < 0) return ErrnoStatus(errno, absl::StrCat("readlink ", candidate));
      std::string target(buf, n);
      if (absl::StartsWith(target, "/")) done.clear();
      std::vector<std::string> parts = absl::StrSplit(target, '/', absl::SkipEmpty());
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) todo.push_back(*it);
      continue;
    }
    done.push_back(part);
  }
  return root + "/" + absl::StrJoin(done, "/");
}

bool IsSluiceImage(const std::string& image) {
  std::string name = image.substr(0, image.find('@'));
  size_t slash = name.rfind('/');
  size_t colon = name.rfind(':');
  if (colon != std::string::npos && (slash == std::string::npos || colon > slash)) {
    name = name.substr(0, colon);
  }
  std::string last = slash == std::string::npos ? name : name.substr(slash + 1);
  return last == "sluice-agent";
}

bool RunsSluiceImage(const json& pod) {
  for (const char* list : {"containers", "initContainers"}) {
    const json& cs = JsonAt(pod, {"spec", list});
    if (!cs.is_array()) continue;
    for (const auto& c : cs) {
      if (IsSluiceImage(c.value("image", ""))) return true;
    }
  }
  return false;
}

std::vector<HostPathEntry> HostPathTable(const LabNode& node) {
  return {
      {"/proc", "proc", ""},
      {"/sys/fs/bpf", "bind", node.bpffs()},
      {"/run/sluice/cgroupv2", "bind", Cgroup2Mount()},
      {"/run/sluice", "bind", node.dir + "/run"},
      {"/var/lib/sluice", "bind", node.state_dir()},
      {"/opt/cni/bin", "bind", node.cni_bin_dir()},
      {"/etc/cni/net.d", "bind", node.cni_conf_dir()},
  };
}

absl::StatusOr<HostPathEntry> MapHostPath(const LabNode& node, const std::string& host_path) {
  std::string p = host_path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  std::optional<HostPathEntry> best;
  for (const HostPathEntry& e : HostPathTable(node)) {
    if ((p == e.host_path || absl::StartsWith(p, e.host_path + "/")) &&
        (!best || e.host_path.size() > best->host_path.size())) {
      best = e;
    }
  }
  if (!best) {
    return absl::NotFoundError(absl::StrCat("hostPath ", host_path,
                                            ": the lab has no stand-in for this host path "
                                            "(docs/lab.md lists the ones it maps)"));
  }
  HostPathEntry e = *best;
  if (p != e.host_path) {
    if (e.kind != "bind") {
      return absl::NotFoundError(absl::StrCat("hostPath ", host_path, ": below ", e.host_path,
                                              ", which the lab maps only as a whole"));
    }
    e.lab_path += p.substr(e.host_path.size());
    e.host_path = p;
  }
  return e;
}

json ContainerSpecToJson(const ContainerSpec& s) {
  json mounts = json::array();
  for (const auto& m : s.mounts) {
    mounts.push_back(
        {{"source", m.source}, {"target", m.target}, {"kind", m.kind}, {"readOnly", m.read_only}});
  }
  return {{"scratchDir", s.scratch_dir},     {"mounts", mounts}, {"argv", s.argv}, {"env", s.env},
          {"restrictCaps", s.restrict_caps}, {"caps", s.caps},   {"uid", s.uid},   {"gid", s.gid}};
}

absl::StatusOr<ContainerSpec> ContainerSpecFromJson(const json& j) {
  try {
    ContainerSpec s;
    s.scratch_dir = j.at("scratchDir").get<std::string>();
    for (const auto& m : j.at("mounts")) {
      s.mounts.push_back({m.at("source").get<std::string>(), m.at("target").get<std::string>(),
                          m.at("kind").get<std::string>(), m.at("readOnly").get<bool>()});
    }
    s.argv = j.at("argv").get<std::vector<std::string>>();
    s.env = j.at("env").get<std::vector<std::string>>();
    s.restrict_caps = j.at("restrictCaps").get<bool>();
    s.caps = j.at("caps").get<std::vector<std::string>>();
    s.uid = j.at("uid").get<int>();
    s.gid = j.at("gid").get<int>();
    if (s.scratch_dir.empty()) return absl::InvalidArgumentError("container spec: no scratchDir");
    return s;
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("container spec: ", e.what()));
  }
}

namespace {

// What `sluice-lab container` says before it exits with `exit_code`: 125 when the runtime
// itself failed, 127 when the command could not be run (podman's and docker's codes).
int ContainerFailed(const absl::Status& status, int exit_code) {
  fprintf(stderr, "sluice-lab container: %s\n", std::string(status.message()).c_str());
  return exit_code;
}

}  // namespace

int RunContainer(const std::string& spec_path, const std::vector<std::string>& argv_override) {
  std::ifstream in(spec_path);
  json j = json::parse(in, nullptr, false);
  auto spec = j.is_discarded() ? absl::InvalidArgumentError(absl::StrCat(spec_path, ": not JSON"))
                               : ContainerSpecFromJson(j);
  if (!spec.ok()) return ContainerFailed(spec.status(), 125);
  std::vector<std::string> argv = argv_override.empty() ? spec->argv : argv_override;
  if (argv.empty()) return ContainerFailed(absl::InvalidArgumentError("no command"), 125);
  std::string root;
  if (auto st = BuildRoot(*spec, &root); !st.ok()) return ContainerFailed(st, 125);
  if (chroot(root.c_str()) != 0 || chdir("/") != 0) {
    return ContainerFailed(ErrnoStatus(errno, absl::StrCat("chroot ", root)), 125);
  }
  if (spec->restrict_caps) {
    std::set<int> keep;
    for (const auto& c : spec->caps) {
      auto it = CapNumbers().find(Cap(c));
      if (it != CapNumbers().end()) keep.insert(it->second);
    }
    for (int cap = 0; cap <= 63; ++cap) {
      if (keep.contains(cap)) continue;
      if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL) {
        return ContainerFailed(ErrnoStatus(errno, absl::StrCat("drop capability ", cap)), 125);
      }
    }
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
  }
  if (spec->gid != 0 || spec->uid != 0) {
    if (setgroups(0, nullptr) != 0 || setgid(spec->gid) != 0 || setuid(spec->uid) != 0) {
      return ContainerFailed(
          ErrnoStatus(errno, absl::StrCat("uid ", spec->uid, " gid ", spec->gid)), 125);
    }
  }
  std::vector<std::string> env = spec->env;
  std::vector<char*> envp;
  if (env.empty()) {
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) envp.push_back(*e);
  } else {
    for (auto& e : env) envp.push_back(e.data());
  }
  envp.push_back(nullptr);
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  // execvpe looks argv[0] up in the PATH of the environment it is given.
  for (auto& e : env) {
    if (absl::StartsWith(e, "PATH=")) setenv("PATH", e.c_str() + 5, 1);
  }
  execvpe(args[0], args.data(), envp.data());
  return ContainerFailed(ErrnoStatus(errno, absl::StrCat("exec ", args[0])), 127);
}

std::string NodeViewSpecPath(const LabNode& node) { return node.dir + "/node-view.json"; }

void SyncNodeReady(ObjectStore* store, const Topology& topology) {
  for (const LabNode& n : topology.nodes) {
    bool ready = fs::exists(n.cni_conf_dir() + "/05-sluice.conflist");
    auto st = store->Update(
        Resource("nodes"), "", n.name,
        [&](json& node) {
          json& conds = node["status"]["conditions"];
          if (!conds.is_array()) conds = json::array();
          std::string status = ready ? "True" : "False";
          for (auto& c : conds) {
            if (c.value("type", "") != "Ready") continue;
            if (c.value("status", "") == status) return absl::OkStatus();
            conds.erase(conds.begin() + (&c - &conds[0]));
            break;
          }
          std::string now = ObjectStore::FormatTimestamp(absl::Now());
          json c = {{"type", "Ready"},
                    {"status", status},
                    {"lastHeartbeatTime", now},
                    {"lastTransitionTime", now}};
          if (ready) {
            c["reason"] = "KubeletReady";
            c["message"] = "kubelet is posting ready status";
          } else {
            c["reason"] = "KubeletNotReady";
            c["message"] =
                "container runtime network not ready: NetworkReady=false "
                "reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin "
                "not initialized";
          }
          conds.push_back(c);
          return absl::OkStatus();
        },
        ObjectStore::Subresource::kStatus);
    if (!st.ok() && !absl::IsNotFound(st.status())) {
      spdlog::warn("node {} Ready: {}", n.name, st.status().ToString());
    }
  }
}

// --- the runtime ---

struct Workloads::Container {
  std::string name;
  ContainerSpec spec;
  pid_t pid = 0;
  bool running = false;
  RestartBackoff backoff;
  absl::Time restart_at = absl::InfinitePast();
  absl::Time started_at;
  int last_exit = 0;
};

struct Workloads::PodRun {
  json pod;  // as last seen
  std::string key, uid;
  const LabNode* node = nullptr;
  std::string dir;  // <node dir>/pods/<namespace>_<name>_<uid>
  std::unique_ptr<Container> main;
  json probe;  // the main container's readinessProbe
  bool ready = false;
  int probe_failures = 0, probe_successes = 0;
  absl::Time next_probe = absl::InfinitePast();
  bool terminating = false;
  absl::Time kill_at = absl::InfiniteFuture();
  bool status_dirty = true;
  std::string start_time;
  std::vector<json> init_statuses;
};

Workloads::Workloads(ObjectStore* store, Topology topology, WorkloadOptions options)
    : store_(store), topology_(std::move(topology)), options_(std::move(options)) {}

Workloads::~Workloads() { Stop(); }

absl::Status Workloads::Start() {
  // The node's view of its host paths, for the CNI plugin the kubelet runs (node/kubelet.cc).
  for (const LabNode& n : topology_.nodes) {
    ContainerSpec view;
    view.scratch_dir = n.dir + "/node-view";
    for (const HostPathEntry& e : HostPathTable(n)) {
      if (e.kind == "bind") {
        if (auto s = MkdirP(e.lab_path); !s.ok()) return s;
      }
      if (e.host_path == "/proc") continue;  // the view has its own /proc already
      view.mounts.push_back({e.lab_path, e.host_path, e.kind, false});
    }
    if (auto s = WriteFile(NodeViewSpecPath(n), ContainerSpecToJson(view).dump(2) + "\n");
        !s.ok()) {
      return s;
    }
  }
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void Workloads::Stop() {
  if (stopping_.exchange(true)) return;
  if (thread_.joinable()) thread_.join();
  for (auto& [uid, run] : runs_) {
    if (run->main && run->main->running) StopProcess(run->main->pid, absl::Seconds(10));
  }
  runs_.clear();
}

void Workloads::Run() {
  absl::Time next_reconcile = absl::InfinitePast();
  while (!stopping_) {
    if (absl::Now() >= next_reconcile) {
      Reconcile();
      next_reconcile = absl::Now() + absl::Milliseconds(300);
    }
    SyncPods();
    absl::SleepFor(options_.tick);  // a control loop's period, not a test's synchronisation
  }
}

// --- DaemonSet and Deployment controllers ---

void Workloads::Reconcile() {
  auto pods = store_->List(Resource("pods"), {});
  auto nodes = store_->List(Resource("nodes"), {});
  if (!pods.ok() || !nodes.ok()) return;
  std::vector<json> pod_list, node_list;
  for (const auto& p : pods->items) pod_list.push_back(*p);
  for (const auto& n : nodes->items) node_list.push_back(*n);
  std::set<std::string> owners;
  for (const char* kind : {"daemonsets", "deployments"}) {
    auto list = store_->List(Resource(kind), {});
    if (!list.ok()) continue;
    for (const auto& o : list->items) {
      owners.insert(JsonStr(*o, {"metadata", "uid"}));
      if (!RunsSluiceImage(JsonAt(*o, {"spec", "template"}))) continue;
      if (std::string(kind) == "daemonsets") {
        ReconcileDaemonSet(*o, pod_list, node_list);
      } else {
        ReconcileDeployment(*o, pod_list, node_list);
      }
    }
  }
  // The garbage collector's part: pods of a DaemonSet or Deployment that is gone.
  for (const json& p : pod_list) {
    const json& refs = JsonAt(p, {"metadata", "ownerReferences"});
    if (!refs.is_array() || Terminating(p)) continue;
    for (const auto& r : refs) {
      std::string kind = r.value("kind", "");
      if ((kind == "DaemonSet" || kind == "Deployment") && r.value("controller", false) &&
          !owners.contains(r.value("uid", ""))) {
        spdlog::info("workloads: {} {} is gone: deleting its pod {}", kind, r.value("name", ""),
                     PodKey(p));
        DeletePod(p);
      }
    }
  }
}

void Workloads::CreatePod(const json& owner, const std::string& hash_label, const std::string& hash,
                          const std::string& node) {
  const json& tmpl = JsonAt(owner, {"spec", "template"});
  std::string name = JsonStr(owner, {"metadata", "name"});
  std::string kind = owner.value("kind", "");
  json pod = {{"apiVersion", "v1"}, {"kind", "Pod"}};
  json md = tmpl.value("metadata", json::object());
  md["name"] = kind == "Deployment" ? absl::StrCat(name, "-", hash, "-", RandomSuffix())
                                    : absl::StrCat(name, "-", RandomSuffix());
  md["generateName"] = kind == "Deployment" ? absl::StrCat(name, "-", hash, "-") : name + "-";
  md["namespace"] = JsonStr(owner, {"metadata", "namespace"});
  md["labels"][hash_label] = hash;
  md["ownerReferences"] = json::array({{{"apiVersion", "apps/v1"},
                                        {"kind", kind},
                                        {"name", name},
                                        {"uid", JsonStr(owner, {"metadata", "uid"})},
                                        {"controller", true},
                                        {"blockOwnerDeletion", true}}});
  pod["metadata"] = md;
  pod["spec"] = tmpl.value("spec", json::object());
  if (!node.empty()) pod["spec"]["nodeName"] = node;
  auto created = store_->Create(Resource("pods"), pod);
  if (!created.ok()) {
    spdlog::warn("workloads: create pod of {} {}: {}", kind, name, created.status().ToString());
  } else {
    spdlog::info("workloads: {} {} created pod {} on {}", kind, name,
                 JsonStr(*created, {"metadata", "name"}), node.empty() ? "(no node)" : node);
  }
}

void Workloads::DeletePod(const json& pod) {
  auto st = store_->Delete(Resource("pods"), JsonStr(pod, {"metadata", "namespace"}),
                           JsonStr(pod, {"metadata", "name"}), {});
  if (!st.ok() && !absl::IsNotFound(st.status())) {
    spdlog::warn("workloads: delete pod {}: {}", PodKey(pod), st.status().ToString());
  }
}

void Workloads::ReconcileDaemonSet(const json& ds, const std::vector<json>& pods,
                                   const std::vector<json>& nodes) {
  std::string uid = JsonStr(ds, {"metadata", "uid"});
  const json& tmpl = JsonAt(ds, {"spec", "template"});
  std::string hash = TemplateHash(tmpl);
  std::map<std::string, std::vector<const json*>> by_node;
  for (const json& p : pods) {
    if (OwnedBy(p, uid)) by_node[JsonStr(p, {"spec", "nodeName"})].push_back(&p);
  }
  std::vector<std::string> eligible;
  for (const json& n : nodes) {
    if (NodeSelected(n, JsonAt(tmpl, {"spec"})))
      eligible.push_back(JsonStr(n, {"metadata", "name"}));
  }
  int desired = static_cast<int>(eligible.size());
  int max_unavailable = std::max(
      1, ScaledValue(JsonAt(ds, {"spec", "updateStrategy", "rollingUpdate", "maxUnavailable"}),
                     desired, 1));
  bool on_delete = JsonStr(ds, {"spec", "updateStrategy", "type"}) == "OnDelete";
  int unavailable = 0, ready = 0, updated = 0, scheduled = 0;
  std::vector<const json*> old_pods;
  for (const std::string& n : eligible) {
    const auto& list = by_node[n];
    const json* alive = nullptr;
    for (const json* p : list) {
      if (!Terminating(*p)) alive = p;
    }
    if (list.empty()) {
      CreatePod(ds, "controller-revision-hash", hash, n);
      ++unavailable;
      continue;
    }
    ++scheduled;
    if (alive == nullptr || !PodReady(*alive)) ++unavailable;
    if (alive != nullptr && PodReady(*alive)) ++ready;
    if (alive != nullptr) {
      if (JsonStr(*alive, {"metadata", "labels", "controller-revision-hash"}) == hash) {
        ++updated;
      } else {
        old_pods.push_back(alive);
      }
    }
  }
  // Rolling update: old pods go (not-ready ones first) while the unavailable budget allows;
  // the node's new pod is created once the old one is gone (maxSurge 0).
  std::stable_sort(old_pods.begin(), old_pods.end(),
                   [](const json* a, const json* b) { return !PodReady(*a) && PodReady(*b); });
  for (const json* p : old_pods) {
    if (on_delete) break;
    bool was_ready = PodReady(*p);
    if (was_ready && unavailable >= max_unavailable) break;
    spdlog::info("workloads: DaemonSet {} rolls {} on {} ({} of {} unavailable)",
                 JsonStr(ds, {"metadata", "name"}), JsonStr(*p, {"metadata", "name"}),
                 JsonStr(*p, {"spec", "nodeName"}), unavailable, max_unavailable);
    DeletePod(*p);
    if (was_ready) ++unavailable;
  }
  json status = {{"desiredNumberScheduled", desired},
                 {"currentNumberScheduled", scheduled},
                 {"numberMisscheduled", 0},
                 {"numberReady", ready},
                 {"numberAvailable", ready},
                 {"numberUnavailable", desired - ready},
                 {"updatedNumberScheduled", updated},
                 {"observedGeneration", JsonAt(ds, {"metadata", "generation"}).is_number()
                                            ? JsonAt(ds, {"metadata", "generation"})
                                            : json(1)}};
  (void)store_->Update(
      Resource("daemonsets"), JsonStr(ds, {"metadata", "namespace"}),
      JsonStr(ds, {"metadata", "name"}),
      [&](json& o) {
        o["status"] = status;
        return absl::OkStatus();
      },
      ObjectStore::Subresource::kStatus);
}

void Workloads::ReconcileDeployment(const json& deploy, const std::vector<json>& pods,
                                    const std::vector<json>& nodes) {
  std::string uid = JsonStr(deploy, {"metadata", "uid"});
  const json& tmpl = JsonAt(deploy, {"spec", "template"});
  std::string hash = TemplateHash(tmpl);
  int replicas = JsonAt(deploy, {"spec", "replicas"}).is_number_integer()
                     ? JsonAt(deploy, {"spec", "replicas"}).get<int>()
                     : 1;
  int max_unavailable = ScaledValue(
      JsonAt(deploy, {"spec", "strategy", "rollingUpdate", "maxUnavailable"}), replicas, 1);
  int max_surge =
      ScaledValue(JsonAt(deploy, {"spec", "strategy", "rollingUpdate", "maxSurge"}), replicas, 0);
  bool anti_affinity = JsonAt(tmpl, {"spec", "affinity", "podAntiAffinity",
                                     "requiredDuringSchedulingIgnoredDuringExecution"})
                           .is_array();
  std::vector<const json*> current, old;
  std::set<std::string> used_nodes;
  int total = 0, ready = 0;
  for (const json& p : pods) {
    if (!OwnedBy(p, uid)) continue;
    ++total;
    used_nodes.insert(JsonStr(p, {"spec", "nodeName"}));
    if (Terminating(p)) continue;
    if (PodReady(p)) ++ready;
    (JsonStr(p, {"metadata", "labels", "pod-template-hash"}) == hash ? current : old).push_back(&p);
  }
  int alive = static_cast<int>(current.size() + old.size());
  // Scale up (within maxSurge), each new pod on a node of its own when anti-affinity asks.
  for (int i = static_cast<int>(current.size());
       i < replicas && total < replicas + max_surge && alive < replicas + max_surge; ++i) {
    std::string chosen;
    for (const json& n : nodes) {
      std::string name = JsonStr(n, {"metadata", "name"});
      if (!NodeSelected(n, JsonAt(tmpl, {"spec"}))) continue;
      if (anti_affinity && used_nodes.contains(name)) continue;
      chosen = name;
      break;
    }
    if (chosen.empty()) break;  // unschedulable for now
    used_nodes.insert(chosen);
    CreatePod(deploy, "pod-template-hash", hash, chosen);
    ++total;
    ++alive;
  }
  // Old pods go while the unavailable budget allows; surplus current pods go.
  int unavailable = std::max(0, replicas - ready);
  for (const json* p : old) {
    if (PodReady(*p) && unavailable >= max_unavailable && alive <= replicas) break;
    if (PodReady(*p)) ++unavailable;
    DeletePod(*p);
    --alive;
  }
  for (size_t i = replicas; i < current.size(); ++i) DeletePod(*current[i]);
  json status = {{"replicas", alive},
                 {"readyReplicas", ready},
                 {"availableReplicas", ready},
                 {"updatedReplicas", static_cast<int>(current.size())},
                 {"observedGeneration", JsonAt(deploy, {"metadata", "generation"}).is_number()
                                            ? JsonAt(deploy, {"metadata", "generation"})
                                            : json(1)}};
  (void)store_->Update(
      Resource("deployments"), JsonStr(deploy, {"metadata", "namespace"}),
      JsonStr(deploy, {"metadata", "name"}),
      [&](json& o) {
        o["status"] = status;
        return absl::OkStatus();
      },
      ObjectStore::Subresource::kStatus);
}

// --- the runtime: pods of the Sluice image on lab nodes ---

void Workloads::SyncPods() {
  auto pods = store_->List(Resource("pods"), {});
  if (!pods.ok()) return;
  std::set<std::string> seen;
  for (const auto& ptr : pods->items) {
    const json& pod = *ptr;
    const LabNode* node = topology_.FindNode(JsonStr(pod, {"spec", "nodeName"}));
    if (node == nullptr || !RunsSluiceImage(pod)) continue;
    std::string uid = JsonStr(pod, {"metadata", "uid"});
    seen.insert(uid);
    auto it = runs_.find(uid);
    if (it == runs_.end()) {
      if (Terminating(pod)) {
        // Never started here: nothing to stop.
        (void)store_->Delete(Resource("pods"), JsonStr(pod, {"metadata", "namespace"}),
                             JsonStr(pod, {"metadata", "name"}), {.grace_period_seconds = 0});
        continue;
      }
      if (failed_.contains(uid)) continue;  // reported; a new pod object is a new attempt
      auto run = std::make_unique<PodRun>();
      run->pod = pod;
      run->key = PodKey(pod);
      run->uid = uid;
      run->node = node;
      run->dir = absl::StrCat(node->dir, "/pods/", JsonStr(pod, {"metadata", "namespace"}), "_",
                              JsonStr(pod, {"metadata", "name"}), "_", uid);
      if (auto st = StartPod(*run); !st.ok()) {
        spdlog::error("workloads: pod {}: {}", run->key, st.ToString());
        failed_[uid] = std::string(st.message());
        WriteFailedStatus(pod, std::string(st.message()));
        if (run->main && run->main->running) StopProcess(run->main->pid, absl::Seconds(1));
        continue;
      }
      it = runs_.emplace(uid, std::move(run)).first;
      if (options_.on_change) options_.on_change();
    }
    PodRun& run = *it->second;
    run.pod = pod;
    if (Terminating(pod) && !run.terminating) BeginTermination(run);
  }
  for (auto it = runs_.begin(); it != runs_.end();) {
    PodRun& run = *it->second;
    Container& c = *run.main;
    absl::Time now = absl::Now();
    bool gone = !seen.contains(it->first);
    if (c.running) {
      if (auto code = ReapIfExited(c.pid)) {
        c.running = false;
        c.last_exit = *code;
        c.restart_at = c.backoff.Exited(now);
        run.ready = false;
        run.probe_successes = run.probe_failures = 0;
        run.status_dirty = true;
        if (!run.terminating && !gone) {
          spdlog::warn("workloads: pod {} container {} (pid {}) exited with {}: restarting in {}",
                       run.key, c.name, c.pid, *code, absl::FormatDuration(c.restart_at - now));
        }
      }
    }
    if (gone || (run.terminating && (!c.running || now >= run.kill_at))) {
      if (c.running) StopProcess(c.pid, absl::Seconds(1));
      c.running = false;
      if (!gone) {
        (void)store_->Delete(Resource("pods"), JsonStr(run.pod, {"metadata", "namespace"}),
                             JsonStr(run.pod, {"metadata", "name"}), {.grace_period_seconds = 0});
      }
      spdlog::info("workloads: pod {} stopped", run.key);
      std::error_code ec;
      fs::remove_all(run.dir, ec);
      it = runs_.erase(it);
      if (options_.on_change) options_.on_change();
      continue;
    }
    if (!c.running && !run.terminating && now >= c.restart_at) {
      auto pid = StartContainer(run, c.name, c.spec);
      if (pid.ok()) {
        c.pid = *pid;
        c.running = true;
        c.backoff.Started(now);
        c.started_at = now;
        run.next_probe = now;
        run.status_dirty = true;
        spdlog::info("workloads: pod {} container {} restarted (restart {}): pid {}", run.key,
                     c.name, c.backoff.restarts(), *pid);
      } else {
        c.restart_at = c.backoff.Exited(now);
      }
    }
    if (c.running && now >= run.next_probe) Probe(run);
    if (run.status_dirty) WriteStatus(run);
    ++it;
  }
  for (auto it = failed_.begin(); it != failed_.end();) {
    it = seen.contains(it->first) ? std::next(it) : failed_.erase(it);
  }
}

absl::StatusOr<ContainerSpec> Workloads::BuildContainer(const PodRun& run, const json& c) {
  const json& pod = run.pod;
  const LabNode& node = *run.node;
  ContainerSpec spec;
  spec.scratch_dir = absl::StrCat(run.dir, "/containers/", c.value("name", "c"));
  // The image's files.
  for (const auto& [name, path] : options_.image_files) {
    spec.mounts.push_back({path, "/usr/local/bin/" + name, "bind", true});
  }
  // Volumes, as the container mounts them.
  std::map<std::string, const json*> volumes;
  if (const json& vs = JsonAt(pod, {"spec", "volumes"}); vs.is_array()) {
    for (const auto& v : vs) volumes[v.value("name", "")] = &v;
  }
  const json& mounts = JsonAt(c, {"volumeMounts"});
  if (mounts.is_array()) {
    for (const auto& m : mounts) {
      std::string vname = m.value("name", ""), target = m.value("mountPath", "");
      bool ro = m.value("readOnly", false);
      auto v = volumes.find(vname);
      if (v == volumes.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "container ", c.value("name", ""), ": volumeMount ", vname, ": no such volume"));
      }
      const json& vol = *v->second;
      if (vol.contains("hostPath")) {
        auto e = MapHostPath(node, JsonStr(vol, {"hostPath", "path"}));
        if (!e.ok())
          return absl::Status(e.status().code(),
                              absl::StrCat("volume ", vname, ": ", e.status().message()));
        if (e->kind == "bind") {
          std::string type = JsonStr(vol, {"hostPath", "type"});
          if (!fs::exists(e->lab_path)) {
            if (type != "DirectoryOrCreate") {
              return absl::NotFoundError(absl::StrCat("volume ", vname, ": hostPath ", e->host_path,
                                                      " (", e->lab_path, ") does not exist"));
            }
            if (auto s = MkdirP(e->lab_path); !s.ok()) return s;
          }
        }
        spec.mounts.push_back({e->lab_path, target, e->kind, ro});
      } else if (vol.contains("configMap")) {
        std::string cm_name = JsonStr(vol, {"configMap", "name"});
        auto cm =
            store_->Get(Resource("configmaps"), JsonStr(pod, {"metadata", "namespace"}), cm_name);
        if (!cm.ok()) {
          return absl::NotFoundError(
              absl::StrCat("volume ", vname, ": configmap \"", cm_name, "\" not found"));
        }
        std::string dir = absl::StrCat(run.dir, "/volumes/", vname);
        std::error_code ec;
        fs::remove_all(dir, ec);
        if (auto s = MkdirP(dir); !s.ok()) return s;
        if (const json& data = JsonAt(*cm, {"data"}); data.is_object()) {
          for (const auto& [k, val] : data.items()) {
            if (auto s = WriteFile(dir + "/" + k, val.is_string() ? val.get<std::string>() : "");
                !s.ok()) {
              return s;
            }
          }
        }
        spec.mounts.push_back({dir, target, "bind", true});
      } else if (vol.contains("emptyDir")) {
        std::string dir = absl::StrCat(run.dir, "/volumes/", vname);
        if (auto s = MkdirP(dir); !s.ok()) return s;
        spec.mounts.push_back({dir, target, "bind", ro});
      } else {
        return absl::UnimplementedError(absl::StrCat(
            "volume ", vname, ": the lab runtime mounts hostPath, configMap and emptyDir only"));
      }
    }
  }
  // The service account's credentials, as the kubelet projects them.
  if (JsonAt(pod, {"spec", "automountServiceAccountToken"}) != json(false)) {
    std::string dir = run.dir + "/volumes/kube-api-access";
    for (const auto& [file, content] : std::vector<std::pair<std::string, std::string>>{
             {"token", options_.token},
             {"ca.crt", options_.ca_pem},
             {"namespace", JsonStr(pod, {"metadata", "namespace"})}}) {
      if (auto s = WriteFile(dir + "/" + file, content); !s.ok()) return s;
    }
    spec.mounts.push_back({dir, kServiceAccountDir, "bind", true});
  }
  // Environment: the image's PATH, the kubelet's service variables, the container's env.
  spec.env = {kImagePath, absl::StrCat("HOSTNAME=", node.name)};
  if (auto k = store_->Get(Resource("services"), "default", "kubernetes"); k.ok()) {
    std::string ip = JsonStr(*k, {"spec", "clusterIP"});
    int port = 443;
    if (const json& ports = JsonAt(*k, {"spec", "ports"}); ports.is_array() && !ports.empty()) {
      port = ports[0].value("port", 443);
    }
    spec.env.push_back("KUBERNETES_SERVICE_HOST=" + ip);
    spec.env.push_back(absl::StrCat("KUBERNETES_SERVICE_PORT=", port));
  }
  if (const json& env = JsonAt(c, {"env"}); env.is_array()) {
    for (const auto& e : env) {
      std::string name = e.value("name", "");
      if (e.contains("value")) {
        spec.env.push_back(
            name + "=" +
            (e["value"].is_string() ? e["value"].get<std::string>() : e["value"].dump()));
        continue;
      }
      std::string field = JsonStr(e, {"valueFrom", "fieldRef", "fieldPath"});
      std::string value;
      if (field == "spec.nodeName") {
        value = node.name;
      } else if (field == "metadata.name") {
        value = JsonStr(pod, {"metadata", "name"});
      } else if (field == "metadata.namespace") {
        value = JsonStr(pod, {"metadata", "namespace"});
      } else if (field == "metadata.uid") {
        value = JsonStr(pod, {"metadata", "uid"});
      } else if (field == "spec.serviceAccountName") {
        value = JsonStr(pod, {"spec", "serviceAccountName"});
      } else if (field == "status.podIP" || field == "status.hostIP") {
        value = node.ip;  // hostNetwork: the node's address
      } else {
        return absl::UnimplementedError(
            absl::StrCat("env ", name, ": valueFrom ", JsonAt(e, {"valueFrom"}).dump(),
                         " (the lab resolves fieldRef of spec.nodeName, metadata.name, "
                         "metadata.namespace, metadata.uid, spec.serviceAccountName, "
                         "status.podIP, status.hostIP)"));
      }
      spec.env.push_back(name + "=" + value);
    }
  }
  // Entrypoint and arguments, as a runtime combines them with the image's.
  std::vector<std::string> command = {"/usr/local/bin/sluice-agent"};  // the image's ENTRYPOINT
  if (const json& cmd = JsonAt(c, {"command"}); cmd.is_array()) {
    command = cmd.get<std::vector<std::string>>();
  }
  spec.argv = command;
  if (const json& args = JsonAt(c, {"args"}); args.is_array()) {
    for (const auto& a : args) spec.argv.push_back(a.get<std::string>());
  }
  // Capabilities: the runtime's default set, plus add, less drop (ALL drops everything).
  const json& sc = JsonAt(c, {"securityContext"});
  if (JsonAt(sc, {"privileged"}) != json(true)) {
    std::set<std::string> caps(DefaultCaps().begin(), DefaultCaps().end());
    if (const json& drop = JsonAt(sc, {"capabilities", "drop"}); drop.is_array()) {
      for (const auto& d : drop) {
        if (Cap(d.get<std::string>()) == "ALL") caps.clear();
        caps.erase(Cap(d.get<std::string>()));
      }
    }
    if (const json& add = JsonAt(sc, {"capabilities", "add"}); add.is_array()) {
      for (const auto& a : add) caps.insert(Cap(a.get<std::string>()));
    }
    spec.restrict_caps = true;
    spec.caps.assign(caps.begin(), caps.end());
  }
  if (const json& u = JsonAt(sc, {"runAsUser"}); u.is_number_integer()) spec.uid = u.get<int>();
  if (const json& g = JsonAt(sc, {"runAsGroup"}); g.is_number_integer()) {
    spec.gid = g.get<int>();
  } else {
    spec.gid = spec.uid;
  }
  return spec;
}

absl::StatusOr<pid_t> Workloads::StartContainer(const PodRun& run, const std::string& name,
                                                const ContainerSpec& spec) {
  std::string spec_path = absl::StrCat(run.dir, "/containers/", name, ".json");
  if (auto s = WriteFile(spec_path, ContainerSpecToJson(spec).dump(2) + "\n"); !s.ok()) return s;
  return StartProcess(
      {.argv = {options_.self_exe, "container", "--spec", spec_path},
       .netns_path = run.node->netns_path(),
       .log_path = absl::StrCat(run.node->log_dir(), "/", JsonStr(run.pod, {"metadata", "name"}),
                                "_", name, ".log")});
}

absl::Status Workloads::StartPod(PodRun& run) {
  const json& pod = run.pod;
  if (JsonAt(pod, {"spec", "hostNetwork"}) != json(true)) {
    return absl::UnimplementedError(
        "the lab runs pods of the Sluice image with hostNetwork: true only");
  }
  if (auto s = MkdirP(run.dir); !s.ok()) return s;
  if (auto s = MkdirP(run.node->log_dir()); !s.ok()) return s;
  run.start_time = ObjectStore::FormatTimestamp(absl::Now());
  std::string log =
      absl::StrCat(run.node->log_dir(), "/", JsonStr(pod, {"metadata", "name"}), ".log");
  // Init containers, in order, each to completion.
  if (const json& inits = JsonAt(pod, {"spec", "initContainers"}); inits.is_array()) {
    for (const auto& c : inits) {
      std::string name = c.value("name", "");
      const json& cmd = JsonAt(c, {"command"});
      bool host_mount = false;
      if (cmd.is_array() && !cmd.empty() && cmd[0] == "nsenter") {
        for (const auto& a : cmd) {
          if (a.is_string() && absl::StartsWith(a.get<std::string>(), "--mount="))
            host_mount = true;
        }
      }
      if (host_mount) {
        // It would mount in the machine's own mount namespace (/proc/1/ns/mnt): the lab mounts
        // each node's bpffs itself and shares the machine's cgroup2 mount instead.
        spdlog::info(
            "workloads: pod {}: init container {} skipped: it mounts through nsenter "
            "into the host's mount namespace; the lab provides the node's bpffs and "
            "cgroup2 mounts itself",
            run.key, name);
        run.init_statuses.push_back(
            CompletedInitStatus(name, c, "skipped by the lab: host mount namespace"));
        continue;
      }
      auto spec = BuildContainer(run, c);
      if (!spec.ok()) return spec.status();
      std::string spec_path = absl::StrCat(run.dir, "/containers/", name, ".json");
      if (auto s = WriteFile(spec_path, ContainerSpecToJson(*spec).dump(2) + "\n"); !s.ok()) {
        return s;
      }
      auto r = RunProcess({.argv = {options_.self_exe, "container", "--spec", spec_path},
                           .netns_path = run.node->netns_path()},
                          absl::Seconds(60));
      if (!r.ok()) return r.status();
      std::ofstream(log, std::ios::app) << r->out << r->err;
      if (r->exit_code != 0) {
        return absl::FailedPreconditionError(absl::StrCat("init container ", name, " exited with ",
                                                          r->exit_code, ": ", r->out, r->err));
      }
      spdlog::info("workloads: pod {}: init container {} done", run.key, name);
      run.init_statuses.push_back(CompletedInitStatus(name, c));
    }
  }
  const json& containers = JsonAt(pod, {"spec", "containers"});
  if (!containers.is_array() || containers.size() != 1) {
    return absl::UnimplementedError("the lab runs pods of the Sluice image with one container");
  }
  const json& c = containers[0];
  auto spec = BuildContainer(run, c);
  if (!spec.ok()) return spec.status();
  run.main = std::make_unique<Container>();
  run.main->name = c.value("name", "");
  run.main->spec = *spec;
  run.probe = JsonAt(c, {"readinessProbe"});
  auto pid = StartContainer(run, run.main->name, *spec);
  if (!pid.ok()) return pid.status();
  run.main->pid = *pid;
  run.main->running = true;
  run.main->backoff.Started(absl::Now());
  run.main->started_at = absl::Now();
  run.next_probe = absl::Now();
  spdlog::info("workloads: pod {} on {}: container {} started: pid {}", run.key, run.node->name,
               run.main->name, *pid);
  return absl::OkStatus();
}

void Workloads::BeginTermination(PodRun& run) {
  run.terminating = true;
  int64_t grace = 30;
  if (const json& g = JsonAt(run.pod, {"metadata", "deletionGracePeriodSeconds"});
      g.is_number_integer()) {
    grace = g.get<int64_t>();
  }
  absl::Time deadline = absl::Now() + absl::Seconds(grace);
  const json* c = nullptr;
  if (const json& cs = JsonAt(run.pod, {"spec", "containers"}); cs.is_array() && !cs.empty()) {
    c = &cs[0];
  }
  const json& pre = c ? JsonAt(*c, {"lifecycle", "preStop", "exec", "command"}) : json();
  if (run.main->running && pre.is_array() && !pre.empty()) {
    // preStop runs in the container (its mounts, env and capabilities), then SIGTERM.
    ContainerSpec spec = run.main->spec;
    spec.argv = pre.get<std::vector<std::string>>();
    spec.scratch_dir = run.dir + "/containers/prestop";
    std::string spec_path = run.dir + "/containers/prestop.json";
    if (WriteFile(spec_path, ContainerSpecToJson(spec).dump(2) + "\n").ok()) {
      auto r = RunProcess({.argv = {options_.self_exe, "container", "--spec", spec_path},
                           .netns_path = run.node->netns_path()},
                          std::max(absl::Seconds(1), deadline - absl::Now()));
      std::string log =
          absl::StrCat(run.node->log_dir(), "/", JsonStr(run.pod, {"metadata", "name"}), "_",
                       run.main->name, ".log");
      if (r.ok()) {
        std::ofstream(log, std::ios::app) << r->out << r->err;
        spdlog::info("workloads: pod {}: preStop exited with {}", run.key, r->exit_code);
      } else {
        spdlog::warn("workloads: pod {}: preStop: {}", run.key, r.status().ToString());
      }
    }
  }
  if (run.main->running) kill(-run.main->pid, SIGTERM);
  run.kill_at = deadline;
  run.ready = false;
  run.status_dirty = true;
  spdlog::info("workloads: pod {} terminating (grace {} s)", run.key, grace);
}

void Workloads::Probe(PodRun& run) {
  if (!run.probe.is_object() || !run.probe.contains("httpGet")) {
    if (!run.ready && !run.terminating) {
      run.ready = true;
      run.status_dirty = true;
    }
    run.next_probe = absl::InfiniteFuture();
    return;
  }
  const json& http = run.probe["httpGet"];
  std::string host = http.value("host", "127.0.0.1");
  int port = http.value("port", 0);
  std::string path = http.value("path", "/");
  int period = run.probe.value("periodSeconds", 10);
  int success_threshold = run.probe.value("successThreshold", 1);
  int failure_threshold = run.probe.value("failureThreshold", 3);
  absl::Duration timeout =
      std::min(absl::Seconds(run.probe.value("timeoutSeconds", 1)), absl::Milliseconds(800));
  bool ok = false;
  std::string netns = run.node->netns_path();
  std::thread([&] {
    if (!EnterNetns(netns).ok()) return;
    httplib::Client cli(host, port);
    int64_t usec = absl::ToInt64Microseconds(timeout);
    cli.set_connection_timeout(usec / 1'000'000, usec % 1'000'000);
    cli.set_read_timeout(usec / 1'000'000, usec % 1'000'000);
    auto res = cli.Get(path);
    ok = res && res->status >= 200 && res->status < 400;
  }).join();
  if (ok) {
    run.probe_failures = 0;
    if (++run.probe_successes >= success_threshold && !run.ready && !run.terminating) {
      run.ready = true;
      run.status_dirty = true;
      spdlog::info("workloads: pod {} is ready", run.key);
    }
  } else {
    run.probe_successes = 0;
    if (++run.probe_failures >= failure_threshold && run.ready) {
      run.ready = false;
      run.status_dirty = true;
      spdlog::warn("workloads: pod {} readiness probe failed {} times", run.key,
                   run.probe_failures);
    }
  }
  run.next_probe = absl::Now() + std::min(absl::Seconds(period), options_.probe_period_cap);
}

void Workloads::WriteStatus(PodRun& run) {
  const Container& c = *run.main;
  std::string now = ObjectStore::FormatTimestamp(absl::Now());
  std::string ready = run.ready ? "True" : "False";
  json state = c.running
                   ? json{{"running", {{"startedAt", ObjectStore::FormatTimestamp(c.started_at)}}}}
                   : json{{"waiting", {{"reason", "CrashLoopBackOff"}}}};
  json cs = {{"name", c.name},
             {"ready", run.ready},
             {"started", c.running},
             {"restartCount", c.backoff.restarts()},
             {"image", JsonAt(run.pod, {"spec", "containers"})[0].value("image", "")},
             {"imageID", ""},
             {"containerID", absl::StrCat("lab://", c.pid)},
             {"state", state}};
  if (c.backoff.restarts() > 0) {
    cs["lastState"] = {{"terminated", {{"exitCode", c.last_exit}}}};
  }
  json status = {{"phase", "Running"},
                 {"hostIP", run.node->ip},
                 {"hostIPs", json::array({{{"ip", run.node->ip}}})},
                 {"podIP", run.node->ip},
                 {"podIPs", json::array({{{"ip", run.node->ip}}})},
                 {"startTime", run.start_time},
                 {"qosClass", "BestEffort"},
                 {"conditions", json::array({{{"type", "PodScheduled"}, {"status", "True"}},
                                             {{"type", "Initialized"}, {"status", "True"}},
                                             {{"type", "ContainersReady"}, {"status", ready}},
                                             {{"type", "Ready"}, {"status", ready}}})},
                 {"containerStatuses", json::array({cs})},
                 {"initContainerStatuses", run.init_statuses}};
  for (auto& cond : status["conditions"]) {
    cond["lastTransitionTime"] = now;
    cond["lastProbeTime"] = nullptr;
  }
  auto st = store_->Update(
      Resource("pods"), JsonStr(run.pod, {"metadata", "namespace"}),
      JsonStr(run.pod, {"metadata", "name"}),
      [&](json& p) {
        if (JsonStr(p, {"metadata", "uid"}) != run.uid) return absl::NotFoundError("replaced");
        // Keep transition times of conditions whose status did not change.
        if (const json& old = JsonAt(p, {"status", "conditions"}); old.is_array()) {
          for (auto& cond : status["conditions"]) {
            for (const auto& o : old) {
              if (o.value("type", "") == cond["type"] && o.value("status", "") == cond["status"]) {
                cond["lastTransitionTime"] = o.value("lastTransitionTime", now);
              }
            }
          }
        }
        p["status"] = status;
        return absl::OkStatus();
      },
      ObjectStore::Subresource::kStatus);
  if (st.ok() || absl::IsNotFound(st.status())) run.status_dirty = false;
  if (options_.on_change) options_.on_change();
}

void Workloads::WriteFailedStatus(const json& pod, const std::string& message) {
  (void)store_->Update(
      Resource("pods"), JsonStr(pod, {"metadata", "namespace"}), JsonStr(pod, {"metadata", "name"}),
      [&](json& p) {
        p["status"] = {{"phase", "Pending"},
                       {"hostIP", ""},
                       {"message", message},
                       {"reason", "CreateContainerConfigError"},
                       {"conditions", json::array({{{"type", "PodScheduled"}, {"status", "True"}},
                                                   {{"type", "Ready"},
                                                    {"status", "False"},
                                                    {"reason", "CreateContainerConfigError"},
                                                    {"message", message}}})}};
        return absl::OkStatus();
      },
      ObjectStore::Subresource::kStatus);
}

}  // namespace sluice::lab
