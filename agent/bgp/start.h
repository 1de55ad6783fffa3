// BGP as the agent runs it (--bgp_control_plane): BIRD announcing this node's pod CIDR to the
// peers of --bgp_peers and importing their routes (speaker.h), with its sessions as metrics.
#pragma once

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "agent/bgp/speaker.h"
#include "agent/metrics/agent_endpoints.h"
#include "agent/routing/node_setup.h"
#include "agent/start/pieces.h"

namespace sluice::agent {

struct RunningBgp {
  std::unique_ptr<bgp::Speaker> speaker;
  std::optional<metrics::ScopedCollector> collector;  // declared last: removed first
};

// `options.peers` and the ASNs from the flags; the router id, what is announced and where BIRD
// lives come from the node and the pieces (<state_dir>/bgp).
[[nodiscard]] absl::StatusOr<std::unique_ptr<RunningBgp>> StartBgp(const StartPieces& pieces,
                                                                   const bgp::BgpOptions& options,
                                                                   const Node& node,
                                                                   const std::string& bird_binary);

}  // namespace sluice::agent
