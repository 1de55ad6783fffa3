// sluicectl ct list | flush | stats: the conntrack of balanced and policy-tracked flows (TCP in
// sluice_ct4, the rest in sluice_ct4_any) and the datapath's conntrack counters (sluice_ct_stats).
// flush deletes every entry: established balanced flows are balanced again on their next
// packet (a TCP flow mid-stream may then reach another backend), so it is for debugging.
#include <arpa/inet.h>
#include <time.h>

#include <string>
#include <vector>

#include "agent/sluicectl/common.h"
#include "nlohmann/json.hpp"

namespace sluice::ctl {
namespace {

const char* Dir(uint8_t d) {
  return d == SLUICE_CT_DIR_FORWARD  ? "forward"
         : d == SLUICE_CT_DIR_REPLY  ? "reply"
         : d == SLUICE_CT_DIR_POLICY ? "policy"
         : d == SLUICE_CT_DIR_FLOW   ? "flow"
                                     : "?";
}

// Entries and capacity of both maps, and what the datapath counted (created entries, refused
// inserts). The agent's GC and LRU eviction figures are on its /metrics (docs/metrics.md).
int ConntrackStats() {
  auto stats = OpenOrDie<maps::CtStatsMap>(maps::name::sluice_ct_stats);
  auto sum = [&](uint32_t slot) {
    uint64_t n = 0;
    if (auto v = stats.Lookup(slot); v.ok())
      for (uint64_t c : *v) n += c;
    return n;
  };
  struct Row {
    const char* map;
    uint32_t created, failed;
  };
  const Row rows[] = {
      {maps::name::sluice_ct4, SLUICE_CT_STAT_TCP_CREATED, SLUICE_CT_STAT_TCP_INSERT_FAILED},
      {maps::name::sluice_ct4_any, SLUICE_CT_STAT_ANY_CREATED, SLUICE_CT_STAT_ANY_INSERT_FAILED},
  };
  const bool json = JsonOutput();
  nlohmann::json out = nlohmann::json::array();
  if (!json) {
    std::printf("%-15s %10s %10s %14s %14s\n", "MAP", "ENTRIES", "CAPACITY", "CREATED",
                "INSERT_FAILED");
  }
  for (const Row& r : rows) {
    auto ct = OpenOrDie<maps::Ct4Map>(r.map);
    auto n = ct.Count();
    bpf_map_info info{};
    uint32_t len = sizeof(info);
    uint32_t cap = bpf_obj_get_info_by_fd(ct.fd(), &info, &len) == 0 ? info.max_entries : 0;
    if (json) {
      out.push_back({{"map", r.map},
                     {"entries", n.ok() ? *n : 0},
                     {"capacity", cap},
                     {"created", sum(r.created)},
                     {"insertFailed", sum(r.failed)}});
      continue;
    }
    std::printf("%-15s %10zu %10u %14llu %14llu\n", r.map, n.ok() ? *n : 0, cap,
                static_cast<unsigned long long>(sum(r.created)),
                static_cast<unsigned long long>(sum(r.failed)));
  }
  if (json) PrintJson(out);
  return 0;
}

}  // namespace

int Conntrack(const std::vector<std::string>& args) {
  const std::string sub = args.empty() ? "list" : args[0];
  if ((sub != "list" && sub != "flush" && sub != "stats") || args.size() > 1) {
    std::fprintf(stderr, "usage: sluicectl ct list|flush|stats\n");
    return 2;
  }
  if (sub == "stats") return ConntrackStats();
  auto tcp = OpenOrDie<maps::Ct4Map>(maps::name::sluice_ct4);
  auto any = OpenOrDie<maps::Ct4Map>(maps::name::sluice_ct4_any);
  if (sub == "flush") {
    size_t deleted = 0;
    absl::Status st;
    for (auto* ct : {&tcp, &any}) {
      std::vector<sluice_ct4_key> keys;
      st.Update(ct->ForEach(
          [&](const sluice_ct4_key& k, const sluice_ct4_entry&) { keys.push_back(k); }));
      for (const auto& k : keys) deleted += ct->Delete(k).ok() ? 1 : 0;
    }
    if (JsonOutput()) {
      PrintJson({{"deleted", deleted}});
    } else {
      std::printf("deleted %zu conntrack entries\n", deleted);
    }
    return st.ok() ? 0 : 1;
  }
  const bool json = JsonOutput();
  if (!PodFlagNamesALocalPod()) return 1;
  const uint64_t now = NowNs();
  auto pods = PodNamesByAddress();
  nlohmann::json out = nlohmann::json::array();
  if (!json) {
    std::printf("%-5s %-8s %-22s %-22s %-22s %7s %8s %s\n", "PROTO", "DIR", "SOURCE", "DESTINATION",
                "BACKEND", "REV_NAT", "IDLE(s)", "FLAGS");
  }
  auto print = [&](const sluice_ct4_key& k, const sluice_ct4_entry& v) {
    // --pod: entries whose source, destination or backend is the pod.
    if (!absl::GetFlag(FLAGS_pod).empty()) {
      auto named = [&](uint32_t a) {
        auto it = pods.find(Ip(a));
        return it != pods.end() && PodSelected(it->second);
      };
      if (!named(k.saddr) && !named(k.daddr) && !named(v.backend_addr)) return;
    }
    std::string src = Ip(k.saddr) + ":" + std::to_string(ntohs(k.sport));
    // A flow entry's key is the client alone; its value names the frontend the client sent to.
    std::string dst = k.dir == SLUICE_CT_DIR_FLOW
                          ? Ip(v.frontend_addr) + ":" + std::to_string(ntohs(v.frontend_port))
                          : Ip(k.daddr) + ":" + std::to_string(ntohs(k.dport));
    // A reply entry's backend is its source; its value names the frontend (SLUICE_CT_F_FRONTEND).
    std::string be = k.dir == SLUICE_CT_DIR_POLICY ? "-"
                     : k.dir == SLUICE_CT_DIR_REPLY
                         ? src
                         : Ip(v.backend_addr) + ":" + std::to_string(ntohs(v.backend_port));
    double idle = now > v.last_seen_ns ? (now - v.last_seen_ns) / 1e9 : 0;
    std::string flags;
    if (v.flags & SLUICE_CT_F_HAIRPIN) flags += "hairpin ";
    if (v.flags & SLUICE_CT_F_ESTABLISHED) flags += "established ";
    if (v.flags & SLUICE_CT_F_CLOSING) flags += "closing ";
    if (!flags.empty()) flags.pop_back();
    if (json) {
      auto src_pod = pods.find(Ip(k.saddr));
      out.push_back({{"proto", Proto(k.proto)},
                     {"direction", Dir(k.dir)},
                     {"source", src},
                     {"destination", dst},
                     {"backend", be},
                     {"backendID", v.backend_id},
                     {"revNatID", v.rev_nat_id},
                     {"idleSeconds", idle},
                     {"flags", flags},
                     {"sourcePod", src_pod == pods.end() ? "" : src_pod->second}});
      if (k.dir == SLUICE_CT_DIR_REPLY && (v.flags & SLUICE_CT_F_FRONTEND))
        out.back()["frontend"] = Ip(v.backend_addr) + ":" + std::to_string(ntohs(v.backend_port));
      return;
    }
    std::printf("%-5s %-8s %-22s %-22s %-22s %7u %8.1f %s\n", Proto(k.proto), Dir(k.dir),
                src.c_str(), dst.c_str(), be.c_str(), v.rev_nat_id, idle,
                flags.empty() ? "-" : flags.c_str());
  };
  absl::Status st = tcp.ForEach(print);
  st.Update(any.ForEach(print));
  if (json) PrintJson(out);
  return st.ok() ? 0 : 1;
}

}  // namespace sluice::ctl
