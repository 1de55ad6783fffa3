// sluicectl: look at a node's Sluice datapath through its pinned maps. Read-only; works while
// the agent is down.
//
//   sluicectl [--bpffs_root=DIR] drops       per-reason drop counters, summed over CPUs
//   sluicectl [--bpffs_root=DIR] endpoints   the local endpoints the datapath delivers to
//   sluicectl [--bpffs_root=DIR] nat         masqueraded flows (pod tuple -> node address:port)
#include <arpa/inet.h>

#include <cstdio>
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
  auto drops = OpenOrDie<maps::DropMap>(SLUICE_MAP_DROPS);
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
  auto eps = OpenOrDie<maps::EndpointMap>(SLUICE_MAP_EP4);
  std::printf("%-16s %-6s %-8s %-18s %-18s\n", "ADDRESS", "ID", "IFINDEX", "POD MAC", "HOST MAC");
  auto st = eps.ForEach([](const sluice_ep4_key& k, const sluice_endpoint& v) {
    std::printf("%-16s %-6u %-8u %-18s %-18s\n", Ip(k.addr).c_str(), v.endpoint_id, v.ifindex,
                Mac(v.mac).c_str(), Mac(v.host_mac).c_str());
  });
  return st.ok() ? 0 : 1;
}

int Nat() {
  auto snat = OpenOrDie<maps::NatMap>(SLUICE_MAP_SNAT4);
  std::printf("%-5s %-22s %-22s %-22s\n", "PROTO", "POD", "REMOTE", "MASQUERADED AS");
  auto st = snat.ForEach([](const sluice_nat4_key& k, const sluice_nat4_entry& v) {
    std::printf("%-5s %-22s %-22s %-22s\n", Proto(k.proto),
                (Ip(k.saddr) + ":" + std::to_string(ntohs(k.sport))).c_str(),
                (Ip(k.daddr) + ":" + std::to_string(ntohs(k.dport))).c_str(),
                (Ip(v.addr) + ":" + std::to_string(ntohs(v.port))).c_str());
  });
  return st.ok() ? 0 : 1;
}

}  // namespace
}  // namespace sluice::ctl

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("sluicectl [--bpffs_root=DIR] drops|endpoints|nat");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  std::string cmd = args.size() > 1 ? args[1] : "";
  if (cmd == "drops") return sluice::ctl::Drops();
  if (cmd == "endpoints") return sluice::ctl::Endpoints();
  if (cmd == "nat") return sluice::ctl::Nat();
  std::fprintf(stderr, "usage: sluicectl [--bpffs_root=DIR] drops|endpoints|nat\n");
  return 2;
}
