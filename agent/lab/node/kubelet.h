// The lab's kubelet (and scheduler), running inside the control-plane daemon: watches Pods in the
// ObjectStore; binds unscheduled pods to the node with the fewest pods; for a pod on a lab node
// makes its network namespace, calls the node's installed CNI plugin exactly as a container
// runtime does (CNI_* environment + the conflist's plugin conf on stdin), starts a netexec
// server per containerPort and the container's `command` in that namespace, and, once every
// netexec server has bound its ports (it says READY=1 on a notify socket, as sd_notify does),
// reports the pod Running with its IP and Ready condition (off with annotation
// lab.sluice.dev/ready: "false"). It records core/v1 Events as kubelet and scheduler do:
// Scheduled, Started, and Warnings for a failed start (FailedCreatePodSandBox with the CNI
// plugin's error, NetworkNotReady while the node's agent has not installed its CNI config).
// A hostNetwork pod (spec.hostNetwork: true) runs in its node's namespace: no namespace of its
// own, no CNI ADD/DEL, status.podIP is the node's InternalIP (as a real kubelet reports it).
// A pod keeps running while terminating (deletionTimestamp set) and is torn down — processes
// killed, CNI DEL, namespace deleted — once it is really gone from the store.
#ifndef SLUICE_AGENT_LAB_NODE_KUBELET_H_
#define SLUICE_AGENT_LAB_NODE_KUBELET_H_

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/lab/network/topology.h"
#include "agent/lab/node/events.h"
#include "agent/lab/store/object_store.h"
#include "nlohmann/json.hpp"

namespace sluice::lab {

inline constexpr char kReadyAnnotation[] = "lab.sluice.dev/ready";

struct KubeletOptions {
  std::string netexec_binary;                        // `sluice-lab` itself (runs `netexec`)
  absl::Duration retry_interval = absl::Seconds(2);  // after a failed pod start (agent not up)
  // A failed CNI DEL is retried (doubling from `initial` up to `cap`) while the sandbox (the
  // pod's network namespace) is kept, until DEL succeeds, the namespace is gone, or `give_up`
  // after the first failure; then the namespace is deleted anyway and the failure logged.
  absl::Duration del_retry_initial = absl::Seconds(1);
  absl::Duration del_retry_cap = absl::Seconds(16);
  absl::Duration del_retry_give_up = absl::Minutes(5);
  std::function<void()> on_change;  // after pods were started or torn down (status file)
  size_t event_limit = EventRecorder::kDefaultLimit;  // core/v1 Events kept (oldest evicted)
};

struct RunningPod {
  std::string namespace_name;
  std::string name;
  std::string uid;
  std::string node;
  std::string netns;  // the node's for a hostNetwork pod
  std::string ip;
  bool host_network = false;
  bool ready = false;
  std::vector<pid_t> pids;
  // The pod's kubernetes.io/ingress-bandwidth and egress-bandwidth annotations ("" : none).
  std::string ingress_bandwidth;
  std::string egress_bandwidth;
};

// A bandwidth annotation's quantity ("8M", "500k", "1Gi", "1000000") in bits per second, as the
// runtime reads it: refused outside 1 kbit/s .. 1 Pbit/s, as the kubelet's own check does.
absl::StatusOr<uint64_t> ParseBandwidthQuantity(const std::string& text);
// runtimeConfig "bandwidth" as containerd passes it for `pod` (a rate per annotation, its burst
// math.MaxUint32: none given); null when the pod has neither annotation.
absl::StatusOr<nlohmann::json> RuntimeBandwidth(const RunningPod& pod);

// The plugin configuration a runtime hands a plugin of a conflist: plugins[0] plus the list's
// cniVersion and name (what libcni does).
absl::StatusOr<nlohmann::json> PluginConfFromConflist(const std::string& conflist_path);
// ips[0].address of a CNI result, without the prefix length.
absl::StatusOr<std::string> PodIpFromCniResult(const std::string& result);
// What a failed plugin said, as libcni reports it: the CNI error object's "msg" (and
// "; details"), else its raw output.
std::string CniErrorText(const std::string& out, const std::string& err);

// The schedule of CNI DEL retries, as a real kubelet keeps retrying StopPodSandbox: per pod
// sandbox (key: pod uid), when the next attempt is due and when to give up.
class CniDelRetries {
 public:
  CniDelRetries(absl::Duration initial, absl::Duration cap, absl::Duration give_up)
      : initial_(initial), cap_(cap), give_up_(give_up) {}
  // DEL failed (first or again) at `now`. False when the retries are over (give up now).
  bool Failed(const std::string& key, absl::Time now);
  void Done(const std::string& key) { entries_.erase(key); }
  // Keys whose next attempt is due.
  std::vector<std::string> Due(absl::Time now) const;
  size_t size() const { return entries_.size(); }
  int attempts(const std::string& key) const;

 private:
  struct Entry {
    absl::Time first_failure;
    absl::Time next;
    absl::Duration delay;
    int attempts = 0;
  };
  const absl::Duration initial_, cap_, give_up_;
  std::map<std::string, Entry> entries_;
};

class Kubelet {
 public:
  Kubelet(ObjectStore* store, Topology topology, KubeletOptions options);
  ~Kubelet();
  Kubelet(const Kubelet&) = delete;
  Kubelet& operator=(const Kubelet&) = delete;

  absl::Status Start();
  // Stops watching, then tears every running pod down (CNI DEL while the agents still run).
  void Stop();

  std::vector<RunningPod> Pods() const;
  // Pod sandboxes whose CNI DEL failed and is being retried.
  size_t PendingDels() const;

 private:
  void Run();
  void Handle(EventType type, const nlohmann::json& pod);
  void Resync();
  void RetryFailed();
  void Schedule(const nlohmann::json& pod);
  absl::Status StartPod(const nlohmann::json& pod, const LabNode& node);
  void TearDown(const RunningPod& pod);
  // CNI DEL, then the namespace; a failed DEL keeps the namespace and schedules a retry.
  void ReleaseSandbox(const RunningPod& pod, const LabNode& node);
  void RetryDels(bool last_chance);
  absl::Status WriteStatus(const RunningPod& pod, const nlohmann::json& spec_pod);
  // A pod whose start failed: Pending, its containers waiting in ContainerCreating, as a real
  // kubelet reports a pod whose sandbox cannot be created.
  void WritePendingStatus(const nlohmann::json& spec_pod);
  absl::StatusOr<std::string> Cni(const std::string& command, const RunningPod& pod,
                                  const LabNode& node);

  ObjectStore* store_;
  Topology topology_;
  KubeletOptions options_;
  EventRecorder events_{store_, options_.event_limit};
  std::unique_ptr<WatchStream> watch_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};

  mutable std::mutex mu_;                   // guards pods_ (read by Pods() from other threads)
  std::map<std::string, RunningPod> pods_;  // "ns/name"
  std::map<std::string, nlohmann::json> failed_;  // waiting for a retry
  std::map<std::string, int> bound_;              // node -> pods bound by us not yet started
  absl::Time next_retry_ = absl::InfinitePast();
  // Sandboxes waiting for a successful CNI DEL, by pod uid (guarded by mu_).
  std::map<std::string, RunningPod> del_pending_;
  CniDelRetries del_retries_{options_.del_retry_initial, options_.del_retry_cap,
                             options_.del_retry_give_up};
};

}  // namespace sluice::lab

#endif  // SLUICE_AGENT_LAB_NODE_KUBELET_H_
