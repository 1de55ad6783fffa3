// sluicectl bgp: the node's BGP sessions and what goes over each, read from BIRD's control
// socket under --state_dir (<state_dir>/bgp/bird.ctl, docs/routing.md, "BGP"): the session's
// state, the prefixes announced to the peer and those learned from it. Works while the agent is
// down: BIRD is not the agent's child.
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agent/bgp/bird_control.h"
#include "agent/sluicectl/common.h"
#include "nlohmann/json.hpp"

namespace sluice::ctl {
namespace {

// The prefixes of a `show route ...` reply: the first word of each line that names one.
std::vector<std::string> Prefixes(const std::vector<std::string>& reply) {
  std::vector<std::string> out;
  for (const auto& line : reply) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    if (!f.empty() && f[0].find('/') != std::string::npos) out.push_back(f[0]);
  }
  return out;
}

}  // namespace

int Bgp() {
  const std::string socket = absl::GetFlag(FLAGS_state_dir) + "/bgp/bird.ctl";
  auto protocols = agent::bgp::BirdCommand(socket, "show protocols");
  if (!protocols.ok()) {
    std::fprintf(stderr,
                 "sluicectl: BGP: BIRD does not answer on %s (--bgp_control_plane off?): %s\n",
                 socket.c_str(), std::string(protocols.status().message()).c_str());
    return 1;
  }
  const bool json = JsonOutput();
  nlohmann::json out = nlohmann::json::array();
  if (!json) {
    std::printf("%-20s %-6s %-14s %-22s %-24s %s\n", "SESSION", "STATE", "SINCE", "BGP STATE",
                "ADVERTISED", "LEARNED");
  }
  for (const auto& s : agent::bgp::ParseBgpSessions(*protocols)) {
    auto exported = agent::bgp::BirdCommand(socket, "show route export " + s.name);
    auto imported = agent::bgp::BirdCommand(socket, "show route protocol " + s.name);
    std::vector<std::string> advertised =
        exported.ok() ? Prefixes(*exported) : std::vector<std::string>{};
    std::vector<std::string> learned =
        imported.ok() ? Prefixes(*imported) : std::vector<std::string>{};
    if (json) {
      out.push_back({{"session", s.name},
                     {"state", s.state},
                     {"since", s.since},
                     {"bgpState", s.info},
                     {"established", s.established()},
                     {"advertised", advertised},
                     {"learned", learned}});
      continue;
    }
    std::printf("%-20s %-6s %-14s %-22s %-24s %s\n", s.name.c_str(), s.state.c_str(),
                s.since.c_str(), s.info.c_str(),
                advertised.empty() ? "-" : absl::StrJoin(advertised, ",").c_str(),
                learned.empty() ? "-" : absl::StrJoin(learned, ",").c_str());
  }
  if (json) PrintJson(out);
  return 0;
}

}  // namespace sluice::ctl
