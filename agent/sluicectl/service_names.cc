#include "agent/sluicectl/service_names.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "agent/sluicectl/common.h"
#include "nlohmann/json.hpp"

namespace sluice::ctl {

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

const Named* ServiceNames::Find(const std::string& addr, uint16_t port, const char* proto,
                                bool node_port) const {
  if (node_port) {
    auto it = by_node_port.find({port, proto});
    return it == by_node_port.end() ? nullptr : &it->second;
  }
  auto it = by_frontend.find({addr, port, proto});
  return it == by_frontend.end() ? nullptr : &it->second;
}

ServiceNames LoadServiceNames() {
  ServiceNames n;
  auto body = AgentGet("/v1/services");
  nlohmann::json j;
  if (body.ok()) {
    j = nlohmann::json::parse(*body, nullptr, /*allow_exceptions=*/false);
    if (!j.is_array()) {
      n.unavailable = "the agent's /v1/services is not a list (no Kubernetes?)";
      return n;
    }
  } else {
    // The agent is down: the names it last wrote describe the maps it left.
    const std::string path = absl::GetFlag(FLAGS_state_dir) + "/services.json";
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      n.unavailable = absl::StrCat(body.status().message(), "; no ", path);
      return n;
    }
    std::stringstream buf;
    buf << in.rdbuf();
    j = nlohmann::json::parse(buf.str(), nullptr, /*allow_exceptions=*/false);
    if (!j.is_array()) {
      n.unavailable = absl::StrCat(body.status().message(), "; ", path, " is not a list");
      return n;
    }
    n.from = absl::StrCat(path, " (the agent is down: ", body.status().message(), ")");
  }
  n.services = j.size();
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

Unprogrammed LoadUnprogrammed() {
  Unprogrammed u;
  const std::string path = absl::GetFlag(FLAGS_state_dir) + "/services-unprogrammed.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    u.unavailable = absl::StrCat("no ", path);
    return u;
  }
  std::stringstream buf;
  buf << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(buf.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("frontends") || !j["frontends"].is_array()) {
    u.unavailable = absl::StrCat(path, " is not a list of frontends");
    return u;
  }
  u.total = j.value("total", size_t{0});
  for (const auto& f : j["frontends"]) {
    if (!f.is_object()) continue;
    UnprogrammedFrontend e;
    e.service = f.value("service", "");
    e.frontend = f.value("frontend", "");
    e.proto = Proto(static_cast<uint8_t>(f.value("protocol", 0)));
    e.internal = f.value("scope", 0) == SLUICE_LB_SCOPE_INTERNAL;
    e.map = f.value("map", "");
    e.backends = f.value("backends", size_t{0});
    e.programmed = f.value("backendsProgrammed", -1L);
    u.frontends.push_back(std::move(e));
  }
  return u;
}

}  // namespace sluice::ctl
