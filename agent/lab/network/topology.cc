#include "agent/lab/network/topology.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fcntl.h>
#include <linux/if_link.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/base/errno.h"
#include "agent/base/files.h"
#include "agent/lab/tools/process.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace sluice::lab {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr char kTopologyFile[] = "topology.json";

// Serialises index allocation between concurrent `up`s.
class LabLock {
 public:
  LabLock() {
    fs::create_directories(kLabRunRoot);
    fd_ = open(absl::StrCat(kLabRunRoot, "/.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd_ >= 0) flock(fd_, LOCK_EX);
  }
  ~LabLock() {
    if (fd_ >= 0) close(fd_);
  }

 private:
  int fd_ = -1;
};

absl::Status Ip(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"ip"};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunChecked(argv);
}

bool NetnsExists(const std::string& netns) {
  return fs::exists(absl::StrCat(kNetnsDir, "/", netns));
}

json ToJson(const Topology& t) {
  json nodes = json::array();
  for (const auto& n : t.nodes) {
    nodes.push_back({{"name", n.name}, {"netns", n.netns}, {"ip", n.ip}, {"dir", n.dir}});
  }
  return {{"lab", t.lab},
          {"index", t.index},
          {"underlayNetns", t.underlay_netns},
          {"externalNetns", t.external_netns},
          {"gatewayIP", t.gateway_ip},
          {"externalIP", t.external_ip},
          {"prefixLength", t.prefix_len},
          {"bgp", t.bgp},
          {"nodes", nodes}};
}

absl::Status WriteTopology(const Topology& t) {
  // Under /run: gone with the machine, so no fsync.
  return agent::WriteFileAtomically(t.dir, kTopologyFile, ToJson(t).dump(2) + "\n", 0644,
                                    agent::Durability::kProcessCrash);
}

Topology Describe(const std::string& lab, int index, int nodes, bool bgp) {
  Topology t;
  t.bgp = bgp;
  t.router_netns = lab + "-router";
  t.client_netns = lab + "-client";
  t.router_ip = absl::StrCat("172.30.", index, ".254");
  t.client_ip = absl::StrCat("172.31.", index, ".2");
  t.client_net = absl::StrCat("172.31.", index, ".0/24");
  t.lab = lab;
  t.index = index;
  t.dir = LabDir(lab);
  t.underlay_netns = lab + "-underlay";
  t.external_netns = lab + "-external";
  std::string net = absl::StrCat("172.30.", index, ".");
  t.gateway_ip = net + "1";
  t.external_ip = net + "200";
  for (int k = 1; k <= nodes; ++k) {
    LabNode n;
    n.name = absl::StrCat("node", k);
    n.netns = absl::StrCat(lab, "-", n.name);
    n.ip = absl::StrCat(net, 10 + k);
    n.dir = absl::StrCat(t.dir, "/", n.name);
    t.nodes.push_back(n);
  }
  return t;
}

// A namespace with lo up and eth0 = a veth whose other end (`port`) is on the underlay bridge.
absl::Status AttachToUnderlay(const Topology& t, const std::string& netns, const std::string& port,
                              const std::string& ip) {
  if (auto st = Ip({"netns", "add", netns}); !st.ok()) return st;
  std::vector<std::vector<std::string>> steps = {
      {"-n", netns, "link", "set", "lo", "up"},
      {"-n", t.underlay_netns, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns",
       netns},
      {"-n", t.underlay_netns, "link", "set", port, "master", "br0", "up"},
      {"-n", netns, "addr", "add", absl::StrCat(ip, "/", t.prefix_len), "dev", "eth0"},
      {"-n", netns, "link", "set", "eth0", "up"},
      {"-n", netns, "route", "add", "default", "via", t.gateway_ip},
  };
  for (const auto& s : steps) {
    if (auto st = Ip(s); !st.ok()) return st;
  }
  return absl::OkStatus();
}

// Whether the nodes' agents run XDP on eth0 (SLUICE_LAB_AGENT_ARGS has --lb_acceleration=native).
bool AgentsRunXdp() {
  const char* extra = getenv("SLUICE_LAB_AGENT_ARGS");
  if (extra == nullptr) return false;
  for (absl::string_view a : absl::StrSplit(extra, ' ', absl::SkipWhitespace())) {
    if (a == "--lb_acceleration=native") return true;
  }
  return false;
}

// A veth takes the frames its peer's XDP program sends back (XDP_TX) or redirects into it only
// through the NAPI queue an XDP program of its own gives it: without one the kernel queues them
// where nothing reads them (GRO on, which the kernel documents as the other way, did not do it on
// the lab's kernels). So the underlay's end of a node's eth0 gets a program that passes every
// frame (native mode, attached to the device, no pin: it goes with the device). From a thread of
// its own, which enters the underlay namespace and ends: no other thread changes namespace.
absl::Status AttachXdpPass(const std::string& netns, const std::string& dev) {
  absl::Status status;
  std::thread worker([&] {
    std::string path = absl::StrCat(kNetnsDir, "/", netns);
    int ns = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (ns < 0 || setns(ns, CLONE_NEWNET) != 0) {
      status = ErrnoStatus(errno, absl::StrCat("enter ", path));
      if (ns >= 0) close(ns);
      return;
    }
    close(ns);
    const struct bpf_insn pass[] = {
        {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = BPF_REG_0, .imm = XDP_PASS},
        {.code = BPF_JMP | BPF_EXIT},
    };
    int fd = bpf_prog_load(BPF_PROG_TYPE_XDP, "lab_xdp_pass", "GPL", pass, 2, nullptr);
    if (fd < 0) {
      status = ErrnoStatus(-fd, "load lab_xdp_pass");
      return;
    }
    int ifindex = static_cast<int>(if_nametoindex(dev.c_str()));
    int err = ifindex == 0 ? -ENODEV : bpf_xdp_attach(ifindex, fd, XDP_FLAGS_DRV_MODE, nullptr);
    close(fd);
    if (err != 0) {
      status = ErrnoStatus(-err, absl::StrCat("attach lab_xdp_pass to ", netns, "/", dev));
    }
  });
  worker.join();
  return status;
}

// A veth hands a TCP/UDP packet on with the checksum its sender's stack left to "hardware"
// (CHECKSUM_PARTIAL: only the pseudo header's sum in the field), and the skb's state says so; an
// XDP program sees the bytes alone, and a frame it sends with XDP_TX or a redirect arrives with
// that partial sum as its checksum, which the receiver rejects. Checksums computed in software
// before eth0 sends (tx checksumming off) make the underlay carry what a wire carries.
absl::Status ChecksumOnTheWire(const std::string& netns) {
  return RunChecked({"ip", "netns", "exec", netns, "ethtool", "-K", "eth0", "tx", "off"});
}

// The router: eth0 on the underlay, eth1 to the client's network, forwarding between them. It
// sends no ICMP redirects: a node's packet for another node's pods leaves by the interface it
// came in on, and a redirect would teach the node the direct path the lab exists to avoid.
absl::Status CreateRouterLinks(const Topology& t) {
  if (auto st = AttachToUnderlay(t, t.router_netns, "rtr", t.router_ip); !st.ok()) return st;
  if (auto st = Ip({"netns", "add", t.client_netns}); !st.ok()) return st;
  std::string router_side = absl::StrCat(t.client_net.substr(0, t.client_net.rfind('.')), ".1");
  std::vector<std::vector<std::string>> steps = {
      {"-n", t.client_netns, "link", "set", "lo", "up"},
      {"-n", t.router_netns, "link", "add", "eth1", "type", "veth", "peer", "name", "eth0", "netns",
       t.client_netns},
      {"-n", t.router_netns, "addr", "add", router_side + "/24", "dev", "eth1"},
      {"-n", t.router_netns, "link", "set", "eth1", "up"},
      {"-n", t.client_netns, "addr", "add", t.client_ip + "/24", "dev", "eth0"},
      {"-n", t.client_netns, "link", "set", "eth0", "up"},
      {"-n", t.client_netns, "route", "add", "default", "via", router_side},
  };
  for (const auto& s : steps) {
    if (auto st = Ip(s); !st.ok()) return st;
  }
  for (const char* sysctl : {"net.ipv4.ip_forward=1", "net.ipv4.conf.all.send_redirects=0",
                             "net.ipv4.conf.eth0.send_redirects=0"}) {
    if (auto st = RunChecked({"ip", "netns", "exec", t.router_netns, "sysctl", "-qw", sysctl});
        !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

absl::Status CreateLinks(const Topology& t) {
  if (auto st = Ip({"netns", "add", t.underlay_netns}); !st.ok()) return st;
  std::vector<std::vector<std::string>> steps = {
      {"-n", t.underlay_netns, "link", "set", "lo", "up"},
      {"-n", t.underlay_netns, "link", "add", "br0", "type", "bridge"},
      {"-n", t.underlay_netns, "addr", "add", absl::StrCat(t.gateway_ip, "/", t.prefix_len), "dev",
       "br0"},
      {"-n", t.underlay_netns, "link", "set", "br0", "up"},
  };
  for (const auto& s : steps) {
    if (auto st = Ip(s); !st.ok()) return st;
  }
  for (size_t k = 0; k < t.nodes.size(); ++k) {
    const LabNode& n = t.nodes[k];
    for (const char* sub : {"bpf", "state", "net.d", "bin", "log"}) {
      fs::create_directories(absl::StrCat(n.dir, "/", sub));
    }
    // A node's CNI bin dir holds its runtime's reference plugins; the agent installs its conflist
    // only once the loopback plugin it needs is there.
    for (const char* loopback : {"/opt/cni/bin/loopback", "/usr/lib/cni/loopback"}) {
      std::error_code ec;
      if (!fs::exists(loopback, ec)) continue;
      fs::create_symlink(loopback, n.cni_bin_dir() + "/loopback", ec);
      break;
    }
    // bpffs mounted from the root mount namespace (not inside the agent's `ip netns exec`
    // mount namespace), so pins survive an agent restart as /sys/fs/bpf does on a real node.
    // mode=0700 as on a real node (systemd mounts /sys/fs/bpf so): the kernel's default root is
    // 1777, which lets any user pin (or squat) names under Sluice's root.
    if (mount("bpffs", n.bpffs().c_str(), "bpf", 0, "mode=0700") != 0) {
      return ErrnoStatus(errno, absl::StrCat("mount bpffs on ", n.bpffs()));
    }
    if (chmod(n.bpffs().c_str(), 0700) != 0) {
      return ErrnoStatus(errno, absl::StrCat("chmod 0700 ", n.bpffs()));
    }
    if (auto st = AttachToUnderlay(t, n.netns, absl::StrCat("n", k + 1), n.ip); !st.ok()) {
      return st;
    }
    if (AgentsRunXdp()) {
      if (auto st = AttachXdpPass(t.underlay_netns, absl::StrCat("n", k + 1)); !st.ok()) return st;
      if (auto st = ChecksumOnTheWire(n.netns); !st.ok()) return st;
    }
  }
  if (auto st = AttachToUnderlay(t, t.external_netns, "ext", t.external_ip); !st.ok()) return st;
  if (t.bgp) {
    if (auto st = CreateRouterLinks(t); !st.ok()) return st;
  }
  return AgentsRunXdp() ? ChecksumOnTheWire(t.external_netns) : absl::OkStatus();
}

}  // namespace

const LabNode* Topology::FindNode(const std::string& name) const {
  for (const auto& n : nodes) {
    if (n.name == name) return &n;
  }
  return nullptr;
}

absl::Status ValidateLabName(const std::string& name) {
  bool ok = !name.empty() && name.size() <= 24 && std::isalnum(static_cast<unsigned char>(name[0]));
  for (char c : name) {
    if (!(std::islower(static_cast<unsigned char>(c)) ||
          std::isdigit(static_cast<unsigned char>(c)) || c == '-')) {
      ok = false;
    }
  }
  if (name.find("-pod-") != std::string::npos) ok = false;
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lab name \"", name, "\": want 1-24 of [a-z0-9-], starting alphanumeric, no \"-pod-\""));
  }
  return absl::OkStatus();
}

