// The agent's trimmed Kubernetes object model: only the fields the datapath and IPAM read, as plain
// value types. Addresses stay strings (IPv4 or IPv6); resourceVersions are opaque strings. What
// the agent never reads is validated by the decoder (decode.h) but not kept: annotations (but for
// the few KeptAnnotation names) and
// ownerReferences of every kind, the labels of Services and EndpointSlices (a slice keeps its
// Service's name), an endpoint's addresses beyond the first, its zone and targetRef. At 10k
// Services / 100k endpoints that is most of what the stores held.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::k8s {

using StringMap = std::map<std::string, std::string>;

// Well-known label and annotation keys.
inline constexpr std::string_view kLabelServiceName = "kubernetes.io/service-name";
inline constexpr std::string_view kLabelServiceProxyName = "service.kubernetes.io/service-proxy-name";
inline constexpr std::string_view kLabelHeadless = "service.kubernetes.io/headless";
inline constexpr std::string_view kAnnotationInitialEventsEnd = "k8s.io/initial-events-end";
// A Service's backend selection, random or maglev: Sluice's own key, and Cilium's, accepted
// alike (Sluice's wins when both are set).
inline constexpr std::string_view kAnnotationLbAlgorithm = "service.sluice.dev/lb-algorithm";
inline constexpr std::string_view kAnnotationCiliumLbAlgorithm = "service.cilium.io/lb-algorithm";
// The only annotations the decoder keeps (every other one is validated and dropped).
inline bool KeptAnnotation(std::string_view key) {
  return key == kAnnotationLbAlgorithm || key == kAnnotationCiliumLbAlgorithm;
}

struct ObjectMeta {
  std::string namespace_;  // empty for cluster-scoped kinds
  std::string name;
  std::string uid;
  std::string resource_version;
  StringMap labels;       // not kept for Services and EndpointSlices
  StringMap annotations;  // only those KeptAnnotation names (the decoder drops the rest)
  bool deleting = false;  // metadata.deletionTimestamp is set

  // "namespace/name", or "name" for cluster-scoped objects (client-go's MetaNamespaceKeyFunc).
  std::string Key() const;
  bool operator==(const ObjectMeta&) const = default;
};

// A port given either as a number or as a container port name.
struct IntOrString {
  bool is_name = false;
  int32_t number = 0;
  std::string name;
  bool operator==(const IntOrString&) const = default;
};

enum class Protocol : uint8_t { kTCP, kUDP, kSCTP, kUnknown };
std::string_view ProtocolName(Protocol p);
Protocol ParseProtocol(std::string_view s);  // "" means TCP (the API default)
// The IP protocol number (IPPROTO_TCP, ...); none for kUnknown.
std::optional<uint8_t> IpProtocolNumber(Protocol p);

struct ServicePort {
  std::string name;
  Protocol protocol = Protocol::kTCP;
  int32_t port = 0;
  IntOrString target_port;
  int32_t node_port = 0;  // 0 when none
  bool operator==(const ServicePort&) const = default;
};

struct Service {
  ObjectMeta meta;
  std::string type;  // ClusterIP | NodePort | LoadBalancer | ExternalName ("" = ClusterIP)
  std::vector<std::string> cluster_ips;  // spec.clusterIPs (or [spec.clusterIP]); empty if headless
  bool headless = false;                 // spec.clusterIP == "None"
  std::vector<std::string> external_ips;
  std::vector<ServicePort> ports;
  StringMap selector;
  bool session_affinity_client_ip = false;
  int32_t session_affinity_timeout_seconds = 0;  // 10800 by API default when ClientIP
  std::string external_traffic_policy;  // Cluster | Local ("" = Cluster)
  std::string internal_traffic_policy;  // Cluster | Local ("" = Cluster)
  int32_t health_check_node_port = 0;
  std::vector<std::string> load_balancer_ingress_ips;  // status.loadBalancer.ingress[].ip, ipMode VIP/unset
  std::vector<std::string> load_balancer_source_ranges;  // trimmed
  bool operator==(const Service&) const = default;
};

struct Endpoint {
  std::string address;       // addresses[0] ("" when none): the only one kube-proxy uses
  bool ready = true;         // conditions.ready, nil => true
  bool serving = true;       // conditions.serving, nil => true
  bool terminating = false;  // conditions.terminating, nil => false
  std::string node_name;
  bool operator==(const Endpoint&) const = default;
};

struct EndpointPort {
  std::string name;
  Protocol protocol = Protocol::kTCP;
  std::optional<int32_t> port;  // nil => kube-proxy ignores the port
  bool operator==(const EndpointPort&) const = default;
};

struct EndpointSlice {
  ObjectMeta meta;
  std::string service_name;  // label kubernetes.io/service-name ("" => not tied to a Service)
  std::string address_type;  // IPv4 | IPv6 | FQDN
  std::vector<Endpoint> endpoints;
  std::vector<EndpointPort> ports;
  bool operator==(const EndpointSlice&) const = default;
};

struct ContainerPort {
  std::string name;
  int32_t port = 0;
  Protocol protocol = Protocol::kTCP;
  bool operator==(const ContainerPort&) const = default;
};

