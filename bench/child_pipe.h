// Length-prefixed messages over a pipe to and from a benchmark's forked child (the lab apiserver
// the Kubernetes benchmarks run against). A failure to write, or a message that does not arrive
// in time, ends the benchmark with `what` in the error.
#pragma once

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "agent/base/clock.h"
#include "agent/base/deadline.h"
#include "agent/base/files.h"

namespace sluice::bench {

[[noreturn]] inline void PipeDie(const char* what, const char* msg) {
  std::fprintf(stderr, "%s: %s\n", what, msg);
  std::_Exit(2);
}

inline void WriteAll(int fd, const void* data, size_t n) {
  absl::Status st =
      agent::WriteAll(fd, absl::string_view(static_cast<const char*>(data), n), "pipe write");
  if (!st.ok()) PipeDie("child pipe", std::string(st.message()).c_str());
}

// Reads exactly n bytes, waiting at most `timeout_s` overall. False on EOF/timeout.
inline bool ReadAll(int fd, void* data, size_t n, int timeout_s) {
  char* p = static_cast<char*>(data);
  const Clock& clock = *RealClock::Get();
  const absl::Time deadline = clock.Now() + absl::Seconds(timeout_s);
  while (n > 0) {
    const int left = PollTimeoutMs(deadline, clock.Now());
    if (left == 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    int pr = ::poll(&pfd, 1, left);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) return false;
    ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

inline void WriteString(int fd, const std::string& s) {
  uint64_t n = s.size();
  WriteAll(fd, &n, sizeof n);
  WriteAll(fd, s.data(), s.size());
}

inline std::string ReadString(int fd, int timeout_s) {
  uint64_t n = 0;
  if (!ReadAll(fd, &n, sizeof n, timeout_s)) PipeDie("server child", "no handshake");
  std::string s(n, '\0');
  if (!ReadAll(fd, s.data(), n, timeout_s)) PipeDie("server child", "short handshake");
  return s;
}

}  // namespace sluice::bench
