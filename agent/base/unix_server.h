// The unix stream socket server the agent's sockets share (the endpoint API,
// agent/endpoint/api_server.h; the observe socket, agent/monitor/observe_server.h): the socket
// made root only (mode 0600 in a 0700 directory; a stale one replaced, a live one refused), peers
// checked with SO_PEERCRED, each connection served on a thread of its own up to a bound, one
// eventfd that ends the accept loop and every wait of the connections, and reads and writes that
// end at a deadline. What a connection carries is the caller's: the server hands it the
// descriptor and closes it afterwards.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace sluice::agent {

// How a wait for a connection to be ready ended.
enum class IoWait { kReady, kTimeout, kStopped, kError };

// Waits until `fd` has one of `events` (POLLIN, POLLOUT), `deadline` passes, or `stop_fd` (-1:
// none) becomes readable; kError leaves errno set. A deadline in the past still looks once.
[[nodiscard]] IoWait WaitForIo(int fd, short events, absl::Time deadline, int stop_fd = -1);

// Sends all of `data` on the socket `fd` (MSG_NOSIGNAL: a peer gone is EPIPE, not a signal).
// Returns 0, or an errno: ETIMEDOUT at `deadline`, ECANCELED once `stop_fd` (-1: none) is
// readable, the send's own otherwise.
[[nodiscard]] int SendAll(int fd, std::string_view data, absl::Time deadline, int stop_fd = -1);

struct UnixServerOptions {
  std::string socket_path;
  // What it serves, in log lines and errors: "the endpoint API", "the observe socket".
  std::string name;
  // Peers (SO_PEERCRED) with another uid are turned away.
  uid_t allowed_uid = 0;
  // Connections served at once; more are turned away.
  int max_connections = 64;
};

class UnixServer {
 public:
  // Serves one accepted connection `fd` (non-blocking) on its own thread; the server closes it
  // once this returns. `relayed`: it came through the extra listener (AddListener), whose peers
  // were not checked.
  using Serve = std::function<void(int fd, bool relayed)>;
  // Why a connection is turned away without a thread.
  enum class Refusal { kDeniedPeer, kBusy };
  // Answers a connection that is turned away, on the accept thread (so briefly: a short deadline);
  // what the client had already sent is drained first, and the server closes `fd` after.
  using Refuse = std::function<void(int fd, Refusal why, const ucred& peer)>;

  struct Stats {
    uint64_t accepted = 0;       // connections accepted
    uint64_t denied_peers = 0;   // another uid
    uint64_t busy = 0;           // turned away at max_connections
    uint64_t accept_errors = 0;  // accept() failures other than the transient ones
    int active = 0;              // connections being served now
  };

  explicit UnixServer(UnixServerOptions options) : options_(std::move(options)) {}
  ~UnixServer();  // Stop()s
  UnixServer(const UnixServer&) = delete;
  UnixServer& operator=(const UnixServer&) = delete;

  // Accepts on `listen_fd` too (listening already; the server owns it from now on, and closes it
  // even if Start fails): a TCP relay, whose protocol authenticates its peers itself. Before
  // Start, at most once.
  void AddListener(int listen_fd);

  // Creates the parent directory (0700) if needed, replaces a stale socket (refuses, with
  // AlreadyExists, one another process still accepts on, and anything that is not a socket),
  // binds, chmods 0600, listens and starts accepting. Once only.
  [[nodiscard]] absl::Status Start(Serve serve, Refuse refuse) ABSL_LOCKS_EXCLUDED(mu_);

  // Stops accepting, makes stop_fd() readable (waits of the connections end), removes the socket
  // path (unless someone replaced it), then waits for every connection's Serve to return.
  // Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Readable once Stop() began: a connection's waits watch it (WaitForIo, SendAll).
  int stop_fd() const { return stop_fd_; }
  // Whether Stop() began.
  [[nodiscard]] bool stopping() const;

  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  const UnixServerOptions& options() const { return options_; }

 private:
  struct Worker {
    std::thread thread;
    std::atomic<bool> done{false};
  };

  void AcceptLoop();
  void ReapWorkers() ABSL_LOCKS_EXCLUDED(mu_);

  const UnixServerOptions options_;
  Serve serve_;
  Refuse refuse_;
  int listen_fd_ = -1;
  int extra_fd_ = -1;  // AddListener's
  int stop_fd_ = -1;   // eventfd
  ino_t socket_inode_ = 0;
  std::thread acceptor_;

  mutable absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::list<std::unique_ptr<Worker>> workers_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::agent
