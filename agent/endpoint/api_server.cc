#include "agent/endpoint/api_server.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/base/deadline.h"
#include "agent/base/errno.h"
#include "spdlog/spdlog.h"

namespace sluice::api {
namespace {

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
    switch (agent::WaitForIo(fd, POLLIN, deadline, stop_fd)) {
      case agent::IoWait::kReady:
        break;
      case agent::IoWait::kTimeout:
        return ReadResult::kTimeout;
      case agent::IoWait::kStopped:
        return ReadResult::kStopped;
      case agent::IoWait::kError:
        *err = errno;
        return ReadResult::kError;
    }
  }
}

}  // namespace

cni::EndpointReply ErrorReply(int code, std::string msg) {
  cni::EndpointReply reply;
  reply.failure = {.code = code, .msg = std::move(msg)};
  return reply;
}

ReceivedFds::~ReceivedFds() {
  for (int fd : fds) close(fd);
}

int ReceivedFds::only() const { return fds.size() == 1 ? fds.front() : -1; }

EndpointApiServer::EndpointApiServer(EndpointApiServerOptions options)
    : options_(std::move(options)),
      server_(agent::UnixServerOptions{.socket_path = options_.socket_path,
                                       .name = "the endpoint API",
                                       .allowed_uid = options_.allowed_uid,
                                       .max_connections = options_.max_concurrent}) {}

EndpointApiServer::~EndpointApiServer() { Stop(); }

absl::Status EndpointApiServer::Start(Handler handler) {
  auto serve = [this, handler = std::move(handler)](int fd, bool) { Serve(fd, handler); };
  auto refuse = [](int fd, agent::UnixServer::Refusal why, const ucred& peer) {
    cni::EndpointReply reply =
        why == agent::UnixServer::Refusal::kBusy
            ? ErrorReply(kCniTryAgainLater, "agent busy")
            : ErrorReply(kCniInvalidEnvironment,
                         absl::StrCat("permission denied: uid ", peer.uid,
                                      " may not use the sluice endpoint API"));
    if (int err =
            agent::SendAll(fd, cni::EncodeReply(reply), WaitDeadline(absl::Milliseconds(100)));
        err != 0) {
      spdlog::debug("api: turning a client away: write: {}", ErrnoText(err));
    }
  };
  return server_.Start(std::move(serve), std::move(refuse));
}

absl::Status EndpointApiServer::Start(
    std::function<cni::EndpointReply(const cni::EndpointRequest&)> handler) {
  return Start(Handler([handler = std::move(handler)](const cni::EndpointRequest& request, int) {
    return handler(request);
  }));
}

EndpointApiServer::Stats EndpointApiServer::stats() const {
  agent::UnixServer::Stats connections = server_.stats();
  absl::MutexLock l(&mu_);
  Stats out = stats_;
  out.accepted = connections.accepted;
  out.busy = connections.busy;
  out.denied_peers = connections.denied_peers;
  out.io_errors += connections.accept_errors;
  out.active = connections.active;
  return out;
}

void EndpointApiServer::Serve(int fd, const Handler& handler) {
  std::string request_text;
  int err = 0;
  // Closed when this returns, whatever the handler did with them.
  ReceivedFds fds;
  ReadResult read = ReadToEof(fd, server_.stop_fd(), WaitDeadline(options_.io_timeout),
                              options_.max_request_bytes, &request_text, &fds, &err);
  if (read == ReadResult::kComplete && (fds.broken || fds.fds.size() > 1)) {
    read = ReadResult::kBadFds;
  }
  std::optional<cni::EndpointReply> reply;
  bool count_io_error = false, count_bad = false, count_bad_fds = false, served = false;
  switch (read) {
    case ReadResult::kComplete: {
      // The one decoding of the request (bounded depth: a peer's 100k nested brackets must not
      // recurse the agent out of stack).
      absl::StatusOr<cni::EndpointRequest> request = cni::ParseEndpointRequest(request_text);
      if (!request.ok()) {
        count_bad = true;
        spdlog::warn("api: refusing a request: {}", request.status().ToString());
        reply = cni::FailureReply(request.status());
        break;
      }
      served = true;
      try {
        reply = handler(*request, fds.only());
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
  if (reply.has_value()) {
    const absl::Time deadline = WaitDeadline(
        read == ReadResult::kStopped ? absl::Milliseconds(100) : options_.io_timeout);
    if (int werr = agent::SendAll(fd, cni::EncodeReply(*reply), deadline); werr != 0) {
      write_failed = true;
      spdlog::warn("api: writing a reply: {}", ErrnoText(werr));
    }
  }
  if (write_failed) {
    absl::MutexLock l(&mu_);
    ++stats_.io_errors;
  }
}

}  // namespace sluice::api
