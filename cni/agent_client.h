// The client side of the agent's endpoint socket: one request per connection, write, shut down
// the write side, read the reply to EOF, all under one deadline.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace sluice::cni {

struct AgentCallTimeouts {
  std::chrono::milliseconds connect{10'000};
  std::chrono::milliseconds total{120'000};  // ADD returns only once the datapath is in place
};

// Largest reply accepted; a bigger one is an error, not an allocation.
inline constexpr size_t kMaxAgentReplyBytes = 16 << 20;

// Sends `request` to the unix stream socket at `socket_path` and returns the raw reply. With
// `pass_fd` >= 0 that descriptor goes with the request's first bytes (SCM_RIGHTS); the caller
// keeps its own copy.
// Errors name the path and carry errno's text:
//   kUnavailable: nobody listens (ENOENT, ECONNREFUSED, EAGAIN on a full backlog);
//   kDeadlineExceeded: connect or the whole exchange timed out;
//   kInvalidArgument: the path does not fit a socket address;
//   kPermissionDenied: EACCES/EPERM;  kInternal/kDataLoss: other socket failures.
[[nodiscard]] absl::StatusOr<std::string> CallAgent(std::string_view socket_path,
                                                    std::string_view request,
                                                    const AgentCallTimeouts& timeouts = {},
                                                    int pass_fd = -1);

}  // namespace sluice::cni
