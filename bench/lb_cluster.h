// The synthetic cluster every Service benchmark programs, in the BPF maps here and as kube-proxy
// rule sets in gen_kube_proxy_rules.py: keep the two address plans identical.
//
//   Service i (0-based) of N: ClusterIP 172.30.0.0 + i + 1, TCP port 80, E backends.
//   Backend j of service i:   10.128.0.0 + i*E + j + 1, port 8080, backend id i*E + j + 1.
//   The probed Service is the last one (i = N - 1); its backends may be replaced by real
//   servers (10.250.0.1 .. 10.250.0.E in the connection benchmark).
//   Pods (the cluster CIDR that kube-proxy's masquerade rules exempt) are 10.128.0.0/9.
// ClusterIPs stay out of 10.96.0.0/12 on purpose: a Sluice agent (or lab, or test) running on the
// same machine attaches socket-LB connect4 hooks to the root cgroup, which refuse connect() to
// unknown addresses of its service range in every namespace.
#pragma once

#include <arpa/inet.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "loader/datapath.h"

namespace sluice::bench {

inline constexpr uint32_t kClusterIpBase = 0xac1e0000;  // 172.30.0.0
inline constexpr uint32_t kBackendBase = 0x0a800000;    // 10.128.0.0
inline constexpr uint16_t kServicePort = 80;
inline constexpr uint16_t kBackendPort = 8080;

inline uint32_t ClusterIp(uint32_t i) { return htonl(kClusterIpBase + i + 1); }
inline uint32_t BackendIp(uint32_t i, uint32_t j, uint32_t per_service) {
  return htonl(kBackendBase + i * per_service + j + 1);
}

struct LbBackend {
  uint32_t id;
  uint32_t addr;  // network order
  uint16_t port;  // host order
};

inline sluice_lb4_key SvcKey(uint32_t addr, uint16_t port, uint16_t slot) {
  sluice_lb4_key k{};
  k.addr = addr;
  k.dport = htons(port);
  k.proto = IPPROTO_TCP;
  k.scope = SLUICE_LB_SCOPE_EXTERNAL;
  k.backend_slot = slot;
  return k;
}

// One TCP service in the agent's hitless order: backends, slots, reverse NAT, master last.
[[nodiscard]] inline absl::Status ProgramService(loader::Datapath& dp, uint32_t addr, uint16_t port,
                                                 uint32_t rev_nat_id,
                                                 const std::vector<LbBackend>& backends) {
  for (const auto& b : backends) {
    sluice_lb4_backend be{};
    be.addr = b.addr;
    be.port = htons(b.port);
    be.proto = IPPROTO_TCP;
    if (auto st = dp.lb4_backends().Update(b.id, be); !st.ok())
      return absl::Status(st.code(), absl::StrCat("backend ", b.id, ": ", st.message()));
  }
  for (size_t s = 0; s < backends.size(); ++s) {
    sluice_lb4_service slot{};
    slot.backend_id = backends[s].id;
    if (auto st = dp.lb4_services().Update(SvcKey(addr, port, s + 1), slot); !st.ok())
      return absl::Status(st.code(), absl::StrCat("slot ", s + 1, ": ", st.message()));
  }
  sluice_lb4_revnat rnat{};
  rnat.addr = addr;
  rnat.port = htons(port);
  if (auto st = dp.lb4_revnat().Update(rev_nat_id, rnat); !st.ok()) return st;
  sluice_lb4_service master{};
  master.count = static_cast<uint16_t>(backends.size());
  master.rev_nat_id = rev_nat_id;
  // The agent gives a frontend of up to SLUICE_LB4_RECORD_SLOTS backends a slot record while
  // sluice_lb4_rec has one free (agent/service/slot_records.h), written before the master that
  // names it; here record rev_nat_id, so frontends beyond the array read their slots from
  // sluice_lb4_svc, as theirs do.
  if (!backends.empty() && backends.size() <= SLUICE_LB4_RECORD_SLOTS &&
      rev_nat_id < SLUICE_LB4_REC_MAX_ENTRIES) {
    sluice_lb4_slot_record rec{};
    for (size_t s = 0; s < backends.size(); ++s) rec.backend_id[s] = backends[s].id;
    if (auto st = dp.lb4_slot_records().Update(rev_nat_id, rec); !st.ok())
      return absl::Status(st.code(), absl::StrCat("slot record: ", st.message()));
    master.backend_id = rev_nat_id;
  }
  return dp.lb4_services().Update(SvcKey(addr, port, 0), master);
}

inline std::vector<LbBackend> SyntheticBackends(uint32_t i, uint32_t per_service) {
  std::vector<LbBackend> v;
  for (uint32_t j = 0; j < per_service; ++j)
    v.push_back({i * per_service + j + 1, BackendIp(i, j, per_service), kBackendPort});
  return v;
}

// Services 0 .. n-2 with synthetic backends, then the probed service n-1 with `probed` (or its
// synthetic backends when empty).
[[nodiscard]] inline absl::Status ProgramCluster(loader::Datapath& dp, uint32_t n,
                                                 uint32_t per_service,
                                                 const std::vector<LbBackend>& probed = {}) {
  for (uint32_t i = 0; i < n; ++i) {
    auto backends = (i + 1 == n && !probed.empty()) ? probed : SyntheticBackends(i, per_service);
    if (auto st = ProgramService(dp, ClusterIp(i), kServicePort, i + 1, backends); !st.ok())
      return absl::Status(st.code(), absl::StrCat("service ", i, ": ", st.message()));
  }
  return absl::OkStatus();
}

}  // namespace sluice::bench
