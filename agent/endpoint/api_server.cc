#include "agent/endpoint/api_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/base/files.h"
#include "cni/netconf.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace sluice::api {
namespace {

using agent::MakeDirs;

using nlohmann::json;

int PollTimeoutMs(absl::Time deadline) {
  absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
}

enum class ReadResult { kComplete, kTimeout, kStopped, kTooLarge, kError, kBadFds };

// Takes the descriptors of every SCM_RIGHTS message in `msg` into `fds` (they are ours from the
// moment recvmsg returns: each is closed by whoever holds `fds`); anything else, or a control
// buffer the kernel had to cut (whose descriptors it closed), marks `fds` as broken.
void TakeDescriptors(msghdr& msg, ReceivedFds& fds) {
  if ((msg.msg_flags & MSG_CTRUNC) != 0) fds.broken = true;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
      fds.broken = true;
      continue;
    }
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int received;
      std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds.fds.push_back(received);
    }
  }
}

// Reads until the peer shuts down its write side, taking the descriptors that come with the
// bytes (SCM_RIGHTS) into `fds`.
ReadResult ReadToEof(int fd, int stop_fd, absl::Time deadline, size_t max_bytes,
                     std::string* out, ReceivedFds* fds, int* err) {
  char buf[16384];
  // Room for more descriptors than a request may carry, so that one too many is seen (and
  // refused) rather than cut off silently.
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxReceivedFds)];
  while (true) {
    iovec iov = {.iov_base = buf, .iov_len = sizeof(buf)};
    msghdr msg = {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n >= 0) TakeDescriptors(msg, *fds);
    if (n > 0) {
      out->append(buf, static_cast<size_t>(n));
      if (out->size() > max_bytes) return ReadResult::kTooLarge;
      continue;
    }
    if (n == 0) return ReadResult::kComplete;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      *err = errno;
      return ReadResult::kError;
    }
    struct pollfd fds[2] = {{fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
    int rc = poll(fds, 2, PollTimeoutMs(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) {
      *err = errno;
      return ReadResult::kError;
    }
    if (fds[1].revents != 0) return ReadResult::kStopped;
    if (rc == 0 && absl::Now() >= deadline) return ReadResult::kTimeout;
  }
}

// Writes all of `data` or fails at `deadline`. Returns 0 or an errno (ETIMEDOUT on timeout).
int WriteAll(int fd, std::string_view data, absl::Time deadline) {
  while (!data.empty()) {
    ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return errno;
    struct pollfd pfd = {fd, POLLOUT, 0};
    int rc = poll(&pfd, 1, PollTimeoutMs(deadline));
    if (rc < 0 && errno != EINTR) return errno;
    if (rc == 0 && absl::Now() >= deadline) return ETIMEDOUT;
  }
  return 0;
}

std::string Dump(const json& j) {
  // Invalid UTF-8 in a handler's strings must not throw here.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

json ErrorReply(int code, std::string msg) {
  return json{{"ok", false}, {"code", code}, {"msg", std::move(msg)}};
}

ReceivedFds::~ReceivedFds() {
  for (int fd : fds) close(fd);
}

int ReceivedFds::only() const { return fds.size() == 1 ? fds.front() : -1; }

EndpointApiServer::EndpointApiServer(EndpointApiServerOptions options)
    : options_(std::move(options)) {}

EndpointApiServer::~EndpointApiServer() { Stop(); }

absl::Status EndpointApiServer::Start(Handler handler) {
  absl::MutexLock l(&mu_);
  if (started_ || stopped_) {
    return absl::FailedPreconditionError("endpoint API server can only be started once");
  }
  const std::string& path = options_.socket_path;
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path \"", path, "\" must be 1 to ", sizeof(addr.sun_path) - 1,
                     " bytes"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());

  if (size_t slash = path.rfind('/'); slash != std::string::npos && slash > 0) {
    if (absl::Status st = MakeDirs(path.substr(0, slash)); !st.ok()) return st;
  }
  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " exists and is not a socket; refusing to replace it"));
    }
    // A socket someone still accepts on belongs to a running agent; a refused one is stale.
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe < 0) return ErrnoStatus(errno, "create probe socket");
    int rc = connect(probe, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
    close(probe);
    if (rc == 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("another process is serving the endpoint API on ", path));
    }
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      return ErrnoStatus(errno, absl::StrCat("remove stale socket ", path));
    }
    spdlog::info("api: removed stale socket {}", path);
  }

  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return ErrnoStatus(errno, "create endpoint API socket");
  auto fail = [&](absl::string_view what) {
    absl::Status status = ErrnoStatus(errno, absl::StrCat(what, " ", path));
    close(fd);
    return status;
  };
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) return fail("bind");
  // The parent directory is 0700, so nobody else can reach the socket before this chmod.
  if (chmod(path.c_str(), 0600) != 0) {
    absl::Status status = fail("chmod 0600");
    unlink(path.c_str());
    return status;
  }
  if (stat(path.c_str(), &st) != 0 || listen(fd, 128) != 0) {
    absl::Status status = fail("listen on");
    unlink(path.c_str());
    return status;
  }
  socket_inode_ = st.st_ino;
  stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd_ < 0) {
    absl::Status status = fail("create stop eventfd for");
    unlink(path.c_str());
    return status;
  }
  listen_fd_ = fd;
  handler_ = std::move(handler);
  started_ = true;
  acceptor_ = std::thread([this] { AcceptLoop(); });
  spdlog::info("api: serving the endpoint API on {}", path);
  return absl::OkStatus();
}

