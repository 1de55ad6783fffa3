// The lab's network: an underlay namespace with a bridge (the control plane's address is its
// .1), one namespace per node attached to it by a veth (eth0), an "external" namespace standing
// for a client outside the cluster, with `up --bgp` a router namespace on the underlay running
// FRR (router.h) and a client namespace behind it, and per-node bpffs mounts and state directories
// under /run/sluice-lab/<lab>/. Every lab gets its own /24 (172.30.<index>.0/24) so labs coexist.
// Links and namespaces are made with iproute2 (`ip`), run with an argv, exit codes checked.
#ifndef SLUICE_AGENT_LAB_NETWORK_TOPOLOGY_H_
#define SLUICE_AGENT_LAB_NETWORK_TOPOLOGY_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sluice::lab {

inline constexpr char kLabRunRoot[] = "/run/sluice-lab";
inline constexpr char kNetnsDir[] = "/var/run/netns";

struct LabNode {
  std::string name;   // Node object name: node1, node2, ...
  std::string netns;  // <lab>-node1
  std::string ip;     // underlay address, 172.30.<index>.(10+k)
  std::string dir;    // /run/sluice-lab/<lab>/node1
  std::string bpffs() const { return dir + "/bpf"; }
  std::string state_dir() const { return dir + "/state"; }
  std::string socket() const { return dir + "/sluice.sock"; }
  std::string observe_socket() const { return dir + "/observe.sock"; }  // sluicectl observe
  std::string cni_conf_dir() const { return dir + "/net.d"; }
  std::string cni_bin_dir() const { return dir + "/bin"; }
  std::string log_dir() const { return dir + "/log"; }
  std::string netns_path() const { return std::string(kNetnsDir) + "/" + netns; }
};

struct Topology {
  std::string lab;  // the lab's name
  int index = 0;    // third octet of the underlay
  std::string dir;  // /run/sluice-lab/<lab>
  std::string underlay_netns;
  std::string external_netns;
  std::string gateway_ip;   // 172.30.<index>.1, the control plane on the underlay bridge
  std::string external_ip;  // 172.30.<index>.200
  int prefix_len = 24;
  std::vector<LabNode> nodes;
  // `up --bgp`: a top-of-rack router on the underlay (172.30.<index>.254) and a client behind it
  // on a network of its own, 172.31.<index>.0/24 (router .1, client .2).
  bool bgp = false;
  std::string router_netns;  // <lab>-router
  std::string router_ip;
  std::string client_netns;  // <lab>-client
  std::string client_ip;
  std::string client_net;                                     // 172.31.<index>.0/24
  std::string router_dir() const { return dir + "/router"; }  // FRR's configs, vty sockets, pids
  std::string frr_pathspace() const { return "sluice-lab-" + lab; }  // /run/frr/<this>

  std::string PodNetns(const std::string& ns, const std::string& pod) const {
    return lab + "-pod-" + ns + "-" + pod;
  }
  std::string netns_path(const std::string& netns) const {
    return std::string(kNetnsDir) + "/" + netns;
  }
  const LabNode* FindNode(const std::string& name) const;
};

// Lab names become namespace names and paths: [a-z0-9-], 1-24 characters, starting alphanumeric.
absl::Status ValidateLabName(const std::string& name);
std::string LabDir(const std::string& lab);
// Names of the labs that have a state directory.
std::vector<std::string> ListLabs();

// Claims an index (lowest free), creates everything and records it in <dir>/topology.json.
// On failure, whatever was created is removed again.
// With `bgp`, the router's and the client's namespaces too (the router's daemons are the control
// plane's to start: router.h).
absl::StatusOr<Topology> CreateTopology(const std::string& lab, int nodes, bool bgp = false);
// The recorded topology of an existing lab.
absl::StatusOr<Topology> LoadTopology(const std::string& lab);
// Removes the namespaces (after killing every process still in them), the recorded pod
// namespaces (<dir>/pods/<netns> markers), the bpffs mounts and the lab's directory. Best effort
// and idempotent: works on a partial lab; returns the first error it met.
absl::Status DestroyTopology(const Topology& topology);

// Pod namespaces: created with lo up, recorded as <dir>/pods/<netns> so teardown finds them even
// after a crash of the control plane.
absl::Status CreatePodNetns(const Topology& topology, const std::string& netns);
absl::Status DeletePodNetns(const Topology& topology, const std::string& netns);

// Kills (SIGKILL) every process inside a network namespace.
void KillNetnsProcesses(const std::string& netns);

}  // namespace sluice::lab

#endif  // SLUICE_AGENT_LAB_NETWORK_TOPOLOGY_H_
