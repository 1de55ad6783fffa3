#include "agent/monitor/observe_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "agent/base/deadline.h"
#include "agent/base/errno.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace sluice::monitor {
namespace {

constexpr size_t kMaxRequestBytes = 64 << 10;
constexpr absl::Duration kRequestTimeout = absl::Seconds(10);
// A client that reads nothing for this long is let go (its observer queue overflows first).
constexpr absl::Duration kWriteTimeout = absl::Seconds(10);

// One line (without its '\n'), up to EOF if the client sends none.
bool ReadLine(int fd, int stop_fd, std::string* line) {
  const absl::Time deadline = WaitDeadline(kRequestTimeout);
  char buf[4096];
  while (line->size() <= kMaxRequestBytes) {
    if (agent::WaitForIo(fd, POLLIN, deadline, stop_fd) != agent::IoWait::kReady) return false;
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

ObserveServer::ObserveServer(FlowMonitor& monitor, ObserveServerOptions options)
    : monitor_(monitor),
      options_(std::move(options)),
      server_(agent::UnixServerOptions{.socket_path = options_.socket_path,
                                       .name = "the observe socket",
                                       .allowed_uid = options_.allowed_uid,
                                       .max_connections = options_.max_observers}) {}

ObserveServer::~ObserveServer() { Stop(); }

bool ObserveServer::WriteLine(int fd, const nlohmann::json& line) {
  return agent::SendAll(fd, line.dump() + "\n", WaitDeadline(kWriteTimeout), server_.stop_fd()) ==
         0;
}

absl::Status ObserveServer::Start() {
  if (!options_.relay_address.empty()) {
    if (options_.relay_token.empty()) {
      return absl::FailedPreconditionError("the relay needs a token (--relay_token_file)");
    }
    auto relay = ListenTcp(options_.relay_address);
    if (!relay.ok()) return relay.status();
    server_.AddListener(*relay);
  }
  auto serve = [this](int fd, bool relayed) { Serve(fd, relayed); };
  auto refuse = [](int fd, agent::UnixServer::Refusal why, const ucred&) {
    const nlohmann::json line = {{"error", why == agent::UnixServer::Refusal::kBusy
                                               ? "too many observers"
                                               : "permission denied"}};
    (void)agent::SendAll(fd, line.dump() + "\n", WaitDeadline(absl::Milliseconds(100)));
  };
  if (absl::Status st = server_.Start(std::move(serve), std::move(refuse)); !st.ok()) return st;
  if (!options_.relay_address.empty()) {
    spdlog::info("monitor: relaying flows on {} (token required)", options_.relay_address);
  }
  return absl::OkStatus();
}

void ObserveServer::Serve(int fd, bool relayed) {
  std::string line;
  if (!ReadLine(fd, server_.stop_fd(), &line)) return;
  nlohmann::json req = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!req.is_object()) {
    WriteLine(fd, {{"error", "a request is one JSON object"}});
    return;
  }
  if (relayed) {
    const nlohmann::json* token = req.contains("token") ? &req["token"] : nullptr;
    if (token == nullptr || !token->is_string() ||
        !SameToken(token->get<std::string>(), options_.relay_token)) {
      spdlog::warn("monitor: a relay request with a wrong or no token was refused");
      WriteLine(fd, {{"error", "permission denied: wrong or no relay token"}});
      return;
    }
  }
  auto filter = FilterFromJson(req.value("filter", nlohmann::json()));
  if (!filter.ok()) {
    WriteLine(fd, {{"error", std::string(filter.status().message())}});
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
  if (!WriteLine(fd,
                 {{"status",
                   {{"events_lost", lost},
                    {"flows_read", monitor_.flows_read()},
                    {"observers", monitor_.observers()}}}})) {
    return;
  }
  for (const Flow& f : history) {
    if (!WriteLine(fd, {{"flow", FlowToJson(f)}})) return;
  }
  if (!observer) return;
  // Where the history ends and live flows begin (a relay's client merges histories by it).
  if (!WriteLine(fd, {{"live", nlohmann::json::object()}})) return;
  absl::Time next_lost_check = options_.clock->Now() + absl::Seconds(1);
  // Whether the agent stops or the client left is looked at when the stream is idle and every
  // 64 flows, not per flow: at full rate the flows are the work.
  int unchecked = 0;
  for (;;) {
    if (unchecked == 0) {
      if (server_.stopping() || PeerGone(fd) || observer->stopped()) return;
    }
    if (auto f = observer->Next(absl::Milliseconds(200))) {
      if (!WriteLine(fd, {{"flow", FlowToJson(*f)}})) return;
      unchecked = (unchecked + 1) % 64;
    } else {
      unchecked = 0;
    }
    if (const absl::Time now = options_.clock->Now(); now >= next_lost_check) {
      next_lost_check = now + absl::Seconds(1);
      uint64_t now_lost = monitor_.EventsLost();
      if (now_lost != lost) {
        lost = now_lost;
        if (!WriteLine(fd, {{"lost", {{"events_lost", lost}}}})) return;
      }
    }
  }
}

}  // namespace sluice::monitor
