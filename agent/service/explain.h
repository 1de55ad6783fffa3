// Why a Service serves what it serves, from the agent's store: per port, how many endpoints
// are ready, serving-while-terminating or not ready, and, when none can serve, the first cause
// an operator would find (no selector and no hand-made endpoints, a selector matching no pod, a
// named targetPort no matching pod declares, no matching pod ready, the EndpointSlices not
// caught up). Pure; served to `sluicectl services` as JSON on the health server (/v1/services).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "agent/k8s/model.h"

namespace sluice::agent {

struct ServicePortDiagnosis {
  std::string name;  // the ServicePort's name ("" allowed)
  int32_t port = 0;
  std::string protocol;     // "TCP", "UDP", "SCTP"
  std::string target_port;  // "8080" or "http"
  int32_t node_port = 0;
  int ready = 0;
  int terminating = 0;  // serving and terminating: used only while nothing is ready
  int not_ready = 0;
  std::string why_empty;  // "" when ready + terminating > 0
};

struct ServiceDiagnosis {
  std::string namespace_, name, type;
  std::vector<std::string> cluster_ips;
  std::vector<std::string> external_ips;  // spec.externalIPs and LoadBalancer ingress IPs
  std::vector<ServicePortDiagnosis> ports;
};

ServiceDiagnosis DiagnoseService(
    const k8s::Service& service,
    const std::vector<std::shared_ptr<const k8s::EndpointSlice>>& slices,
    const std::vector<std::shared_ptr<const k8s::Pod>>& pods);

// Every Service of the stores, sorted by namespace/name, as a JSON array.
std::string DiagnoseServicesJson(
    const std::vector<std::shared_ptr<const k8s::Service>>& services,
    const std::vector<std::shared_ptr<const k8s::EndpointSlice>>& slices,
    const std::vector<std::shared_ptr<const k8s::Pod>>& pods);

}  // namespace sluice::agent
