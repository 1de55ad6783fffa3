// TCP_NODELAY on every open TCP socket of this process (service_churn_bench, cluster_scale_bench:
// the lab apiserver's sockets, before a latency measurement).
#pragma once

#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cstdint>
#include <cstdlib>

namespace sluice::bench {

// The lab apiserver (cpp-httplib) leaves Nagle on; kube-apiserver (Go) sets TCP_NODELAY on every
// connection. With Nagle, a response's body segment (or the next watch event) waits for the
// client's delayed ACK: ~40 ms per PUT, and watch events closer than that are held back.
inline int32_t SetNoDelayOnOpenSockets() {
  int32_t count = 0;
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  while (dirent* e = readdir(d)) {
    int fd = std::atoi(e->d_name);
    if (e->d_name[0] == '.' || fd == dirfd(d)) continue;
    int type = 0;
    socklen_t len = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) continue;
    sockaddr_storage sa{};
    len = sizeof sa;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0 ||
        (sa.ss_family != AF_INET && sa.ss_family != AF_INET6)) {
      continue;
    }
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0) ++count;
  }
  closedir(d);
  return count;
}

}  // namespace sluice::bench
