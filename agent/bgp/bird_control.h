// BIRD's control socket (what `birdc` speaks): one command a connection, answered by lines that
// start with a four-digit code, a '-' after it while more lines follow and a space on the last
// (continuation lines start with a space). Codes 8xxx and 9xxx are errors. The speaker uses it
// to reload the configuration and to read the sessions' states; sluicectl reads the same.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace sluice::agent::bgp {

// Sends `command` to the control socket at `socket_path` and returns the reply's text, one
// entry a line, codes removed. An error reply (8xxx, 9xxx) is an error with its text; no answer
// within `timeout` is DeadlineExceeded.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> BirdCommand(
    const std::string& socket_path, absl::string_view command,
    absl::Duration timeout = absl::Seconds(5));

// One BGP session as `show protocols` lists it.
struct BgpSession {
  std::string name;   // the protocol: peer_172_30_0_254
  std::string state;  // BIRD's protocol state: up, start, down, ...
  std::string since;
  std::string info;  // the BGP state: Established, Active, Connect, ...
  bool established() const { return info.rfind("Established", 0) == 0; }
};

// The `protocol bgp` rows of a `show protocols` reply (as BirdCommand returns it).
std::vector<BgpSession> ParseBgpSessions(const std::vector<std::string>& reply);

}  // namespace sluice::agent::bgp
