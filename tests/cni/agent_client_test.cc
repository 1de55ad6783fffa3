#include "cni/agent_client.h"

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "support/temp_dir.h"

namespace sluice::cni {
namespace {

using ::testing::HasSubstr;

class AgentClientTest : public ::testing::Test {
 protected:
  AgentClientTest() : path_(tmp_ / "agent.sock") {}
  ~AgentClientTest() override {
    if (listen_fd_ >= 0) close(listen_fd_);
  }

  void Listen(bool listening = true) {
    listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un address = {};
    address.sun_family = AF_UNIX;
    strncpy(address.sun_path, path_.c_str(), sizeof(address.sun_path) - 1);
    ASSERT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    if (listening) {
      ASSERT_EQ(listen(listen_fd_, 4), 0);
    }
  }

  sluice::testing::TempDir tmp_{"sluice-agent-client-test"};
  std::string path_;
  int listen_fd_ = -1;
};

TEST_F(AgentClientTest, ExchangesOneRequestAndReadsTheReplyToEof) {
  Listen();
  std::string received;
  std::thread agent([&] {
    const int fd = accept(listen_fd_, nullptr, nullptr);
    char buffer[256];
    ssize_t n;
    while ((n = read(fd, buffer, sizeof(buffer))) > 0) received.append(buffer, n);
    const std::string reply(100'000, 'r');  // more than one socket buffer's worth
    size_t sent = 0;
    while (sent < reply.size()) {
      n = write(fd, reply.data() + sent, reply.size() - sent);
      if (n <= 0) break;
      sent += n;
    }
    close(fd);
  });
  absl::StatusOr<std::string> reply = CallAgent(path_, "{\"command\":\"ADD\"}");
  agent.join();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(received, "{\"command\":\"ADD\"}");
  EXPECT_EQ(*reply, std::string(100'000, 'r'));
}

TEST_F(AgentClientTest, AbsentSocketIsUnavailableNamingThePathAndErrno) {
  absl::StatusOr<std::string> reply = CallAgent(path_, "{}");
  ASSERT_EQ(reply.status().code(), absl::StatusCode::kUnavailable) << reply.status();
  EXPECT_THAT(reply.status().message(), HasSubstr(path_));
  EXPECT_THAT(reply.status().message(), HasSubstr("ENOENT"));
}

TEST_F(AgentClientTest, SocketWithoutListenerIsUnavailable) {
  Listen(/*listening=*/false);
  absl::StatusOr<std::string> reply = CallAgent(path_, "{}");
  ASSERT_EQ(reply.status().code(), absl::StatusCode::kUnavailable) << reply.status();
  EXPECT_THAT(reply.status().message(), HasSubstr("ECONNREFUSED"));
}

TEST_F(AgentClientTest, SilentAgentHitsTheDeadline) {
  Listen();  // the kernel completes the connection from the backlog; nobody ever answers
  AgentCallTimeouts timeouts;
  timeouts.total = std::chrono::milliseconds(200);
  absl::StatusOr<std::string> reply = CallAgent(path_, "{}", timeouts);
  ASSERT_EQ(reply.status().code(), absl::StatusCode::kDeadlineExceeded) << reply.status();
  EXPECT_THAT(reply.status().message(), HasSubstr(path_));
}

TEST_F(AgentClientTest, PathTooLongForSunPathIsInvalidArgument) {
  absl::StatusOr<std::string> reply = CallAgent("/" + std::string(200, 'x'), "{}");
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::cni
