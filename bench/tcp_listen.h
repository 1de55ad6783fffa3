// The benchmarks' TCP servers (conn_load, tcp_rr): a listening socket on every IPv4 address.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>

namespace sluice::bench {

// Listens on `port` with `backlog` (SIGPIPE ignored: a client may go first); prints
// "listening on PORT" once it does, which the scripts wait for. -1 after printing why.
inline int ListenTcp(int port, int backlog, const char* who) {
  signal(SIGPIPE, SIG_IGN);
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  if (ls < 0 || bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      listen(ls, backlog) != 0) {
    std::fprintf(stderr, "%s serve: bind/listen: %m\n", who);
    if (ls >= 0) close(ls);
    return -1;
  }
  std::printf("listening on %d\n", port);
  std::fflush(stdout);
  return ls;
}

}  // namespace sluice::bench
