#include "agent/base/unix_server.h"

#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "agent/base/deadline.h"
#include "agent/base/errno.h"
#include "agent/base/files.h"
#include "spdlog/spdlog.h"

namespace sluice::agent {

IoWait WaitForIo(int fd, short events, absl::Time deadline, int stop_fd) {
  while (true) {
    struct pollfd fds[2] = {{fd, events, 0}, {stop_fd, POLLIN, 0}};
    int rc = poll(fds, stop_fd >= 0 ? 2 : 1, PollTimeoutMs(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return IoWait::kError;
    if (stop_fd >= 0 && fds[1].revents != 0) return IoWait::kStopped;
    // POLLERR and POLLHUP count as ready: the read or write that follows reports them.
    if (fds[0].revents != 0) return IoWait::kReady;
    if (WaitDeadlinePassed(deadline)) return IoWait::kTimeout;
  }
}

int SendAll(int fd, std::string_view data, absl::Time deadline, int stop_fd) {
  while (!data.empty()) {
    ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return errno;
    switch (WaitForIo(fd, POLLOUT, deadline, stop_fd)) {
      case IoWait::kReady:
        break;
      case IoWait::kTimeout:
        return ETIMEDOUT;
      case IoWait::kStopped:
        return ECANCELED;
      case IoWait::kError:
        return errno;
    }
  }
  return 0;
}

UnixServer::~UnixServer() {
  Stop();
  if (extra_fd_ >= 0) close(extra_fd_);  // added, and never started
}

void UnixServer::AddListener(int listen_fd) {
  if (extra_fd_ >= 0) close(extra_fd_);
  extra_fd_ = listen_fd;
}

bool UnixServer::stopping() const {
  absl::MutexLock l(&mu_);
  return stopped_;
}

absl::Status UnixServer::Start(Serve serve, Refuse refuse) {
  absl::MutexLock l(&mu_);
  if (started_ || stopped_) {
    return absl::FailedPreconditionError(absl::StrCat(options_.name, ": a server starts once"));
  }
  const std::string& path = options_.socket_path;
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(options_.name, ": socket path \"", path,
                                                   "\" must be 1 to ", sizeof(addr.sun_path) - 1,
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
          absl::StrCat("another process is serving ", options_.name, " on ", path));
    }
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      return ErrnoStatus(errno, absl::StrCat("remove stale socket ", path));
    }
    spdlog::info("{}: removed stale socket {}", options_.name, path);
  }

  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("create the socket of ", options_.name));
  auto fail = [&](absl::string_view what, bool bound) {
    absl::Status status = ErrnoStatus(errno, absl::StrCat(what, " ", path));
    close(fd);
    if (bound) unlink(path.c_str());
    return status;
  };
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return fail("bind", false);
  }
  // The parent directory is 0700, so nobody else can reach the socket before this chmod.
  if (chmod(path.c_str(), 0600) != 0) return fail("chmod 0600", true);
  if (stat(path.c_str(), &st) != 0 || listen(fd, 128) != 0) return fail("listen on", true);
  socket_inode_ = st.st_ino;
  stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd_ < 0) return fail("create the stop eventfd for", true);
  listen_fd_ = fd;
  serve_ = std::move(serve);
  refuse_ = std::move(refuse);
  started_ = true;
  acceptor_ = std::thread([this] { AcceptLoop(); });
  spdlog::info("serving {} on {}", options_.name, path);
  return absl::OkStatus();
}

