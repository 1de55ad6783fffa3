#include "agent/base/unix_server.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "support/eventually.h"
#include "support/temp_dir.h"

namespace sluice::agent {
namespace {

using ::sluice::testing::Eventually;
using ::sluice::testing::TempDir;

int Connect(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct timeval tv = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

// A TCP listener on loopback, the kind of extra listener the observe relay adds; its port in
// `port`.
int ListenLoopback(int* port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  struct sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 4) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return -1;
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

int ConnectLoopback(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

class UnixServerTest : public ::testing::Test {
 protected:
  UnixServerOptions Options() {
    return UnixServerOptions{.socket_path = tmp_.path() + "/run/test.sock", .name = "the test"};
  }
  static void Answer(int fd, const std::string& text) {
    ASSERT_EQ(SendAll(fd, text, absl::Now() + absl::Seconds(10)), 0);
  }

  TempDir tmp_{"sluice-unix-server-test"};
};

TEST_F(UnixServerTest, ServesEachConnectionAndTellsWhichListenerItCameThrough) {
  // A peer uid nobody has: the unix socket turns everyone away, the extra listener does not
  // look at peers (its protocol checks them).
  UnixServerOptions options = Options();
  options.allowed_uid = getuid() + 1;
  UnixServer server(options);
  int port = 0;
  int relay = ListenLoopback(&port);
  ASSERT_GE(relay, 0);
  server.AddListener(relay);
  ASSERT_TRUE(server
                  .Start([](int fd, bool relayed) { Answer(fd, relayed ? "relayed" : "local"); },
                         [](int fd, UnixServer::Refusal why, const ucred& peer) {
                           Answer(fd, why == UnixServer::Refusal::kDeniedPeer
                                          ? "denied uid " + std::to_string(peer.uid)
                                          : "busy");
                         })
                  .ok());
  int local = Connect(options.socket_path);
  ASSERT_GE(local, 0);
  EXPECT_EQ(ReadAll(local), "denied uid " + std::to_string(getuid()));
  close(local);
  int remote = ConnectLoopback(port);
  ASSERT_GE(remote, 0);
  EXPECT_EQ(ReadAll(remote), "relayed");
  close(remote);
  UnixServer::Stats stats = server.stats();
  EXPECT_EQ(stats.accepted, 2u);
  EXPECT_EQ(stats.denied_peers, 1u);
}

TEST_F(UnixServerTest, TurnsConnectionsAwayBeyondTheBound) {
  UnixServerOptions options = Options();
  options.allowed_uid = getuid();
  options.max_connections = 1;
  absl::Notification release;
  UnixServer server(options);
  ASSERT_TRUE(server
                  .Start(
                      [&](int fd, bool) {
                        release.WaitForNotificationWithTimeout(absl::Seconds(10));
                        Answer(fd, "served");
                      },
                      [](int fd, UnixServer::Refusal why, const ucred&) {
                        Answer(fd, why == UnixServer::Refusal::kBusy ? "busy" : "denied");
                      })
                  .ok());
  int first = Connect(options.socket_path);
  ASSERT_GE(first, 0);
  ASSERT_TRUE(Eventually([&] { return server.stats().active == 1; }));
  int second = Connect(options.socket_path);
  ASSERT_GE(second, 0);
  EXPECT_EQ(ReadAll(second), "busy");
  close(second);
  release.Notify();
  EXPECT_EQ(ReadAll(first), "served");
  close(first);
  EXPECT_EQ(server.stats().busy, 1u);
  EXPECT_TRUE(Eventually([&] { return server.stats().active == 0; }));
}

TEST_F(UnixServerTest, StopEndsTheWaitsOfConnectionsAndWaitsForThem) {
  UnixServerOptions options = Options();
  options.allowed_uid = getuid();
  UnixServer server(options);
  std::atomic<int> stopped_waits = 0, cancelled_sends = 0;
  ASSERT_TRUE(server
                  .Start(
                      [&](int fd, bool) {
                        // A client that sends nothing and reads nothing: only Stop ends these.
                        if (WaitForIo(fd, POLLIN, absl::Now() + absl::Hours(1), server.stop_fd()) ==
                            IoWait::kStopped) {
                          ++stopped_waits;
                        }
                        const std::string big(8 << 20, 'x');
                        if (SendAll(fd, big, absl::Now() + absl::Hours(1), server.stop_fd()) ==
                            ECANCELED) {
                          ++cancelled_sends;
                        }
                      },
                      [](int, UnixServer::Refusal, const ucred&) {})
                  .ok());
  int idle = Connect(options.socket_path);
  ASSERT_GE(idle, 0);
  ASSERT_TRUE(Eventually([&] { return server.stats().active == 1; }));
  const absl::Time start = absl::Now();
  server.Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // not the hour of either deadline
  EXPECT_EQ(stopped_waits, 1);
  EXPECT_EQ(cancelled_sends, 1);
  EXPECT_NE(access(options.socket_path.c_str(), F_OK), 0);  // the socket is gone
  close(idle);
  server.Stop();  // idempotent
}

TEST(SendAllTest, EndsAtItsDeadlineWhenThePeerReadsNothing) {
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  const std::string big(8 << 20, 'x');  // more than the socket buffers hold
  const absl::Time start = absl::Now();
  EXPECT_EQ(SendAll(pair[0], big, absl::Now() + absl::Milliseconds(100)), ETIMEDOUT);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
  EXPECT_EQ(WaitForIo(pair[0], POLLIN, absl::Now() + absl::Milliseconds(50)), IoWait::kTimeout);
  close(pair[1]);
  EXPECT_EQ(SendAll(pair[0], "x", absl::Now() + absl::Seconds(1)), EPIPE);
  close(pair[0]);
}

}  // namespace
}  // namespace sluice::agent
