// sluicectl: look at a node's Sluice datapath through its pinned maps. Read-only; works while
// the agent is down.
//
//   sluicectl [--bpffs_root=DIR] drops       per-reason drop counters, summed over CPUs
//   sluicectl [--bpffs_root=DIR] endpoints   the local endpoints the datapath delivers to
//   sluicectl [--bpffs_root=DIR] nat         masqueraded flows (pod tuple -> node address:port)
//   sluicectl [--bpffs_root=DIR] services    Service frontends, their flags and backend slots
#include <arpa/inet.h>

#include <cstdio>
#include <map>
#include <tuple>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "loader/datapath.h"
#include "maps/sluice_maps.h"

ABSL_FLAG(std::string, bpffs_root, SLUICE_DEFAULT_BPFFS_ROOT, "where the agent pins its maps");

namespace sluice::ctl {
namespace {

std::string Ip(uint32_t be) {
  char buf[INET_ADDRSTRLEN];
  in_addr a{be};
  inet_ntop(AF_INET, &a, buf, sizeof(buf));
  return buf;
}

std::string Mac(const uint8_t* m) {
  char buf[18];
  std::snprintf(buf, sizeof(buf), "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4],
                m[5]);
  return buf;
}

const char* Proto(uint8_t p) { return p == 6 ? "tcp" : p == 17 ? "udp" : p == 1 ? "icmp" : "?"; }

template <typename M>
M OpenOrDie(const char* name) {
  auto m = M::Open(maps::PinPath(absl::GetFlag(FLAGS_bpffs_root), name));
  if (!m.ok()) {
    std::fprintf(stderr, "sluicectl: %s\n", std::string(m.status().message()).c_str());
    std::exit(1);
  }
  return std::move(*m);
}

int Drops() {
  auto drops = OpenOrDie<maps::DropMap>(maps::name::sluice_drops);
  auto totals = loader::ReadDropTotals(drops);
  if (!totals.ok()) {
    std::fprintf(stderr, "sluicectl: %s\n", std::string(totals.status().message()).c_str());
    return 1;
  }
  std::printf("%-4s %-20s %12s %14s\n", "ID", "REASON", "PACKETS", "BYTES");
  for (const auto& t : *totals) {
    std::printf("%-4u %-20s %12llu %14llu\n", t.reason, t.name,
                static_cast<unsigned long long>(t.packets),
                static_cast<unsigned long long>(t.bytes));
  }
  return 0;
}

int Endpoints() {
  auto eps = OpenOrDie<maps::EndpointMap>(maps::name::sluice_ep4);
  std::printf("%-16s %-6s %-8s %-18s %-18s\n", "ADDRESS", "ID", "IFINDEX", "POD MAC", "HOST MAC");
  auto st = eps.ForEach([](const sluice_ep4_key& k, const sluice_endpoint& v) {
    std::printf("%-16s %-6u %-8u %-18s %-18s\n", Ip(k.addr).c_str(), v.endpoint_id, v.ifindex,
                Mac(v.mac).c_str(), Mac(v.host_mac).c_str());
  });
  return st.ok() ? 0 : 1;
}

int Nat() {
  auto snat = OpenOrDie<maps::NatMap>(maps::name::sluice_snat4);
  std::printf("%-5s %-22s %-22s %-22s\n", "PROTO", "POD", "REMOTE", "MASQUERADED AS");
  auto st = snat.ForEach([](const sluice_nat4_key& k, const sluice_nat4_entry& v) {
    std::printf("%-5s %-22s %-22s %-22s\n", Proto(k.proto),
                (Ip(k.saddr) + ":" + std::to_string(ntohs(k.sport))).c_str(),
                (Ip(k.daddr) + ":" + std::to_string(ntohs(k.dport))).c_str(),
                (Ip(v.addr) + ":" + std::to_string(ntohs(v.port))).c_str());
  });
  return st.ok() ? 0 : 1;
}

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

}  // namespace
}  // namespace sluice::ctl

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("sluicectl [--bpffs_root=DIR] drops|endpoints|nat|services");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  std::string cmd = args.size() > 1 ? args[1] : "";
  if (cmd == "drops") return sluice::ctl::Drops();
  if (cmd == "endpoints") return sluice::ctl::Endpoints();
  if (cmd == "nat") return sluice::ctl::Nat();
  if (cmd == "services") return sluice::ctl::Services();
  std::fprintf(stderr, "usage: sluicectl [--bpffs_root=DIR] drops|endpoints|nat|services\n");
  return 2;
}
