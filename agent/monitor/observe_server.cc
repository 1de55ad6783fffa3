#include "agent/monitor/observe_server.h"

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
    struct pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("monitor: poll on the observe socket: {}", ErrnoText(errno));
      return;
    }
    if (fds[1].revents) return;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    struct ucred cred = {};
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
        cred.uid != options_.allowed_uid) {
      WriteLine(fd, stop_fd_, {{"error", "permission denied"}});
      close(fd);
      continue;
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
    raw->thread = std::thread([this, fd, raw] {
      Serve(fd);
      close(fd);
      raw->done = true;
    });
    workers_.push_back(std::move(w));
  }
}

void ObserveServer::Serve(int fd) {
  std::string line;
  if (!ReadLine(fd, stop_fd_, &line)) return;
  nlohmann::json req = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!req.is_object()) {
    WriteLine(fd, stop_fd_, {{"error", "a request is one JSON object"}});
    return;
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
