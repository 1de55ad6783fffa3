// Service names for sluicectl's views of sluice_lb4_svc: frontends named by the Service port
// the running agent (its /v1/services) says they belong to or, with the agent down, the table it
// last wrote (<state_dir>/services.json, agent/service/name_file.h); and the frontend flags
// spelled out.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>

namespace sluice::ctl {

// "clusterip,affinity", "nodeport,etp-local", ...: a master entry's flags as words.
std::string SvcFlags(uint16_t flags);

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
  std::string from;         // "" from the agent, else the file the names come from and why
  size_t services = 0;      // Services named

  const Named* Find(const std::string& addr, uint16_t port, const char* proto,
                    bool node_port) const;
};

// Asks the agent (--agent); when it does not answer, reads <--state_dir>/services.json (no
// why_empty then); when neither has names `unavailable` says why and the maps are empty.
ServiceNames LoadServiceNames();

}  // namespace sluice::ctl