absl::Status EndpointApiServer::Start(std::function<json(const json&)> handler) {
  return Start(Handler([handler = std::move(handler)](const json& request, int) {
    return handler(request);
  }));
}

void EndpointApiServer::Stop() {
  {
    absl::MutexLock l(&mu_);
    bool was_running = started_ && !stopped_;
    stopped_ = true;
    if (!was_running) return;
  }
  uint64_t one = 1;
  if (write(stop_fd_, &one, sizeof(one)) != sizeof(one)) {
    spdlog::error("api: cannot signal stop: {}", ErrnoText(errno));  // unreachable for eventfd
  }
  acceptor_.join();
  close(listen_fd_);
  listen_fd_ = -1;
  struct stat st;
  const std::string& path = options_.socket_path;
  if (lstat(path.c_str(), &st) == 0 && st.st_ino == socket_inode_) {
    unlink(path.c_str());
  } else {
    spdlog::warn("api: {} was replaced by someone else; leaving it", path);
  }
  std::list<std::unique_ptr<Worker>> workers;
  {
    absl::MutexLock l(&mu_);
    workers.swap(workers_);
  }
  for (auto& w : workers) w->thread.join();
  close(stop_fd_);
  stop_fd_ = -1;
  spdlog::info("api: stopped serving on {}", path);
}

EndpointApiServer::Stats EndpointApiServer::stats() const {
  absl::MutexLock l(&mu_);
  return stats_;
}

void EndpointApiServer::ReapWorkers() {
  std::list<std::unique_ptr<Worker>> finished;
  {
    absl::MutexLock l(&mu_);
    for (auto it = workers_.begin(); it != workers_.end();) {
      if ((*it)->done.load(std::memory_order_acquire)) {
        finished.splice(finished.end(), workers_, it++);
      } else {
        ++it;
      }
    }
  }
  for (auto& w : finished) w->thread.join();
}

void EndpointApiServer::AcceptLoop() {
  while (true) {
    struct pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("api: poll on {}: {}", options_.socket_path, ErrnoText(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    ReapWorkers();
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED) continue;
      spdlog::error("api: accept on {}: {}", options_.socket_path, ErrnoText(err));
      {
        absl::MutexLock l(&mu_);
        ++stats_.io_errors;
      }
      // Out of fds or memory: back off instead of spinning on a readable listener.
      struct pollfd stop = {stop_fd_, POLLIN, 0};
      poll(&stop, 1, 100);
      continue;
    }

    struct ucred cred = {};
    socklen_t len = sizeof(cred);
    bool peer_ok = getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 &&
                   cred.uid == options_.allowed_uid;
    enum { kServe, kBusy, kDenied } verdict;
    Worker* worker = nullptr;
    {
      absl::MutexLock l(&mu_);
      ++stats_.accepted;
      if (!peer_ok) {
        ++stats_.denied_peers;
        verdict = kDenied;
      } else if (stats_.active >= options_.max_concurrent) {
        ++stats_.busy;
        verdict = kBusy;
      } else {
        ++stats_.active;
        verdict = kServe;
        workers_.push_back(std::make_unique<Worker>());
        worker = workers_.back().get();
      }
    }
    switch (verdict) {
      case kDenied:
        spdlog::warn("api: refusing peer pid {} uid {} on {}: only uid {} may use the API",
                     cred.pid, cred.uid, options_.socket_path, options_.allowed_uid);
        RejectInline(fd, ErrorReply(kCniInvalidEnvironment,
                                    absl::StrCat("permission denied: uid ", cred.uid,
                                                 " may not use the sluice endpoint API")));
        break;
      case kBusy:
        spdlog::warn("api: {} requests in flight; turning a client away", options_.max_concurrent);
        RejectInline(fd, ErrorReply(kCniTryAgainLater, "agent busy"));
        break;
      case kServe:
        worker->thread = std::thread([this, fd, worker] { Serve(fd, worker); });
        break;
    }
  }
}

