// netexec and probe/request in a private network namespace: answers over TCP and UDP, UDP replies
// from the address asked, and the four probe outcomes (CONNECTED, REFUSED, TIMEOUT, UNREACHABLE).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "agent/lab/network/netexec.h"
#include "agent/lab/network/probe.h"
#include "agent/lab/tools/process.h"
#include "gtest/gtest.h"

namespace sluice::lab {
namespace {

constexpr int kPort = 18080;
constexpr char kSilentHost[] = "10.123.0.2";  // a neighbour that never answers
constexpr char kSecondAddress[] = "10.124.0.5";
constexpr char kUnreachableHost[] = "10.125.0.7";  // an `unreachable` route: EHOSTUNREACH
constexpr char kNoRouteHost[] = "10.126.0.7";      // no route at all: ENETUNREACH

class NetexecProbeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_EQ(unshare(CLONE_NEWNET), 0) << "needs root: " << strerror(errno);
    for (const auto& argv : std::vector<std::vector<std::string>>{
             {"ip", "link", "set", "lo", "up"},
             {"ip", "addr", "add", std::string(kSecondAddress) + "/32", "dev", "lo"},
             // A veth whose far end drops everything: frames go to a MAC nobody has.
             {"ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1"},
             {"ip", "addr", "add", "10.123.0.1/24", "dev", "v0"},
             {"ip", "link", "set", "v0", "up"},
             {"ip", "link", "set", "v1", "up"},
             {"ip", "neigh", "add", kSilentHost, "lladdr", "02:00:00:00:00:99", "dev", "v0", "nud",
              "permanent"},
             {"ip", "route", "add", "unreachable", "10.125.0.0/24"},
         }) {
      ASSERT_TRUE(RunChecked(argv).ok()) << RunChecked(argv);
    }
    auto server = NetexecServer::Start({.port = kPort, .name = "pod-a"});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = server->release();
  }
  static void TearDownTestSuite() { delete server_; }

  static ProbeTarget Target(const std::string& host, int port, Protocol p,
                            absl::Duration timeout = absl::Seconds(2)) {
    return {.host = host, .port = port, .protocol = p, .timeout = timeout};
  }

  static NetexecServer* server_;
};
NetexecServer* NetexecProbeTest::server_ = nullptr;

TEST_F(NetexecProbeTest, AnswersHostnameClientIpAndEchoOverTcpAndUdp) {
  for (Protocol p : {Protocol::kTcp, Protocol::kUdp}) {
    auto t = Target("127.0.0.1", kPort, p);
    auto r = Request(t, "hostname");
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->outcome, ProbeOutcome::kConnected);
    EXPECT_EQ(r->reply, "pod-a\n");
    r = Request(t, "clientip");
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r->reply.starts_with("127.0.0.1:")) << r->reply;
    r = Request(t, "some text");
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->reply, "some text\n");
  }
}

TEST_F(NetexecProbeTest, UdpRepliesLeaveFromTheAddressAsked) {
  // The client sends from 127.0.0.1 to the second address; a reply sourced from anything else
  // would be dropped by the connected socket.
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in local = {.sin_family = AF_INET};
  inet_pton(AF_INET, "127.0.0.1", &local.sin_addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof(local)), 0);
  sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(kPort)};
  inet_pton(AF_INET, kSecondAddress, &dst.sin_addr);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof(dst)), 0);
  timeval tv = {.tv_sec = 2, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ASSERT_EQ(send(fd, "hostname\n", 9, 0), 9);
  char buf[64] = {};
  ssize_t n = recv(fd, buf, sizeof(buf), 0);
  close(fd);
  ASSERT_GT(n, 0) << "no reply from " << kSecondAddress << ": " << strerror(errno);
  EXPECT_EQ(std::string(buf, n), "pod-a\n");
}

TEST_F(NetexecProbeTest, ProbeOfAServingPortIsConnected) {
  for (Protocol p : {Protocol::kTcp, Protocol::kUdp}) {
    auto r = Probe(Target(kSecondAddress, kPort, p));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, ProbeOutcome::kConnected);
  }
}

TEST_F(NetexecProbeTest, ProbeOfAClosedPortIsRefused) {
  for (Protocol p : {Protocol::kTcp, Protocol::kUdp}) {
    auto r = Probe(Target("127.0.0.1", kPort + 1, p));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, ProbeOutcome::kRefused) << ProbeOutcomeName(*r);
    auto q = Request(Target("127.0.0.1", kPort + 1, p), "hostname");
    ASSERT_TRUE(q.ok());
    EXPECT_EQ(q->outcome, ProbeOutcome::kRefused);
  }
}