void UnixServer::Stop() {
  {
    absl::MutexLock l(&mu_);
    bool was_running = started_ && !stopped_;
    stopped_ = true;
    if (!was_running) return;
  }
  uint64_t one = 1;
  if (write(stop_fd_, &one, sizeof(one)) != sizeof(one)) {
    spdlog::error("{}: cannot signal stop: {}", options_.name,
                  ErrnoText(errno));  // not for eventfd
  }
  acceptor_.join();
  close(listen_fd_);
  listen_fd_ = -1;
  if (extra_fd_ >= 0) close(extra_fd_);
  extra_fd_ = -1;
  struct stat st;
  const std::string& path = options_.socket_path;
  if (lstat(path.c_str(), &st) == 0 && st.st_ino == socket_inode_) {
    unlink(path.c_str());
  } else {
    spdlog::warn("{}: {} was replaced by someone else; leaving it", options_.name, path);
  }
  // No worker is added once the acceptor is gone.
  std::list<std::unique_ptr<Worker>> workers;
  {
    absl::MutexLock l(&mu_);
    workers.swap(workers_);
  }
  for (auto& w : workers) w->thread.join();
  close(stop_fd_);
  stop_fd_ = -1;
  spdlog::info("stopped serving {} on {}", options_.name, path);
}

UnixServer::Stats UnixServer::stats() const {
  absl::MutexLock l(&mu_);
  return stats_;
}

void UnixServer::ReapWorkers() {
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

void UnixServer::AcceptLoop() {
  while (true) {
    struct pollfd fds[3] = {{stop_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}, {extra_fd_, POLLIN, 0}};
    if (poll(fds, extra_fd_ >= 0 ? 3 : 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("{}: poll on {}: {}", options_.name, options_.socket_path, ErrnoText(errno));
      return;
    }
    if (fds[0].revents != 0) return;
    ReapWorkers();
    const bool relayed = extra_fd_ >= 0 && fds[2].revents != 0;
    int fd =
        accept4(relayed ? extra_fd_ : listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED) continue;
      spdlog::error("{}: accept: {}", options_.name, ErrnoText(err));
      {
        absl::MutexLock l(&mu_);
        ++stats_.accept_errors;
      }
      // Out of fds or memory: back off instead of spinning on a readable listener.
      struct pollfd stop = {stop_fd_, POLLIN, 0};
      poll(&stop, 1, 100);
      continue;
    }

    // The unix socket is allowed_uid's only; a relayed peer is checked by its protocol.
    struct ucred cred = {};
    socklen_t len = sizeof(cred);
    const bool peer_ok = relayed || (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 &&
                                     cred.uid == options_.allowed_uid);
    std::optional<Refusal> refusal;
    Worker* worker = nullptr;
    {
      // Counted before the client hears anything, so one that has its answer sees it in stats().
      absl::MutexLock l(&mu_);
      ++stats_.accepted;
      if (!peer_ok) {
        ++stats_.denied_peers;
        refusal = Refusal::kDeniedPeer;
      } else if (stats_.active >= options_.max_connections) {
        ++stats_.busy;
        refusal = Refusal::kBusy;
      } else {
        ++stats_.active;
        workers_.push_back(std::make_unique<Worker>());
        worker = workers_.back().get();
      }
    }
    if (refusal.has_value()) {
      if (*refusal == Refusal::kDeniedPeer) {
        spdlog::warn("{}: refusing peer pid {} uid {}: only uid {} may connect", options_.name,
                     cred.pid, cred.uid, options_.allowed_uid);
      } else {
        spdlog::warn("{}: {} connections in service; turning a client away", options_.name,
                     options_.max_connections);
      }
      // Drain what the client already sent, so closing does not turn into a reset before it
      // reads the answer; never wait for more.
      char buf[4096];
      for (int i = 0; i < 16 && recv(fd, buf, sizeof(buf), MSG_DONTWAIT) > 0; ++i) {
      }
      refuse_(fd, *refusal, cred);
      close(fd);
      continue;
    }
    worker->thread = std::thread([this, fd, worker, relayed] {
      serve_(fd, relayed);
      close(fd);
      {
        absl::MutexLock l(&mu_);
        --stats_.active;
      }
      worker->done.store(true, std::memory_order_release);
    });
  }
}

}  // namespace sluice::agent
