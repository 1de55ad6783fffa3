// Length-prefixed messages over a pipe to and from a benchmark's forked child (the lab apiserver
// the Kubernetes benchmarks run against). A failure to write, or a message that does not arrive
// in time, ends the benchmark with `what` in the error.
#pragma once

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace sluice::bench {

[[noreturn]] inline void PipeDie(const char* what, const char* msg) {
  std::fprintf(stderr, "%s: %s\n", what, msg);
  std::_Exit(2);
}

inline void WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) PipeDie("pipe write", std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Reads exactly n bytes, waiting at most `timeout_s` overall. False on EOF/timeout.
inline bool ReadAll(int fd, void* data, size_t n, int timeout_s) {
  char* p = static_cast<char*>(data);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (n > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    int pr = ::poll(&pfd, 1, static_cast<int>(left));
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
