#include "agent/service/translator.h"

#include <netinet/in.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "maps/lb.h"

namespace sluice::agent {
namespace {

std::optional<IpAddress> ParseV4(const std::string& text) {
  absl::StatusOr<IpAddress> a = IpAddress::Parse(absl::StripAsciiWhitespace(text));
  if (!a.ok() || !a->is_v4()) return std::nullopt;
  return *a;
}

// The IPv4 ranges that are never a Service backend or frontend address, and why.
std::optional<RefusalReason> SpecialV4(const IpAddress& a) {
  const uint32_t h = a.v4_host_order();
  if ((h >> 24) == 127) return RefusalReason::kBackendLoopback;
  if ((h >> 24) == 0) return RefusalReason::kBackendUnspecified;
  if ((h >> 16) == 0xa9fe) return RefusalReason::kBackendLinkLocal;
  if ((h >> 28) == 0xe) return RefusalReason::kBackendMulticast;
  if (h == 0xffffffff) return RefusalReason::kBackendBroadcast;
  return std::nullopt;
}

const char* RangeName(RefusalReason r) {
  switch (r) {
    case RefusalReason::kBackendLoopback:
      return "loopback";
    case RefusalReason::kBackendUnspecified:
      return "unspecified";
    case RefusalReason::kBackendLinkLocal:
      return "link-local";
    case RefusalReason::kBackendMulticast:
      return "multicast";
    case RefusalReason::kBackendBroadcast:
      return "broadcast";
    default:
      return "invalid";
  }
}

// externalIPs / LB ingress IPs: IPv4 addresses to program; IPv6 ones are valid but not ours yet
// (skipped without a word), anything else is refused as `reason`.
std::vector<IpAddress> ParseFrontendIps(const std::vector<std::string>& texts, RefusalReason reason,
                                        const char* field, std::set<Refusal>* refused) {
  std::set<IpAddress> out;
  for (const std::string& t : texts) {
    absl::StatusOr<IpAddress> a = IpAddress::Parse(absl::StripAsciiWhitespace(t));
    if (!a.ok()) {
      refused->insert({reason, absl::StrCat(field, " '", t, "': not an IP address")});
      continue;
    }
    if (!a->is_v4()) continue;
    if (std::optional<RefusalReason> special = SpecialV4(*a)) {
      refused->insert({reason, absl::StrCat(field, " ", t, ": ", RangeName(*special))});
      continue;
    }
    out.insert(*a);
  }
  return {out.begin(), out.end()};
}

// loadBalancerSourceRanges: IPv4 CIDRs, parsed sloppily like kube-proxy (host bits are masked off,
// a bare address is a /32). Other families and garbage are skipped.
std::vector<IpPrefix> ParseV4SourceRanges(const std::vector<std::string>& texts) {
  std::set<IpPrefix> out;
  for (const std::string& raw : texts) {
    absl::string_view text = absl::StripAsciiWhitespace(raw);
    if (text.empty()) continue;
    std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(text, '/');
    int length = 32;
    if (text.find('/') != absl::string_view::npos &&
        (!absl::SimpleAtoi(parts.second, &length) || length < 0 || length > 32)) {
      continue;
    }
    absl::StatusOr<IpAddress> addr = IpAddress::Parse(parts.first);
    if (!addr.ok() || !addr->is_v4()) continue;
    uint32_t mask = length == 0 ? 0 : ~uint32_t{0} << (32 - length);
    absl::StatusOr<IpPrefix> prefix =
        IpPrefix::Make(IpAddress::V4(addr->v4_host_order() & mask), length);
    if (prefix.ok()) out.insert(*prefix);
  }
  return {out.begin(), out.end()};
}

// One endpoint of one service port, after merging its copies across slices.
struct Candidate {
  LbBackend backend;  // terminating/local filled in at selection
  bool ready = false;
  bool serving = false;
  bool terminating = false;
  bool local = false;
  std::string node_name;
};

// Better copy of a duplicated endpoint: kube-proxy prefers the local copy; then ready, then
// serving; node name breaks the remaining tie so the result does not depend on slice order.
bool BetterCopy(const Candidate& a, const Candidate& b) {
  return std::make_tuple(a.local, a.ready, a.serving, a.terminating, b.node_name) >
         std::make_tuple(b.local, b.ready, b.serving, b.terminating, a.node_name);
}

// The endpoints of `port` across the service's slices, deduplicated by address:port.
std::vector<Candidate> CollectEndpoints(
    const k8s::Service& service, const k8s::ServicePort& port, uint8_t proto,
    const std::vector<std::shared_ptr<const k8s::EndpointSlice>>& slices, const NodeContext& node,
    std::set<Refusal>* refused) {
  std::map<std::pair<IpAddress, uint16_t>, Candidate> merged;
  for (const std::shared_ptr<const k8s::EndpointSlice>& slice : slices) {
    if (slice == nullptr) continue;
    if (slice->service_name != service.meta.name ||
        slice->meta.namespace_ != service.meta.namespace_) {
      continue;
    }
    if (slice->address_type != "IPv4") continue;
    // The slice port with the service port's name carries the resolved target port for the
    // endpoints of this slice (a named targetPort may resolve differently per slice).
    std::optional<uint16_t> target;
    for (const k8s::EndpointPort& ep : slice->ports) {
      if (ep.name != port.name || ep.protocol != port.protocol || !ep.port.has_value()) continue;
      if (*ep.port <= 0 || *ep.port > 65535) {
        refused->insert(
            {RefusalReason::kPortInvalid, absl::StrCat("EndpointSlice ", slice->meta.Key(),
                                                       " port '", ep.name, "' ", *ep.port)});
        continue;
      }
      target = static_cast<uint16_t>(*ep.port);
      break;
    }
    if (!target.has_value()) continue;
    for (const k8s::Endpoint& e : slice->endpoints) {
      if (e.address.empty()) continue;
      std::optional<IpAddress> addr = ParseV4(e.address);
      if (!addr.has_value()) {
        refused->insert(
            {RefusalReason::kBackendInvalid,
             absl::StrCat("EndpointSlice ", slice->meta.Key(), " endpoint '", e.address, "'")});
        continue;
      }
      if (std::optional<RefusalReason> special = SpecialV4(*addr)) {
        refused->insert({*special, absl::StrCat("EndpointSlice ", slice->meta.Key(), " endpoint ",
                                                addr->ToString())});
        continue;
      }
      Candidate c;
      c.backend.addr = *addr;
      c.backend.port = *target;
      c.backend.proto = proto;
      c.ready = e.ready;
      c.serving = e.serving;
      c.terminating = e.terminating;
      c.local = !node.node_name.empty() && e.node_name == node.node_name;
      c.node_name = e.node_name;
      auto [it, inserted] = merged.try_emplace({*addr, *target}, c);
      if (!inserted && BetterCopy(c, it->second)) it->second = c;
    }
  }
  std::vector<Candidate> out;
  out.reserve(merged.size());
  for (auto& [key, c] : merged) out.push_back(std::move(c));
  return out;
}

// kube-proxy's CategorizeEndpoints for one set: ready endpoints; if there is none, the serving
// and terminating ones (graceful termination). Endpoints that are neither are never used.
std::vector<LbBackend> Select(const std::vector<Candidate>& candidates, bool local_only) {
  std::vector<LbBackend> out;
  for (const Candidate& c : candidates) {
    if (local_only && !c.local) continue;
    if (!c.ready) continue;
    LbBackend b = c.backend;
    b.terminating = false;
    b.local = c.local;
    out.push_back(b);
  }
  if (out.empty()) {
    for (const Candidate& c : candidates) {
      if (local_only && !c.local) continue;
      if (c.ready || !c.serving || !c.terminating) continue;
      LbBackend b = c.backend;
      b.terminating = true;
      b.local = c.local;
      out.push_back(b);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::string_view RefusalReasonName(RefusalReason reason) {
  switch (reason) {
    case RefusalReason::kBackendLoopback:
      return "backend_loopback";
    case RefusalReason::kBackendUnspecified:
      return "backend_unspecified";
    case RefusalReason::kBackendLinkLocal:
      return "backend_link_local";
    case RefusalReason::kBackendMulticast:
      return "backend_multicast";
    case RefusalReason::kBackendBroadcast:
      return "backend_broadcast";
    case RefusalReason::kBackendInvalid:
      return "backend_invalid";
    case RefusalReason::kPortInvalid:
      return "port_invalid";
    case RefusalReason::kProtocolUnknown:
      return "protocol_unknown";
    case RefusalReason::kExternalIpInvalid:
      return "external_ip_invalid";
    case RefusalReason::kLoadBalancerIpInvalid:
      return "load_balancer_ip_invalid";
    case RefusalReason::kProtocolUnsupported:
      return "protocol_unsupported";
    case RefusalReason::kAffinityTimeoutInvalid:
      return "session_affinity_timeout_invalid";
    case RefusalReason::kLbAlgorithmInvalid:
      return "lb_algorithm_invalid";
    case RefusalReason::kCount:
      break;
  }
  return "unknown";
}

bool FrontendKeyLess(const LbFrontend& a, const LbFrontend& b) {
  return std::tie(a.addr, a.port, a.proto, a.scope, a.service, a.port_name, a.flags) <
         std::tie(b.addr, b.port, b.proto, b.scope, b.service, b.port_name, b.flags);
}

ServiceTranslation TranslateService(
    const k8s::Service& service,
    const std::vector<std::shared_ptr<const k8s::EndpointSlice>>& slices_of_this_service,
    const NodeContext& node) {
  ServiceTranslation out;
  if (service.headless || service.type == "ExternalName") return out;
  std::optional<IpAddress> cluster_ip;
  for (const std::string& ip : service.cluster_ips) {
    if (ip == "None") return out;
    cluster_ip = ParseV4(ip);
    if (cluster_ip.has_value()) break;
  }
  if (!cluster_ip.has_value()) return out;

  const std::string key = service.meta.Key();
  const bool nodeport_type = service.type == "NodePort" || service.type == "LoadBalancer";
  const bool etp_local = service.external_traffic_policy == "Local";
  const bool itp_local = service.internal_traffic_policy == "Local";

  uint16_t common_flags = 0;
  uint32_t affinity_timeout = 0;
  if (service.session_affinity_client_ip) {
    // The apiserver refuses a Service whose timeout is outside 1..86400
    // (MaxClientIPServiceAffinitySeconds): programming it with some other timeout would serve a
    // Service that cannot exist.
    if (service.session_affinity_timeout_seconds < 0 ||
        service.session_affinity_timeout_seconds > kMaxAffinityTimeoutSeconds) {
      out.refused.push_back(
          {RefusalReason::kAffinityTimeoutInvalid,
           absl::StrCat("Service with sessionAffinityConfig.clientIP.timeoutSeconds ",
                        service.session_affinity_timeout_seconds, " (the API allows 1..",
                        kMaxAffinityTimeoutSeconds, ")")});
      return out;
    }
    common_flags |= SLUICE_SVC_F_AFFINITY;
    affinity_timeout = service.session_affinity_timeout_seconds > 0
                           ? static_cast<uint32_t>(service.session_affinity_timeout_seconds)
                           : kDefaultAffinityTimeoutSeconds;
  }

  const std::vector<IpAddress> node_addrs = [&] {
    std::set<IpAddress> s;
    for (const IpAddress& a : node.node_addresses) {
      if (a.is_v4()) s.insert(a);
    }
    return std::vector<IpAddress>(s.begin(), s.end());
  }();
  std::set<Refusal> refused;
  const std::vector<IpAddress> external_ips = ParseFrontendIps(
      service.external_ips, RefusalReason::kExternalIpInvalid, "externalIP", &refused);
  const std::vector<IpAddress> lb_ips =
      ParseFrontendIps(service.load_balancer_ingress_ips, RefusalReason::kLoadBalancerIpInvalid,
                       "loadBalancer ingress IP", &refused);
  const std::vector<IpPrefix> source_ranges =
      ParseV4SourceRanges(service.load_balancer_source_ranges);

  // Maglev or random: the Service's own choice (Sluice's annotation, else Cilium's), else the
  // node's default for the external frontends.
  std::optional<bool> maglev_chosen;
  for (std::string_view annotation :
       {k8s::kAnnotationLbAlgorithm, k8s::kAnnotationCiliumLbAlgorithm}) {
    auto a = service.meta.annotations.find(std::string(annotation));
    if (a == service.meta.annotations.end()) continue;
    if (a->second == "maglev" || a->second == "random") {
      maglev_chosen = a->second == "maglev";
      break;
    }
    refused.insert({RefusalReason::kLbAlgorithmInvalid,
                    absl::StrCat("annotation ", std::string(annotation), ": \"", a->second,
                                 "\" (want random or maglev)")});
  }
  constexpr uint16_t kExternalFlags =
      SLUICE_SVC_F_NODEPORT | SLUICE_SVC_F_EXTERNAL_IP | SLUICE_SVC_F_LOADBALANCER;

  std::set<IpAddress> local_ready;  // for the health check
  for (const k8s::ServicePort& sp : service.ports) {
    std::optional<uint8_t> proto = k8s::IpProtocolNumber(sp.protocol);
    if (!proto.has_value()) {
      refused.insert({RefusalReason::kProtocolUnknown,
                      absl::StrCat("port '", sp.name, "' ", sp.port, ": unknown protocol")});
      continue;
    }
    if (*proto == IPPROTO_SCTP) {
      // The datapath balances TCP and UDP only: it neither looks SCTP packets up as Service
      // traffic nor rewrites SCTP's CRC32c, so the frontend would catch nothing (Cilium likewise
      // skips SCTP ports while its SCTP support is off).
      refused.insert({RefusalReason::kProtocolUnsupported,
                      absl::StrCat("port '", sp.name, "' ", sp.port, "/SCTP")});
      continue;
    }
    if (sp.port <= 0 || sp.port > 65535) {
      refused.insert({RefusalReason::kPortInvalid, absl::StrCat("port '", sp.name, "' ", sp.port)});
      continue;
    }
    if (nodeport_type && (sp.node_port < 0 || sp.node_port > 65535)) {
      // The port itself is still served on the ClusterIP; only the NodePort is left out.
      refused.insert({RefusalReason::kPortInvalid,
                      absl::StrCat("port '", sp.name, "' nodePort ", sp.node_port)});
    }
    std::vector<Candidate> candidates =
        CollectEndpoints(service, sp, *proto, slices_of_this_service, node, &refused);
    for (const Candidate& c : candidates) {
      if (c.local && c.ready) local_ready.insert(c.backend.addr);
    }
    const std::vector<LbBackend> cluster_set = Select(candidates, /*local_only=*/false);
    const std::vector<LbBackend> local_set = Select(candidates, /*local_only=*/true);

    auto make = [&](const IpAddress& addr, uint16_t port, uint16_t flags, bool policy_local) {
      LbFrontend f;
      f.service = key;
      f.port_name = sp.name;
      f.addr = addr;
      f.port = port;
      f.proto = *proto;
      f.scope = SLUICE_LB_SCOPE_EXTERNAL;
      f.flags = static_cast<uint16_t>(common_flags | flags);
      if (maglev_chosen.value_or(node.maglev_default && (flags & kExternalFlags) != 0))
        f.flags |= SLUICE_SVC_F_MAGLEV;
      f.affinity_timeout = affinity_timeout;
      f.backends = policy_local ? local_set : cluster_set;
      // No usable endpoint anywhere: reject. A Local policy that filters out every endpoint
      // while others exist elsewhere drops instead (kube-proxy: "has no local endpoints").
      if (f.backends.empty() && cluster_set.empty()) f.flags |= SLUICE_SVC_F_REJECT;
      if (policy_local && (flags & SLUICE_SVC_F_ETP_LOCAL)) {
        LbFrontend in_cluster = f;
        in_cluster.scope = SLUICE_LB_SCOPE_INTERNAL;
        in_cluster.flags &= static_cast<uint16_t>(~SLUICE_SVC_F_ETP_LOCAL);
        in_cluster.backends = cluster_set;
        out.in_cluster_frontends.push_back(std::move(in_cluster));
      }
      out.frontends.push_back(std::move(f));
    };

    const uint16_t svc_port = static_cast<uint16_t>(sp.port);
    make(*cluster_ip, svc_port, itp_local ? SLUICE_SVC_F_ITP_LOCAL : 0, itp_local);

    const uint16_t etp_flag = etp_local ? SLUICE_SVC_F_ETP_LOCAL : 0;
    if (nodeport_type && sp.node_port > 0 && sp.node_port <= 65535) {
      for (const IpAddress& a : node_addrs) {
        make(a, static_cast<uint16_t>(sp.node_port), SLUICE_SVC_F_NODEPORT | etp_flag, etp_local);
      }
    }
    for (const IpAddress& a : external_ips) {
      make(a, svc_port, SLUICE_SVC_F_EXTERNAL_IP | etp_flag, etp_local);
    }
    for (const IpAddress& a : lb_ips) {
      make(a, svc_port, SLUICE_SVC_F_LOADBALANCER | etp_flag, etp_local);
      if (!source_ranges.empty()) {
        out.frontends.back().flags |= SLUICE_SVC_F_SOURCE_RANGES;
        out.frontends.back().source_ranges = source_ranges;
        if (etp_local) {
          out.in_cluster_frontends.back().flags |= SLUICE_SVC_F_SOURCE_RANGES;
          out.in_cluster_frontends.back().source_ranges = source_ranges;
        }
      }
    }
  }
  // One map key, one frontend: an address listed twice (an externalIP that is also an LB ingress
  // IP or a node address) keeps the first in key order, i.e. the lowest flags (kube-proxy matches
  // externalIPs before LB ingress IPs).
  for (std::vector<LbFrontend>* list : {&out.frontends, &out.in_cluster_frontends}) {
    std::sort(list->begin(), list->end(), FrontendKeyLess);
    list->erase(std::unique(list->begin(), list->end(),
                            [](const LbFrontend& a, const LbFrontend& b) {
                              return std::tie(a.addr, a.port, a.proto, a.scope) ==
                                     std::tie(b.addr, b.port, b.proto, b.scope);
                            }),
                list->end());
  }

  out.refused.assign(refused.begin(), refused.end());

  if (service.type == "LoadBalancer" && etp_local && service.health_check_node_port > 0 &&
      service.health_check_node_port <= 65535) {
    out.health_check = HealthCheck{key, static_cast<uint16_t>(service.health_check_node_port),
                                   static_cast<int>(local_ready.size())};
  }
  return out;
}

}  // namespace sluice::agent
