// Service load balancing as the agent runs it (kube-proxy replacement): socket LB for the node's
// own processes, NodePort acceleration (XDP), and the Service maps following the Services and
// EndpointSlices.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/conntrack/gc.h"
#include "agent/metrics/agent_endpoints.h"
#include "agent/metrics/http_server.h"
#include "agent/routing/node_setup.h"
#include "agent/service/health_check.h"
#include "agent/service/reconciler.h"
#include "agent/service/sync.h"
#include "agent/start/pieces.h"

namespace sluice::agent {

// Host-network clients reach Services through their sockets: attaches socket LB to `cgroup_root`
// ("": the cgroup2 mount, else one mounted at /run/sluice/cgroupv2), or detaches it when not
// `enabled`. Links pinned in the bpffs keep the programs attached across agent restarts.
[[nodiscard]] absl::Status StartSocketLb(const StartPieces& pieces, bool enabled,
                                         std::string cgroup_root);

struct RunningLbAcceleration {
  std::atomic<int> xdp_mode{0};  // a loader::XdpMode
  std::atomic<uint64_t> xdp_refused{0};
  std::optional<metrics::ScopedCollector> acceleration_metrics;  // reads the two above
};

// NodePort acceleration: `native` attaches sluice_xdp_net to the node's native device (a restart
// swaps the program in place), otherwise unpins it. Another program's XDP on the device is never
// replaced: NodePorts are then balanced at TC only, and it is counted.
[[nodiscard]] absl::StatusOr<std::unique_ptr<RunningLbAcceleration>> StartLbAcceleration(
    const StartPieces& pieces, bool native, const Node& node);

struct RunningServices {
  std::unique_ptr<BpfLbMaps> lb_maps;
  std::unique_ptr<ServiceReconciler> reconciler;  // writes lb_maps: declared after them
  std::unique_ptr<HealthCheckServers> health_checks;
  std::unique_ptr<ServiceSync> sync;                        // drives both: declared after them
  std::optional<metrics::ScopedCollector> refusal_metrics;  // reads sync: declared after it
};

// Backend selection (--lb_algorithm, --maglev_table_size).
struct LbAlgorithmOptions {
  bool maglev_default = false;  // NodeContext::maglev_default
  uint32_t maglev_table_size = kDefaultMaglevTableSize;
};

// Needs the pieces' Kubernetes state. The Service maps are restored from what is pinned, then
// follow the Services and EndpointSlices; flow entries the reconciler splits are reported to `gc`.
// With `socket_lb`, a connected UDP socket sent to a backend that goes is closed.
[[nodiscard]] absl::StatusOr<std::unique_ptr<RunningServices>> StartServices(
    const StartPieces& pieces, conntrack::ConntrackGc& gc, bool socket_lb, const Node& node,
    const LbAlgorithmOptions& lb_algorithm = {});

// GET /v1/services: every Service with the reason a port serves nothing (`sluicectl services`).
metrics::HttpReply ServicesRoute(KubernetesState* k8s);

}  // namespace sluice::agent
