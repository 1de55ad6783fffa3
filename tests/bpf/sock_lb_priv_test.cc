// Socket-level load balancing against the real kernel: the cgroup sock_addr programs attached by
// Datapath::AttachSocketLb to a scratch cgroup, acting for a scratch network namespace. Clients
// are forked children moved into that cgroup and namespace; servers are plain sockets the test
// opens in the namespace (the test process itself stays outside the cgroup, so its sockets are
// never translated). Services are programmed through the production maps/ API.
#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "loader/cgroup.h"
#include "loader/tc.h"
#include "support/fixture.h"

namespace sluice::testing {
namespace {

using std::chrono::steady_clock;
constexpr auto kDeadline = std::chrono::seconds(10);

constexpr const char* kClusterIp = "10.96.0.10";
constexpr const char* kRejectIp = "10.96.0.11";
constexpr const char* kEmptyIp = "10.96.0.12";
constexpr const char* kNodePortIp = "10.96.0.13";
constexpr const char* kAffinityIp = "10.96.0.14";
constexpr const char* kUnknownIp = "10.96.0.99";
constexpr const char* kNodeIp = "192.0.2.1";

sockaddr_in Addr(const std::string& ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = Ip4(ip);
  a.sin_port = htons(port);
  return a;
}

std::string Str(const sockaddr_in& a) {
  return absl::StrCat(FormatIp4(a.sin_addr.s_addr), ":", ntohs(a.sin_port));
}

// A network namespace of its own with lo up, entered per thread for as long as an Enter lives.
class ScratchNetns {
 public:
  ScratchNetns() {
    int orig = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (orig < 0 || unshare(CLONE_NEWNET) != 0) {
      ADD_FAILURE() << "unshare(CLONE_NEWNET): " << strerror(errno);
      return;
    }
    fd_ = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ifreq ifr{};
    std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ);
    ioctl(s, SIOCGIFFLAGS, &ifr);
    ifr.ifr_flags |= IFF_UP;
    if (ioctl(s, SIOCSIFFLAGS, &ifr) != 0) ADD_FAILURE() << "lo up: " << strerror(errno);
    close(s);
    if (setns(orig, CLONE_NEWNET) != 0) ADD_FAILURE() << "setns back: " << strerror(errno);
    close(orig);
  }
  ~ScratchNetns() {
    if (fd_ >= 0) close(fd_);
  }
  int fd() const { return fd_; }

  class Enter {
   public:
    explicit Enter(const ScratchNetns& ns) {
      orig_ = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
      EXPECT_EQ(setns(ns.fd(), CLONE_NEWNET), 0) << strerror(errno);
    }
    ~Enter() {
      EXPECT_EQ(setns(orig_, CLONE_NEWNET), 0) << strerror(errno);
      close(orig_);
    }

   private:
    int orig_ = -1;
  };

