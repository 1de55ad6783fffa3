#include "cni/agent_client.h"

#include "agent/base/errno.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>

#include "absl/status/status.h"
#include "cni/protocol/strings.h"

namespace sluice::cni {
namespace {

using Clock = std::chrono::steady_clock;

// Owns one file descriptor.
class UniqueFd {
 public:
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() {
    if (fd_ >= 0) close(fd_);
  }
  [[nodiscard]] int get() const { return fd_; }

 private:
  int fd_;
};

// The project's errno mapping, except that a missing socket means the agent is not up yet:
// Unavailable, like a refused or reset connection, which the plugin answers with CNI code 11
// ("try again later").
absl::Status SocketError(int err, std::string_view what, std::string_view path) {
  absl::Status st = sluice::ErrnoStatus(err, StrCat(what, " ", path));
  if (err == ENOENT) return absl::UnavailableError(st.message());
  return st;
}

// Waits for `events` on `fd` until `deadline`; returns false on timeout.
absl::StatusOr<bool> WaitFor(int fd, short events, Clock::time_point deadline,
                             std::string_view path) {
  while (true) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd = {.fd = fd, .events = events, .revents = 0};
    const int ready = poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left.count(), INT32_MAX)));
    if (ready < 0) {
      if (errno == EINTR) continue;
      return SocketError(errno, "poll on socket", path);
    }
    if (ready > 0) return true;
  }
}

// Sends from `data` with `fd` attached (SCM_RIGHTS): like send(), and the descriptor travels
// with the first byte that goes out; a call that sends nothing sends no descriptor either.
ssize_t SendWithFd(int socket_fd, std::string_view data, int fd) {
  iovec iov = {.iov_base = const_cast<char*>(data.data()), .iov_len = data.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
  return sendmsg(socket_fd, &msg, MSG_NOSIGNAL);
}

}  // namespace

absl::StatusOr<std::string> CallAgent(std::string_view socket_path, std::string_view request,
                                      const AgentCallTimeouts& timeouts, int pass_fd) {
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + timeouts.total;
  const Clock::time_point connect_deadline = std::min(deadline, start + timeouts.connect);

  sockaddr_un address = {};
  address.sun_family = AF_UNIX;
  if (socket_path.empty() || socket_path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(
        StrCat("socket path \"", socket_path, "\" does not fit a unix socket address"));
  }
  std::copy(socket_path.begin(), socket_path.end(), address.sun_path);

  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return SocketError(errno, "socket() for", socket_path);

  if (connect(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    if (errno != EINPROGRESS && errno != EAGAIN) {
      return SocketError(errno, "connect to", socket_path);
    }
    // A unix socket whose backlog is full reports EAGAIN; treat it as a slow agent and wait for
    // writability until the connect deadline, then retry once.
    const bool backlog_full = errno == EAGAIN;
    absl::StatusOr<bool> ready = WaitFor(fd.get(), POLLOUT, connect_deadline, socket_path);
    if (!ready.ok()) return ready.status();
    if (!*ready) {
      return absl::DeadlineExceededError(StrCat("connect to ", socket_path, ": no answer within ",
                                                timeouts.connect.count(), " ms"));
    }
    if (backlog_full) {
      if (connect(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0 &&
          errno != EISCONN) {
        return SocketError(errno, "connect to", socket_path);
      }
    } else {
      int err = 0;
      socklen_t len = sizeof(err);
      if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      if (err != 0) return SocketError(err, "connect to", socket_path);
    }
  }

  if (pass_fd >= 0 && request.empty()) {
    return absl::InvalidArgumentError("a descriptor needs at least one byte of request to travel with");
  }
  size_t sent = 0;
  while (sent < request.size()) {
    const std::string_view rest = request.substr(sent);
    const ssize_t n = sent == 0 && pass_fd >= 0 ? SendWithFd(fd.get(), rest, pass_fd)
                                                : send(fd.get(), rest.data(), rest.size(), MSG_NOSIGNAL);
    if (n >= 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN) return SocketError(errno, "send request to", socket_path);
    absl::StatusOr<bool> ready = WaitFor(fd.get(), POLLOUT, deadline, socket_path);
    if (!ready.ok()) return ready.status();
    if (!*ready) {
      return absl::DeadlineExceededError(StrCat(
          "send request to ", socket_path, ": timed out after ", timeouts.total.count(), " ms"));
    }
  }
  if (shutdown(fd.get(), SHUT_WR) != 0)
    return SocketError(errno, "shutdown(SHUT_WR) on", socket_path);

  std::string reply;
  char buffer[16 * 1024];
  while (true) {
    const ssize_t n = recv(fd.get(), buffer, sizeof(buffer), 0);
    if (n > 0) {
      if (reply.size() + static_cast<size_t>(n) > kMaxAgentReplyBytes) {
        return absl::DataLossError(
            StrCat("reply from ", socket_path, " exceeds ", kMaxAgentReplyBytes, " bytes"));
      }
      reply.append(buffer, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) return reply;
    if (errno == EINTR) continue;
    if (errno != EAGAIN) return SocketError(errno, "receive reply from", socket_path);
    absl::StatusOr<bool> ready = WaitFor(fd.get(), POLLIN, deadline, socket_path);
    if (!ready.ok()) return ready.status();
    if (!*ready) {
      return absl::DeadlineExceededError(
          StrCat("no reply from ", socket_path, " within ", timeouts.total.count(), " ms"));
    }
  }
}

}  // namespace sluice::cni
