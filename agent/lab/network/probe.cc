#include "agent/lab/network/probe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "agent/base/deadline.h"
#include "agent/base/errno.h"

namespace sluice::lab {
namespace {

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

int RemainingMs(absl::Time deadline) { return PollTimeoutMs(deadline, absl::Now()); }

absl::StatusOr<sockaddr_in> Address(const ProbeTarget& t) {
  sockaddr_in sa = {};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(t.port);
  if (inet_pton(AF_INET, t.host.c_str(), &sa.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("not an IPv4 address: ", t.host));
  }
  return sa;
}

ProbeOutcome FromErrno(int err) {
  switch (err) {
    case ECONNREFUSED:
      return ProbeOutcome::kRefused;
    case EHOSTUNREACH:
    case ENETUNREACH:
      return ProbeOutcome::kUnreachable;
    default:
      return ProbeOutcome::kTimeout;
  }
}

// An error a connected UDP socket reports (from an ICMP error) that ends the exchange.
bool EndsUdpExchange(int err) {
  return err == ECONNREFUSED || err == EHOSTUNREACH || err == ENETUNREACH;
}

// Non-blocking connect with a deadline; 0 on success, else the errno (ETIMEDOUT for the deadline).
int ConnectTcp(int fd, const sockaddr_in& sa, absl::Time deadline) {
  if (connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof(sa)) == 0) return 0;
  if (errno != EINPROGRESS) return errno;
  pollfd p = {fd, POLLOUT, 0};
  int n = poll(&p, 1, RemainingMs(deadline));
  if (n <= 0) return ETIMEDOUT;
  int err = 0;
  socklen_t len = sizeof(err);
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  return err;
}

// UDP exchange on a connected socket: sends `payload` every 500 ms until a datagram arrives.
RequestResult ExchangeUdp(int fd, const std::string& payload, absl::Time deadline) {
  absl::Time next_send = absl::InfinitePast();
  while (true) {
    if (absl::Now() >= next_send) {
      if (send(fd, payload.data(), payload.size(), MSG_NOSIGNAL) < 0 && EndsUdpExchange(errno)) {
        return {FromErrno(errno), ""};
      }
      next_send = absl::Now() + absl::Milliseconds(500);
    }
    int wait = std::min(RemainingMs(deadline), RemainingMs(next_send));
    if (RemainingMs(deadline) == 0) return {ProbeOutcome::kTimeout, ""};
    pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, wait) <= 0) continue;
    char buf[65536];
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n >= 0) return {ProbeOutcome::kConnected, std::string(buf, n)};
    if (EndsUdpExchange(errno)) return {FromErrno(errno), ""};
  }
}

}  // namespace

const char* ProbeOutcomeName(ProbeOutcome outcome) {
  switch (outcome) {
    case ProbeOutcome::kConnected:
      return "CONNECTED";
    case ProbeOutcome::kRefused:
      return "REFUSED";
    case ProbeOutcome::kTimeout:
      return "TIMEOUT";
    case ProbeOutcome::kUnreachable:
      return "UNREACHABLE";
  }
  return "?";
}

int ProbeExitCode(ProbeOutcome outcome) {
  switch (outcome) {
    case ProbeOutcome::kConnected:
      return 0;
    case ProbeOutcome::kRefused:
      return 3;
    case ProbeOutcome::kTimeout:
      return 4;
    case ProbeOutcome::kUnreachable:
      return 5;
  }
  return 1;
}

absl::Status ParseHostPort(const std::string& text, ProbeTarget* target) {
  size_t colon = text.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(text.substr(colon + 1), &port) || port <= 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("want HOST:PORT, got \"", text, "\""));
  }
  target->host = text.substr(0, colon);
  target->port = port;
  in_addr a;
  if (inet_pton(AF_INET, target->host.c_str(), &a) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("not an IPv4 address: ", target->host));
  }
  return absl::OkStatus();
}

absl::StatusOr<Protocol> ParseProtocol(const std::string& text) {
  if (text == "tcp" || text == "TCP") return Protocol::kTcp;
  if (text == "udp" || text == "UDP") return Protocol::kUdp;
  return absl::InvalidArgumentError(absl::StrCat("protocol must be tcp or udp, got ", text));
}

absl::Status EnterNetns(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open netns ", path));
  int rc = setns(fd, CLONE_NEWNET);
  int err = errno;
  close(fd);
  if (rc != 0) return ErrnoStatus(err, absl::StrCat("setns ", path));
  return absl::OkStatus();
}

absl::StatusOr<ProbeOutcome> Probe(const ProbeTarget& target) {
  if (target.protocol == Protocol::kUdp) {
    auto r = Request(target, "hostname");
    if (!r.ok()) return r.status();
    return r->outcome;
  }
  auto sa = Address(target);
  if (!sa.ok()) return sa.status();
  Fd fd(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return ErrnoStatus(errno, "socket");
  int err = ConnectTcp(fd.get(), *sa, absl::Now() + target.timeout);
  return err == 0 ? ProbeOutcome::kConnected : FromErrno(err);
}

std::vector<absl::StatusOr<ProbeOutcome>> ProbeAll(const std::vector<ProbeTarget>& targets) {
  std::vector<absl::StatusOr<ProbeOutcome>> out(targets.size(), ProbeOutcome::kTimeout);
  std::vector<std::thread> threads;
  threads.reserve(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    threads.emplace_back([&out, &targets, i] { out[i] = Probe(targets[i]); });
  }
  for (auto& t : threads) t.join();
  return out;
}

absl::StatusOr<RequestResult> Request(const ProbeTarget& target, const std::string& data) {
  auto sa = Address(target);
  if (!sa.ok()) return sa.status();
  absl::Time deadline = absl::Now() + target.timeout;
  std::string payload = data + "\n";
  int type = target.protocol == Protocol::kTcp ? SOCK_STREAM : SOCK_DGRAM;
  Fd fd(socket(AF_INET, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return ErrnoStatus(errno, "socket");
  if (target.protocol == Protocol::kUdp) {
    if (connect(fd.get(), reinterpret_cast<const sockaddr*>(&*sa), sizeof(*sa)) != 0) {
      return RequestResult{FromErrno(errno), ""};
    }
    return ExchangeUdp(fd.get(), payload, deadline);
  }
  if (int err = ConnectTcp(fd.get(), *sa, deadline); err != 0) {
    return RequestResult{FromErrno(err), ""};
  }
  size_t off = 0;
  while (off < payload.size()) {
    pollfd p = {fd.get(), POLLOUT, 0};
    if (poll(&p, 1, RemainingMs(deadline)) <= 0) return RequestResult{ProbeOutcome::kTimeout, ""};
    ssize_t n = send(fd.get(), payload.data() + off, payload.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EINTR) return RequestResult{FromErrno(errno), ""};
    if (n > 0) off += n;
  }
  shutdown(fd.get(), SHUT_WR);
  std::string reply;
  while (true) {
    pollfd p = {fd.get(), POLLIN, 0};
    if (poll(&p, 1, RemainingMs(deadline)) <= 0) {
      // Connected but the reply did not finish in time: what arrived is still the answer.
      if (!reply.empty()) break;
      return RequestResult{ProbeOutcome::kTimeout, ""};
    }
    char buf[4096];
    ssize_t n = recv(fd.get(), buf, sizeof(buf), 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      if (!reply.empty()) break;
      return RequestResult{FromErrno(errno), ""};
    }
    reply.append(buf, n);
  }
  return RequestResult{ProbeOutcome::kConnected, reply};
}

}  // namespace sluice::lab