 private:
  int fd_ = -1;
};

// What a client child saw, passed back over a pipe.
struct ClientResult {
  int err = 0;  // errno of the first failing call, 0 if none
  char failed_call[16] = {};
  sockaddr_in peer{};  // getpeername() after connect
  sockaddr_in from{};  // source of the reply, as recvfrom() reports it
  char reply[32] = {};
};

bool Fail(ClientResult& r, const char* call) {
  r.err = errno;
  std::strncpy(r.failed_call, call, sizeof(r.failed_call) - 1);
  return false;
}

// A child in the scratch cgroup and a network namespace, running `body` on its own sockets.
class Client {
 public:
  Client(const std::string& cgroup, int netns_fd, std::function<void(ClientResult&)> body) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "pipe: " << strerror(errno);
      return;
    }
    pid_ = fork();
    if (pid_ == 0) {
      close(p[0]);
      ClientResult r;
      // Sockets take the cgroup and namespace of the task that creates them: join both first.
      int cg = open((cgroup + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
      if (cg < 0 || write(cg, "0\n", 2) != 2) {
        Fail(r, "cgroup.procs");
      } else if (setns(netns_fd, CLONE_NEWNET) != 0) {
        Fail(r, "setns");
      } else {
        body(r);
      }
      (void)!write(p[1], &r, sizeof(r));
      _exit(0);
    }
    close(p[1]);
    fd_ = p[0];
  }

  // Waits for the child's result (bounded by the deadline).
  ClientResult Wait() {
    ClientResult r;
    pollfd pfd{fd_, POLLIN, 0};
    int ms = std::chrono::duration_cast<std::chrono::milliseconds>(kDeadline).count();
    if (poll(&pfd, 1, ms) != 1 || read(fd_, &r, sizeof(r)) != sizeof(r)) {
      ADD_FAILURE() << "client child gave no result in time";
      kill(pid_, SIGKILL);
    }
    int status = 0;
    waitpid(pid_, &status, 0);
    close(fd_);
    return r;
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
};

// The child side of a TCP connect to addr:port.
std::function<void(ClientResult&)> TcpConnect(const std::string& addr, uint16_t port,
                                              int times = 1) {
  return [=](ClientResult& r) {
    for (int i = 0; i < times; ++i) {
      int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in to = Addr(addr, port);
      if (connect(s, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
        Fail(r, "connect");
        return;
      }
      socklen_t len = sizeof(r.peer);
      if (getpeername(s, reinterpret_cast<sockaddr*>(&r.peer), &len) != 0) {
        Fail(r, "getpeername");
        return;
      }
      close(s);
    }
  };
}

// The child side of a UDP exchange with addr:port: "ping" out, the reply in. With `connected`,
// through connect()+send(), else sendto().
std::function<void(ClientResult&)> UdpExchange(const std::string& addr, uint16_t port,
                                               bool connected) {
  return [=](ClientResult& r) {
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    timeval tv{5, 0};  // a deadline for the reply, not a wait
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    sockaddr_in to = Addr(addr, port);
    if (connected) {
      if (connect(s, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
        Fail(r, "connect");
        return;
      }
      socklen_t len = sizeof(r.peer);
      if (getpeername(s, reinterpret_cast<sockaddr*>(&r.peer), &len) != 0) {
        Fail(r, "getpeername");
        return;
      }
      if (send(s, "ping", 4, 0) != 4) {
        Fail(r, "send");
        return;
      }
    } else if (sendto(s, "ping", 4, 0, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 4) {
      Fail(r, "sendto");
      return;
    }
    socklen_t len = sizeof(r.from);
    if (recvfrom(s, r.reply, sizeof(r.reply) - 1, 0, reinterpret_cast<sockaddr*>(&r.from), &len) <
        0) {
      Fail(r, "recvfrom");
      return;
    }
    close(s);
  };
}

int Listen(int type, uint16_t* port) {
  int s = socket(AF_INET, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_in a = Addr("127.0.0.1", 0);
  EXPECT_EQ(bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << strerror(errno);
  if (type == SOCK_STREAM) {
    EXPECT_EQ(listen(s, 128), 0);
  }
  socklen_t len = sizeof(a);
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return s;
}

// Accepts every connection already queued on a non-blocking listener.
int DrainAccepts(int listener) {
  int n = 0;
  for (int c; (c = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC)) >= 0; ++n) close(c);
  return n;
}

bool WaitReadable(int fd) {
  pollfd pfd{fd, POLLIN, 0};
  return poll(&pfd, 1, std::chrono::duration_cast<std::chrono::milliseconds>(kDeadline).count()) ==
         1;
}

struct BackendSpec {
  uint32_t id;
  uint16_t port;
  uint8_t proto;
};

class SockLbTest : public DatapathTest {
 protected:
  void SetUp() override {
    DatapathTest::SetUp();
    if (HasFatalFailure()) return;
    auto mount = loader::FindCgroup2Mount();
    ASSERT_TRUE(mount.ok()) << mount.status();
    static std::atomic<int> seq{0};
    cgroup_ = absl::StrCat(*mount, "/sluice-socklb-test-", getpid(), "-", seq++);
    ASSERT_EQ(mkdir(cgroup_.c_str(), 0755), 0) << cgroup_ << ": " << strerror(errno);
    cgroup_fd_ = open(cgroup_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(cgroup_fd_, 0);

    sluice_node_config cfg{};
    cfg.node_ip4 = Ip4(kNodeIp);
    cfg.service_cidr4 = Ip4("10.96.0.0");
    cfg.service_cidr4_len = 16;
    ASSERT_TRUE(dp_->node_config().Update(0, cfg).ok());

    {
      ScratchNetns::Enter in(node_ns_);
      tcp_ = Listen(SOCK_STREAM, &tcp_port_);
      tcp2_ = Listen(SOCK_STREAM, &tcp2_port_);
      udp_ = Listen(SOCK_DGRAM, &udp_port_);
      // The programs act for the namespace of the thread that attaches them.
      auto st = dp_->AttachSocketLb(cgroup_);
      ASSERT_TRUE(st.ok()) << st;
    }
    SetService(kClusterIp, 80, IPPROTO_TCP, 1, {{1, tcp_port_, IPPROTO_TCP}});
    SetService(kClusterIp, 53, IPPROTO_UDP, 2, {{2, udp_port_, IPPROTO_UDP}});
    SetService(kRejectIp, 80, IPPROTO_TCP, 3, {}, SLUICE_SVC_F_REJECT);
    SetService(kRejectIp, 53, IPPROTO_UDP, 4, {}, SLUICE_SVC_F_REJECT);
    SetService(kEmptyIp, 80, IPPROTO_TCP, 5, {});
    SetService(kNodePortIp, 80, IPPROTO_TCP, 6, {{1, tcp_port_, IPPROTO_TCP}},
               SLUICE_SVC_F_NODEPORT);
  }

  void TearDown() override {
    for (int fd : {tcp_, tcp2_, udp_, cgroup_fd_})
      if (fd >= 0) close(fd);
    if (dp_) {
      EXPECT_TRUE(dp_->DetachSocketLb().ok());
    }
    DatapathTest::TearDown();
    if (!cgroup_.empty()) {
      EXPECT_EQ(rmdir(cgroup_.c_str()), 0) << strerror(errno);
    }
  }

  static sluice_lb4_key SvcKey(const std::string& addr, uint16_t port, uint8_t proto,
                               uint16_t slot) {
    return LbKey(addr, port, proto, slot);
  }

  // Backends (all on 127.0.0.1 in the node namespace), then slots, then the master entry.
  void SetService(const std::string& addr, uint16_t port, uint8_t proto, uint32_t rev_nat_id,
                  const std::vector<BackendSpec>& backends, uint16_t flags = 0,
                  uint32_t affinity_timeout = 0) {
    std::vector<LbBackendSpec> specs;
    for (const auto& b : backends) specs.push_back({b.id, "127.0.0.1", b.port, b.proto});
    ASSERT_TRUE(
        ProgramService(*dp_, addr, port, proto, rev_nat_id, specs, flags, affinity_timeout).ok());
  }

  Client InNode(std::function<void(ClientResult&)> body) {
    return Client(cgroup_, node_ns_.fd(), std::move(body));
  }

  std::vector<uint32_t> Attached(enum bpf_attach_type type) {
    auto ids = loader::CgroupPrograms(cgroup_fd_, type);
    EXPECT_TRUE(ids.ok()) << ids.status();
    return ids.ok() ? *ids : std::vector<uint32_t>{};
  }

  // Programs left on the hooks once released links are gone: the kernel frees a link whose last
  // reference went in a deferred work item, so this polls up to the deadline for none to be left.
  size_t AttachedAfterRelease() {
    auto left = [&] {
      size_t n = 0;
      for (auto hook : kHooks) n += Attached(hook).size();
      return n;
    };
    auto until = steady_clock::now() + kDeadline;
    while (left() != 0 && steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return left();
  }

  static constexpr bpf_attach_type kHooks[] = {BPF_CGROUP_INET4_CONNECT, BPF_CGROUP_UDP4_SENDMSG,
                                               BPF_CGROUP_UDP4_RECVMSG,
                                               BPF_CGROUP_INET4_GETPEERNAME};

  ScratchNetns node_ns_;
  std::string cgroup_;
  int cgroup_fd_ = -1;
  int tcp_ = -1, tcp2_ = -1, udp_ = -1;
  uint16_t tcp_port_ = 0, tcp2_port_ = 0, udp_port_ = 0;
};

TEST_F(SockLbTest, TcpConnectToClusterIpReachesTheBackendAndPeerNameIsTheFrontend) {
  Client c = InNode(TcpConnect(kClusterIp, 80));
  ClientResult r = c.Wait();
  ASSERT_EQ(r.err, 0) << r.failed_call << ": " << strerror(r.err);
  EXPECT_EQ(Str(r.peer), "10.96.0.10:80");
  // The connection was made to the backend: it is queued on the backend's listener.
  ASSERT_TRUE(WaitReadable(tcp_));
  sockaddr_in peer{}, local{};
  socklen_t len = sizeof(peer);
  int conn = accept4(tcp_, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC);
  ASSERT_GE(conn, 0) << strerror(errno);
  len = sizeof(local);
  getsockname(conn, reinterpret_cast<sockaddr*>(&local), &len);
  EXPECT_EQ(Str(local), absl::StrCat("127.0.0.1:", tcp_port_));
  EXPECT_EQ(FormatIp4(peer.sin_addr.s_addr), "127.0.0.1");
  close(conn);
}

// A NodePort frontend is one of the node's own addresses: no packet of a local connection to it
// passes a TC hook, so the socket hooks translate it as they translate a ClusterIP (issue 9:
// a node process reaching its own nodeIP:nodePort was refused). Untranslated, 10.96.0.13 has no
// route in the namespace (only lo is up) and connect() would fail with ENETUNREACH.
TEST_F(SockLbTest, NodePortFrontendIsTranslatedForTheNodesOwnSockets) {
  ClientResult r = InNode(TcpConnect(kNodePortIp, 80)).Wait();
  ASSERT_EQ(r.err, 0) << r.failed_call << ": " << strerror(r.err);
  EXPECT_EQ(Str(r.peer), "10.96.0.13:80");
  ASSERT_TRUE(WaitReadable(tcp_));
  EXPECT_EQ(DrainAccepts(tcp_), 1) << "the connection reached the NodePort's backend";
}

TEST_F(SockLbTest, UdpSendtoReachesTheBackendAndTheReplyComesFromTheFrontend) {
  Client c = InNode(UdpExchange(kClusterIp, 53, /*connected=*/false));
  ASSERT_TRUE(WaitReadable(udp_));
  char buf[32] = {};
  sockaddr_in from{};
  socklen_t len = sizeof(from);
  ASSERT_EQ(recvfrom(udp_, buf, sizeof(buf), 0, reinterpret_cast<sockaddr*>(&from), &len), 4);
  EXPECT_STREQ(buf, "ping");
  ASSERT_EQ(sendto(udp_, "pong", 4, 0, reinterpret_cast<sockaddr*>(&from), len), 4);
  ClientResult r = c.Wait();
  ASSERT_EQ(r.err, 0) << r.failed_call << ": " << strerror(r.err);
  EXPECT_STREQ(r.reply, "pong");
  EXPECT_EQ(Str(r.from), "10.96.0.10:53");
}

TEST_F(SockLbTest, ConnectedUdpSeesTheFrontendAsPeerAndSource) {
  Client c = InNode(UdpExchange(kClusterIp, 53, /*connected=*/true));
  ASSERT_TRUE(WaitReadable(udp_));
  char buf[32] = {};
  sockaddr_in from{};
  socklen_t len = sizeof(from);
  ASSERT_EQ(recvfrom(udp_, buf, sizeof(buf), 0, reinterpret_cast<sockaddr*>(&from), &len), 4);
  ASSERT_EQ(sendto(udp_, "pong", 4, 0, reinterpret_cast<sockaddr*>(&from), len), 4);
  ClientResult r = c.Wait();
  ASSERT_EQ(r.err, 0) << r.failed_call << ": " << strerror(r.err);
  EXPECT_EQ(Str(r.peer), "10.96.0.10:53");
  EXPECT_EQ(Str(r.from), "10.96.0.10:53");
  EXPECT_STREQ(r.reply, "pong");
}

// ---- What a client's connect()/sendto() sees, as a table -----------------------------------------

// One call of a client child in the node's namespace and cgroup, and what must come of it.
struct SockCase {
  std::string name;
  std::function<void(loader::Datapath&)> setup;  // map writes beyond the fixture's services
  std::string addr;
  uint16_t port;
  bool udp = false;  // sendto() of a datagram instead of a TCP connect()
  int err = 0;       // errno of the failing call
  const char* failed_call = "";
  // Drop reasons counted once each; every other counter stays.
  std::vector<unsigned> drops;
};
void PrintTo(const SockCase& c, std::ostream* os) { *os << c.name; }

std::vector<SockCase> SockCases() {
  return {
      {.name = "RejectedServiceRefusesTcpConnectWithEconnrefused",
       .addr = kRejectIp,
       .port = 80,
       .err = ECONNREFUSED,
       .failed_call = "connect",
       .drops = {SLUICE_DROP_SERVICE_REJECTED}},
      {.name = "RejectedServiceRefusesUdpSendtoWithEconnrefused",
       .addr = kRejectIp,
       .port = 53,
       .udp = true,
       .err = ECONNREFUSED,
       .failed_call = "sendto",
       .drops = {SLUICE_DROP_SERVICE_REJECTED}},
      // A service without slots is refused the same way, flag or not; counted as the TC path
      // counts it: no slot is no backend.
      {.name = "ServiceWithoutSlotsRefusesConnectAndCountsNoBackend",
       .addr = kEmptyIp,
       .port = 80,
       .err = ECONNREFUSED,
       .failed_call = "connect",
       .drops = {SLUICE_DROP_SERVICE_NO_BACKEND}},
      {.name = "UnknownAddressInTheServiceRangeIsUnreachableAtOnce",
       .addr = kUnknownIp,
       .port = 80,
       .err = EHOSTUNREACH,
       .failed_call = "connect",
       .drops = {SLUICE_DROP_SERVICE_UNKNOWN_IP}},
      // The ClusterIP's wildcard entry {addr, 0, 0} marks the address as in use (see
      // lb4_frontend).
      {.name = "PortAClusterIpDoesNotDefineIsRefused",
       .setup =
           [](loader::Datapath& dp) {
             sluice_lb4_service wildcard{};
             ASSERT_TRUE(dp.lb4_services().Update(LbKey(kClusterIp, 0, 0, 0), wildcard).ok());
           },
       .addr = kClusterIp,
       .port = 81,
       .err = ECONNREFUSED,
       .failed_call = "connect",
       .drops = {SLUICE_DROP_SERVICE_REJECTED}},
  };
}

class SockLbTable : public SockLbTest, public ::testing::WithParamInterface<SockCase> {};

TEST_P(SockLbTable, Call) {
  const SockCase& c = GetParam();
  if (c.setup) {
    c.setup(*dp_);
    if (HasFatalFailure()) return;
  }
  auto before = DropCounts();
  ClientResult r =
      InNode(c.udp ? UdpExchange(c.addr, c.port, /*connected=*/false) : TcpConnect(c.addr, c.port))
          .Wait();
  EXPECT_EQ(r.err, c.err) << r.failed_call << ": " << strerror(r.err);
  EXPECT_STREQ(r.failed_call, c.failed_call);
  for (const auto& [reason, after] : DropCounts()) {
    int counted = 0;
    for (unsigned d : c.drops) counted += d == reason;
    EXPECT_EQ(after, before[reason] + counted) << "drop reason " << sluice_drop_reason_name(reason);
    // A refused socket call is what a client sends: an egress drop, never an ingress one.
    EXPECT_EQ(Drops(reason, SLUICE_DROP_DIR_EGRESS), after) << sluice_drop_reason_name(reason);
  }
  EXPECT_EQ(DrainAccepts(tcp_), 0) << "a refused or untranslated call reaches no backend";
}

INSTANTIATE_TEST_SUITE_P(SocketLb, SockLbTable, ::testing::ValuesIn(SockCases()),
                         [](const auto& info) { return info.param.name; });

TEST_F(SockLbTest, SocketsOfAnotherNamespaceInTheSameCgroupAreNotTranslated) {
  ScratchNetns other;
  int listener;
  uint16_t port;
  {
    // The same backend exists there: a translated connect would succeed.
    ScratchNetns::Enter in(other);
    listener = Listen(SOCK_STREAM, &port);
  }
  SetService(kClusterIp, 8080, IPPROTO_TCP, 7, {{8, port, IPPROTO_TCP}});
  ClientResult r = Client(cgroup_, other.fd(), TcpConnect(kClusterIp, 8080)).Wait();
  EXPECT_EQ(r.err, ENETUNREACH) << r.failed_call << ": " << strerror(r.err);
  EXPECT_EQ(DrainAccepts(listener), 0);
  close(listener);
  // Control: from the node's namespace the same service is translated.
  {
    ScratchNetns::Enter in(node_ns_);
    listener = Listen(SOCK_STREAM, &port);
  }
  SetService(kClusterIp, 8080, IPPROTO_TCP, 7, {{8, port, IPPROTO_TCP}});
  r = InNode(TcpConnect(kClusterIp, 8080)).Wait();
  EXPECT_EQ(r.err, 0) << r.failed_call << ": " << strerror(r.err);
  EXPECT_EQ(DrainAccepts(listener), 1);
  close(listener);
}

TEST_F(SockLbTest, WithoutAffinityConnectsSpreadOverBackends) {
  SetService(kAffinityIp, 80, IPPROTO_TCP, 8,
             {{11, tcp_port_, IPPROTO_TCP}, {12, tcp2_port_, IPPROTO_TCP}});
  ClientResult r = InNode(TcpConnect(kAffinityIp, 80, /*times=*/32)).Wait();
  ASSERT_EQ(r.err, 0) << r.failed_call << ": " << strerror(r.err);
  int a = DrainAccepts(tcp_), b = DrainAccepts(tcp2_);
  EXPECT_EQ(a + b, 32);
  // Both backends chosen (each connect picks one of two at random: 2^-31 to miss one).
  EXPECT_GT(a, 0);
  EXPECT_GT(b, 0);
}

TEST_F(SockLbTest, AffinityKeepsTheNodesSocketsOnOneBackend) {
  SetService(kAffinityIp, 80, IPPROTO_TCP, 8,
             {{11, tcp_port_, IPPROTO_TCP}, {12, tcp2_port_, IPPROTO_TCP}}, SLUICE_SVC_F_AFFINITY,
             /*affinity_timeout=*/300);
  ClientResult r = InNode(TcpConnect(kAffinityIp, 80, /*times=*/32)).Wait();
  ASSERT_EQ(r.err, 0) << r.failed_call << ": " << strerror(r.err);
  int a = DrainAccepts(tcp_), b = DrainAccepts(tcp2_);
  EXPECT_EQ(a + b, 32);
  EXPECT_TRUE(a == 32 || b == 32) << a << " / " << b;
  // The node's address is the client the affinity is recorded for.
  sluice_lb4_affinity_key k{};
  k.client_addr = Ip4(kNodeIp);
  k.rev_nat_id = 8;
  auto aff = dp_->lb4_affinity().Lookup(k);
  ASSERT_TRUE(aff.ok()) << aff.status();
  EXPECT_EQ(aff->backend_id, a == 32 ? 11u : 12u);
}

TEST_F(SockLbTest, ReattachAndRestartKeepExactlyOneProgramPerHookAndSwapItInPlace) {
  for (auto hook : kHooks) ASSERT_EQ(Attached(hook).size(), 1u) << hook;
  auto first_connect = Attached(BPF_CGROUP_INET4_CONNECT);
  {
    ScratchNetns::Enter in(node_ns_);
    auto st = dp_->AttachSocketLb(cgroup_);
    ASSERT_TRUE(st.ok()) << st;
  }
  for (auto hook : kHooks) EXPECT_EQ(Attached(hook).size(), 1u) << hook;
  EXPECT_EQ(Attached(BPF_CGROUP_INET4_CONNECT), first_connect);

  // A restarted agent: a new load on the same root (maps reused), the same attach. The links
  // now run the new programs; there is still one per hook.
  dp_.reset();
  auto dp = loader::Datapath::Load(bpffs_->path());
  ASSERT_TRUE(dp.ok()) << dp.status();
  dp_ = std::move(*dp);
  for (auto hook : kHooks) EXPECT_EQ(Attached(hook).size(), 1u) << "while down: " << hook;
  {
    ScratchNetns::Enter in(node_ns_);
    auto st = dp_->AttachSocketLb(cgroup_);
    ASSERT_TRUE(st.ok()) << st;
  }
  for (auto hook : kHooks) EXPECT_EQ(Attached(hook).size(), 1u) << hook;
  auto id = loader::ProgramId(dp_->sock_connect4_fd());
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_THAT(Attached(BPF_CGROUP_INET4_CONNECT), ::testing::ElementsAre(*id));
  EXPECT_NE(*id, first_connect[0]);

  // And they still translate, with the services that survived in the pinned maps.
  ClientResult r = InNode(TcpConnect(kClusterIp, 80)).Wait();
  ASSERT_EQ(r.err, 0) << r.failed_call << ": " << strerror(r.err);
  EXPECT_EQ(Str(r.peer), "10.96.0.10:80");
  EXPECT_EQ(DrainAccepts(tcp_), 1);
}

TEST_F(SockLbTest, AttachingToAnotherCgroupMovesTheLinksThere) {
  std::string other = cgroup_ + "-moved";
  ASSERT_EQ(mkdir(other.c_str(), 0755), 0) << strerror(errno);
  int other_fd = open(other.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(other_fd, 0);
  {
    ScratchNetns::Enter in(node_ns_);
    auto st = dp_->AttachSocketLb(other);
    EXPECT_TRUE(st.ok()) << st;
  }
  for (auto hook : kHooks) {
    auto ids = loader::CgroupPrograms(other_fd, hook);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(ids->size(), 1u) << hook;
  }
  // The old links were unpinned, which releases them (deferred by the kernel).
  EXPECT_EQ(AttachedAfterRelease(), 0u);
  EXPECT_TRUE(dp_->DetachSocketLb().ok());
  close(other_fd);
  // rmdir succeeds with links still being released: they only pin the cgroup's BPF state.
  EXPECT_EQ(rmdir(other.c_str()), 0) << strerror(errno);
}

TEST_F(SockLbTest, ProgramsStayWithoutTheAgentAndGoWithTheBpffs) {
  // The agent exits: its process drops every fd, the pinned links keep the programs attached.
  dp_.reset();
  for (auto hook : kHooks) EXPECT_EQ(Attached(hook).size(), 1u) << hook;
  ClientResult r = InNode(TcpConnect(kClusterIp, 80)).Wait();
  ASSERT_EQ(r.err, 0) << r.failed_call << ": " << strerror(r.err);
  EXPECT_EQ(DrainAccepts(tcp_), 1);

  // What `sluice-lab down` does: unmount the node's bpffs. The links are released with it
  // (asynchronously, by the kernel's deferred free): wait for that with a deadline.
  bpffs_.reset();
  EXPECT_EQ(AttachedAfterRelease(), 0u);
}

TEST_F(SockLbTest, DetachSocketLbRemovesThePrograms) {
  ASSERT_TRUE(dp_->DetachSocketLb().ok());
  EXPECT_EQ(AttachedAfterRelease(), 0u);
  EXPECT_FALSE(std::filesystem::exists(dp_->LinkPinPath(SLUICE_LINK_SOCK_CONNECT4)));
}

}  // namespace
}  // namespace sluice::testing
