// sluicectl services: Service frontends, their flags and backend slots.
#include <arpa/inet.h>

#include <map>
#include <string>
#include <tuple>

#include "agent/sluicectl/common.h"

namespace sluice::ctl {

namespace {

std::string SvcFlags(uint16_t f) {
  static const std::pair<uint16_t, const char*> kNames[] = {
      {SLUICE_SVC_F_NODEPORT, "nodeport"},       {SLUICE_SVC_F_EXTERNAL_IP, "external-ip"},
      {SLUICE_SVC_F_LOADBALANCER, "loadbalancer"}, {SLUICE_SVC_F_AFFINITY, "affinity"},
      {SLUICE_SVC_F_ETP_LOCAL, "etp-local"},     {SLUICE_SVC_F_ITP_LOCAL, "itp-local"},
      {SLUICE_SVC_F_SOURCE_RANGES, "source-ranges"}, {SLUICE_SVC_F_REJECT, "reject"},
  };
  // A frontend that is none of the node-address kinds is a ClusterIP.
  std::string out = (f & (SLUICE_SVC_F_NODEPORT | SLUICE_SVC_F_EXTERNAL_IP |
                          SLUICE_SVC_F_LOADBALANCER)) != 0
                        ? ""
                        : "clusterip";
  for (const auto& [bit, name] : kNames) {
    if ((f & bit) == 0) continue;
    if (!out.empty()) out += ",";
    out += name;
  }
  return out;
}

}  // namespace

int Services() {
  auto svc = OpenOrDie<maps::Lb4ServiceMap>(maps::name::sluice_lb4_svc);
  auto be = OpenOrDie<maps::Lb4BackendMap>(maps::name::sluice_lb4_be);
  // Frontend (host-order address, port, proto, scope) -> slot -> entry; slot 0 is the master.
  using Fe = std::tuple<uint32_t, uint16_t, uint8_t, uint8_t>;
  std::map<Fe, std::map<uint16_t, sluice_lb4_service>> all;
  auto st = svc.ForEach([&](const sluice_lb4_key& k, const sluice_lb4_service& v) {
    all[Fe{ntohl(k.addr), ntohs(k.dport), k.proto, k.scope}][k.backend_slot] = v;
  });
  if (!st.ok()) return 1;
  std::printf("%-22s %-5s %-8s %-34s %8s %6s\n", "FRONTEND", "PROTO", "SCOPE", "FLAGS",
              "REV_NAT", "COUNT");
  for (const auto& [fe, slots] : all) {
    const auto& [addr, port, proto, scope] = fe;
    auto master = slots.find(0);
    std::string where = Ip(htonl(addr)) + ":" + (port == 0 ? "*" : std::to_string(port));
    if (master == slots.end()) {
      std::printf("%-22s %-5s (slots without a master entry)\n", where.c_str(), Proto(proto));
      continue;
    }
    const sluice_lb4_service& m = master->second;
    if (port == 0 && proto == 0) {
      std::printf("%-22s %-5s %-8s %-34s %8s %6s\n", where.c_str(), "any", "-",
                  "reject (no such port on this ClusterIP)", "-", "-");
      continue;
    }
    std::printf("%-22s %-5s %-8s %-34s %8u %6u\n", where.c_str(), Proto(proto),
                scope == SLUICE_LB_SCOPE_INTERNAL ? "internal" : "external",
                SvcFlags(m.flags).c_str(), m.rev_nat_id, m.count);
    for (const auto& [slot, v] : slots) {
      if (slot == 0) continue;
      auto b = be.Lookup(v.backend_id);
      std::string what = "(missing backend)";
      if (b.ok()) {
        what = Ip(b->addr) + ":" + std::to_string(ntohs(b->port));
        if (b->flags & SLUICE_BE_F_LOCAL) what += " local";
        if (b->flags & SLUICE_BE_F_TERMINATING) what += " terminating";
      }
      std::printf("  %s slot %-4u backend %-6u %s\n", slot > m.count ? "stale" : "     ", slot,
                  v.backend_id, what.c_str());
    }
  }
  return 0;
}

}  // namespace sluice::ctl
