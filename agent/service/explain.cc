#include "agent/service/explain.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace sluice::agent {
namespace {

bool Selects(const k8s::StringMap& selector, const k8s::StringMap& labels) {
  for (const auto& [k, v] : selector) {
    auto it = labels.find(k);
    if (it == labels.end() || it->second != v) return false;
  }
  return true;
}

std::string SelectorText(const k8s::StringMap& selector) {
  std::vector<std::string> parts;
  for (const auto& [k, v] : selector) parts.push_back(absl::StrCat(k, "=", v));
  std::sort(parts.begin(), parts.end());
  return absl::StrJoin(parts, ",");
}

}  // namespace

ServiceDiagnosis DiagnoseService(
    const k8s::Service& service,
    const std::vector<std::shared_ptr<const k8s::EndpointSlice>>& slices,
    const std::vector<std::shared_ptr<const k8s::Pod>>& pods) {
  ServiceDiagnosis d;
  d.namespace_ = service.meta.namespace_;
  d.name = service.meta.name;
  d.type = service.type.empty() ? "ClusterIP" : service.type;
  d.cluster_ips = service.cluster_ips;
  d.external_ips = service.external_ips;
  d.external_ips.insert(d.external_ips.end(), service.load_balancer_ingress_ips.begin(),
                        service.load_balancer_ingress_ips.end());
  std::vector<const k8s::EndpointSlice*> own;
  for (const auto& s : slices) {
    if (s != nullptr && s->service_name == service.meta.name &&
        s->meta.namespace_ == service.meta.namespace_) {
      own.push_back(s.get());
    }
  }
  std::vector<const k8s::Pod*> selected;
  if (!service.selector.empty()) {
    for (const auto& p : pods) {
      if (p != nullptr && p->meta.namespace_ == service.meta.namespace_ && !p->host_network &&
          Selects(service.selector, p->meta.labels)) {
        selected.push_back(p.get());
      }
    }
  }
  for (const k8s::ServicePort& sp : service.ports) {
    ServicePortDiagnosis pd;
    pd.name = sp.name;
    pd.port = sp.port;
    pd.protocol = std::string(k8s::ProtocolName(sp.protocol));
    pd.target_port = sp.target_port.is_name       ? sp.target_port.name
                     : sp.target_port.number != 0 ? absl::StrCat(sp.target_port.number)
                                                  : absl::StrCat(sp.port);
    pd.node_port = sp.node_port;
    // Endpoints of this port, by address, as the translator collects them.
    std::map<std::string, const k8s::Endpoint*> eps;
    for (const k8s::EndpointSlice* s : own) {
      bool has_port = false;
      for (const auto& p : s->ports) {
        has_port |= p.name == sp.name && p.protocol == sp.protocol && p.port.has_value();
      }
      if (!has_port) continue;
      for (const auto& e : s->endpoints) {
        if (!e.address.empty()) eps.emplace(e.address, &e);
      }
    }
    for (const auto& [addr, e] : eps) {
      if (e->ready)
        ++pd.ready;
      else if (e->serving && e->terminating)
        ++pd.terminating;
      else
        ++pd.not_ready;
    }
    if (pd.ready + pd.terminating == 0) {
      int ready_pods = 0;
      bool port_declared = false;
      for (const k8s::Pod* p : selected) {
        ready_pods += p->ready ? 1 : 0;
        for (const auto& cp : p->container_ports) {
          port_declared |= cp.name == sp.target_port.name && cp.protocol == sp.protocol;
        }
      }
      if (service.selector.empty()) {
        pd.why_empty = own.empty()
                           ? "no selector, and no EndpointSlice was made for it by hand"
                           : "no selector; its hand-made EndpointSlices list no endpoint for "
                             "this port";
      } else if (selected.empty()) {
        pd.why_empty = absl::StrCat("selector ", SelectorText(service.selector),
                                    " matches no pod in namespace ", service.meta.namespace_);
      } else if (sp.target_port.is_name && !port_declared) {
        pd.why_empty =
            absl::StrCat("targetPort '", sp.target_port.name, "' is no container port (",
                         pd.protocol, ") of the ", selected.size(), " pod(s) the selector matches");
      } else if (ready_pods == 0) {
        pd.why_empty = absl::StrCat(selected.size(), " pod(s) match the selector, none is ready");
      } else {
        pd.why_empty =
            absl::StrCat(ready_pods, " ready pod(s) match, but the EndpointSlices list none yet");
      }
    }
    d.ports.push_back(std::move(pd));
  }
  return d;
}

std::string DiagnoseServicesJson(
    const std::vector<std::shared_ptr<const k8s::Service>>& services,
    const std::vector<std::shared_ptr<const k8s::EndpointSlice>>& slices,
    const std::vector<std::shared_ptr<const k8s::Pod>>& pods) {
  std::vector<ServiceDiagnosis> all;
  for (const auto& s : services) {
    if (s != nullptr) all.push_back(DiagnoseService(*s, slices, pods));
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
    return std::tie(a.namespace_, a.name) < std::tie(b.namespace_, b.name);
  });
  nlohmann::json out = nlohmann::json::array();
  for (const ServiceDiagnosis& d : all) {
    nlohmann::json ports = nlohmann::json::array();
    for (const auto& p : d.ports) {
      ports.push_back({{"name", p.name},
                       {"port", p.port},
                       {"protocol", p.protocol},
                       {"targetPort", p.target_port},
                       {"nodePort", p.node_port},
                       {"ready", p.ready},
                       {"terminating", p.terminating},
                       {"notReady", p.not_ready},
                       {"whyEmpty", p.why_empty}});
    }
    out.push_back({{"namespace", d.namespace_},
                   {"name", d.name},
                   {"type", d.type},
                   {"clusterIPs", d.cluster_ips},
                   {"externalIPs", d.external_ips},
                   {"ports", ports}});
  }
  return out.dump(2);
}

}  // namespace sluice::agent
