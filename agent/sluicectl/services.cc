// sluicectl services: Service frontends, their flags and backend slots, named by Service (and
// backends by pod) when the agent answers; a frontend with nothing to serve says why.
#include <arpa/inet.h>

#include <map>
#include <string>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "agent/sluicectl/common.h"

namespace sluice::ctl {

namespace {

std::string SvcFlags(uint16_t f) {
  static const std::pair<uint16_t, const char*> kNames[] = {
      {SLUICE_SVC_F_NODEPORT, "nodeport"},           {SLUICE_SVC_F_EXTERNAL_IP, "external-ip"},
      {SLUICE_SVC_F_LOADBALANCER, "loadbalancer"},   {SLUICE_SVC_F_AFFINITY, "affinity"},
      {SLUICE_SVC_F_ETP_LOCAL, "etp-local"},         {SLUICE_SVC_F_ITP_LOCAL, "itp-local"},
      {SLUICE_SVC_F_SOURCE_RANGES, "source-ranges"}, {SLUICE_SVC_F_REJECT, "reject"},
  };
  // A frontend that is none of the node-address kinds is a ClusterIP.
  std::string out =
      (f & (SLUICE_SVC_F_NODEPORT | SLUICE_SVC_F_EXTERNAL_IP | SLUICE_SVC_F_LOADBALANCER)) != 0
          ? ""
          : "clusterip";
  for (const auto& [bit, name] : kNames) {
    if ((f & bit) == 0) continue;
    if (!out.empty()) out += ",";
    out += name;
  }
  return out;
}

struct Named {
  std::string service;  // "default/web:http"
  std::string why_empty;
};

// From the agent's /v1/services: frontend (address, port, proto) -> Service port, and
// (nodePort, proto) -> Service port for NodePort frontends on any node address.
struct ServiceNames {
  std::map<std::tuple<std::string, uint16_t, std::string>, Named> by_frontend;
  std::map<std::pair<uint16_t, std::string>, Named> by_node_port;
  std::string unavailable;  // why there are no names

