// sluicectl drops: per-reason drop counters, summed over CPUs, in total and per direction
// (ingress / egress, as in sluice_drop_count_total), then the policy_denied drops per endpoint and
// direction (sluice_pol_drops) with the pod each endpoint belongs to.
#include <arpa/inet.h>
#include <bpf/bpf.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/sluicectl/common.h"
#include "loader/datapath.h"
#include "nlohmann/json.hpp"

namespace sluice::ctl {
namespace {

struct PolicyDrops {
  uint32_t endpoint_id = 0;
  uint8_t direction = 0;
  std::string pod;  // "namespace/name", "(gone)" when no endpoint record holds the id
  uint64_t packets = 0, bytes = 0;
};

const char* Direction(uint8_t d) { return d == SLUICE_POLICY_INGRESS ? "ingress" : "egress"; }

// Every sluice_pol_drops entry, summed over CPUs, sorted by endpoint and direction; only the
// --pod one's when given.
absl::StatusOr<std::vector<PolicyDrops>> ReadPolicyDrops(maps::PolicyDropMap& map) {
  std::map<uint32_t, std::string> pods;
  for (const agent::Endpoint& ep : EndpointRecords()) pods[ep.endpoint_id] = PodName(ep);
  std::map<std::pair<uint32_t, uint8_t>, PolicyDrops> rows;
  sluice_policy_drop_key key{}, next{};
  const sluice_policy_drop_key* cur = nullptr;
  while (bpf_map_get_next_key(map.fd(), cur, &next) == 0) {
    key = next;
    cur = &key;
    auto per_cpu = map.Lookup(key);
    if (!per_cpu.ok()) continue;  // evicted from the LRU meanwhile
    auto it = pods.find(key.endpoint_id);
    PolicyDrops row{key.endpoint_id, key.direction, it == pods.end() ? "(gone)" : it->second};
    if (it == pods.end() ? !absl::GetFlag(FLAGS_pod).empty() : !PodSelected(it->second)) continue;
    for (const auto& c : *per_cpu) {
      row.packets += c.packets;
      row.bytes += c.bytes;
    }
    rows[{key.endpoint_id, key.direction}] = row;
  }
  if (errno != ENOENT)
    return absl::InternalError(absl::StrCat("iterate sluice_pol_drops: ", std::strerror(errno)));
  std::vector<PolicyDrops> out;
  for (auto& [k, row] : rows) out.push_back(std::move(row));
  return out;
}

}  // namespace

int Drops() {
  const bool json = JsonOutput();
  if (!PodFlagNamesALocalPod()) return 1;
  auto drops = OpenOrDie<maps::DropMap>(maps::name::sluice_drops);
  auto totals = loader::ReadDropTotals(drops);
  if (!totals.ok()) {
    std::fprintf(stderr, "sluicectl: %s\n", std::string(totals.status().message()).c_str());
    return 1;
  }
  auto pol_drops = OpenOrDie<maps::PolicyDropMap>(maps::name::sluice_pol_drops);
  auto policy = ReadPolicyDrops(pol_drops);
  if (!policy.ok()) {
    std::fprintf(stderr, "sluicectl: %s\n", std::string(policy.status().message()).c_str());
    return 1;
  }
  if (json) {
    nlohmann::json reasons = nlohmann::json::array(), per_endpoint = nlohmann::json::array();
    for (const auto& t : *totals) {
      nlohmann::json dirs = nlohmann::json::object();
      for (unsigned d = 0; d < SLUICE_DROP_DIR_MAX; ++d) {
        dirs[sluice_drop_dir_name(d)] = {{"packets", t.dir_packets[d]}, {"bytes", t.dir_bytes[d]}};
      }
      reasons.push_back({{"id", t.reason},
                         {"reason", t.name},
                         {"packets", t.packets},
                         {"bytes", t.bytes},
                         {"direction", dirs}});
    }
    for (const auto& p : *policy) {
      per_endpoint.push_back({{"endpoint", p.endpoint_id},
                              {"pod", p.pod},
                              {"direction", Direction(p.direction)},
                              {"packets", p.packets},
                              {"bytes", p.bytes}});
    }
    PrintJson({{"reasons", reasons}, {"policy_denied_by_endpoint", per_endpoint}});
    return 0;
  }
  // INGRESS / EGRESS: the packets of PACKETS by direction (maps/drop.h).
  std::printf("%-4s %-20s %12s %14s %12s %12s\n", "ID", "REASON", "PACKETS", "BYTES", "INGRESS",
              "EGRESS");
  for (const auto& t : *totals) {
    std::printf("%-4u %-20s %12llu %14llu %12llu %12llu\n", t.reason, t.name,
                static_cast<unsigned long long>(t.packets),
                static_cast<unsigned long long>(t.bytes),
                static_cast<unsigned long long>(t.dir_packets[SLUICE_DROP_DIR_INGRESS]),
                static_cast<unsigned long long>(t.dir_packets[SLUICE_DROP_DIR_EGRESS]));
  }
  std::printf("\npolicy_denied by endpoint:\n");
  if (policy->empty()) {
    std::printf("  (none)\n");
    return 0;
  }
  std::printf("  %-8s %-40s %-9s %12s %14s\n", "ENDPOINT", "POD", "DIRECTION", "PACKETS", "BYTES");
  for (const auto& p : *policy) {
    std::printf("  %-8u %-40s %-9s %12llu %14llu\n", p.endpoint_id, p.pod.c_str(),
                Direction(p.direction), static_cast<unsigned long long>(p.packets),
                static_cast<unsigned long long>(p.bytes));
  }
  return 0;
}

}  // namespace sluice::ctl
