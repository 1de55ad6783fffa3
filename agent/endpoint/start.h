// The endpoint feature as the agent runs it, in three steps because the node's set-up and the
// policy hook come between them: the state (IPAM and endpoint records) opened before the node is
// set up, the service (restored endpoints) before policy hooks into it, and the endpoint API the
// CNI plugin reaches once both are in place.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "agent/endpoint/api_server.h"
#include "agent/endpoint/endpoint_service.h"
#include "agent/endpoint/endpoint_store.h"
#include "agent/endpoint/ipam.h"
#include "agent/kernel/pod_link_watch.h"
#include "agent/metrics/agent_endpoints.h"
#include "agent/start/pieces.h"

namespace sluice::agent {

struct EndpointState {
  std::unique_ptr<Ipam> ipam;
  std::unique_ptr<EndpointStore> store;
  std::optional<metrics::ScopedCollector> count_metrics;  // reads store: declared after it
};

// Opens IPAM for `pod_cidr` and the endpoint records in the pieces' state directory, which
// readiness from now on requires to be writable (every ADD writes there).
[[nodiscard]] absl::StatusOr<std::unique_ptr<EndpointState>> OpenEndpointState(
    const StartPieces& pieces, const IpPrefix& pod_cidr);

struct RunningEndpointService {
  RunningEndpointService(const StartPieces& pieces, EndpointState& state, int mtu);

  BpfEndpointDatapath datapath;
  EndpointService service;  // writes through datapath: declared after it
  std::optional<metrics::ScopedCollector> service_metrics;  // reads service: declared after it
  // Calls service on every pod link change (a MAC set by a chained plugin): declared after it.
  std::unique_ptr<PodLinkWatch> pod_link_watch;
};

// The endpoint service with pods of `mtu` by default, and the endpoints of an earlier run
// restored (re-attached, their map entries rewritten, what belongs to no live pod removed); from
// then on each endpoint follows its pod interface's MAC (PodLinkWatch).
[[nodiscard]] absl::StatusOr<std::unique_ptr<RunningEndpointService>> StartEndpointService(
    const StartPieces& pieces, EndpointState& state, int mtu);

struct ServingEndpointApi {
  std::unique_ptr<api::EndpointApiServer> server;
  std::optional<metrics::ScopedCollector> metrics;  // reads server: declared after it
};

// Serves the endpoint API on `socket_path`: each request, instrumented, to `service`, with the
// descriptor it carried (the pod's network namespace). What the server refuses before the
// service sees it is counted on /metrics.
[[nodiscard]] absl::StatusOr<std::unique_ptr<ServingEndpointApi>> ServeEndpointApi(
    const StartPieces& pieces, EndpointService& service, const std::string& socket_path);

}  // namespace sluice::agent
