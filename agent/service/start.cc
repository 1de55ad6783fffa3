#include "agent/service/start.h"

#include <utility>

#include "agent/k8s/watches.h"
#include "agent/kernel/sock_destroy.h"
#include "agent/service/explain.h"
#include "loader/cgroup.h"
#include "loader/datapath.h"
#include "spdlog/spdlog.h"

namespace sluice::agent {

absl::Status StartSocketLb(const StartPieces& pieces, bool enabled, std::string cgroup_root) {
  loader::Datapath& dp = *pieces.datapath;
  if (!enabled) {
    if (auto st = dp.DetachSocketLb(); !st.ok()) return StartError(st, "detach socket LB");
    return absl::OkStatus();
  }
  if (cgroup_root.empty()) {
    auto found = loader::FindOrMountCgroup2("/run/sluice/cgroupv2");
    if (!found.ok()) return StartError(found.status(), "find the cgroup2 mount for socket LB");
    cgroup_root = *found;
  }
  if (auto st = dp.AttachSocketLb(cgroup_root); !st.ok()) return StartError(st, "attach socket LB");
  spdlog::info("socket LB attached to cgroup {}", cgroup_root);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RunningLbAcceleration>> StartLbAcceleration(
    const StartPieces& pieces, bool native, const Node& node) {
  loader::Datapath& dp = *pieces.datapath;
  auto running = std::make_unique<RunningLbAcceleration>();
  running->xdp_mode = static_cast<int>(loader::XdpMode::kNone);
  if (native) {
    auto mode = dp.AttachXdp(node.native_ifindex);
    if (!mode.ok()) return StartError(mode.status(), "attach XDP");
    running->xdp_mode = static_cast<int>(*mode);
    if (*mode == loader::XdpMode::kNone) {
      running->xdp_refused++;
      auto other = loader::AttachedXdpProgram(node.native_ifindex);
      spdlog::warn(
          "lb_acceleration=native: {} already runs XDP program id {} that is not "
          "Sluice's; left in place, NodePorts are balanced at TC only",
          node.native_device, other.ok() ? *other : 0u);
    } else {
      spdlog::info("lb_acceleration=native: sluice_xdp_net attached to {} in {} XDP mode",
                   node.native_device, loader::XdpModeName(*mode));
    }
  } else if (auto st = dp.DetachXdp(); !st.ok()) {
    return StartError(st, "detach XDP");
  }
  RunningLbAcceleration* r = running.get();
  running->acceleration_metrics.emplace(
      *pieces.registry, pieces.registry->AddCollector([r](metrics::ScrapeSink& out) {
        for (auto m : {loader::XdpMode::kNative, loader::XdpMode::kGeneric}) {
          out.Gauge("sluice_lb_acceleration_attached",
                    "1 when sluice_xdp_net runs on the native device in this XDP mode",
                    {{"mode", loader::XdpModeName(m)}},
                    r->xdp_mode.load() == static_cast<int>(m) ? 1.0 : 0.0);
        }
        out.Counter("sluice_lb_acceleration_refused_total",
                    "XDP attaches not made because the native device runs another program's XDP",
                    {}, static_cast<double>(r->xdp_refused.load()));
      }));
  return running;
}

absl::StatusOr<std::unique_ptr<RunningServices>> StartServices(const StartPieces& pieces,
                                                               conntrack::ConntrackGc& gc,
                                                               bool socket_lb, const Node& node,
                                                               const LbAlgorithmOptions& lb_algorithm) {
  loader::Datapath& dp = *pieces.datapath;
  KubernetesState* kube = pieces.k8s;
  auto running = std::make_unique<RunningServices>();
  running->lb_maps = std::make_unique<BpfLbMaps>(
      dp.lb4_services(), dp.lb4_backends(), dp.lb4_revnat(), dp.lb4_source_ranges(), dp.ct4_any(),
      &dp.lb4_affinity(), &dp.ct4(), &dp.lb4_non_backend_ports(), &dp.lb4_slot_records());
  running->lb_maps->OnPairsWritten([&gc] { return gc.PairsWritten(); });
  running->lb_maps->WriteMaglevTablesTo(&dp.lb4_maglev());
  // A connected UDP socket socket LB sent to a backend that goes is closed: its send() runs
  // no hook that could send it elsewhere (agent/kernel/sock_destroy.h).
  if (socket_lb)
    running->lb_maps->CloseSocketLbUdpWith(&dp.sock4_revnat(), DestroyConnectedUdp4Sockets);
  auto reconciler = ServiceReconciler::Create(*running->lb_maps);
  if (!reconciler.ok()) return StartError(reconciler.status(), "restore service maps");
  running->reconciler = std::move(*reconciler);
  running->reconciler->SetMaglevTableSize(lb_algorithm.maglev_table_size);
  running->health_checks = std::make_unique<HealthCheckServers>(node.node_ip.ToString());
  running->sync = std::make_unique<ServiceSync>(
      kube->services(), kube->endpoint_slices(),
      // Services depend on these two kinds only: no need to wait for Pods and Nodes.
      [kube] { return kube->services().HasSynced() && kube->endpoint_slices().HasSynced(); },
      *running->reconciler, running->health_checks.get(),
      NodeContext{kube->node_name(), {node.node_ip}, lb_algorithm.maglev_default},
      pieces.state_dir, pieces.clock);
  running->refusal_metrics.emplace(
      *pieces.registry,
      pieces.registry->AddCollector([s = running->sync.get()](metrics::ScrapeSink& out) {
        RefusalCounts counts = s->refusals();
        for (size_t r = 0; r < static_cast<size_t>(RefusalReason::kCount); ++r) {
          out.Counter("sluice_service_refusals_total",
                      "Parts of Services and EndpointSlices not programmed (an invalid or "
                      "special backend address, port or protocol, external or LoadBalancer "
                      "IP), counted once per object when first refused, per reason",
                      {{"reason", std::string(RefusalReasonName(static_cast<RefusalReason>(r)))}},
                      static_cast<double>(counts.by_reason[r]));
        }
      }));
  return running;
}

metrics::HttpReply ServicesRoute(KubernetesState* k8s) {
  if (k8s == nullptr) return {.status = 404, .body = "no Kubernetes\n"};
  return {.content_type = "application/json",
          .body = DiagnoseServicesJson(k8s->services().List(), k8s->endpoint_slices().List(),
                                       k8s->pods().List())};
}

}  // namespace sluice::agent
