// TCP request/response latency for overlay_bench.sh (netperf TCP_RR's measure, in one small
// binary that both datapaths run identically).
//
//   tcp_rr serve PORT
//     Listens, prints "listening on PORT" once bound, then serves one connection at a time for
//     ever: every byte read is written back (TCP_NODELAY). Killed by the caller.
//
//   tcp_rr run ADDR PORT N [WARMUP]
//     One connection, WARMUP (default 1000) untimed one-byte round trips, then N timed ones
//     (send one byte, read one byte, CLOCK_MONOTONIC around the pair). Prints
//     "p50_us mean_us p99_us" of the timed ones.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench/tcp_listen.h"

namespace {

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

void NoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Reads exactly one byte; false on EOF or error.
bool ReadByte(int fd, char* b) {
  for (;;) {
    ssize_t n = read(fd, b, 1);
    if (n == 1) return true;
    if (n < 0 && errno == EINTR) continue;
    return false;
  }
}

int Serve(int port) {
  int ls = sluice::bench::ListenTcp(port, 16, "tcp_rr");
  if (ls < 0) return 1;
  for (;;) {
    int c = accept(ls, nullptr, nullptr);
    if (c < 0) continue;
    NoDelay(c);
    char b;
    while (ReadByte(c, &b) && write(c, &b, 1) == 1) {
    }
    close(c);
  }
}

int Run(const char* addr, int port, int n, int warmup) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, addr, &a.sin_addr) != 1) {
    std::fprintf(stderr, "tcp_rr run: bad address %s\n", addr);
    return 2;
  }
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    std::fprintf(stderr, "tcp_rr run: connect %s:%d: %s\n", addr, port, strerror(errno));
    return 1;
  }
  NoDelay(s);
  std::vector<int64_t> rtt;
  rtt.reserve(static_cast<size_t>(n));
  char b = 'x';
  for (int i = 0; i < warmup + n; ++i) {
    int64_t t = NowNs();
    if (write(s, &b, 1) != 1 || !ReadByte(s, &b)) {
      std::fprintf(stderr, "tcp_rr run: round trip %d to %s:%d failed: %s\n", i, addr, port,
                   strerror(errno));
      return 1;
    }
    if (i >= warmup) rtt.push_back(NowNs() - t);
  }
  close(s);
  std::sort(rtt.begin(), rtt.end());
  double sum = 0;
  for (int64_t v : rtt) sum += static_cast<double>(v);
  std::printf("%.1f %.1f %.1f\n", static_cast<double>(rtt[rtt.size() / 2]) / 1000,
              sum / static_cast<double>(rtt.size()) / 1000,
              static_cast<double>(rtt[rtt.size() * 99 / 100]) / 1000);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "serve") == 0) return Serve(std::atoi(argv[2]));
  if ((argc == 5 || argc == 6) && std::strcmp(argv[1], "run") == 0) {
    int n = std::atoi(argv[4]);
    if (n <= 0) {
      std::fprintf(stderr, "tcp_rr run: N must be positive\n");
      return 2;
    }
    return Run(argv[2], std::atoi(argv[3]), n, argc == 6 ? std::atoi(argv[5]) : 1000);
  }
  std::fprintf(stderr, "usage: tcp_rr serve PORT | tcp_rr run ADDR PORT N [WARMUP]\n");
  return 2;
}
