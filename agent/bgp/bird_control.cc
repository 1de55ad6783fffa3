#include "agent/bgp/bird_control.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/base/deadline.h"
#include "agent/base/errno.h"
#include "agent/base/files.h"

namespace sluice::agent::bgp {
namespace {

// Reads until a complete reply (a line whose code is followed by a space) after the greeting.
absl::StatusOr<std::vector<std::string>> ReadReply(int fd, absl::Time deadline,
                                                   bool* greeting_seen) {
  std::string buf;
  std::vector<std::string> lines;
  size_t pos = 0;
  while (true) {
    size_t nl;
    while ((nl = buf.find('\n', pos)) != std::string::npos) {
      std::string line = buf.substr(pos, nl - pos);
      pos = nl + 1;
      bool coded = line.size() >= 5 && absl::ascii_isdigit(line[0]) &&
                   absl::ascii_isdigit(line[1]) && absl::ascii_isdigit(line[2]) &&
                   absl::ascii_isdigit(line[3]) && (line[4] == ' ' || line[4] == '-');
      if (!coded) {
        if (!line.empty() && line[0] == ' ') lines.push_back(line.substr(1));
        continue;
      }
      int code =
          (line[0] - '0') * 1000 + (line[1] - '0') * 100 + (line[2] - '0') * 10 + (line[3] - '0');
      std::string text = line.substr(5);
      if (code == 1 && !*greeting_seen) {  // "0001 BIRD 2.0.12 ready."
        *greeting_seen = true;
        return lines;
      }
      if (code >= 8000) {
        return absl::FailedPreconditionError(absl::StrCat("BIRD: ", code, " ", text));
      }
      lines.push_back(text);
      if (line[4] == ' ') return lines;
    }
    if (WaitDeadlinePassed(deadline)) return absl::DeadlineExceededError("BIRD did not answer");
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    int r = poll(&p, 1, PollTimeoutMs(deadline));
    if (r < 0 && errno != EINTR) return ErrnoStatus(errno, "poll BIRD's control socket");
    if (r <= 0) continue;
    char chunk[4096];
    ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno != EINTR) return ErrnoStatus(errno, "read BIRD's control socket");
    if (n == 0) return absl::UnavailableError("BIRD closed its control socket mid-reply");
    if (n > 0) buf.append(chunk, n);
  }
}

}  // namespace

absl::StatusOr<std::vector<std::string>> BirdCommand(const std::string& socket_path,
                                                     absl::string_view command,
                                                     absl::Duration timeout) {
  if (command.find('\n') != absl::string_view::npos) {
    return absl::InvalidArgumentError("a BIRD command is one line");
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path too long: ", socket_path));
  }
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus(errno, "socket");
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ErrnoStatus(errno, absl::StrCat("connect ", socket_path));
  }
  const absl::Time deadline = WaitDeadline(timeout);
  bool greeting = false;
  if (auto hello = ReadReply(fd, deadline, &greeting); !hello.ok()) return hello.status();
  if (auto st = WriteAll(fd, absl::StrCat(command, "\n"), "write BIRD's control socket");
      !st.ok()) {
    return st;
  }
  return ReadReply(fd, deadline, &greeting);
}

std::vector<BgpSession> ParseBgpSessions(const std::vector<std::string>& reply) {
  // "peer_172_30_0_254 BGP        ---        up     20:26:23.836  Established"
  std::vector<BgpSession> sessions;
  for (const auto& line : reply) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    if (f.size() < 5 || f[1] != "BGP") continue;
    BgpSession s{.name = f[0], .state = f[3], .since = f[4]};
    for (size_t i = 5; i < f.size(); ++i) absl::StrAppend(&s.info, i > 5 ? " " : "", f[i]);
    sessions.push_back(s);
  }
  return sessions;
}

}  // namespace sluice::agent::bgp