TEST_F(NetexecProbeTest, ProbeOfASilentHostTimesOutAfterTheTimeout) {
  for (Protocol p : {Protocol::kTcp, Protocol::kUdp}) {
    absl::Time start = absl::Now();
    auto r = Probe(Target(kSilentHost, kPort, p, absl::Milliseconds(700)));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, ProbeOutcome::kTimeout) << ProbeOutcomeName(*r);
    EXPECT_GE(absl::Now() - start, absl::Milliseconds(650));
    EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  }
}

TEST_F(NetexecProbeTest, ProbeWithoutARouteIsUnreachableNotATimeout) {
  for (const char* host : {kUnreachableHost, kNoRouteHost}) {
    for (Protocol p : {Protocol::kTcp, Protocol::kUdp}) {
      auto r = Probe(Target(host, kPort, p));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(*r, ProbeOutcome::kUnreachable) << host << ": " << ProbeOutcomeName(*r);
      auto q = Request(Target(host, kPort, p), "hostname");
      ASSERT_TRUE(q.ok());
      EXPECT_EQ(q->outcome, ProbeOutcome::kUnreachable) << host;
    }
  }
}

TEST(ProbeOutcomes, EachHasItsOwnNameAndExitCode) {
  EXPECT_EQ(ProbeExitCode(ProbeOutcome::kConnected), 0);
  std::set<int> codes;
  std::set<std::string> names;
  for (ProbeOutcome o : {ProbeOutcome::kConnected, ProbeOutcome::kRefused, ProbeOutcome::kTimeout,
                         ProbeOutcome::kUnreachable}) {
    codes.insert(ProbeExitCode(o));
    names.insert(ProbeOutcomeName(o));
    if (o != ProbeOutcome::kConnected) EXPECT_GT(ProbeExitCode(o), 2) << ProbeOutcomeName(o);
  }
  EXPECT_EQ(codes.size(), 4u);
  EXPECT_EQ(names, (std::set<std::string>{"CONNECTED", "REFUSED", "TIMEOUT", "UNREACHABLE"}));
}

TEST_F(NetexecProbeTest, ProbeAllReportsEachTargetInOrderAndWaitsOneTimeoutNotSix) {
  std::vector<ProbeTarget> targets = {Target(kSecondAddress, kPort, Protocol::kTcp),
                                      Target("127.0.0.1", kPort + 1, Protocol::kTcp),
                                      Target(kSecondAddress, kPort, Protocol::kUdp)};
  for (int i = 0; i < 6; ++i) {
    targets.push_back(Target(kSilentHost, kPort + i, i % 2 ? Protocol::kUdp : Protocol::kTcp,
                             absl::Milliseconds(700)));
  }
  absl::Time start = absl::Now();
  auto got = ProbeAll(targets);
  absl::Duration took = absl::Now() - start;
  ASSERT_EQ(got.size(), targets.size());
  for (const auto& r : got) ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*got[0], ProbeOutcome::kConnected);
  EXPECT_EQ(*got[1], ProbeOutcome::kRefused);
  EXPECT_EQ(*got[2], ProbeOutcome::kConnected);
  for (size_t i = 3; i < got.size(); ++i) {
    EXPECT_EQ(*got[i], ProbeOutcome::kTimeout) << i << ": " << ProbeOutcomeName(*got[i]);
  }
  // One after the other, the six silent targets would take at least 4.2 s.
  EXPECT_GE(took, absl::Milliseconds(650));
  EXPECT_LT(took, absl::Seconds(3));
}

TEST(ProbeArgs, ParsesHostPortAndRejectsNonsense) {
  ProbeTarget t;
  ASSERT_TRUE(ParseHostPort("10.0.0.1:80", &t).ok());
  EXPECT_EQ(t.host, "10.0.0.1");
  EXPECT_EQ(t.port, 80);
  EXPECT_FALSE(ParseHostPort("10.0.0.1", &t).ok());
  EXPECT_FALSE(ParseHostPort("10.0.0.1:0", &t).ok());
  EXPECT_FALSE(ParseHostPort("host:80", &t).ok());
  EXPECT_FALSE(ParseProtocol("sctp").ok());
}

}  // namespace
}  // namespace sluice::lab
