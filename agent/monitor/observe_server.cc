#include "agent/monitor/observe_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "agent/base/errno.h"
#include "agent/base/files.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace sluice::monitor {
namespace {

constexpr size_t kMaxRequestBytes = 64 << 10;
constexpr absl::Duration kRequestTimeout = absl::Seconds(10);
// A client that reads nothing for this long is let go (its observer queue overflows first).
constexpr absl::Duration kWriteTimeout = absl::Seconds(10);

int RemainingMs(absl::Time deadline) {
  return static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
}

// One line (without its '\n'), up to EOF if the client sends none.
bool ReadLine(int fd, int stop_fd, std::string* line) {
  absl::Time deadline = absl::Now() + kRequestTimeout;
  char buf[4096];
  while (line->size() <= kMaxRequestBytes) {
    struct pollfd fds[2] = {{fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
    int rc = poll(fds, 2, RemainingMs(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0 || fds[1].revents) return false;
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return !line->empty();
    line->append(buf, n);
    if (auto nl = line->find('\n'); nl != std::string::npos) {
      line->resize(nl);
      return true;
    }
  }
  return false;
}

bool WriteAll(int fd, int stop_fd, const std::string& data) {
  absl::Time deadline = absl::Now() + kWriteTimeout;
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += n;
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EINTR) return false;
    struct pollfd fds[2] = {{fd, POLLOUT, 0}, {stop_fd, POLLIN, 0}};
    int rc = poll(fds, 2, RemainingMs(deadline));
    if (rc <= 0 || fds[1].revents || (fds[0].revents & (POLLERR | POLLHUP))) return false;
  }
  return true;
}

bool WriteLine(int fd, int stop_fd, const nlohmann::json& j) {
  return WriteAll(fd, stop_fd, j.dump() + "\n");
}

// Whether the client closed its end (EOF or an error; anything it sends after its request is
// ignored).
bool PeerGone(int fd) {
  struct pollfd p = {fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLRDHUP)) return true;
  char buf[256];
  ssize_t n = read(fd, buf, sizeof(buf));
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR);
}

// Equal strings, in a time that does not depend on where they differ.
bool SameToken(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() != b.size();
  for (size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[i % (b.empty() ? 1 : b.size())];
  return diff == 0 && !b.empty();
}

absl::StatusOr<int> ListenTcp(const std::string& address) {
  auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat("--relay_address ", address, ": want HOST:PORT"));
  }
  std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  struct addrinfo hints = {}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--relay_address ", address, ": ", gai_strerror(rc)));
  }
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  int one = 1;
  if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
      bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 16) != 0) {
    absl::Status st = ErrnoStatus(errno, absl::StrCat("serve the relay on ", address));
    if (fd >= 0) close(fd);
    freeaddrinfo(res);
    return st;
  }
  freeaddrinfo(res);
  return fd;
}

}  // namespace

ObserveServer::~ObserveServer() { Stop(); }

absl::Status ObserveServer::Start() {
  absl::MutexLock lock(&mu_);
  if (started_ || stopped_) return absl::FailedPreconditionError("observe server starts once");
  const std::string& path = options_.socket_path;
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("observe socket path \"", path, "\" is too long"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (size_t slash = path.rfind('/'); slash != std::string::npos && slash > 0) {
    if (absl::Status st = agent::MakeDirs(path.substr(0, slash)); !st.ok()) return st;
  }
  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(path, " exists and is not a socket"));
    }
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe < 0) return ErrnoStatus(errno, "create probe socket");
    int rc = connect(probe, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
    close(probe);
    if (rc == 0) {
      return absl::AlreadyExistsError(absl::StrCat("another process serves ", path));
    }
    unlink(path.c_str());
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return ErrnoStatus(errno, "create observe socket");
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 ||
      chmod(path.c_str(), 0600) != 0 || listen(fd, 16) != 0) {
    absl::Status status = ErrnoStatus(errno, absl::StrCat("serve the observe socket ", path));
    close(fd);
    unlink(path.c_str());
    return status;
  }
  stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd_ < 0) {
    absl::Status status = ErrnoStatus(errno, "create stop eventfd");
    close(fd);
    unlink(path.c_str());
    return status;
  }
  if (!options_.relay_address.empty()) {
    auto relay = options_.relay_token.empty()
                     ? absl::StatusOr<int>(absl::FailedPreconditionError(
                           "the relay needs a token (--relay_token_file)"))
                     : ListenTcp(options_.relay_address);
    if (!relay.ok()) {
      close(fd);
      close(stop_fd_);
      unlink(path.c_str());
      return relay.status();
    }
    relay_fd_ = *relay;
    spdlog::info("monitor: relaying flows on {} (token required)", options_.relay_address);
  }
  listen_fd_ = fd;
  started_ = true;
  acceptor_ = std::thread([this] { AcceptLoop(); });
  spdlog::info("monitor: serving observers on {}", path);
  return absl::OkStatus();
}

