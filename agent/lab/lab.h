// A lab as a whole: `up` (topology + the control-plane daemon), the daemon itself (apiserver,
// controllers, Node objects, one sluice-agent per node, the kubelet), `down`, `status`, and the
// name -> namespace resolution the CLI's exec/probe/request use.
#ifndef SLUICE_AGENT_LAB_LAB_H_
#define SLUICE_AGENT_LAB_LAB_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/lab/network/topology.h"
#include "nlohmann/json.hpp"

namespace sluice::lab {

inline constexpr int kUnderlayApiPort = 6443;

struct UpOptions {
  std::string name = "lab";
  int nodes = 2;
  absl::Duration timeout = absl::Seconds(90);  // API answering and every agent ready
  // Nodes without agents (and without the lab's pod CIDR allocator): Sluice is then installed
  // from the Helm chart with kubectl, its DaemonSet and operator run by the lab (workloads/).
  bool no_agents = false;
  // A router running FRR on the underlay and a client behind it; every agent peers with the
  // router over BGP (agent/lab/network/router.h).
  bool bgp = false;
};

// Where the sibling binaries are: <build>/agent/lab/sluice-lab -> <build>/agent/sluice-agent and
// <build>/cni/sluice-cni (overridable with SLUICE_LAB_AGENT / SLUICE_LAB_CNI).
std::string AgentBinary();
std::string CniBinary();
// `sluice-lab sluicectl`'s binary: $SLUICE_LAB_SLUICECTL, else the build's agent/sluicectl.
std::string SluicectlBinary();

// The command line of one node's agent (inside `ip netns exec`). Today the pod CIDR comes from
// the Node object and is passed as --pod_cidr. SLUICE_LAB_AGENT_FROM_API=1 passes
// --kubeconfig=<lab>/kubeconfig-nodes --node_name=<node> instead; SLUICE_LAB_AGENT_ARGS (split
// on spaces) is appended either way.
std::vector<std::string> AgentCommand(const Topology& topology, const LabNode& node,
                                      const std::string& pod_cidr);

// Creates the topology, starts the daemon and waits for it; returns the kubeconfig path.
absl::StatusOr<std::string> Up(const UpOptions& options, const std::string& self_exe);
// The daemon (`sluice-lab controlplane --name NAME`): runs until SIGTERM/SIGINT, then deletes
// the pods (CNI DEL), stops the agents, and removes the whole topology.
// With `no_agents` (`up --no-agents`): no agents, no pod CIDR allocator, Nodes NotReady until a
// conflist appears, and the workload runtime for the chart's DaemonSet and Deployment.
int RunControlPlane(const std::string& name, bool no_agents = false);
// Stops the daemon and removes everything the lab made (also after a crash).
absl::Status Down(const std::string& name);
// Human-readable: nodes, pod CIDRs, agents' liveness, pods with IPs.
absl::StatusOr<std::string> Status(const std::string& name);

// The lab a command means: `flag` if set, else the only lab present.
absl::StatusOr<std::string> ResolveLab(const std::string& flag);
// "external" | "node/NODE" | "NAMESPACE/POD" -> the network namespace's path.
absl::StatusOr<std::string> ResolveNetns(const Topology& topology, const std::string& from);
std::string KubeconfigPath(const std::string& lab);
// POSTs `body` ({"action": "cut-watches" | "expire-watches" | "stall" | "go-away" | "compact",
// ...}) to the admin endpoint /lab/faults of the apiserver `kubeconfig` points at; returns the
// body.
absl::StatusOr<std::string> Fault(const std::string& kubeconfig, const nlohmann::json& body);

// `sluice-lab agent ACTION --node NODE`: what the control plane's supervisor does to one node's
// agent. kill: SIGKILL (a crash; restarted after the back-off); restart: SIGTERM (restarted
// likewise); stop: holds it down (<node>/agent.hold), SIGTERM, waits until it is gone; start:
// releases the hold. With `wait` (kill, restart, start) returns once a new agent process is up.
// Returns "OLD_PID -> NEW_PID" (0 for none).
absl::StatusOr<std::string> AgentAction(const std::string& lab, const std::string& node,
                                        const std::string& action, bool wait);

}  // namespace sluice::lab

#endif  // SLUICE_AGENT_LAB_LAB_H_
