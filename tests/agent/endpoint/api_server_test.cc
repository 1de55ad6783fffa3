#include "agent/endpoint/api_server.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "support/eventually.h"
#include "support/temp_dir.h"

namespace sluice::api {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;
using ::sluice::testing::Eventually;
using ::sluice::testing::TempDir;


// A connected client socket; -1 if connect failed. Reads time out after 10 s so a broken server
// fails the test instead of hanging it.
int Connect(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct timeval tv = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
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

// The bytes of a request that decodes (cni::ParseEndpointRequest): `command` for container
// `container_id`, eth0, with an empty network configuration.
std::string Request(const std::string& command, const std::string& container_id = "c1") {
  return json{{"command", command}, {"containerID", container_id}, {"netns", "/var/run/netns/p"},
              {"ifName", "eth0"},   {"args", ""},                  {"config", json::object()}}
      .dump();
}

// One request the way sluice-cni sends it: write, shut down the write side, read to EOF.
json Call(const std::string& path, const std::string& request) {
  int fd = Connect(path);
  if (fd < 0) return json{{"client_error", absl::StrCat("connect: ", std::strerror(errno))}};
  size_t off = 0;
  while (off < request.size()) {
    ssize_t n = send(fd, request.data() + off, request.size() - off, MSG_NOSIGNAL);
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
  shutdown(fd, SHUT_WR);
  std::string reply = ReadAll(fd);
  close(fd);
  json j = json::parse(reply, nullptr, false);
  if (j.is_discarded()) return json{{"client_error", "bad reply: " + reply}};
  return j;
}

// Call(), with `fds` sent along with the request's bytes (SCM_RIGHTS), as sluice-cni passes the
// pod's network namespace.
json CallWithFds(const std::string& path, const std::string& request, const std::vector<int>& fds) {
  int fd = Connect(path);
  if (fd < 0) return json{{"client_error", absl::StrCat("connect: ", std::strerror(errno))}};
  iovec iov = {.iov_base = const_cast<char*>(request.data()), .iov_len = request.size()};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
  msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
  std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  if (sendmsg(fd, &msg, MSG_NOSIGNAL) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return json{{"client_error", absl::StrCat("sendmsg: ", std::strerror(errno))}};
  }
  shutdown(fd, SHUT_WR);
  std::string reply = ReadAll(fd);
  close(fd);
  json j = json::parse(reply, nullptr, false);
  if (j.is_discarded()) return json{{"client_error", "bad reply: " + reply}};
  return j;
}

size_t OpenFdCount() {
  return static_cast<size_t>(std::distance(fs::directory_iterator("/proc/self/fd"),
                                           fs::directory_iterator()));
}

ino_t Inode(int fd) {
  struct stat st = {};
  return fstat(fd, &st) == 0 ? st.st_ino : 0;
}

class ApiServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.socket_path = dir_ + "/run/sluice/sluice.sock";
    options_.io_timeout = absl::Seconds(10);
  }

  static cni::EndpointReply Echo(const cni::EndpointRequest& request) {
    return cni::SuccessReply(json{{"command", request.command}});
  }

  TempDir tmp_{"sluice-api-test"};
  const std::string dir_ = tmp_.path();
  EndpointApiServerOptions options_;
};

TEST_F(ApiServerTest, CreatesAnOwnerOnlySocketInAPrivateDirectory) {
  EndpointApiServer server(options_);
  ASSERT_TRUE(server.Start(Echo).ok());
  struct stat st;
  ASSERT_EQ(stat(options_.socket_path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(stat((dir_ + "/run/sluice").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

TEST_F(ApiServerTest, RoundTripsARequestThroughTheHandler) {
  EndpointApiServer server(options_);
  ASSERT_TRUE(server.Start(Echo).ok());
  json reply = Call(options_.socket_path, Request("ADD"));
  EXPECT_EQ(reply, (json{{"ok", true}, {"result", {{"command", "ADD"}}}}));
  EXPECT_EQ(server.stats().served, 1u);
}

TEST_F(ApiServerTest, HandsTheRequestsDescriptorToTheHandlerAndClosesEveryOneItReceives) {
  const std::string file = dir_ + "/netns-stand-in";
  { std::FILE* f = std::fopen(file.c_str(), "w"); std::fclose(f); }
  const int sent = open(file.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(sent, 0);
  std::atomic<int> calls = 0, seen_inode_ok = 0, without_fd = 0;
  EndpointApiServer server(options_);
  ASSERT_TRUE(server.Start([&](const cni::EndpointRequest& r, int fd) {
                      ++calls;
                      if (fd < 0) ++without_fd;
                      if (fd >= 0 && Inode(fd) == Inode(sent)) ++seen_inode_ok;
                      return Echo(r);
                    }).ok());
  const size_t before = OpenFdCount();
  constexpr int kRounds = 100;
  for (int i = 0; i < kRounds; ++i) {
    ASSERT_EQ(CallWithFds(options_.socket_path, Request("ADD"), {sent})["ok"], true);
    json two = CallWithFds(options_.socket_path, Request("ADD"), {sent, sent});
    ASSERT_EQ(two["code"], kCniInvalidEnvironment) << two;
    ASSERT_THAT(two.value("msg", ""), HasSubstr("at most one file descriptor"));
    ASSERT_EQ(Call(options_.socket_path, Request("DEL"))["ok"], true);
  }
  EXPECT_EQ(calls, 2 * kRounds);  // the doubled ones never reached the handler
  EXPECT_EQ(seen_inode_ok, kRounds);
  EXPECT_EQ(without_fd, kRounds);
  EXPECT_EQ(server.stats().bad_fds, static_cast<uint64_t>(kRounds));
  // Every descriptor received (300 of them) is closed once its request is answered.
  EXPECT_TRUE(Eventually([&] { return OpenFdCount() <= before; }))
      << OpenFdCount() << " descriptors open, " << before << " before";
  close(sent);
}

TEST_F(ApiServerTest, WhatIsNotARequestIsAnsweredWithoutReachingTheHandler) {
  std::atomic<int> calls = 0;
  EndpointApiServer server(options_);
  ASSERT_TRUE(server.Start([&](const cni::EndpointRequest& r) {
                      ++calls;
                      return Echo(r);
                    }).ok());
  json reply = Call(options_.socket_path, R"({"command": "ADD")");
  EXPECT_EQ(reply["ok"], false);
  EXPECT_EQ(reply["code"], kCniDecodeFailure);
  EXPECT_EQ(Call(options_.socket_path, "[1, 2]")["code"], kCniDecodeFailure);
  EXPECT_EQ(Call(options_.socket_path, "")["code"], kCniDecodeFailure);
  // JSON, but not a request: no network configuration, then an interface name Linux refuses.
  EXPECT_EQ(Call(options_.socket_path, R"({"command":"ADD"})")["code"], kCniInvalidNetworkConfig);
  json bad_ifname = json::parse(Request("ADD"));
  bad_ifname["ifName"] = "eth0/../x";
  EXPECT_EQ(Call(options_.socket_path, bad_ifname.dump())["code"], kCniInvalidEnvironment);
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(server.stats().bad_requests, 5u);
  EXPECT_EQ(server.stats().served, 0u);
}

TEST_F(ApiServerTest, DeeplyNestedRequestIsDecodeFailureNotACrash) {
  std::atomic<int> calls = 0;
  EndpointApiServer server(options_);
  ASSERT_TRUE(server.Start([&](const cni::EndpointRequest& r) {
                      ++calls;
                      return Echo(r);
                    }).ok());
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  json reply = Call(options_.socket_path, R"({"command":"ADD","config":)" + deep + "}");
  EXPECT_EQ(reply["ok"], false);
  EXPECT_EQ(reply["code"], kCniDecodeFailure);
  EXPECT_THAT(reply.value("msg", ""), HasSubstr("deeper than"));
  EXPECT_EQ(calls, 0);
  // Still serving.
  EXPECT_EQ(Call(options_.socket_path, Request("ADD"))["ok"], true);
}

TEST_F(ApiServerTest, OversizedRequestIsRefused) {
  options_.max_request_bytes = 1024;
  EndpointApiServer server(options_);
  ASSERT_TRUE(server.Start(Echo).ok());
  json reply = Call(options_.socket_path, std::string(4096, ' '));
  EXPECT_EQ(reply["code"], kCniDecodeFailure);
  EXPECT_THAT(reply["msg"].get<std::string>(), HasSubstr("exceeds 1024 bytes"));
}

TEST_F(ApiServerTest, HandlerExceptionBecomesAnInternalErrorReply) {
  EndpointApiServer server(options_);
  ASSERT_TRUE(server
                  .Start([](const cni::EndpointRequest&) -> cni::EndpointReply {
                    throw std::runtime_error("boom");
                  })
                  .ok());
  json reply = Call(options_.socket_path, Request("STATUS"));
  EXPECT_EQ(reply["code"], kSluiceInternal);
  EXPECT_THAT(reply["msg"].get<std::string>(), HasSubstr("boom"));
}

TEST_F(ApiServerTest, ServesClientsConcurrently) {
  constexpr int kClients = 8;
  absl::Mutex mu;
  int inside = 0;
  EndpointApiServer server(options_);
  // Every handler waits until all are inside at once: only possible if they run in parallel.
  ASSERT_TRUE(server.Start([&](const cni::EndpointRequest& r) {
                      absl::MutexLock l(&mu);
                      ++inside;
                      bool all = mu.AwaitWithTimeout(
                          absl::Condition(+[](int* n) { return *n >= kClients; }, &inside),
                          absl::Seconds(10));
                      return all ? cni::SuccessReply(json{{"id", r.container_id}})
                                 : ErrorReply(kSluiceInternal, "not all inside at once");
                    }).ok());
  std::vector<json> replies(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      replies[i] = Call(options_.socket_path, Request("ADD", absl::StrCat("c", i)));
    });
  }
  for (auto& c : clients) c.join();
  for (int i = 0; i < kClients; ++i) {
    EXPECT_EQ(replies[i], (json{{"ok", true}, {"result", {{"id", absl::StrCat("c", i)}}}}))
        << "client " << i;
  }
}

TEST_F(ApiServerTest, TurnsClientsAwayBeyondTheConcurrencyLimit) {
  options_.max_concurrent = 1;
  EndpointApiServer server(options_);
  ASSERT_TRUE(server.Start(Echo).ok());
  int idle = Connect(options_.socket_path);  // holds the only slot by never finishing its request
  ASSERT_GE(idle, 0);
  ASSERT_TRUE(Eventually([&] { return server.stats().active == 1; }));
  json reply = Call(options_.socket_path, Request("ADD"));
  EXPECT_EQ(reply, (json{{"ok", false}, {"code", 11}, {"msg", "agent busy"}}));
  EXPECT_EQ(server.stats().busy, 1u);
  shutdown(idle, SHUT_WR);  // the held request completes (empty: decode failure) and frees the slot
  EXPECT_EQ(json::parse(ReadAll(idle))["code"], kCniDecodeFailure);
  close(idle);
  ASSERT_TRUE(Eventually([&] { return server.stats().active == 0; }));
  EXPECT_EQ(Call(options_.socket_path, Request("DEL"))["ok"], true);
}

TEST_F(ApiServerTest, ClientThatNeverFinishesItsRequestTimesOut) {
  options_.io_timeout = absl::Milliseconds(100);
  EndpointApiServer server(options_);
  ASSERT_TRUE(server.Start(Echo).ok());
  int fd = Connect(options_.socket_path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "{\"command\":", 11), 11);  // and never shuts down its write side
  json reply = json::parse(ReadAll(fd), nullptr, false);
  close(fd);
  EXPECT_EQ(reply["code"], kCniIoFailure);
  EXPECT_THAT(reply["msg"].get<std::string>(), HasSubstr("no complete request"));
  EXPECT_EQ(server.stats().io_errors, 1u);
}

TEST_F(ApiServerTest, StopRemovesTheSocketAndRefusesNewClients) {
  EndpointApiServer server(options_);
  ASSERT_TRUE(server.Start(Echo).ok());
  ASSERT_EQ(Call(options_.socket_path, Request("STATUS"))["ok"], true);
  server.Stop();
  EXPECT_FALSE(fs::exists(options_.socket_path));
  EXPECT_EQ(Connect(options_.socket_path), -1);
  server.Stop();  // idempotent
  EXPECT_EQ(server.Start(Echo).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ApiServerTest, StopDoesNotWaitForAClientThatSendsNothing) {
  options_.io_timeout = absl::Hours(1);
  EndpointApiServer server(options_);
  ASSERT_TRUE(server.Start(Echo).ok());
  int idle = Connect(options_.socket_path);
  ASSERT_GE(idle, 0);
  ASSERT_TRUE(Eventually([&] { return server.stats().active == 1; }));
  absl::Time start = absl::Now();
  server.Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // not the hour of io_timeout
  EXPECT_EQ(json::parse(ReadAll(idle))["code"], kCniTryAgainLater);
  close(idle);
}

TEST_F(ApiServerTest, StopWaitsForTheRequestInTheHandlerAndDeliversItsReply) {
  absl::Notification entered, release;
  EndpointApiServer server(options_);
  ASSERT_TRUE(server.Start([&](const cni::EndpointRequest& r) {
                      entered.Notify();
                      release.WaitForNotificationWithTimeout(absl::Seconds(10));
                      return Echo(r);
                    }).ok());
  json reply;
  std::thread client([&] { reply = Call(options_.socket_path, Request("ADD")); });
  ASSERT_TRUE(entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  std::atomic<bool> stopped = false;
  std::thread stopper([&] {
    server.Stop();
    stopped = true;
  });
  // Stop removes the socket before it waits for in-flight requests.
  ASSERT_TRUE(Eventually([&] { return !fs::exists(options_.socket_path); }));
  EXPECT_FALSE(stopped);
  release.Notify();
  stopper.join();
  client.join();
  EXPECT_TRUE(stopped);
  EXPECT_EQ(reply, (json{{"ok", true}, {"result", {{"command", "ADD"}}}}));
}

TEST_F(ApiServerTest, PeerWithAnotherUidIsRefusedAndCounted) {
  options_.allowed_uid = getuid() + 1;
  std::atomic<int> calls = 0;
  EndpointApiServer server(options_);
  ASSERT_TRUE(server.Start([&](const cni::EndpointRequest& r) {
                      ++calls;
                      return Echo(r);
                    }).ok());
  json reply = Call(options_.socket_path, Request("ADD"));
  EXPECT_EQ(reply["ok"], false);
  EXPECT_THAT(reply["msg"].get<std::string>(), HasSubstr("permission denied"));
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(server.stats().denied_peers, 1u);
}

TEST_F(ApiServerTest, ReplacesAStaleSocketButNotALiveOne) {
  {
    EndpointApiServer live(options_);
    ASSERT_TRUE(live.Start(Echo).ok());
    EndpointApiServer second(options_);
    EXPECT_EQ(second.Start(Echo).code(), absl::StatusCode::kAlreadyExists);
    EXPECT_EQ(Call(options_.socket_path, Request("STATUS"))["ok"], true);  // the live one is untouched
  }
  // A socket file left by a crashed agent: bound, never unlinked.
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, options_.socket_path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  close(fd);
  ASSERT_TRUE(fs::exists(options_.socket_path));
  EndpointApiServer server(options_);
  ASSERT_TRUE(server.Start(Echo).ok());
  EXPECT_EQ(Call(options_.socket_path, Request("STATUS"))["ok"], true);
}

TEST_F(ApiServerTest, RefusesToReplaceAFileThatIsNotASocket) {
  fs::create_directories(dir_ + "/run/sluice");
  { std::FILE* f = std::fopen(options_.socket_path.c_str(), "w"); std::fclose(f); }
  EndpointApiServer server(options_);
  EXPECT_EQ(server.Start(Echo).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(fs::is_regular_file(options_.socket_path));
}

TEST_F(ApiServerTest, RejectsASocketPathTooLongForSunPath) {
  options_.socket_path = dir_ + "/" + std::string(200, 'x');
  EndpointApiServer server(options_);
  EXPECT_EQ(server.Start(Echo).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::api
