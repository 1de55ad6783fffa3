#include "agent/monitor/observe_client.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "agent/base/errno.h"
#include "nlohmann/json.hpp"

namespace sluice::monitor {

namespace {

// Sends the request line on a connected socket and hands each reply line to on_line.
absl::Status Stream(int fd, const nlohmann::json& request,
                    const std::function<bool(const nlohmann::json&)>& on_line) {
  std::string out = request.dump() + "\n";
  for (size_t off = 0; off < out.size();) {
    ssize_t n = send(fd, out.data() + off, out.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoStatus(errno, "send the observe request");
    off += n;
  }
  std::string buf;
  char chunk[65536];
  for (;;) {
    ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, "read flows");
    if (n == 0) return absl::OkStatus();
    buf.append(chunk, n);
    size_t start = 0;
    for (size_t nl; (nl = buf.find('\n', start)) != std::string::npos; start = nl + 1) {
      nlohmann::json j = nlohmann::json::parse(buf.begin() + start, buf.begin() + nl, nullptr,
                                               /*allow_exceptions=*/false);
      if (j.is_discarded()) return absl::DataLossError("the agent sent a line that is no JSON");
      if (j.contains("error")) {
        return absl::FailedPreconditionError(j["error"].is_string() ? j["error"].get<std::string>()
                                                                    : j["error"].dump());
      }
      if (!on_line(j)) return absl::OkStatus();
    }
    buf.erase(0, start);
  }
}


}  // namespace

absl::Status Observe(const std::string& socket_path, const nlohmann::json& request,
                     const std::function<bool(const nlohmann::json&)>& on_line) {
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path too long: ", socket_path));
  }
  std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus(errno, "create socket");
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ErrnoStatus(errno, absl::StrCat("connect to the agent's observe socket ", socket_path,
                                           " (is sluice-agent running with --monitor?)"));
  }
  return Stream(fd, request, on_line);
}

absl::Status ObserveRelay(const std::string& address, const std::string& token,
                          nlohmann::json request,
                          const std::function<bool(const nlohmann::json&)>& on_line) {
  auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat(address, ": want HOST:PORT"));
  }
  std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  struct addrinfo hints = {}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat(address, ": ", gai_strerror(rc)));
  }
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    freeaddrinfo(res);
    return ErrnoStatus(errno, "create socket");
  }
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  // Bounded: a node that does not answer must not hold the whole cluster's view.
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  const int rc = connect(fd, res->ai_addr, res->ai_addrlen);
  const int err = errno;
  freeaddrinfo(res);
  if (rc != 0) {
    return ErrnoStatus(err, absl::StrCat("connect to the relay ", address,
                                         " (is its agent running with --relay_address?)"));
  }
  request["token"] = token;
  return Stream(fd, request, on_line);
}

}  // namespace sluice::monitor
