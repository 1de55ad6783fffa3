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
#include <vector>

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

// Frontends the agent could not program because a Service map is full, from the list it writes
// after each batch (<--state_dir>/services-unprogrammed.json, agent/service/name_file.h), in the
// order it will program them as room appears.
struct UnprogrammedFrontend {
  std::string service;   // "default/web"
  std::string frontend;  // "10.96.0.10:80"
  std::string proto;     // "tcp"
  bool internal = false;
  std::string map;  // the map that is full
  size_t backends = 0;
  long programmed = -1;  // >= 0: programmed with this many of `backends` (truncated)
};
struct Unprogrammed {
  size_t total = 0;  // may exceed frontends.size(): the file lists the first 10000
  std::vector<UnprogrammedFrontend> frontends;
  std::string unavailable;  // no list (no file: an agent without Services, or an older one)
};
Unprogrammed LoadUnprogrammed();

}  // namespace sluice::ctl
