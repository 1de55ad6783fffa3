#include "agent/monitor/names.h"

#include <arpa/inet.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace sluice::monitor {
namespace {

std::string FrontendKey(const std::string& ip, uint16_t port, const std::string& proto) {
  return absl::StrCat(ip, ":", port, "/", proto);
}

std::string Ip4Text(uint32_t be) {
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &be, buf, sizeof(buf));
  return buf;
}

}  // namespace

void FlowNames::RefreshLocked() {
  absl::Time now = sources_.clock->Now();
  if (now - built_ < sources_.refresh) return;
  built_ = now;
  pod_by_ip_.clear();
  service_by_frontend_.clear();
  interfaces_.clear();
  if (sources_.endpoints) {
    for (const auto& ep : sources_.endpoints->List()) {
      if (!ep.pod_name.empty()) pod_by_ip_[ep.ipv4] = {ep.pod_namespace, ep.pod_name};
    }
  }
  if (sources_.pods) {
    for (const auto& pod : sources_.pods->List()) {
      if (pod->host_network) continue;  // its address is the node's
      for (const auto& ip : pod->pod_ips) {
        pod_by_ip_.try_emplace(ip, Named{pod->meta.namespace_, pod->meta.name});
      }
    }
  }
  if (sources_.services) {
    for (const auto& svc : sources_.services->List()) {
      Named n{svc->meta.namespace_, svc->meta.name};
      for (const auto& port : svc->ports) {
        std::string proto = absl::AsciiStrToLower(std::string(k8s::ProtocolName(port.protocol)));
        auto add = [&](const std::string& ip) {
          service_by_frontend_.try_emplace(FrontendKey(ip, port.port, proto), n);
        };
        for (const auto& ip : svc->cluster_ips) add(ip);
        for (const auto& ip : svc->external_ips) add(ip);
        for (const auto& ip : svc->load_balancer_ingress_ips) add(ip);
        if (port.node_port != 0) {
          service_by_frontend_.try_emplace(FrontendKey("*", port.node_port, proto), n);
        }
      }
    }
  }
}

void FlowNames::NamePeerLocked(FlowPeer& p) {
  if (p.ip.empty() || !p.pod.empty()) return;
  auto it = pod_by_ip_.find(p.ip);
  if (it == pod_by_ip_.end()) return;
  p.namespace_ = it->second.namespace_;
  p.pod = it->second.name;
}

const FlowNames::Named* FlowNames::ServiceOfLocked(const std::string& ip, uint16_t port,
                                                   const std::string& proto) {
  auto it = service_by_frontend_.find(FrontendKey(ip, port, proto));
  if (it == service_by_frontend_.end())
    it = service_by_frontend_.find(FrontendKey("*", port, proto));
  return it == service_by_frontend_.end() ? nullptr : &it->second;
}

void FlowNames::Name(Flow& flow) {
  absl::MutexLock lock(&mu_);
  RefreshLocked();
  NamePeerLocked(flow.source);
  NamePeerLocked(flow.destination);
  NamePeerLocked(flow.backend);
  if (flow.service.empty()) {
    const Named* svc = nullptr;
    if (flow.rev_nat_id != 0 && sources_.rev_nat) {
      // The frontend as the reverse NAT entry records it: the address replies come from.
      if (auto fe = sources_.rev_nat(flow.rev_nat_id)) {
        svc = ServiceOfLocked(Ip4Text(fe->addr), ntohs(fe->port), flow.protocol);
      }
    }
    // A flow sent to a frontend (a drop before translation, a reject): the destination.
    if (!svc && !flow.destination.ip.empty()) {
      auto it = service_by_frontend_.find(
          FrontendKey(flow.destination.ip, flow.destination.port, flow.protocol));
      if (it != service_by_frontend_.end()) svc = &it->second;
    }
    if (svc) {
      flow.service_namespace = svc->namespace_;
      flow.service = svc->name;
    }
  }
  if (flow.ifindex != 0 && flow.interface.empty() && sources_.interface_name) {
    auto it = interfaces_.find(flow.ifindex);
    if (it == interfaces_.end()) {
      it = interfaces_.emplace(flow.ifindex, sources_.interface_name(flow.ifindex)).first;
    }
    flow.interface = it->second;
  }
}

}  // namespace sluice::monitor
