// The agent side of the endpoint API (see agent/endpoint/api_protocol.h): a unix stream socket, root only,
// one JSON request per connection, each connection served on its own thread up to a bound.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/endpoint/api_protocol.h"
#include "nlohmann/json_fwd.hpp"

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
nlohmann::json ErrorReply(int code, std::string msg);

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
  // Called on a connection thread, concurrently with other requests. Returns the whole reply.
  // An exception it throws becomes a kSluiceInternal reply. `fd` is the one descriptor the
  // request carried (the pod's network namespace, ADD and CHECK), or -1; the server closes it
  // once the handler returns (a handler that needs it longer reopens it). A request with more
  // than one, or other control data, is answered kCniInvalidEnvironment without the handler.
  using Handler = std::function<nlohmann::json(const nlohmann::json& request, int fd)>;

  struct Stats {
    uint64_t accepted = 0;      // connections accepted
    uint64_t served = 0;        // requests that reached the handler
    uint64_t busy = 0;          // turned away at max_concurrent
    uint64_t denied_peers = 0;  // wrong uid
    uint64_t bad_requests = 0;  // unparsable, not an object, or too large
    uint64_t bad_fds = 0;       // came with more than one descriptor, or other control data
    uint64_t io_errors = 0;     // read/write failures and timeouts
    int active = 0;             // connections being served now
  };

  explicit EndpointApiServer(EndpointApiServerOptions options);
  ~EndpointApiServer();  // Stop()s
  EndpointApiServer(const EndpointApiServer&) = delete;
  EndpointApiServer& operator=(const EndpointApiServer&) = delete;

  // Creates the parent directory (0700) if needed, replaces a stale socket (refuses if another
  // process still serves it), binds, chmods 0600, listens and starts accepting. Once only.
  [[nodiscard]] absl::Status Start(Handler handler) ABSL_LOCKS_EXCLUDED(mu_);
  // The same with a handler that takes no descriptor (one a request carries is closed unused).
  [[nodiscard]] absl::Status Start(std::function<nlohmann::json(const nlohmann::json&)> handler)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Stops accepting, removes the socket path, aborts connections still sending their request
  // and waits for requests already in the handler to be answered. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  const std::string& socket_path() const { return options_.socket_path; }

 private:
  struct Worker {
    std::thread thread;
    std::atomic<bool> done{false};
  };

  void AcceptLoop();
  void Serve(int fd, Worker* self);
  // Answers `fd` without a worker thread (busy, wrong peer) and closes it.
  void RejectInline(int fd, const nlohmann::json& reply);
  void ReapWorkers() ABSL_LOCKS_EXCLUDED(mu_);

  const EndpointApiServerOptions options_;
  Handler handler_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;  // eventfd, readable once Stop() began
  ino_t socket_inode_ = 0;
  std::thread acceptor_;

  mutable absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::list<std::unique_ptr<Worker>> workers_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::api
