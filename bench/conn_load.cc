// A minimal TCP load generator and accept server for the Service connection benchmark
// (service_conn_bench.sh).
//
//   conn_load serve PORT
//     Accepts, reads one request, answers "backend <local address>\n" and closes first (so the
//     server side holds TIME_WAIT, as an HTTP/1.0 server would, and the client can reuse ports).
//
//   conn_load client ADDR PORT [--seconds=S] [--warmup=S] [--threads=T]
//     T threads each loop: connect (timed: SYN -> SYN-ACK as the client sees it), send a small
//     request, read the answer to EOF, close. Prints one line of key=value results: completed
//     connections, connections per second over the measured window, connect latency p50/p90/p99
//     in microseconds, errors, and how many answers each backend gave (validation that the
//     Service was translated and balanced).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench/tcp_listen.h"

namespace {

using Clock = std::chrono::steady_clock;

int Serve(int port) {
  int ls = sluice::bench::ListenTcp(port, 4096, "conn_load");
  if (ls < 0) return 1;
  // Two acceptors: the client side may run more than one thread.
  auto loop = [ls] {
    char buf[512];
    for (;;) {
      int c = accept(ls, nullptr, nullptr);
      if (c < 0) continue;
      sockaddr_in local{};
      socklen_t len = sizeof(local);
      getsockname(c, reinterpret_cast<sockaddr*>(&local), &len);
      (void)!read(c, buf, sizeof(buf));
      char ip[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &local.sin_addr, ip, sizeof(ip));
      int n = std::snprintf(buf, sizeof(buf), "backend %s\n", ip);
      (void)!write(c, buf, static_cast<size_t>(n));
      close(c);
    }
  };
  std::thread t(loop);
  loop();
  return 0;
}

struct ThreadResult {
  std::vector<uint32_t> connect_ns;
  uint64_t errors = 0;
  std::map<std::string, uint64_t> error_kinds;  // "connect:EADDRNOTAVAIL", "read:ECONNRESET", ...
  std::map<std::string, uint64_t> backends;
};

void ClientLoop(sockaddr_in dst, Clock::time_point start, Clock::time_point end,
                ThreadResult* out) {
  static const char kRequest[] = "GET / HTTP/1.0\r\n\r\n";
  char buf[256];
  while (true) {
    auto t0 = Clock::now();
    if (t0 >= end) break;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) {
      ++out->errors;
      continue;
    }
    const char* failed = nullptr;
    int rc = connect(s, reinterpret_cast<sockaddr*>(&dst), sizeof(dst));
    auto t1 = Clock::now();
    if (rc != 0) failed = "connect";
    if (!failed && write(s, kRequest, sizeof(kRequest) - 1) <= 0) failed = "write";
    size_t got = 0;
    while (!failed) {
      ssize_t n = read(s, buf + got, sizeof(buf) - 1 - got);
      if (n < 0) failed = "read";
      if (n <= 0) break;
      got += static_cast<size_t>(n);
      if (got == sizeof(buf) - 1) break;
    }
    int err = errno;
    close(s);
    if (!failed && got == 0) {
      failed = "read";
      err = 0;  // EOF before any answer
    }
    if (failed) {
      if (t0 >= start) {
        ++out->errors;
        ++out->error_kinds[std::string(failed) + ":" + (err ? strerrorname_np(err) : "EOF")];
      }
      continue;
    }
    if (t0 < start) continue;  // warm-up
    buf[got] = 0;
    std::string answer(buf);
    if (answer.rfind("backend ", 0) == 0) {
      answer = answer.substr(8);
      while (!answer.empty() && answer.back() == '\n') answer.pop_back();
    }
    ++out->backends[answer];
    out->connect_ns.push_back(static_cast<uint32_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()));
  }
}

int Client(int argc, char** argv) {
  if (argc < 2) return 2;
  double seconds = 3, warmup = 0.5;
  int threads = 1;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--seconds=", 0) == 0)
      seconds = std::atof(a.c_str() + 10);
    else if (a.rfind("--warmup=", 0) == 0)
      warmup = std::atof(a.c_str() + 9);
    else if (a.rfind("--threads=", 0) == 0)
      threads = std::atoi(a.c_str() + 10);
    else
      return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(static_cast<uint16_t>(std::atoi(argv[1])));
  if (inet_pton(AF_INET, argv[0], &dst.sin_addr) != 1) return 2;

  auto start = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(warmup * 1e6));
  auto end = start + std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
  std::vector<ThreadResult> results(static_cast<size_t>(threads));
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back(ClientLoop, dst, start, end, &results[static_cast<size_t>(t)]);
  for (auto& t : ts) t.join();

  std::vector<uint32_t> all;
  uint64_t errors = 0;
  std::map<std::string, uint64_t> backends, error_kinds;
  for (auto& r : results) {
    for (auto& [k, n] : r.error_kinds) error_kinds[k] += n;
    all.insert(all.end(), r.connect_ns.begin(), r.connect_ns.end());
    errors += r.errors;
    for (auto& [b, n] : r.backends) backends[b] += n;
  }
  std::sort(all.begin(), all.end());
  auto pct = [&](double p) -> double {
    if (all.empty()) return 0;
    size_t i = std::min(all.size() - 1, static_cast<size_t>(p * static_cast<double>(all.size())));
    return all[i] / 1000.0;
  };
  std::printf(
      "conns=%zu conns_per_s=%.0f p50_us=%.1f p90_us=%.1f p99_us=%.1f errors=%llu backends=",
      all.size(), static_cast<double>(all.size()) / seconds, pct(0.50), pct(0.90), pct(0.99),
      static_cast<unsigned long long>(errors));
  bool first = true;
  for (auto& [b, n] : backends) {
    std::printf("%s%s:%llu", first ? "" : ",", b.c_str(), static_cast<unsigned long long>(n));
    first = false;
  }
  if (!error_kinds.empty()) {
    std::printf(" error_kinds=");
    first = true;
    for (auto& [k, n] : error_kinds) {
      std::printf("%s%s:%llu", first ? "" : ",", k.c_str(), static_cast<unsigned long long>(n));
      first = false;
    }
  }
  std::printf("\n");
  return all.empty() ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "serve") == 0) return Serve(std::atoi(argv[2]));
  if (argc >= 4 && std::strcmp(argv[1], "client") == 0) {
    int rc = Client(argc - 2, argv + 2);
    if (rc == 2)
      std::fprintf(stderr,
                   "usage: conn_load client ADDR PORT [--seconds=S] [--warmup=S] [--threads=T]\n");
    return rc;
  }
  std::fprintf(stderr, "usage: conn_load serve PORT | conn_load client ADDR PORT [...]\n");
  return 2;
}