void ObserveServer::Stop() {
  std::list<std::unique_ptr<Worker>> workers;
  {
    absl::MutexLock lock(&mu_);
    bool running = started_ && !stopped_;
    stopped_ = true;
    if (!running) return;
    workers.swap(workers_);
  }
  uint64_t one = 1;
  if (write(stop_fd_, &one, sizeof(one)) != sizeof(one)) {
    spdlog::error("monitor: cannot signal the observe server to stop: {}", ErrnoText(errno));
  }
  acceptor_.join();
  for (auto& w : workers) w->thread.join();
  {
    absl::MutexLock lock(&mu_);  // workers started before the swap
    for (auto& w : workers_) w->thread.join();
    workers_.clear();
  }
  close(listen_fd_);
  if (relay_fd_ >= 0) close(relay_fd_);
  close(stop_fd_);
  unlink(options_.socket_path.c_str());
}

void ObserveServer::ReapLocked() {
  for (auto it = workers_.begin(); it != workers_.end();) {
    if ((*it)->done) {
      (*it)->thread.join();
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
}

void ObserveServer::AcceptLoop() {
  for (;;) {
    struct pollfd fds[3] = {{stop_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}, {relay_fd_, POLLIN, 0}};
    if (poll(fds, relay_fd_ >= 0 ? 3 : 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("monitor: poll on the observe socket: {}", ErrnoText(errno));
      return;
    }
    if (fds[0].revents) return;
    const bool relayed = relay_fd_ >= 0 && fds[2].revents;
    int fd = accept4(relayed ? relay_fd_ : listen_fd_, nullptr, nullptr,
                     SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    if (!relayed) {
      // The unix socket: root (allowed_uid) only. The relay checks its token per request.
      struct ucred cred = {};
      socklen_t len = sizeof(cred);
      if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
          cred.uid != options_.allowed_uid) {
        WriteLine(fd, stop_fd_, {{"error", "permission denied"}});
        close(fd);
        continue;
      }
    }
    absl::MutexLock lock(&mu_);
    ReapLocked();
    if (stopped_ || static_cast<int>(workers_.size()) >= options_.max_observers) {
      WriteLine(fd, stop_fd_, {{"error", "too many observers"}});
      close(fd);
      continue;
    }
    auto w = std::make_unique<Worker>();
    Worker* raw = w.get();
    raw->thread = std::thread([this, fd, raw, relayed] {
      Serve(fd, relayed);
      close(fd);
      raw->done = true;
    });
    workers_.push_back(std::move(w));
  }
}

void ObserveServer::Serve(int fd, bool relayed) {
  std::string line;
  if (!ReadLine(fd, stop_fd_, &line)) return;
  nlohmann::json req = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!req.is_object()) {
    WriteLine(fd, stop_fd_, {{"error", "a request is one JSON object"}});
    return;
  }
  if (relayed) {
    const nlohmann::json* token = req.contains("token") ? &req["token"] : nullptr;
    if (token == nullptr || !token->is_string() ||
        !SameToken(token->get<std::string>(), options_.relay_token)) {
      spdlog::warn("monitor: a relay request with a wrong or no token was refused");
      WriteLine(fd, stop_fd_, {{"error", "permission denied: wrong or no relay token"}});
      return;
    }
  }
  auto filter = FilterFromJson(req.value("filter", nlohmann::json()));
  if (!filter.ok()) {
    WriteLine(fd, stop_fd_, {{"error", std::string(filter.status().message())}});
    return;
  }
  bool follow = req.value("follow", false);
  int64_t last = req.contains("last") && req["last"].is_number_integer()
                     ? req["last"].get<int64_t>()
                     : (follow ? 0 : static_cast<int64_t>(options_.default_last));
  if (last < 0) last = 0;
  std::vector<Flow> history;
  auto observer = monitor_.Observe(*filter, static_cast<size_t>(last), follow, &history);
  uint64_t lost = monitor_.EventsLost();
  if (!WriteLine(fd, stop_fd_,
                 {{"status",
                   {{"events_lost", lost},
                    {"flows_read", monitor_.flows_read()},
                    {"observers", monitor_.observers()}}}})) {
    return;
  }
  for (const Flow& f : history) {
    if (!WriteLine(fd, stop_fd_, {{"flow", FlowToJson(f)}})) return;
  }
  if (!observer) return;
  // Where the history ends and live flows begin (a relay's client merges histories by it).
  if (!WriteLine(fd, stop_fd_, {{"live", nlohmann::json::object()}})) return;
  absl::Time next_lost_check = absl::Now() + absl::Seconds(1);
  // Whether the agent stops or the client left is looked at when the stream is idle and every
  // 64 flows, not per flow: at full rate the flows are the work.
  int unchecked = 0;
  for (;;) {
    if (unchecked == 0) {
      struct pollfd stop = {stop_fd_, POLLIN, 0};
      if (poll(&stop, 1, 0) > 0 || PeerGone(fd) || observer->stopped()) return;
    }
    if (auto f = observer->Next(absl::Milliseconds(200))) {
      if (!WriteLine(fd, stop_fd_, {{"flow", FlowToJson(*f)}})) return;
      unchecked = (unchecked + 1) % 64;
    } else {
      unchecked = 0;
    }
    if (absl::Now() >= next_lost_check) {
      next_lost_check = absl::Now() + absl::Seconds(1);
      uint64_t now_lost = monitor_.EventsLost();
      if (now_lost != lost) {
        lost = now_lost;
        if (!WriteLine(fd, stop_fd_, {{"lost", {{"events_lost", lost}}}})) return;
      }
    }
  }
}

}  // namespace sluice::monitor
