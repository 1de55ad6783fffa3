// sluicectl services: Service frontends, their flags and backend slots, named by Service (and
// backends by pod) when the agent answers; a frontend with nothing to serve says why.
#include <arpa/inet.h>

#include <map>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "agent/sluicectl/common.h"
#include "agent/sluicectl/service_names.h"
#include "nlohmann/json.hpp"

namespace sluice::ctl {

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
    } else if (!names.from.empty()) {
      std::printf("(Service names from %s)\n", names.from.c_str());
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
  // What the agent could not program (a Service map is full), in the order it will as room
  // appears: a JSON entry has "notProgrammed" instead of slots.
  Unprogrammed refused = LoadUnprogrammed();
  size_t shown = 0;
  for (const UnprogrammedFrontend& u : refused.frontends) {
    if (!absl::GetFlag(FLAGS_service).empty() && !ServiceSelected(u.service)) continue;
    const std::string what =
        u.programmed >= 0
            ? absl::StrCat("programmed with ", u.programmed, " of ", u.backends, " backends")
            : absl::StrCat("not programmed (", u.backends, " backends)");
    if (json) {
      out.push_back({{"frontend", u.frontend},
                     {"proto", u.proto},
                     {"scope", u.internal ? "internal" : "external"},
                     {"service", u.service},
                     {"notProgrammed", "map_full"},
                     {"map", u.map},
                     {"backendsWanted", u.backends},
                     {"backendsProgrammed", u.programmed >= 0 ? u.programmed : 0}});
      continue;
    }
    if (shown++ == 0) {
      std::printf("\nMAP FULL: %zu frontends not (fully) programmed, in the order they get room:\n",
                  refused.total);
      std::printf("%-22s %-5s %-8s %-16s %-40s %s\n", "FRONTEND", "PROTO", "SCOPE", "FULL MAP",
                  "STATE", "SERVICE");
    }
    std::printf("%-22s %-5s %-8s %-16s %-40s %s\n", u.frontend.c_str(), u.proto.c_str(),
                u.internal ? "internal" : "external", u.map.c_str(), what.c_str(),
                u.service.c_str());
  }
  if (!json && refused.total > refused.frontends.size() && shown > 0) {
    std::printf("... and %zu more (sluice_services_unprogrammed on /metrics)\n",
                refused.total - refused.frontends.size());
  }
  if (json) PrintJson(out);
  return 0;
}

}  // namespace sluice::ctl
