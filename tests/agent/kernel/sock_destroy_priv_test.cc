// SOCK_DESTROY of connected UDP sockets by cookie and peer, on real sockets over loopback: the
// named connected one fails its next calls (recv: ECONNABORTED, send: EDESTADDRREQ); another
// connected to the same peer, an unconnected one that sent to it, and one named with another
// peer keep working.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "agent/kernel/sock_destroy.h"
#include "gtest/gtest.h"

namespace sluice::agent {
namespace {

class Fd {
 public:
  Fd() : fd_(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

uint64_t CookieOf(const Fd& s) {
  uint64_t cookie = 0;
  socklen_t len = sizeof(cookie);
  EXPECT_EQ(getsockopt(s.get(), SOL_SOCKET, SO_COOKIE, &cookie, &len), 0) << strerror(errno);
  return cookie;
}

TEST(DestroyConnectedUdp4SocketsTest, OnlyTheSocketStillConnectedToTheNamedPeerIsClosed) {
  Fd server;
  sockaddr_in peer{};
  peer.sin_family = AF_INET;
  peer.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(server.get(), reinterpret_cast<sockaddr*>(&peer), sizeof(peer)), 0);
  socklen_t len = sizeof(peer);
  ASSERT_EQ(getsockname(server.get(), reinterpret_cast<sockaddr*>(&peer), &len), 0);
  auto* to = reinterpret_cast<sockaddr*>(&peer);
  Fd doomed, kept, unconnected, elsewhere;
  for (const Fd* c : {&doomed, &kept, &elsewhere}) {
    ASSERT_EQ(connect(c->get(), to, sizeof(peer)), 0);
    ASSERT_EQ(send(c->get(), "x", 1, 0), 1);
  }
  ASSERT_EQ(sendto(unconnected.get(), "x", 1, 0, to, sizeof(peer)), 1);
  const uint32_t addr = peer.sin_addr.s_addr;
  const uint16_t port = peer.sin_port;

  auto n = DestroyConnectedUdp4Sockets({{CookieOf(doomed), addr, port},
                                        {CookieOf(unconnected), addr, port},
                                        {CookieOf(elsewhere), addr, htons(ntohs(port) + 1)},
                                        {0x7fffffffffffull, addr, port}});
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 1u);

  char buf[8];
  EXPECT_EQ(recv(doomed.get(), buf, sizeof(buf), MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, ECONNABORTED) << strerror(errno);
  // No longer connected: the application must connect again (socket LB then picks a backend).
  EXPECT_EQ(send(doomed.get(), "x", 1, 0), -1);
  EXPECT_EQ(errno, EDESTADDRREQ) << strerror(errno);
  for (const Fd* c : {&kept, &elsewhere})
    EXPECT_EQ(send(c->get(), "y", 1, 0), 1) << strerror(errno);
  EXPECT_EQ(sendto(unconnected.get(), "y", 1, 0, to, sizeof(peer)), 1) << strerror(errno);
  EXPECT_EQ(recv(unconnected.get(), buf, sizeof(buf), MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, EAGAIN) << "the unconnected socket has no error pending: " << strerror(errno);
}

}  // namespace
}  // namespace sluice::agent
