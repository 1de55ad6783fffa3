// The observe socket: `sluicectl observe` talks to the agent's FlowMonitor through a unix stream
// socket (root only, 0600 in a 0700 directory, peers checked with SO_PEERCRED: the agent's unix
// socket server, agent/base/unix_server.h). The client writes one JSON request line
// {"last": N, "follow": bool, "filter": {...}} (filter.h); the agent answers JSON lines:
// {"status": {...}} first, then {"flow": {...}} per flow of the history, and while following
// {"live": {}}, every new flow and {"lost": {"events_lost": N}} whenever that total grows;
// {"error": "..."} for a bad request. A following connection ends when the client closes it or
// the agent stops.
//
// The relay (`--relay_address`, off by default): the same protocol on a TCP listener, so that one
// `sluicectl observe --nodes A,B,...` sees the flows of every node. Off the node there is no
// SO_PEERCRED: each request must carry {"token": "..."} equal to the contents of
// `--relay_token_file` (compared in constant time); without a token file the relay does not
// start. The stream is not encrypted (docs/observe.md).
#pragma once

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "agent/base/clock.h"
#include "agent/base/unix_server.h"
#include "agent/monitor/monitor.h"
#include "nlohmann/json_fwd.hpp"

namespace sluice::monitor {

inline constexpr char kDefaultObserveSocket[] = "/run/sluice/observe.sock";

struct ObserveServerOptions {
  std::string socket_path = kDefaultObserveSocket;
  uid_t allowed_uid = 0;
  int max_observers = 32;
  size_t default_last = 20;  // a request with neither last nor follow
  std::string relay_address;  // HOST:PORT of the TCP relay; empty: none
  std::string relay_token;    // what a relay request's "token" must be (never empty)
  const Clock* clock = RealClock::Get();  // paces the lost-event reports; borrowed
};

class ObserveServer {
 public:
  ObserveServer(FlowMonitor& monitor, ObserveServerOptions options);
  ~ObserveServer();  // Stop()s

  [[nodiscard]] absl::Status Start();
  // Stops accepting, ends every connection, removes the socket. Idempotent.
  void Stop() { server_.Stop(); }

 private:
  void Serve(int fd, bool relayed);
  // One JSON line to the client, given up at kWriteTimeout or when the server stops.
  bool WriteLine(int fd, const nlohmann::json& line);

  FlowMonitor& monitor_;
  const ObserveServerOptions options_;
  agent::UnixServer server_;  // the socket, the relay's listener, the connections' threads
};

}  // namespace sluice::monitor
