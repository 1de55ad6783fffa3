// The lab's top-of-rack router (`up --bgp`): FRR's zebra and bgpd from Debian, one instance per
// lab in the router's namespace (`-N sluice-lab-<lab> --vty_socket <lab>/router`), peering over
// eBGP with every node's speaker (a listen range over the underlay: nodes need no configuration
// on the router), installing the pod CIDRs they announce into its kernel and announcing the
// client's network back with itself as next hop. Read it with
// `vtysh --vty_socket /run/sluice-lab/<lab>/router -c 'show ip bgp'`.
#ifndef SLUICE_AGENT_LAB_NETWORK_ROUTER_H_
#define SLUICE_AGENT_LAB_NETWORK_ROUTER_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/lab/network/topology.h"

namespace sluice::lab {

inline constexpr uint32_t kRouterAsn = 65000;
// Every node's (Calico's default): the router rewrites it in what it passes on (as-override),
// or a node would refuse another node's routes for carrying its own AS.
inline constexpr uint32_t kNodeAsn = 64512;

// bgpd's configuration for the topology's router.
std::string RouterBgpConfig(const Topology& topology);

// Writes the configurations under topology.router_dir() and starts zebra, then bgpd, in the
// router's namespace; returns their pids (the caller stops them with StopProcess) once both
// answer on their vty sockets.
absl::StatusOr<std::vector<pid_t>> StartRouter(const Topology& topology);

}  // namespace sluice::lab

#endif  // SLUICE_AGENT_LAB_NETWORK_ROUTER_H_
