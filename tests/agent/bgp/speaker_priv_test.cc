// The speaker with a real BIRD (Debian's bird2), in the test's own network namespace: started
// with the rendered configuration, left running when the agent's speaker goes (an agent
// restart), adopted and reloaded by the next one, and started again in graceful restart
// recovery when it dies under a running agent.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "agent/bgp/speaker.h"

namespace sluice::agent::bgp {
namespace {

namespace fs = std::filesystem;
using ::testing::Contains;
using ::testing::Field;

pid_t PidFile(const std::string& dir) {
  std::ifstream in(dir + "/bird.pid");
  std::string text;
  std::getline(in, text);
  int pid = 0;
  return absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &pid) ? pid : 0;
}

template <typename F>
bool WaitUntil(F f, absl::Duration limit = absl::Seconds(10)) {
  absl::Time deadline = absl::Now() + limit;
  while (!f()) {
    if (absl::Now() > deadline) return false;
    usleep(20'000);
  }
  return true;
}

class SpeakerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("sluice-bgp-" + std::to_string(getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override {
    if (pid_t pid = PidFile(dir_); pid > 1) kill(pid, SIGKILL);
    fs::remove_all(dir_);
  }
  SpeakerOptions Options() {
    return {.bgp = {.local_asn = 64512,
                    .peers = {*ParseBgpPeer("127.0.0.2:65000")},
                    .log_file = dir_ + "/bird.log"},
            .router_id = *IpAddress::Parse("127.0.0.1"),
            .pod_cidrs = {*IpPrefix::Parse("10.244.7.0/24")},
            .dir = dir_,
            .check_interval = absl::Milliseconds(50)};
  }
  std::string dir_;
};

TEST_F(SpeakerTest, OutlivesTheAgentIsAdoptedAndIsRestartedWhenItDies) {
  pid_t first = 0;
  {
    auto speaker = Speaker::Start(Options());
    ASSERT_TRUE(speaker.ok()) << speaker.status();
    first = PidFile(dir_);
    ASSERT_GT(first, 1);
    auto routes = BirdCommand((*speaker)->control_socket(), "show route protocol sluice_pod_cidrs");
    ASSERT_TRUE(routes.ok()) << routes.status();
    EXPECT_THAT(absl::StrJoin(*routes, "\n"), ::testing::HasSubstr("10.244.7.0/24"));
    ASSERT_TRUE(WaitUntil([&] { return !(*speaker)->sessions().empty(); }));
    EXPECT_THAT((*speaker)->sessions(), Contains(Field(&BgpSession::name, "peer_127_0_0_2")));
  }
  // The agent's speaker is gone (as at an agent restart): BIRD is not.
  EXPECT_EQ(kill(first, 0), 0) << "BIRD went with the agent's speaker";

  SpeakerOptions changed = Options();
  changed.pod_cidrs = {*IpPrefix::Parse("10.244.8.0/24")};
  auto speaker = Speaker::Start(changed);
  ASSERT_TRUE(speaker.ok()) << speaker.status();
  EXPECT_EQ(PidFile(dir_), first) << "a second BIRD was started instead of adopting the first";
  auto routes = BirdCommand((*speaker)->control_socket(), "show route protocol sluice_pod_cidrs");
  ASSERT_TRUE(routes.ok()) << routes.status();
  EXPECT_THAT(absl::StrJoin(*routes, "\n"), ::testing::HasSubstr("10.244.8.0/24"));
  EXPECT_THAT(absl::StrJoin(*routes, "\n"), ::testing::Not(::testing::HasSubstr("10.244.7.0")));

  // BIRD dies under a running agent: started again, in recovery, counted.
  ASSERT_EQ(kill(first, SIGKILL), 0);
  ASSERT_TRUE(WaitUntil([&] {
    pid_t now = PidFile(dir_);
    return (*speaker)->speaker_restarts() == 1 && now != first && now > 1 && kill(now, 0) == 0 &&
           (*speaker)->speaker_up();
  })) << "restarts "
      << (*speaker)->speaker_restarts();
}

TEST_F(SpeakerTest, ABadConfigurationIsAnErrorAndStartsNothing) {
  SpeakerOptions options = Options();
  options.bgp.password = "quote\"";
  EXPECT_FALSE(Speaker::Start(options).ok());
  EXPECT_EQ(PidFile(dir_), 0);
}

}  // namespace
}  // namespace sluice::agent::bgp
