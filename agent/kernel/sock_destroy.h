// Closing sockets of other processes from the outside: SOCK_DESTROY through NETLINK_SOCK_DIAG
// (the kernel's `ss -K`; needs CONFIG_INET_DIAG_DESTROY and CAP_NET_ADMIN). Socket LB uses it for
// connected UDP sockets whose backend went: connect() translated them once, and a connected
// socket's send() runs no cgroup hook that could translate it again (udp_sendmsg runs sendmsg4
// only with an address), so it would keep sending to the deleted backend. A destroyed socket is
// no longer connected: its next recv() fails with ECONNABORTED, send() with EDESTADDRREQ; the
// application connects again, to a live backend (Cilium's socket LB does the same).
#ifndef SLUICE_AGENT_KERNEL_SOCK_DESTROY_H_
#define SLUICE_AGENT_KERNEL_SOCK_DESTROY_H_

#include <cstddef>
#include <cstdint>
#include <tuple>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"

namespace sluice::agent {

// A socket by its cookie (SO_COOKIE, bpf_get_socket_cookie) and the peer it must be connected
// to (address and port in network order).
using ConnectedUdpSocket = std::tuple<uint64_t, uint32_t, uint16_t>;

// Destroys the IPv4 UDP sockets of the calling thread's network namespace that are connected
// to the peer `sockets` names for their cookie. Unconnected sockets (which pick a peer per
// datagram) and sockets connected elsewhere since are left alone. Returns how many were
// destroyed (sockets closed meanwhile are not counted, and no error).
[[nodiscard]] absl::StatusOr<size_t> DestroyConnectedUdp4Sockets(
    const absl::flat_hash_set<ConnectedUdpSocket>& sockets);

}  // namespace sluice::agent

#endif