  const Named* Find(const std::string& addr, uint16_t port, const char* proto,
                    bool node_port) const {
    if (node_port) {
      auto it = by_node_port.find({port, proto});
      return it == by_node_port.end() ? nullptr : &it->second;
    }
    auto it = by_frontend.find({addr, port, proto});
    return it == by_frontend.end() ? nullptr : &it->second;
  }
};

ServiceNames LoadServiceNames() {
  ServiceNames n;
  auto body = AgentGet("/v1/services");
  if (!body.ok()) {
    n.unavailable = std::string(body.status().message());
    return n;
  }
  auto j = nlohmann::json::parse(*body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array()) {
    n.unavailable = "the agent's /v1/services is not a list (no Kubernetes?)";
    return n;
  }
  for (const auto& s : j) {
    const std::string name = s.value("namespace", "") + "/" + s.value("name", "");
    std::vector<std::string> addrs = s.value("clusterIPs", std::vector<std::string>{});
    for (const auto& a : s.value("externalIPs", std::vector<std::string>{})) addrs.push_back(a);
    for (const auto& p : s.value("ports", nlohmann::json::array())) {
      Named named{name + (p.value("name", "").empty() ? "" : ":" + p.value("name", "")),
                  p.value("whyEmpty", "")};
      std::string proto = absl::AsciiStrToLower(p.value("protocol", "TCP"));
      auto port = static_cast<uint16_t>(p.value("port", 0));
      for (const auto& a : addrs) n.by_frontend[{a, port, proto}] = named;
      if (int np = p.value("nodePort", 0); np > 0) {
        n.by_node_port[{static_cast<uint16_t>(np), proto}] = named;
      }
    }
  }
  return n;
}

}  // namespace

int Services() {
  const bool json = JsonOutput();
  auto svc = OpenOrDie<maps::Lb4ServiceMap>(maps::name::sluice_lb4_svc);
  auto be = OpenOrDie<maps::Lb4BackendMap>(maps::name::sluice_lb4_be);
  ServiceNames names = LoadServiceNames();
  auto pods = PodNamesByAddress();
  // Frontend (host-order address, port, proto, scope) -> slot -> entry; slot 0 is the master.
  using Fe = std::tuple<uint32_t, uint16_t, uint8_t, uint8_t>;
  std::map<Fe, std::map<uint16_t, sluice_lb4_service>> all;
  auto st = svc.ForEach([&](const sluice_lb4_key& k, const sluice_lb4_service& v) {
    all[Fe{ntohl(k.addr), ntohs(k.dport), k.proto, k.scope}][k.backend_slot] = v;
  });
  if (!st.ok()) return 1;
  nlohmann::json out = nlohmann::json::array();
  if (!json) {
    if (!names.unavailable.empty()) {
      std::printf("(Service names unavailable: %s)\n", names.unavailable.c_str());
    }
    std::printf("%-22s %-5s %-8s %-34s %8s %6s  %s\n", "FRONTEND", "PROTO", "SCOPE", "FLAGS",
                "REV_NAT", "COUNT", "SERVICE");
  }
  for (const auto& [fe, slots] : all) {
    const auto& [addr, port, proto, scope] = fe;
    auto master = slots.find(0);
    const std::string ip = Ip(htonl(addr));
    std::string where = ip + ":" + (port == 0 ? "*" : std::to_string(port));
    if (master == slots.end()) {
      if (json) {
        out.push_back({{"frontend", where}, {"proto", Proto(proto)}, {"error", "no master"}});
      } else {
        std::printf("%-22s %-5s (slots without a master entry)\n", where.c_str(), Proto(proto));
      }
      continue;
    }
    const sluice_lb4_service& m = master->second;
    if (port == 0 && proto == 0) {
      if (!absl::GetFlag(FLAGS_service).empty()) continue;  // belongs to no one Service
      if (json) {
        out.push_back({{"frontend", where},
                       {"proto", "any"},
                       {"flags", "reject"},
                       {"note", "no such port on this ClusterIP"}});
      } else {
        std::printf("%-22s %-5s %-8s %-34s %8s %6s\n", where.c_str(), "any", "-",
                    "reject (no such port on this ClusterIP)", "-", "-");
      }
      continue;
    }
    const Named* named = names.Find(ip, port, Proto(proto), (m.flags & SLUICE_SVC_F_NODEPORT) != 0);
    const std::string service = named == nullptr ? "-" : named->service;
    if (!absl::GetFlag(FLAGS_service).empty() && (named == nullptr || !ServiceSelected(service))) {
      continue;
    }
    // Only a frontend that cannot serve gets the store's reason.
    const std::string why = named != nullptr && m.count == 0 ? named->why_empty : "";
    nlohmann::json backends = nlohmann::json::array();
    if (!json) {
      std::printf("%-22s %-5s %-8s %-34s %8u %6u  %s\n", where.c_str(), Proto(proto),
                  scope == SLUICE_LB_SCOPE_INTERNAL ? "internal" : "external",
                  SvcFlags(m.flags).c_str(), m.rev_nat_id, m.count, service.c_str());
      if (!why.empty()) std::printf("  why: %s\n", why.c_str());
    }
    for (const auto& [slot, v] : slots) {
      if (slot == 0) continue;
      auto b = be.Lookup(v.backend_id);
      std::string what = "(missing backend)";
      std::string pod;
      if (b.ok()) {
        what = Ip(b->addr) + ":" + std::to_string(ntohs(b->port));
        if (auto it = pods.find(Ip(b->addr)); it != pods.end()) pod = it->second;
        if (b->flags & SLUICE_BE_F_LOCAL) what += " local";
        if (b->flags & SLUICE_BE_F_TERMINATING) what += " terminating";
      }
      if (json) {
        backends.push_back({{"slot", slot},
                            {"backendID", v.backend_id},
                            {"backend", what},
                            {"pod", pod},
                            {"stale", slot > m.count}});
        continue;
      }
      std::printf("  %s slot %-4u backend %-6u %s%s\n", slot > m.count ? "stale" : "     ", slot,
                  v.backend_id, what.c_str(), pod.empty() ? "" : ("  " + pod).c_str());
    }
    if (json) {
      out.push_back({{"frontend", where},
                     {"proto", Proto(proto)},
                     {"scope", scope == SLUICE_LB_SCOPE_INTERNAL ? "internal" : "external"},
                     {"flags", SvcFlags(m.flags)},
                     {"revNatID", m.rev_nat_id},
                     {"count", m.count},
                     {"service", service},
                     {"whyEmpty", why},
                     {"backends", backends}});
    }
  }
  if (json) PrintJson(out);
  return 0;
}

}  // namespace sluice::ctl