std::string LabDir(const std::string& lab) { return absl::StrCat(kLabRunRoot, "/", lab); }

std::vector<std::string> ListLabs() {
  std::vector<std::string> labs;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(kLabRunRoot, ec)) {
    if (e.is_directory() && fs::exists(e.path() / kTopologyFile)) {
      labs.push_back(e.path().filename());
    }
  }
  std::sort(labs.begin(), labs.end());
  return labs;
}

absl::StatusOr<Topology> LoadTopology(const std::string& lab) {
  if (auto st = ValidateLabName(lab); !st.ok()) return st;
  std::string path = absl::StrCat(LabDir(lab), "/", kTopologyFile);
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("no lab \"", lab, "\" (", path, ")"));
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::DataLossError(absl::StrCat("unreadable ", path));
  }
  Topology t = Describe(lab, j.value("index", 0), 0, j.value("bgp", false));
  for (const auto& n : j.value("nodes", json::array())) {
    t.nodes.push_back({.name = n.value("name", ""),
                       .netns = n.value("netns", ""),
                       .ip = n.value("ip", ""),
                       .dir = n.value("dir", "")});
  }
  return t;
}

absl::StatusOr<Topology> CreateTopology(const std::string& lab, int nodes, bool bgp) {
  if (auto st = ValidateLabName(lab); !st.ok()) return st;
  if (nodes < 1 || nodes > 50) return absl::InvalidArgumentError("--nodes must be 1..50");
  Topology t;
  {
    LabLock lock;
    if (fs::exists(LabDir(lab))) {
      return absl::AlreadyExistsError(absl::StrCat("lab \"", lab, "\" exists (", LabDir(lab),
                                                   "); `sluice-lab down --name ", lab, "` first"));
    }
    std::set<int> used;
    for (const auto& other : ListLabs()) {
      if (auto o = LoadTopology(other); o.ok()) used.insert(o->index);
    }
    int index = 0;
    while (used.contains(index)) ++index;
    if (index > 254) return absl::ResourceExhaustedError("no free underlay /24 for another lab");
    t = Describe(lab, index, nodes, bgp);
    fs::create_directories(absl::StrCat(t.dir, "/pods"));
    // Recorded before anything is made, so `down` can clean up after a failure half-way.
    if (auto st = WriteTopology(t); !st.ok()) return st;
  }
  for (const auto& ns : {t.underlay_netns, t.external_netns, t.router_netns, t.client_netns}) {
    if ((ns == t.router_netns || ns == t.client_netns) && !t.bgp) continue;
    if (NetnsExists(ns)) {
      return absl::AlreadyExistsError(absl::StrCat("network namespace ", ns, " already exists"));
    }
  }
  if (auto st = CreateLinks(t); !st.ok()) {
    DestroyTopology(t).IgnoreError();
    return st;
  }
  return t;
}

