// The node's BGP speaker is BIRD 2 (docs/routing.md, "BGP"): this renders its whole
// configuration from what the agent knows, the node's address (router id), its pod CIDR(s) from
// the Node object or cluster-pool IPAM, and the peers of --bgp_peers. A pure function, tested
// without a kernel; the speaker (speaker.h) writes the result and asks BIRD to reload it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/base/net.h"

namespace sluice::agent::bgp {

struct BgpPeer {
  IpAddress address;
  uint32_t asn = 0;
  uint32_t hold_time = 9;       // seconds; the session is down after this long without a message
  uint32_t keepalive_time = 3;  // seconds, below hold_time
};

struct BgpOptions {
  uint32_t local_asn = 64512;
  std::vector<BgpPeer> peers;
  // How long a peer keeps this node's routes while its speaker restarts (BGP graceful restart,
  // RFC 4724): the routes stay and the network keeps forwarding to the node meanwhile.
  uint32_t graceful_restart_time = 120;
  std::string password;  // TCP MD5 for every session; empty: none
  std::string log_file;  // BIRD's log (sessions going up and down); empty: syslog
};

// "ADDRESS:ASN[:HOLD[:KEEPALIVE]]", e.g. "172.30.0.254:65000:9:3". Every field is checked
// (an IPv4 address, ASN 1..4294967295, hold time 0 or 3..65535, keepalive below the hold time).
[[nodiscard]] absl::StatusOr<BgpPeer> ParseBgpPeer(absl::string_view text);

// The name of a peer's `protocol bgp` in BIRD: "peer_172_30_0_254".
std::string PeerProtocolName(const IpAddress& address);

// BIRD 2's configuration: a static protocol holding the pod CIDRs (blackhole routes, never
// exported to the kernel: the agent's own routes and the pods' veths deliver them), one
// `protocol bgp` per peer exporting exactly those, importing what the peers announce into the
// kernel's main table (protocol "bird"), graceful restart on both the sessions and the kernel
// protocol (BIRD started with -R keeps its routes in the kernel until it has recovered them).
// A password or log file with a double quote, a backslash or a control character is refused.
[[nodiscard]] absl::StatusOr<std::string> RenderBirdConfig(const BgpOptions& options,
                                                           const IpAddress& router_id,
                                                           const std::vector<IpPrefix>& pod_cidrs);

}  // namespace sluice::agent::bgp
