// The lab's container runtime for Sluice's own workloads, so the Helm chart installs into the lab
// as into a cluster (`sluice-lab up --no-agents`, then `kubectl apply` of the rendered chart):
//  - a DaemonSet and Deployment controller for the workloads whose pods run the Sluice image
//    (helm/Dockerfile): one pod per matching Node (rolling update honouring maxUnavailable) and
//    `replicas` pods on distinct Nodes (podAntiAffinity by hostname, as the chart's operator
//    asks), each with ownerReferences and a template hash label; pods whose owner is gone are
//    deleted (the garbage collector's part);
//  - a runtime for pods of that image on lab nodes: every container is a process in the node's
//    network namespace with a private mount namespace of its own, as a container runtime gives
//    it: the image's files (/usr/local/bin/sluice-agent, sluice-cni, sluice-operator, sluicectl
//    bind-mounted from the build), hostPath volumes bind-mounted from the node's lab directories
//    (HostPathTable), configMap volumes as one file per key, the service-account token, ca.crt
//    and namespace, env with fieldRef resolved, capabilities as the securityContext says, init
//    containers in order before the main one, readinessProbe (httpGet in the node's namespace)
//    reported as the Pod's Ready condition, restart with back-off on exit, preStop then SIGTERM
//    on deletion.
// The lab kubelet (node/kubelet.h) leaves these pods alone and runs the CNI plugin in the node's
// view of its host paths (NodeViewSpecPath), where the conflist the agent wrote names them.
#ifndef SLUICE_AGENT_LAB_WORKLOADS_WORKLOADS_H_
#define SLUICE_AGENT_LAB_WORKLOADS_WORKLOADS_H_

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/lab/network/topology.h"
#include "agent/lab/store/object_store.h"
#include "nlohmann/json.hpp"

namespace sluice::lab {

// An image of the chart's (helm/Dockerfile): "[registry/]repo/sluice-agent[:tag][@digest]".
bool IsSluiceImage(const std::string& image);
// Does any container or init container of this Pod run it?
bool RunsSluiceImage(const nlohmann::json& pod);

// A host path of a node and what stands for it in the lab. kind "bind": `lab_path` is
// bind-mounted; "proc": a proc mount of the container's own (the node's namespaces).
struct HostPathEntry {
  std::string host_path;
  std::string kind;
  std::string lab_path;
};
// Every host path the lab maps for `node` (docs/lab.md has the table): /proc, /sys/fs/bpf,
// /run/sluice/cgroupv2 (the machine's cgroup2 mount), /run/sluice, /var/lib/sluice,
// /opt/cni/bin, /etc/cni/net.d.
std::vector<HostPathEntry> HostPathTable(const LabNode& node);
// The entry for `host_path` (exact, or a path below a mapped one: a bind of the matching
// sub-directory); NotFound for a host path the lab has no stand-in for.
absl::StatusOr<HostPathEntry> MapHostPath(const LabNode& node, const std::string& host_path);

// One container's process, as `sluice-lab container --spec FILE` starts it.
struct ContainerMount {
  std::string source;         // a path in the root mount namespace ("" for kind proc)
  std::string target;         // inside the container
  std::string kind = "bind";  // bind | proc
  bool read_only = false;
};
struct ContainerSpec {
  std::string scratch_dir;  // the container's root (an overlay of the machine's /) lives here
  std::vector<ContainerMount> mounts;
  std::vector<std::string> argv;  // empty: the argv after `--`
  std::vector<std::string> env;   // empty: inherited
  bool restrict_caps = false;     // true: the bounding set is `caps` only
  std::vector<std::string> caps;  // "NET_ADMIN", ...
  int uid = 0;
  int gid = 0;
};
nlohmann::json ContainerSpecToJson(const ContainerSpec& spec);
absl::StatusOr<ContainerSpec> ContainerSpecFromJson(const nlohmann::json& j);
// `path` inside a container's root directory with its symlinks resolved against that root, as
// after a chroot: with <root>/var/run -> /run, /var/run/x is <root>/run/x, never the machine's
// /run/x (mounts and mkdirs made from outside the chroot must not land on the machine).
absl::StatusOr<std::string> ResolveInRoot(const std::string& root, const std::string& path);
// `sluice-lab container --spec FILE [-- ARGV...]`, already in the node's network namespace:
// unshares the mount namespace (everything rslave: the host's later mounts, such as new pod
// network namespaces, show; nothing made here reaches the host), builds the root (an overlay of
// / with fresh /proc, /sys, /run and /tmp, the host's /dev and /run/netns), mounts the spec's
// mounts, chroots, limits capabilities, sets uid/gid and execs. Returns only on failure.
int RunContainer(const std::string& spec_path, const std::vector<std::string>& argv);

// <node dir>/node-view.json: the spec (mounts of HostPathTable only) under which the kubelet runs
// the CNI plugin of a node whose Sluice came from the chart; absent otherwise.
std::string NodeViewSpecPath(const LabNode& node);

// Node Ready follows the node's CNI configuration (05-sluice.conflist), as a kubelet's
// NetworkReady does: False with KubeletNotReady and the runtime's message until it exists.
void SyncNodeReady(ObjectStore* store, const Topology& topology);

struct WorkloadOptions {
  std::string self_exe;                            // sluice-lab (runs `container`)
  std::map<std::string, std::string> image_files;  // name in /usr/local/bin -> built binary
  std::string token;                               // the service accounts' token
  std::string ca_pem;                              // ca.crt
  absl::Duration tick = absl::Milliseconds(100);
  absl::Duration probe_period_cap = absl::Seconds(1);  // the lab probes at least this often
  std::function<void()> on_change;
};

class Workloads {
 public:
  Workloads(ObjectStore* store, Topology topology, WorkloadOptions options);
  ~Workloads();
  Workloads(const Workloads&) = delete;
  Workloads& operator=(const Workloads&) = delete;

  absl::Status Start();
  // Stops every container (no preStop: the lab is going away) and the loop.
  void Stop();

 private:
  struct Container;
  struct PodRun;
  void Run();
  void Reconcile();
  void ReconcileDaemonSet(const nlohmann::json& ds, const std::vector<nlohmann::json>& pods,
                          const std::vector<nlohmann::json>& nodes);
  void ReconcileDeployment(const nlohmann::json& deploy, const std::vector<nlohmann::json>& pods,
                           const std::vector<nlohmann::json>& nodes);
  void CreatePod(const nlohmann::json& owner, const std::string& hash_label,
                 const std::string& hash, const std::string& node);
  void DeletePod(const nlohmann::json& pod);
  void SyncPods();
  absl::Status StartPod(PodRun& run);
  absl::StatusOr<ContainerSpec> BuildContainer(const PodRun& run, const nlohmann::json& c);
  absl::StatusOr<pid_t> StartContainer(const PodRun& run, const std::string& name,
                                       const ContainerSpec& spec);
  void BeginTermination(PodRun& run);
  void Probe(PodRun& run);
  void WriteStatus(PodRun& run);
  void WriteFailedStatus(const nlohmann::json& pod, const std::string& message);

  ObjectStore* store_;
  Topology topology_;
  WorkloadOptions options_;
  std::map<std::string, std::unique_ptr<PodRun>> runs_;  // by pod uid; the loop thread's only
  std::map<std::string, std::string> failed_;            // pod uid -> why it could not start
  std::thread thread_;
  std::atomic<bool> stopping_{false};
};

}  // namespace sluice::lab

#endif  // SLUICE_AGENT_LAB_WORKLOADS_WORKLOADS_H_
