// The agent side of the endpoint API (the wire format: cni/protocol/wire.h): a unix stream socket,
// root only (agent/base/unix_server.h), one JSON request per connection, each connection served
// on its own thread up to a bound. Each request is decoded once, here, into the typed request the
// handler takes, and the handler's typed reply is encoded once.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/base/unix_server.h"
#include "cni/protocol/messages.h"
#include "cni/protocol/wire.h"

namespace sluice::api {

struct EndpointApiServerOptions {
  std::string socket_path = kDefaultSocketPath;
  // Budget for reading a whole request, and separately for writing the reply.
  absl::Duration io_timeout = absl::Seconds(30);
  size_t max_request_bytes = 4 << 20;
  // Connections served at once; more are answered {"ok":false,"code":11,"msg":"agent busy"}.
  int max_concurrent = 64;
  // Peers (SO_PEERCRED) with another uid get an error reply.
  uid_t allowed_uid = 0;
};

// {"ok": false, "code": code, "msg": msg}
[[nodiscard]] cni::EndpointReply ErrorReply(int code, std::string msg);

// The descriptors one request carried (SCM_RIGHTS), closed when this is destroyed.
struct ReceivedFds {
  ReceivedFds() = default;
  ReceivedFds(const ReceivedFds&) = delete;
  ReceivedFds& operator=(const ReceivedFds&) = delete;
  ~ReceivedFds();
  // The one descriptor, or -1 when there is none (or more than one).
  int only() const;

  std::vector<int> fds;
  bool broken = false;  // control data that was not SCM_RIGHTS, or cut short (MSG_CTRUNC)
};

// Descriptors read per message: a request may carry one; more are received (so that they are
// closed) and the request refused.
inline constexpr size_t kMaxReceivedFds = 8;

class EndpointApiServer {
 public:
  // Called on a connection thread, concurrently with other requests, with a request that decoded
  // (cni::ParseEndpointRequest: one that does not is answered without the handler). Returns the
  // whole reply. An exception it throws becomes a kSluiceInternal reply. `fd` is the one
  // descriptor the request carried (the pod's network namespace, ADD and CHECK), or -1; the
  // server closes it once the handler returns (a handler that needs it longer reopens it). A
  // request with more than one, or other control data, is answered kCniInvalidEnvironment
  // without the handler.
  using Handler = std::function<cni::EndpointReply(const cni::EndpointRequest& request, int fd)>;

  struct Stats {
    uint64_t accepted = 0;      // connections accepted
    uint64_t served = 0;        // requests that reached the handler
    uint64_t busy = 0;          // turned away at max_concurrent
    uint64_t denied_peers = 0;  // wrong uid
    uint64_t bad_requests = 0;  // too large, or not a request (cni::ParseEndpointRequest)
    uint64_t bad_fds = 0;       // came with more than one descriptor, or other control data
    uint64_t io_errors = 0;     // accept, read and write failures, and timeouts
    int active = 0;             // connections being served now
  };

  explicit EndpointApiServer(EndpointApiServerOptions options);
  ~EndpointApiServer();  // Stop()s
  EndpointApiServer(const EndpointApiServer&) = delete;
  EndpointApiServer& operator=(const EndpointApiServer&) = delete;

  // Creates the parent directory (0700) if needed, replaces a stale socket (refuses if another
  // process still serves it), binds, chmods 0600, listens and starts accepting. Once only.
  [[nodiscard]] absl::Status Start(Handler handler);
  // The same with a handler that takes no descriptor (one a request carries is closed unused).
  [[nodiscard]] absl::Status Start(
      std::function<cni::EndpointReply(const cni::EndpointRequest&)> handler);

  // Stops accepting, removes the socket path, aborts connections still sending their request
  // and waits for requests already in the handler to be answered. Idempotent.
  void Stop() { server_.Stop(); }

  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  const std::string& socket_path() const { return options_.socket_path; }

 private:
  // One connection: reads the request to EOF, decodes it, calls `handler`, writes the reply.
  void Serve(int fd, const Handler& handler);

  const EndpointApiServerOptions options_;
  agent::UnixServer server_;

  mutable absl::Mutex mu_;
  Stats stats_ ABSL_GUARDED_BY(mu_);  // what the connections count (the rest is server_'s)
};

}  // namespace sluice::api
