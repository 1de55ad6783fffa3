#include "agent/lab/network/netexec.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "agent/base/errno.h"
#include "agent/base/unix_server.h"
#include "spdlog/spdlog.h"

namespace sluice::lab {
namespace {

std::string FormatPeer(const sockaddr_in& sa) {
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof(buf));
  return absl::StrCat(buf, ":", ntohs(sa.sin_port));
}

// Reads up to the first newline (or EOF / 4 KiB / 5 s of silence).
std::string ReadRequestLine(int fd) {
  std::string data;
  char buf[1024];
  while (data.size() < 4096 && data.find('\n') == std::string::npos) {
    pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 5000) <= 0) break;
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    data.append(buf, n);
  }
  return data;
}


// sd_notify's READY=1 to $NOTIFY_SOCKET (a path, or "@name" for an abstract socket); nothing
// when it is unset.
absl::Status NotifyReady() {
  const char* path = getenv("NOTIFY_SOCKET");
  if (path == nullptr || *path == '\0') return absl::OkStatus();
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  size_t len = strlen(path);
  if (len >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("NOTIFY_SOCKET too long: ", path));
  }
  memcpy(addr.sun_path, path, len);
  if (addr.sun_path[0] == '@') addr.sun_path[0] = '\0';
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus(errno, "socket unix");
  constexpr char kReady[] = "READY=1";
  ssize_t n = sendto(fd, kReady, sizeof(kReady) - 1, MSG_NOSIGNAL,
                     reinterpret_cast<sockaddr*>(&addr), offsetof(sockaddr_un, sun_path) + len);
  int err = errno;
  close(fd);
  if (n < 0) return ErrnoStatus(err, absl::StrCat("notify ", path));
  return absl::OkStatus();
}

void LogRequest(const char* protocol, const std::string& client, const std::string& request) {
  std::string text(absl::StripAsciiWhitespace(request));
  if (text.size() > 80) text = text.substr(0, 80) + "...";
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  if (text.empty()) {
    spdlog::info("{} connection from {} without a request", protocol, client);  // a probe
  } else {
    spdlog::info("{} request from {}: \"{}\"", protocol, client, text);
  }
}

}  // namespace

std::string NetexecAnswer(const std::string& name, const std::string& request,
                          const std::string& client) {
  std::string text(absl::StripAsciiWhitespace(request));
  if (text == "hostname") return name + "\n";
  if (text == "clientip") return client + "\n";
  return request;
}

absl::StatusOr<std::unique_ptr<NetexecServer>> NetexecServer::Start(const NetexecOptions& options) {
  std::unique_ptr<NetexecServer> s(new NetexecServer(options));
  if (pipe2(s->stop_pipe_, O_CLOEXEC) != 0) return ErrnoStatus(errno, "pipe");
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(options.port);
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  int one = 1;
  if (options.tcp) {
    s->tcp_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s->tcp_fd_ < 0) return ErrnoStatus(errno, "socket tcp");
    setsockopt(s->tcp_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(s->tcp_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      return ErrnoStatus(errno, absl::StrCat("bind tcp port ", options.port));
    }
    if (listen(s->tcp_fd_, 128) != 0) return ErrnoStatus(errno, "listen");
  }
  if (options.udp) {
    s->udp_fd_ = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s->udp_fd_ < 0) return ErrnoStatus(errno, "socket udp");
    setsockopt(s->udp_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    setsockopt(s->udp_fd_, IPPROTO_IP, IP_PKTINFO, &one, sizeof(one));
    if (bind(s->udp_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      return ErrnoStatus(errno, absl::StrCat("bind udp port ", options.port));
    }
  }
  // Bound (and listening) is enough: connections and datagrams queue until the threads run.
  if (auto st = NotifyReady(); !st.ok()) return st;
  if (s->tcp_fd_ >= 0) s->threads_.emplace_back([p = s.get()] { p->ServeTcp(); });
  if (s->udp_fd_ >= 0) s->threads_.emplace_back([p = s.get()] { p->ServeUdp(); });
  return s;
}

NetexecServer::~NetexecServer() {
  Stop();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  for (int fd : {tcp_fd_, udp_fd_, stop_pipe_[0], stop_pipe_[1]}) {
    if (fd >= 0) close(fd);
  }
}

void NetexecServer::Stop() {
  if (stopping_.exchange(true)) return;
  char c = 0;
  [[maybe_unused]] ssize_t n = write(stop_pipe_[1], &c, 1);
}

void NetexecServer::Wait() {
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void NetexecServer::ServeTcp() {
  while (!stopping_) {
    pollfd p[2] = {{tcp_fd_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
    if (poll(p, 2, -1) < 0) continue;
    if (p[1].revents) return;
    sockaddr_in peer = {};
    socklen_t len = sizeof(peer);
    int fd = accept4(tcp_fd_, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::thread([fd, peer, name = options_.name, log = options_.log_requests] {
      std::string request = ReadRequestLine(fd);
      if (log) LogRequest("tcp", FormatPeer(peer), request);
      // A peer that stops reading is given up on, as one that goes (best effort: it asked).
      if (!request.empty()) {
        (void)agent::SendAll(fd, NetexecAnswer(name, request, FormatPeer(peer)),
                             absl::Now() + absl::Seconds(5));
      }
      shutdown(fd, SHUT_WR);
      close(fd);
    }).detach();
  }
}

void NetexecServer::ServeUdp() {
  while (!stopping_) {
    pollfd p[2] = {{udp_fd_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
    if (poll(p, 2, -1) < 0) continue;
    if (p[1].revents) return;
    char buf[65536];
    char control[CMSG_SPACE(sizeof(in_pktinfo))] = {};
    sockaddr_in peer = {};
    iovec iov = {buf, sizeof(buf)};
    msghdr msg = {};
    msg.msg_name = &peer;
    msg.msg_namelen = sizeof(peer);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = recvmsg(udp_fd_, &msg, 0);
    if (n < 0) continue;
    std::optional<in_addr> local;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
        in_pktinfo info;
        memcpy(&info, CMSG_DATA(c), sizeof(info));
        local = info.ipi_addr;
      }
    }
    if (options_.log_requests) LogRequest("udp", FormatPeer(peer), std::string(buf, n));
    std::string reply = NetexecAnswer(options_.name, std::string(buf, n), FormatPeer(peer));
    iovec out_iov = {reply.data(), reply.size()};
    char out_control[CMSG_SPACE(sizeof(in_pktinfo))] = {};
    msghdr out = {};
    out.msg_name = &peer;
    out.msg_namelen = sizeof(peer);
    out.msg_iov = &out_iov;
    out.msg_iovlen = 1;
    if (local) {
      // Source address = the address the request was sent to; the kernel picks the route.
      out.msg_control = out_control;
      out.msg_controllen = sizeof(out_control);
      cmsghdr* c = CMSG_FIRSTHDR(&out);
      c->cmsg_level = IPPROTO_IP;
      c->cmsg_type = IP_PKTINFO;
      c->cmsg_len = CMSG_LEN(sizeof(in_pktinfo));
      in_pktinfo info = {};
      info.ipi_spec_dst = *local;
      memcpy(CMSG_DATA(c), &info, sizeof(info));
    }
    sendmsg(udp_fd_, &out, MSG_NOSIGNAL);
  }
}

}  // namespace sluice::lab