void EndpointApiServer::RejectInline(int fd, const json& reply) {
  // Drain what the client already sent, so closing does not turn into a reset before it reads
  // the reply; never wait for more.
  char buf[4096];
  for (int i = 0; i < 16 && recv(fd, buf, sizeof(buf), MSG_DONTWAIT) > 0; ++i) {
  }
  if (int err = WriteAll(fd, Dump(reply), absl::Now() + absl::Milliseconds(100)); err != 0) {
    spdlog::debug("api: rejecting a client: write: {}", ErrnoText(err));
  }
  close(fd);
}

void EndpointApiServer::Serve(int fd, Worker* self) {
  std::string request_text;
  int err = 0;
  // Closed when this returns, whatever the handler did with them.
  ReceivedFds fds;
  ReadResult read = ReadToEof(fd, stop_fd_, absl::Now() + options_.io_timeout,
                              options_.max_request_bytes, &request_text, &fds, &err);
  if (read == ReadResult::kComplete && (fds.broken || fds.fds.size() > 1)) {
    read = ReadResult::kBadFds;
  }
  json reply;
  bool count_io_error = false, count_bad = false, count_bad_fds = false, served = false;
  switch (read) {
    case ReadResult::kComplete: {
      // Bounded depth: a peer's 100k nested brackets must not recurse the agent out of stack.
      absl::StatusOr<json> parsed = cni::ParseJsonBounded(request_text, "request");
      if (!parsed.ok() || !parsed->is_object()) {
        count_bad = true;
        reply = ErrorReply(kCniDecodeFailure, parsed.ok() ? "request is not a JSON object"
                                                          : std::string(parsed.status().message()));
        break;
      }
      const json& request = *parsed;
      served = true;
      try {
        reply = handler_(request, fds.only());
      } catch (const std::exception& e) {
        spdlog::error("api: handler failed: {}", e.what());
        reply = ErrorReply(kSluiceInternal, absl::StrCat("agent error: ", e.what()));
      } catch (...) {
        spdlog::error("api: handler failed with an unknown exception");
        reply = ErrorReply(kSluiceInternal, "agent error");
      }
      break;
    }
    case ReadResult::kTooLarge:
      count_bad = true;
      reply = ErrorReply(kCniDecodeFailure, absl::StrCat("request exceeds ",
                                                         options_.max_request_bytes, " bytes"));
      break;
    case ReadResult::kTimeout:
      count_io_error = true;
      reply = ErrorReply(kCniIoFailure,
                         absl::StrCat("no complete request within ",
                                      absl::FormatDuration(options_.io_timeout),
                                      " (the client must shut down its write side)"));
      break;
    case ReadResult::kStopped:
      reply = ErrorReply(kCniTryAgainLater, "agent shutting down");
      break;
    case ReadResult::kBadFds:
      count_bad_fds = true;
      spdlog::warn("api: refusing a request that came with {} descriptors{}", fds.fds.size(),
                   fds.broken ? " and control data that is not SCM_RIGHTS or was cut short" : "");
      reply = ErrorReply(kCniInvalidEnvironment,
                         absl::StrCat("a request carries at most one file descriptor (the pod's "
                                      "network namespace); this one came with ",
                                      fds.fds.size(), fds.broken ? " and other control data" : ""));
      break;
    case ReadResult::kError:
      count_io_error = true;
      spdlog::warn("api: reading a request: {}", ErrnoText(err));
      break;
  }
  {
    // Counted before the reply goes out, so a client that has its answer sees it in stats().
    absl::MutexLock l(&mu_);
    if (served) ++stats_.served;
    if (count_bad) ++stats_.bad_requests;
    if (count_bad_fds) ++stats_.bad_fds;
    if (count_io_error) ++stats_.io_errors;
  }
  bool write_failed = false;
  if (!reply.is_null()) {
    absl::Time deadline = absl::Now() + (read == ReadResult::kStopped ? absl::Milliseconds(100)
                                                                      : options_.io_timeout);
    if (int werr = WriteAll(fd, Dump(reply), deadline); werr != 0) {
      write_failed = true;
      spdlog::warn("api: writing a reply: {}", ErrnoText(werr));
    }
  }
  close(fd);
  absl::MutexLock l(&mu_);
  if (write_failed) ++stats_.io_errors;
  --stats_.active;
  self->done.store(true, std::memory_order_release);
}

}  // namespace sluice::api
