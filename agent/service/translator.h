// Service translation: a Service plus its EndpointSlices, seen from one node, become the load
// balancer frontends (and their backends) the datapath programs into sluice_lb4_* (maps/lb.h).
// A pure function in kube-proxy's semantics: no kernel, no I/O, deterministic output (frontends
// and backends sorted, so backend slots stay stable across recomputations).
#pragma once

#include <compare>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/endpoint/ipam.h"
#include "agent/k8s/model.h"

namespace sluice::agent {

// What the translation needs to know about the node it runs on.
struct NodeContext {
  std::string node_name;                // endpoints with this nodeName are local
  std::vector<IpAddress> node_addresses;  // NodePort frontends: one per (IPv4) node address
  // The default backend selection (--lb-algorithm, chart loadBalancer.algorithm): maglev puts
  // SLUICE_SVC_F_MAGLEV on the NodePort, ExternalIP and LoadBalancer frontends of every Service
  // without a valid lb-algorithm annotation; the annotation decides for all of a Service's
  // frontends, its ClusterIP included.
  bool maglev_default = false;
};

struct LbBackend {
  IpAddress addr;
  uint16_t port = 0;  // host order
  uint8_t proto = 0;  // IPPROTO_*
  bool terminating = false;  // serving+terminating, used only because no endpoint is ready
  bool local = false;        // endpoint nodeName == NodeContext::node_name

  friend auto operator<=>(const LbBackend&, const LbBackend&) = default;
};

struct LbFrontend {
  std::string service;    // "namespace/name"
  std::string port_name;  // the ServicePort's name ("" allowed)
  IpAddress addr;
  uint16_t port = 0;  // host order
  uint8_t proto = 0;  // IPPROTO_TCP / IPPROTO_UDP / IPPROTO_SCTP
  uint8_t scope = 0;  // enum sluice_lb_scope
  uint16_t flags = 0;  // enum sluice_svc_flags
  uint32_t affinity_timeout = 0;  // seconds, with SLUICE_SVC_F_AFFINITY
  std::vector<LbBackend> backends;  // sorted, unique by (addr, port, proto)
  std::vector<IpPrefix> source_ranges;  // sorted; with SLUICE_SVC_F_SOURCE_RANGES

  friend bool operator==(const LbFrontend&, const LbFrontend&) = default;
};

// Frontends are ordered by their map key (addr, port, proto, scope), then service and port name.
bool FrontendKeyLess(const LbFrontend& a, const LbFrontend& b);

// ETP Local LoadBalancer services: the node answers HTTP health checks on node_port with the
// number of local ready endpoints (200 when > 0, 503 otherwise).
struct HealthCheck {
  std::string service;  // "namespace/name"
  uint16_t node_port = 0;
  int local_endpoints = 0;  // distinct local ready endpoint addresses across the service's ports

  friend bool operator==(const HealthCheck&, const HealthCheck&) = default;
};

// Why part of a Service or EndpointSlice is not programmed. Refused as kube-proxy and the
// apiserver's validation refuse them: a backend on the node's loopback, 0.0.0.0, link-local,
// multicast or broadcast would let a ClusterIP reach what no pod should (a listener bound only to
// the node's 127.0.0.1); a port or protocol the datapath cannot express is no frontend. Only the
// offending port, address or endpoint is dropped; the rest of the Service is programmed.
enum class RefusalReason : uint8_t {
  kBackendLoopback,        // 127.0.0.0/8
  kBackendUnspecified,     // 0.0.0.0/8
  kBackendLinkLocal,       // 169.254.0.0/16
  kBackendMulticast,       // 224.0.0.0/4
  kBackendBroadcast,       // 255.255.255.255
  kBackendInvalid,         // not an IPv4 address in an IPv4 EndpointSlice
  kPortInvalid,            // a Service port, nodePort or EndpointSlice port outside 1..65535
  kProtocolUnknown,        // not TCP, UDP or SCTP
  kExternalIpInvalid,      // spec.externalIPs: unparsable or one of the special ranges above
  kLoadBalancerIpInvalid,  // status.loadBalancer.ingress[].ip: likewise
  kProtocolUnsupported,     // SCTP: the datapath balances TCP and UDP only
  kAffinityTimeoutInvalid,  // sessionAffinityConfig.clientIP.timeoutSeconds outside 1..86400:
                            // the whole Service (the apiserver refuses such a Service)
  kLbAlgorithmInvalid,      // an lb-algorithm annotation neither random nor maglev: the
                            // annotation only (the Service gets the node's default)
  kCount,
};
std::string_view RefusalReasonName(RefusalReason reason);  // "backend_loopback", ...

struct Refusal {
  RefusalReason reason;
  std::string what;  // "EndpointSlice default/web-abc endpoint 127.0.0.1", "port 'http' 0"

  friend auto operator<=>(const Refusal&, const Refusal&) = default;
};

struct ServiceTranslation {
  std::vector<LbFrontend> frontends;  // sorted by FrontendKeyLess
  // externalTrafficPolicy: Local, seen from inside the cluster: each external frontend (NodePort,
  // ExternalIP, LoadBalancer IP) again, in scope SLUICE_LB_SCOPE_INTERNAL, without
  // SLUICE_SVC_F_ETP_LOCAL and with the cluster-wide endpoints. This node's pods and its own
  // sockets balance over it, as kube-proxy sends in-cluster traffic to every endpoint; traffic
  // from outside the node keeps the local-only frontend. Sorted by FrontendKeyLess.
  std::vector<LbFrontend> in_cluster_frontends;
  std::optional<HealthCheck> health_check;
  std::vector<Refusal> refused;  // sorted, unique; what was left out and why

  friend bool operator==(const ServiceTranslation&, const ServiceTranslation&) = default;
};

inline constexpr uint32_t kDefaultAffinityTimeoutSeconds = 10800;
inline constexpr int32_t kMaxAffinityTimeoutSeconds = 86400;  // the apiserver's validation

// Translates one Service (IPv4 only for now). Headless, ExternalName and Services without an IPv4
// ClusterIP yield nothing. Slices not labelled for this Service (other namespace or service name),
// and slices whose addressType is not IPv4, are ignored.
ServiceTranslation TranslateService(
    const k8s::Service& service,
    const std::vector<std::shared_ptr<const k8s::EndpointSlice>>& slices_of_this_service,
    const NodeContext& node);

}  // namespace sluice::agent
