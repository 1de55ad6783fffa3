#include "agent/endpoint/start.h"

#include <utility>

#include "agent/metrics/agent_metrics.h"
#include "spdlog/spdlog.h"

namespace sluice::agent {

absl::StatusOr<std::unique_ptr<EndpointState>> OpenEndpointState(const StartPieces& pieces,
                                                                 const IpPrefix& pod_cidr) {
  auto state = std::make_unique<EndpointState>();
  auto ipam = Ipam::Open(pieces.state_dir, pod_cidr);
  if (!ipam.ok()) return StartError(ipam.status(), "open IPAM");
  state->ipam = std::move(*ipam);
  auto store = EndpointStore::Open(pieces.state_dir);
  if (!store.ok()) return StartError(store.status(), "open endpoint store");
  state->store = std::move(*store);
  // Every ADD writes there: a full or read-only file system makes the node not ready.
  pieces.ready->RequireWritableStateDir(pieces.state_dir);
  state->count_metrics.emplace(
      *pieces.registry, metrics::AddEndpointCountCollector(
                            *pieces.registry, [s = state->store.get()] { return s->size(); }));
  return state;
}

RunningEndpointService::RunningEndpointService(const StartPieces& pieces, EndpointState& state,
                                               int mtu)
    : datapath(*pieces.datapath),
      service(*pieces.netlink, *state.ipam, *state.store, datapath,
              {.default_mtu = mtu, .clock = pieces.clock}) {}

namespace {

// The veths of removed pods waiting for deletion, and the requests refused before acting.
int AddEndpointServiceCollector(metrics::Registry& registry, EndpointService* service) {
  return registry.AddCollector([service](metrics::ScrapeSink& out) {
    const LinkReaperStats s = service->link_reaper().stats();
    out.Gauge("sluice_endpoint_veths_pending_delete",
              "Host veths of removed pods, down and waiting for the agent to delete them", {},
              static_cast<double>(service->link_reaper().pending()));
    for (const auto& [result, n] : {std::pair{"deleted", s.deleted}, std::pair{"gone", s.gone},
                                    std::pair{"failed", s.failed}}) {
      out.Counter("sluice_endpoint_veth_deletes_total",
                  "Host veths of removed pods the agent deleted after DEL answered "
                  "(gone: already deleted or the name taken since; failed: left for the next "
                  "start)",
                  {{"result", result}}, static_cast<double>(n));
    }
    const EndpointServiceStats es = service->stats();
    for (const auto& [reason, n] : {std::pair{"bad_netns", es.bad_netns},
                                    std::pair{"other_network", es.other_network_requests},
                                    std::pair{"lock_timeout", es.lock_timeouts}}) {
      out.Counter("sluice_endpoint_requests_refused_total",
                  "CNI requests the agent refused before acting, per reason (bad_netns: the "
                  "pod's network namespace descriptor missing, undeclared or not a network "
                  "namespace; other_network: an interface another network attached; "
                  "lock_timeout: the node or attachment stayed busy past the lock timeout)",
                  {{"reason", reason}}, static_cast<double>(n));
    }
    out.Counter("sluice_endpoint_pod_mac_changes_total",
                "Pod interfaces whose MAC changed after ADD (a chained plugin's \"mac\", or "
                "anything in the pod) and whose endpoint followed it: map entry, neighbour entry "
                "and record",
                {}, static_cast<double>(es.pod_mac_changes));
    out.Counter("sluice_endpoint_netns_paths_opened_total",
                "ADD and CHECK requests of an older plugin, without a namespace descriptor: "
                "the agent opened CNI_NETNS itself",
                {}, static_cast<double>(es.netns_paths_opened));
  });
}

}  // namespace

absl::StatusOr<std::unique_ptr<RunningEndpointService>> StartEndpointService(
    const StartPieces& pieces, EndpointState& state, int mtu) {
  auto running = std::make_unique<RunningEndpointService>(pieces, state, mtu);
  running->service_metrics.emplace(
      *pieces.registry, AddEndpointServiceCollector(*pieces.registry, &running->service));
  if (auto st = running->service.Restore(); !st.ok()) return StartError(st, "restore endpoints");
  spdlog::info("restored {} endpoints", state.store->size());
  auto watch = PodLinkWatch::Start(
      [service = &running->service](const std::vector<PeerLinkChange>& changes, bool lost) {
        service->FollowPodLinks(changes, /*all=*/lost);
      });
  if (watch.ok()) {
    running->pod_link_watch = std::move(*watch);
    spdlog::info("hearing link changes in the pods' network namespaces (NETLINK_LISTEN_ALL_NSID)");
  } else {
    // Without CAP_NET_BROADCAST: pods still work, but a MAC changed after ADD is followed only at
    // the pod's next CHECK or the agent's next start.
    spdlog::error(
        "pod link changes will not be heard (a pod's MAC set after its ADD is followed only at "
        "its next CHECK or the agent's next start): {}",
        watch.status().ToString());
  }
  return running;
}

absl::StatusOr<std::unique_ptr<ServingEndpointApi>> ServeEndpointApi(
    const StartPieces& pieces, EndpointService& service, const std::string& socket_path) {
  api::EndpointApiServerOptions options;
  options.socket_path = socket_path;
  auto serving = std::make_unique<ServingEndpointApi>();
  serving->server = std::make_unique<api::EndpointApiServer>(options);
  api::EndpointApiServer* server = serving->server.get();
  serving->metrics.emplace(
      *pieces.registry, pieces.registry->AddCollector([server](metrics::ScrapeSink& out) {
        const api::EndpointApiServer::Stats s = server->stats();
        for (const auto& [reason, n] :
             {std::pair{"bad_request", s.bad_requests}, std::pair{"bad_fds", s.bad_fds},
              std::pair{"busy", s.busy}, std::pair{"denied_peer", s.denied_peers}}) {
          out.Counter("sluice_endpoint_api_requests_refused_total",
                      "Connections to the endpoint API answered without reaching the endpoint "
                      "service, per reason (bad_request: too large or not a request; bad_fds: "
                      "more than one descriptor or other control data; busy: past the "
                      "concurrency limit; denied_peer: a peer of another uid)",
                      {{"reason", reason}}, static_cast<double>(n));
        }
        out.Counter("sluice_endpoint_api_io_errors_total",
                    "Endpoint API accept, read and write failures and timeouts", {},
                    static_cast<double>(s.io_errors));
      }));
  // The request's descriptor (the pod's netns) goes to the service beside the instrumented call.
  if (auto st = server->Start(metrics::InstrumentEndpointApi(
          [&service](const cni::EndpointRequest& req, int netns_fd) {
            return service.Handle(req, netns_fd);
          },
          *pieces.registry, pieces.clock));
      !st.ok()) {
    return StartError(st, "start endpoint API");
  }
  return serving;
}

}  // namespace sluice::agent