void KillNetnsProcesses(const std::string& netns) {
  for (int round = 0; round < 3; ++round) {
    auto r = RunProcess({.argv = {"ip", "netns", "pids", netns}}, absl::Seconds(10));
    if (!r.ok() || r->exit_code != 0) return;
    bool any = false;
    for (absl::string_view line : absl::StrSplit(r->out, '\n', absl::SkipWhitespace())) {
      int pid = 0;
      if (absl::SimpleAtoi(line, &pid) && pid > 1 && pid != getpid()) {
        kill(pid, SIGKILL);
        any = true;
      }
    }
    if (!any) return;
    usleep(50'000);
  }
}

absl::Status CreatePodNetns(const Topology& t, const std::string& netns) {
  fs::create_directories(absl::StrCat(t.dir, "/pods"));
  std::ofstream(absl::StrCat(t.dir, "/pods/", netns)).put('\n');
  if (!NetnsExists(netns)) {
    if (auto st = Ip({"netns", "add", netns}); !st.ok()) return st;
  }
  return Ip({"-n", netns, "link", "set", "lo", "up"});
}

absl::Status DeletePodNetns(const Topology& t, const std::string& netns) {
  absl::Status result;
  if (NetnsExists(netns)) {
    KillNetnsProcesses(netns);
    result = Ip({"netns", "del", netns});
  }
  std::error_code ec;
  if (result.ok()) fs::remove(absl::StrCat(t.dir, "/pods/", netns), ec);
  return result;
}

absl::Status DestroyTopology(const Topology& t) {
  absl::Status first;
  auto note = [&](absl::Status st) {
    if (!st.ok()) {
      spdlog::warn("teardown of lab {}: {}", t.lab, st.ToString());
      if (first.ok()) first = st;
    }
  };
  std::vector<std::string> namespaces;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(absl::StrCat(t.dir, "/pods"), ec)) {
    namespaces.push_back(e.path().filename());
  }
  for (const auto& n : t.nodes) namespaces.push_back(n.netns);
  if (t.bgp) {
    namespaces.push_back(t.client_netns);
    namespaces.push_back(t.router_netns);
  }
  namespaces.push_back(t.external_netns);
  namespaces.push_back(t.underlay_netns);
  for (const auto& ns : namespaces) {
    if (!NetnsExists(ns)) continue;
    KillNetnsProcesses(ns);
    note(Ip({"netns", "del", ns}));
  }
  // Every mount under the lab's directory (the bpffs of each node), deepest first.
  std::vector<std::string> mounts;
  std::ifstream proc_mounts("/proc/self/mounts");
  std::string line;
  while (std::getline(proc_mounts, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    if (f.size() > 1 && (f[1] == t.dir || f[1].rfind(t.dir + "/", 0) == 0)) mounts.push_back(f[1]);
  }
  std::sort(mounts.rbegin(), mounts.rend());
  for (const auto& m : mounts) {
    if (umount2(m.c_str(), MNT_DETACH) != 0) {
      note(ErrnoStatus(errno, absl::StrCat("umount ", m)));
    }
  }
  if (t.bgp) fs::remove_all(absl::StrCat("/run/frr/", t.frr_pathspace()), ec);
  if (first.ok()) {
    fs::remove_all(t.dir, ec);
    if (ec) note(absl::InternalError(absl::StrCat("remove ", t.dir, ": ", ec.message())));
  }
  return first;
}

}  // namespace sluice::lab