struct Pod {
  ObjectMeta meta;
  std::string node_name;
  bool host_network = false;
  std::vector<std::string> pod_ips;  // status.podIPs[].ip (or [status.podIP])
  std::string host_ip;
  std::string phase;
  bool ready = false;  // condition Ready == True
  std::vector<ContainerPort> container_ports;
  bool operator==(const Pod&) const = default;
};

struct Namespace {
  ObjectMeta meta;
  bool operator==(const Namespace&) const = default;
};

struct Node {
  ObjectMeta meta;
  std::vector<std::string> pod_cidrs;     // spec.podCIDRs (or [spec.podCIDR])
  std::vector<std::string> internal_ips;  // status.addresses[type=InternalIP]
  bool ready = false;                     // condition Ready == True
  bool operator==(const Node&) const = default;
};

// metav1.LabelSelector. Operators are kept as written; the policy translator rejects unknown ones.
struct LabelSelectorRequirement {
  std::string key;
  std::string op;  // In | NotIn | Exists | DoesNotExist
  std::vector<std::string> values;
  bool operator==(const LabelSelectorRequirement&) const = default;
};

struct LabelSelector {
  StringMap match_labels;
  std::vector<LabelSelectorRequirement> match_expressions;
  std::string error;  // why it could not be decoded ("" when fine); it then matches nothing
  bool operator==(const LabelSelector&) const = default;
};

// networking.k8s.io/v1 IPBlock. CIDRs stay strings: the translator validates and masks them.
struct IpBlock {
  std::string cidr;
  std::vector<std::string> except;
  bool operator==(const IpBlock&) const = default;
};

// One entry of from / to. The API allows either selectors (one or both) or an ipBlock.
struct NetworkPolicyPeer {
  std::optional<LabelSelector> pod_selector;
  std::optional<LabelSelector> namespace_selector;
  std::optional<IpBlock> ip_block;
  bool operator==(const NetworkPolicyPeer&) const = default;
};

struct NetworkPolicyPort {
  std::string protocol;  // as written ("" = TCP, the API default)
  std::optional<IntOrString> port;  // absent: every port of the protocol
  std::optional<int64_t> end_port;  // kept wide so an out-of-range value is seen as such
  bool operator==(const NetworkPolicyPort&) const = default;
};

// An ingress (from) or egress (to) rule: peers x ports; an empty list means "all".
struct NetworkPolicyRule {
  std::vector<NetworkPolicyPeer> peers;
  std::vector<NetworkPolicyPort> ports;
  std::string error;  // a field of the wrong JSON type: the translator rejects the rule
  bool operator==(const NetworkPolicyRule&) const = default;
};

struct NetworkPolicySpec {
  LabelSelector pod_selector;
  std::vector<std::string> policy_types;  // as written; empty = defaulted by the translator
  std::vector<NetworkPolicyRule> ingress;
  std::vector<NetworkPolicyRule> egress;
  std::string error;  // the spec could not be decoded: the translator fails closed
  bool operator==(const NetworkPolicySpec&) const = default;
};

struct NetworkPolicy {
  ObjectMeta meta;
  std::string spec_json;  // the whole spec, minified JSON
  NetworkPolicySpec spec;  // the same, typed
  bool operator==(const NetworkPolicy&) const = default;
};

// Labels the apiserver sets on every Namespace (and the policy translator assumes).
inline constexpr std::string_view kLabelNamespaceName = "kubernetes.io/metadata.name";

// A metav1.Status (errors on HTTP responses and in watch ERROR events).
struct ApiStatus {
  int32_t code = 0;
  std::string status;  // Success | Failure
  std::string reason;  // Expired, Gone, NotFound, Timeout, ...
  std::string message;
  std::vector<std::string> cause_reasons;  // details.causes[].reason
  int32_t retry_after_seconds = 0;         // details.retryAfterSeconds
  bool operator==(const ApiStatus&) const = default;

  // 410 Gone / reason Expired or Gone: the requested resourceVersion or continue token is too old.
  bool IsExpired() const;
  // 504 with cause ResourceVersionTooLarge (a lagging apiserver): relist with RV="".
  bool IsTooLargeResourceVersion() const;
};

// Where each kind is listed and watched (cluster-wide).
template <typename T>
struct KindInfo;
template <>
struct KindInfo<Service> {
  static constexpr std::string_view kKind = "Service";
  static constexpr std::string_view kPath = "/api/v1/services";
};
template <>
struct KindInfo<EndpointSlice> {
  static constexpr std::string_view kKind = "EndpointSlice";
  static constexpr std::string_view kPath = "/apis/discovery.k8s.io/v1/endpointslices";
};
template <>
struct KindInfo<Pod> {
  static constexpr std::string_view kKind = "Pod";
  static constexpr std::string_view kPath = "/api/v1/pods";
};
template <>
struct KindInfo<Namespace> {
  static constexpr std::string_view kKind = "Namespace";
  static constexpr std::string_view kPath = "/api/v1/namespaces";
};
template <>
struct KindInfo<Node> {
  static constexpr std::string_view kKind = "Node";
  static constexpr std::string_view kPath = "/api/v1/nodes";
};
template <>
struct KindInfo<NetworkPolicy> {
  static constexpr std::string_view kKind = "NetworkPolicy";
  static constexpr std::string_view kPath = "/apis/networking.k8s.io/v1/networkpolicies";
};

}  // namespace sluice::k8s
