// The whole map ABI for C++ callers, with typed aliases and the pin paths under a bpffs root.
#pragma once

#include <string>

#include "maps/conntrack.h"
#include "maps/drop.h"
#include "maps/lb.h"
#include "maps/endpoint.h"
#include "maps/map.h"
#include "maps/nat.h"
#include "maps/node.h"
#include "maps/sock_lb.h"

namespace sluice::maps {

using EndpointMap = Map<sluice_ep4_key, sluice_endpoint>;
using NodeConfigMap = Map<__u32, sluice_node_config>;
using NoMasqMap = Map<sluice_lpm4_key, __u8>;
using NatMap = Map<sluice_nat4_key, sluice_nat4_entry>;
using DropMap = PerCpuMap<__u32, sluice_drop_count>;
using Lb4ServiceMap = Map<sluice_lb4_key, sluice_lb4_service>;
using Lb4BackendMap = Map<__u32, sluice_lb4_backend>;
using Lb4RevNatMap = Map<__u32, sluice_lb4_revnat>;
using Ct4Map = Map<sluice_ct4_key, sluice_ct4_entry>;
using Lb4SourceRangeMap = Map<sluice_lb4_srcrange_key, __u8>;
using Lb4AffinityMap = Map<sluice_lb4_affinity_key, sluice_lb4_affinity>;
using SockConfigMap = Map<__u32, sluice_sock_config>;
using Sock4RevNatMap = Map<sluice_sock4_revnat_key, sluice_sock4_revnat>;

inline std::string PinPath(const std::string& root, const char* map_name) {
  return root + "/" + map_name;
}

}  // namespace sluice::maps
