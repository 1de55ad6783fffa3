// Runs the real sluice-cni binary the way a container runtime does (controlled environment,
// configuration on stdin) against a test-owned endpoint socket.
#include <fcntl.h>
#include <sched.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cni/protocol/wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "support/temp_dir.h"

namespace sluice::cni {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;
using Env = std::map<std::string, std::string>;
using Clock = std::chrono::steady_clock;

constexpr auto kPluginDeadline = std::chrono::seconds(30);

std::string PluginPath() { return std::string(SLUICE_BUILD_DIR) + "/cni/sluice-cni"; }

struct PluginRun {
  int exit_code = -1;
  std::string stdout_text;
  std::string stderr_text;

  // stdout as JSON (discarded value if it is not JSON).
  [[nodiscard]] json Output() const { return json::parse(stdout_text, nullptr, false); }
};

// fork/exec of sluice-cni with exactly `env` and `stdin_text`; kills it after kPluginDeadline.
PluginRun RunPlugin(const Env& env, const std::string& stdin_text) {
  int in[2], out[2], err[2];
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "pipe2: " << strerror(errno);
    return {};
  }
  std::vector<std::string> env_strings;
  for (const auto& [key, value] : env) env_strings.push_back(key + "=" + value);
  std::vector<char*> envp;
  for (std::string& entry : env_strings) envp.push_back(entry.data());
  envp.push_back(nullptr);
  std::string path = PluginPath();
  char* argv[] = {path.data(), nullptr};

  const pid_t pid = fork();
  if (pid == 0) {
    dup2(in[0], STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    execve(path.c_str(), argv, envp.data());
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  close(err[1]);
  // The plugin reads all of stdin before anything else; the test inputs fit the pipe buffer.
  if (!stdin_text.empty() && write(in[1], stdin_text.data(), stdin_text.size()) < 0) {
    ADD_FAILURE() << "write stdin: " << strerror(errno);
  }
  close(in[1]);

  PluginRun run;
  const Clock::time_point deadline = Clock::now() + kPluginDeadline;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  std::string* sinks[2] = {&run.stdout_text, &run.stderr_text};
  int open_fds = 2;
  bool killed = false;
  while (open_fds > 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      kill(pid, SIGKILL);
      killed = true;
      break;
    }
    if (poll(fds, 2, static_cast<int>(left)) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buffer[4096];
      const ssize_t n = read(fds[i].fd, buffer, sizeof(buffer));
      if (n > 0) {
        sinks[i]->append(buffer, static_cast<size_t>(n));
      } else {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (pollfd& fd : fds) {
    if (fd.fd >= 0) close(fd.fd);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_FALSE(killed) << "sluice-cni did not finish within the deadline";
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return run;
}

int BoundUnixSocket(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address = {};
  address.sun_family = AF_UNIX;
  strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    ADD_FAILURE() << "bind " << path << ": " << strerror(errno);
  }
  return fd;
}

// The agent's side of the endpoint socket: accepts one connection, reads the request to EOF,
// answers with reply(request) and closes. The received request is available after Join().
class FakeAgent {
 public:
  using ReplyFn = std::function<std::string(const std::string& request)>;

  FakeAgent(std::string path, ReplyFn reply) : path_(std::move(path)), reply_(std::move(reply)) {
    listen_fd_ = BoundUnixSocket(path_);
    if (listen(listen_fd_, 4) != 0) ADD_FAILURE() << "listen: " << strerror(errno);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeAgent() {
    shutdown(listen_fd_, SHUT_RDWR);  // wakes Serve() if the plugin never connected
    Join();
    close(listen_fd_);
  }

  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  // The request bytes, parsed; null if no request arrived.
  [[nodiscard]] json Request() {
    Join();
    return request_.has_value() ? json::parse(*request_, nullptr, false) : json();
  }
  [[nodiscard]] const std::string& path() const { return path_; }
  // Inodes of the descriptors that came with the request (SCM_RIGHTS).
  [[nodiscard]] std::vector<ino_t> ReceivedInodes() {
    Join();
    return received_inodes_;
  }

 private:
  void Serve() {
    pollfd pfd = {listen_fd_, POLLIN, 0};
    if (poll(&pfd, 1, std::chrono::milliseconds(kPluginDeadline).count()) != 1) return;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    std::string request;
    char buffer[4096];
    ssize_t n;
    while (true) {
      iovec iov = {.iov_base = buffer, .iov_len = sizeof(buffer)};
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
      msghdr msg = {};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
      if (n <= 0) break;
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); ++i) {
          int received;
          memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
          struct stat st = {};
          if (fstat(received, &st) == 0) received_inodes_.push_back(st.st_ino);
          close(received);
        }
      }
      request.append(buffer, n);
    }
    request_ = request;
    const std::string reply = reply_(request);
    if (write(fd, reply.data(), reply.size()) < 0) ADD_FAILURE() << "reply: " << strerror(errno);
    close(fd);
  }

  std::string path_;
  ReplyFn reply_;
  int listen_fd_ = -1;
  std::optional<std::string> request_;
  std::vector<ino_t> received_inodes_;
  std::thread thread_;
};

FakeAgent::ReplyFn Reply(const json& reply) {
  return [text = reply.dump()](const std::string&) { return text; };
}

class PluginTest : public ::testing::Test {
 protected:
  // The pod: a child process in a network namespace of its own, named by /proc/PID/ns/net (the
  // plugin opens CNI_NETNS of ADD and CHECK itself).
  static void SetUpTestSuite() {
    int ready[2];
    ASSERT_EQ(pipe2(ready, O_CLOEXEC), 0);
    pod_pid_ = fork();
    if (pod_pid_ == 0) {
      if (unshare(CLONE_NEWNET) != 0 && unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0) _exit(1);
      if (write(ready[1], "x", 1) != 1) _exit(1);
      pause();
      _exit(0);
    }
    close(ready[1]);
    char c;
    ASSERT_EQ(read(ready[0], &c, 1), 1) << "no network namespace for the test pod";
    close(ready[0]);
    pod_netns_ = "/proc/" + std::to_string(pod_pid_) + "/ns/net";
  }
  static void TearDownTestSuite() {
    kill(pod_pid_, SIGKILL);
    waitpid(pod_pid_, nullptr, 0);
  }
  static ino_t PodInode() {
    struct stat st = {};
    return stat(pod_netns_.c_str(), &st) == 0 ? st.st_ino : 0;
  }
  static inline pid_t pod_pid_ = -1;
  static inline std::string pod_netns_;

  [[nodiscard]] std::string SocketPath() const { return scratch_.path() + "/agent.sock"; }

  [[nodiscard]] json Config(std::string_view version = "1.0.0") const {
    return json{{"cniVersion", version},
                {"name", "sluice-net"},
                {"type", "sluice"},
                {"socketPath", SocketPath()},
                {"runtimeConfig", {{"podAnnotations", {{"a", "b"}}}}}};
  }

  [[nodiscard]] static Env AttachmentEnv(std::string_view command) {
    return Env{{"CNI_COMMAND", std::string(command)},
               {"CNI_CONTAINERID", "0123456789abcdef"},
               {"CNI_NETNS", pod_netns_},
               {"CNI_IFNAME", "eth0"},
               {"CNI_PATH", "/opt/cni/bin"},
               {"CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0"}};
  }

  sluice::testing::TempDir scratch_{"sluice-cni-test"};
};

// Asserts that `run` failed with a CNI error object of `code` whose msg contains `msg_part`.
void ExpectCniError(const PluginRun& run, int code, std::string_view msg_part,
                    std::string_view version = "1.0.0") {
  EXPECT_EQ(run.exit_code, 1) << run.stdout_text << run.stderr_text;
  json error = run.Output();
  ASSERT_TRUE(error.is_object()) << "stdout: " << run.stdout_text;
  EXPECT_EQ(error.value("code", -1), code) << error;
  EXPECT_THAT(error.value("msg", ""), HasSubstr(msg_part)) << error;
  EXPECT_EQ(error.value("cniVersion", ""), version) << error;
}

// --- VERSION --------------------------------------------------------------------------------

TEST_F(PluginTest, VersionWithEmptyStdinReportsLatestVersionAndSupportedList) {
  PluginRun run = RunPlugin({{"CNI_COMMAND", "VERSION"}}, "");
  EXPECT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_EQ(run.Output(),
            (json{{"cniVersion", "1.1.0"},
                  {"supportedVersions", {"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}}}));
}

TEST_F(PluginTest, VersionAnswersInTheVersionTheRuntimeAsked) {
  PluginRun run = RunPlugin({{"CNI_COMMAND", "VERSION"}}, R"({"cniVersion":"0.4.0"})");
  EXPECT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_EQ(run.Output()["cniVersion"], "0.4.0");
}

// --- Environment ----------------------------------------------------------------------------

TEST_F(PluginTest, MissingCommandNamesCniCommand) {
  ExpectCniError(RunPlugin({}, Config().dump()), api::kCniInvalidEnvironment, "CNI_COMMAND");
}

TEST_F(PluginTest, UnknownCommandNamesCniCommand) {
  Env env = AttachmentEnv("INIT");
  ExpectCniError(RunPlugin(env, Config().dump()), api::kCniInvalidEnvironment, "CNI_COMMAND");
}

struct MissingVariableCase {
  std::string command;
  std::string variable;
};

class PluginMissingVariableTest : public PluginTest,
                                  public ::testing::WithParamInterface<MissingVariableCase> {};

TEST_P(PluginMissingVariableTest, IsInvalidEnvironmentNamingTheVariable) {
  Env env = AttachmentEnv(GetParam().command);
  env.erase(GetParam().variable);
  ExpectCniError(RunPlugin(env, Config().dump()), api::kCniInvalidEnvironment, GetParam().variable);
}

INSTANTIATE_TEST_SUITE_P(RequiredVariables, PluginMissingVariableTest,
                         ::testing::Values(MissingVariableCase{"ADD", "CNI_CONTAINERID"},
                                           MissingVariableCase{"ADD", "CNI_NETNS"},
                                           MissingVariableCase{"ADD", "CNI_IFNAME"},
                                           MissingVariableCase{"ADD", "CNI_PATH"},
                                           MissingVariableCase{"CHECK", "CNI_CONTAINERID"},
                                           MissingVariableCase{"CHECK", "CNI_NETNS"},
                                           MissingVariableCase{"CHECK", "CNI_IFNAME"},
                                           MissingVariableCase{"CHECK", "CNI_PATH"},
                                           MissingVariableCase{"DEL", "CNI_CONTAINERID"},
                                           MissingVariableCase{"DEL", "CNI_IFNAME"},
                                           MissingVariableCase{"DEL", "CNI_PATH"}),
                         [](const ::testing::TestParamInfo<MissingVariableCase>& info) {
                           return info.param.command + "Without" + info.param.variable;
                         });

TEST_F(PluginTest, AddWithInvalidContainerIdNamesTheVariable) {
  Env env = AttachmentEnv("ADD");
  env["CNI_CONTAINERID"] = "../../etc";
  ExpectCniError(RunPlugin(env, Config().dump()), api::kCniInvalidEnvironment, "CNI_CONTAINERID");
}

TEST_F(PluginTest, AddWithTooLongInterfaceNameNamesTheVariable) {
  Env env = AttachmentEnv("ADD");
  env["CNI_IFNAME"] = "a-very-long-ifname";
  ExpectCniError(RunPlugin(env, Config().dump()), api::kCniInvalidEnvironment, "CNI_IFNAME");
}

TEST_F(PluginTest, AddWithRelativeNetnsNamesTheVariable) {
  Env env = AttachmentEnv("ADD");
  env["CNI_NETNS"] = "netns/pod";
  ExpectCniError(RunPlugin(env, Config().dump()), api::kCniInvalidEnvironment, "CNI_NETNS");
}

TEST_F(PluginTest, AddWithMalformedCniArgsNamesTheVariable) {
  Env env = AttachmentEnv("ADD");
  env["CNI_ARGS"] = "K8S_POD_NAMESPACE=default;garbage";
  ExpectCniError(RunPlugin(env, Config().dump()), api::kCniInvalidEnvironment, "CNI_ARGS");
}

// --- Hostile input: every byte of the environment and stdin -------------------------------

TEST_F(PluginTest, DeeplyNestedConfigIsDecodeFailureNotACrash) {
  // 100k levels: a recursive parser or printer runs out of stack long before.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  ExpectCniError(RunPlugin(AttachmentEnv("ADD"), deep), api::kCniDecodeFailure, "deeper than",
                 "1.1.0");
  const std::string nested_field =
      R"({"cniVersion":"1.0.0","name":"n","type":"sluice","x":)" + deep + "}";
  ExpectCniError(RunPlugin(AttachmentEnv("ADD"), nested_field), api::kCniDecodeFailure,
                 "deeper than", "1.1.0");
}

struct HostileVariableCase {
  std::string variable;
  std::string value;
  friend void PrintTo(const HostileVariableCase& c, std::ostream* os) {
    *os << c.variable << "=" << json(c.value).dump(-1, ' ', true, json::error_handler_t::replace);
  }
};

class PluginHostileVariableTest : public PluginTest,
                                  public ::testing::WithParamInterface<HostileVariableCase> {};

TEST_P(PluginHostileVariableTest, IsInvalidEnvironmentNamingTheVariable) {
  Env env = AttachmentEnv("ADD");
  env[GetParam().variable] = GetParam().value;
  PluginRun run = RunPlugin(env, Config().dump());
  ExpectCniError(run, api::kCniInvalidEnvironment, GetParam().variable);
  // Nothing of it may reach the agent: no socket exists, so a forwarded request would be 11.
}

INSTANTIATE_TEST_SUITE_P(
    InvalidBytes, PluginHostileVariableTest,
    ::testing::Values(HostileVariableCase{"CNI_IFNAME", "eth\xff"},
                      HostileVariableCase{"CNI_IFNAME", "e\xe2\x80\xa8"},  // U+2028
                      HostileVariableCase{"CNI_IFNAME", "e\x01"},
                      HostileVariableCase{"CNI_NETNS", "/var/run/netns/\xff"},
                      HostileVariableCase{"CNI_NETNS", "/var/run/netns/a\nb"},
                      HostileVariableCase{"CNI_ARGS", "K8S_POD_NAME=\xc0\xaf"},
                      HostileVariableCase{"CNI_CONTAINERID", "c\xff"}),
    [](const ::testing::TestParamInfo<HostileVariableCase>& info) {
      return info.param.variable + "Case" + std::to_string(info.index);
    });

TEST_F(PluginTest, InvalidUtf8CommandStillAnswersWithAnErrorObject) {
  Env env = AttachmentEnv("ADD");
  env["CNI_COMMAND"] = "AD\xff";
  ExpectCniError(RunPlugin(env, Config().dump()), api::kCniInvalidEnvironment, "CNI_COMMAND",
                 "1.0.0");
}

// --- CNI_NETNS that cannot be a pod's namespace ----------------------------------------------

TEST_F(PluginTest, AddIntoThePluginsOwnNetnsIsRefused) {
  Env env = AttachmentEnv("ADD");
  env["CNI_NETNS"] = "/proc/self/ns/net";
  PluginRun run = RunPlugin(env, Config().dump());
  ExpectCniError(run, api::kCniInvalidEnvironment,
                 "plugin's netns and CNI_NETNS must not be the same");
  // Any path to the same namespace, by inode: the plugin's parent (this test) shares it.
  env["CNI_NETNS"] = "/proc/" + std::to_string(getpid()) + "/ns/net";
  ExpectCniError(RunPlugin(env, Config().dump()), api::kCniInvalidEnvironment,
                 "must not be the same");
  env["CNI_COMMAND"] = "CHECK";
  ExpectCniError(RunPlugin(env, Config().dump()), api::kCniInvalidEnvironment,
                 "must not be the same");
}

TEST_F(PluginTest, NetnsThatIsNotAFileIsInvalidEnvironmentAndNeverBlocks) {
  const std::string fifo = scratch_.path() + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << strerror(errno);
  for (const auto& [path, kind] : std::vector<std::pair<std::string, std::string>>{
           {fifo, "named pipe"}, {scratch_.path(), "directory"}, {"/dev/null", "character device"}}) {
    Env env = AttachmentEnv("ADD");
    env["CNI_NETNS"] = path;
    const Clock::time_point start = Clock::now();
    PluginRun run = RunPlugin(env, Config().dump());
    ExpectCniError(run, api::kCniInvalidEnvironment, kind);
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(5)) << path;
  }
}

TEST_F(PluginTest, AddOfAMissingNetnsIsInvalidEnvironmentFromThePlugin) {
  Env env = AttachmentEnv("ADD");
  env["CNI_NETNS"] = scratch_.path() + "/absent";
  ExpectCniError(RunPlugin(env, Config().dump()), api::kCniInvalidEnvironment, "does not exist");
}

TEST_F(PluginTest, DelNeverOpensTheNetns) {
  // A FIFO would block an open for reading; DEL forwards the path and no descriptor.
  const std::string fifo = scratch_.path() + "/del-fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << strerror(errno);
  FakeAgent agent(SocketPath(), Reply({{"ok", true}}));
  Env env = AttachmentEnv("DEL");
  env["CNI_NETNS"] = fifo;
  PluginRun run = RunPlugin(env, Config().dump());
  EXPECT_EQ(run.exit_code, 0) << run.stdout_text << run.stderr_text;
  EXPECT_EQ(agent.Request()["netns"], fifo);
  EXPECT_TRUE(agent.ReceivedInodes().empty());
}

TEST_F(PluginTest, AContainerIdTooLongForTheAgentsRecordIsRefusedUpFront) {
  // "<id>-eth0.json.tmp" must fit NAME_MAX (255): 241 characters do, 242 do not.
  Env env = AttachmentEnv("ADD");
  env["CNI_CONTAINERID"] = std::string(242, 'c');
  ExpectCniError(RunPlugin(env, Config().dump()), api::kCniInvalidEnvironment,
                 "CNI_CONTAINERID is too long");
  FakeAgent agent(SocketPath(), Reply({{"ok", true}}));
  env["CNI_COMMAND"] = "CHECK";
  env["CNI_CONTAINERID"] = std::string(241, 'c');
  EXPECT_EQ(RunPlugin(env, Config().dump()).exit_code, 0);
}

TEST_F(PluginTest, HelpNamesTheConfigKeyThePluginReads) {
  std::string path = PluginPath();
  FILE* p = popen(("env -u CNI_COMMAND " + path + " --help").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string help;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), p)) > 0) help.append(buffer, n);
  pclose(p);
  EXPECT_THAT(help, HasSubstr("\"socketPath\""));
  EXPECT_THAT(help, ::testing::Not(HasSubstr("\"socket\"")));
  // And the key it names is the one that is read: the request reaches the socket it gives.
  FakeAgent agent(SocketPath(), Reply({{"ok", true}}));
  EXPECT_EQ(RunPlugin(AttachmentEnv("CHECK"), Config().dump()).exit_code, 0);
  EXPECT_EQ(agent.Request()["command"], "CHECK");
}

TEST_F(PluginTest, CheckWithAPrevResultOfAnUnknownVersionIsIncompatibleVersion) {
  json config = Config();
  config["prevResult"] = {{"cniVersion", "9.9.9"}, {"ips", json::array()}};
  ExpectCniError(RunPlugin(AttachmentEnv("CHECK"), config.dump()), api::kCniIncompatibleVersion,
                 "incompatible CNI versions");
}

// --- Configuration --------------------------------------------------------------------------

TEST_F(PluginTest, AddWithNonJsonConfigIsDecodeFailure) {
  ExpectCniError(RunPlugin(AttachmentEnv("ADD"), "{not json"), api::kCniDecodeFailure, "JSON",
                 "1.1.0");
}

TEST_F(PluginTest, AddWithWrongTypeIsInvalidNetworkConfig) {
  json config = Config();
  config["type"] = "bridge";
  ExpectCniError(RunPlugin(AttachmentEnv("ADD"), config.dump()), api::kCniInvalidNetworkConfig,
                 "type");
}

TEST_F(PluginTest, AddWithUnsupportedVersionIsIncompatibleVersion) {
  ExpectCniError(RunPlugin(AttachmentEnv("ADD"), Config("0.2.0").dump()),
                 api::kCniIncompatibleVersion, "incompatible", "1.1.0");
}

TEST_F(PluginTest, AddWithIpamSectionIsUnsupportedFieldInTheConfigVersion) {
  json config = Config("0.4.0");
  config["ipam"] = {{"type", "host-local"}};
  ExpectCniError(RunPlugin(AttachmentEnv("ADD"), config.dump()), api::kCniUnsupportedField, "ipam",
                 "0.4.0");
}

TEST_F(PluginTest, CheckWithPre040VersionIsIncompatibleVersion) {
  ExpectCniError(RunPlugin(AttachmentEnv("CHECK"), Config("0.3.1").dump()),
                 api::kCniIncompatibleVersion, "CHECK", "0.3.1");
}

TEST_F(PluginTest, StatusWithPre110VersionIsIncompatibleVersion) {
  ExpectCniError(RunPlugin({{"CNI_COMMAND", "STATUS"}}, Config("1.0.0").dump()),
                 api::kCniIncompatibleVersion, "STATUS");
}

// CNI 1.1.0 has the runtime pass the list, but libcni omits the key when it has none and Go
// prints a nil list as null, so `cnitool gc` sends one or the other: GC is forwarded (the agent
// then keeps every recorded attachment and collects only leaked resources; docs/operating.md).
TEST_F(PluginTest, GcWithMissingOrNullValidAttachmentsIsForwarded) {
  for (bool with_null : {false, true}) {
    unlink(SocketPath().c_str());  // the previous round's agent socket
    FakeAgent agent(SocketPath(), Reply({{"ok", true}}));
    json config = Config("1.1.0");
    if (with_null) config["cni.dev/valid-attachments"] = nullptr;
    PluginRun run = RunPlugin({{"CNI_COMMAND", "GC"}, {"CNI_PATH", "/opt/cni/bin"}}, config.dump());
    EXPECT_EQ(run.exit_code, 0) << run.stdout_text << run.stderr_text;
    EXPECT_EQ(run.stdout_text, "");
    EXPECT_EQ(agent.Request()["command"], "GC");
  }
}

// --- Agent unreachable ----------------------------------------------------------------------

TEST_F(PluginTest, AddWithoutAgentSocketIsTryAgainLaterNamingThePath) {
  ExpectCniError(RunPlugin(AttachmentEnv("ADD"), Config().dump()), api::kCniTryAgainLater,
                 SocketPath());
}

TEST_F(PluginTest, AddWithStaleSocketFileIsTryAgainLater) {
  const int fd = BoundUnixSocket(SocketPath());  // bound, never listening: ECONNREFUSED
  ExpectCniError(RunPlugin(AttachmentEnv("ADD"), Config().dump()), api::kCniTryAgainLater,
                 "not reachable");
  close(fd);
}

TEST_F(PluginTest, DelWithoutAgentSocketIsTryAgainLater) {
  ExpectCniError(RunPlugin(AttachmentEnv("DEL"), Config().dump()), api::kCniTryAgainLater,
                 "sluice-agent");
}

TEST_F(PluginTest, StatusWithoutAgentSocketIsNotAvailable) {
  ExpectCniError(RunPlugin({{"CNI_COMMAND", "STATUS"}}, Config("1.1.0").dump()),
                 api::kCniNotAvailable, "not available", "1.1.0");
}

// --- Forwarding -----------------------------------------------------------------------------

TEST_F(PluginTest, AddForwardsTheRequestAndPrintsTheAgentsResult) {
  const json result = json::parse(R"({
    "cniVersion": "1.0.0",
    "interfaces": [{"name": "eth0", "mac": "aa:bb:cc:00:00:02", "sandbox": "/var/run/netns/pod-1"}],
    "ips": [{"address": "10.0.1.5/24", "gateway": "10.0.1.1", "interface": 0}],
    "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.1.1"}]
  })");
  FakeAgent agent(SocketPath(), Reply({{"ok", true}, {"result", result}}));
  const json config = Config();

  PluginRun run = RunPlugin(AttachmentEnv("ADD"), config.dump());

  EXPECT_EQ(run.exit_code, 0) << run.stdout_text << run.stderr_text;
  EXPECT_EQ(run.Output(), result);
  json request = agent.Request();
  EXPECT_EQ(request["command"], "ADD");
  EXPECT_EQ(request["containerID"], "0123456789abcdef");
  EXPECT_EQ(request["netns"], pod_netns_);
  // The namespace goes with the request as a descriptor the plugin opened.
  EXPECT_EQ(request["netnsFd"], true);
  EXPECT_THAT(agent.ReceivedInodes(), ::testing::ElementsAre(PodInode()));
  EXPECT_EQ(request["ifName"], "eth0");
  EXPECT_EQ(request["args"], "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0");
  EXPECT_EQ(request["config"], config);
}

TEST_F(PluginTest, AddAgentFailureIsPrintedAsCniErrorInTheConfigVersion) {
  FakeAgent agent(SocketPath(), Reply({{"ok", false},
                                       {"code", api::kSluicePoolExhausted},
                                       {"msg", "no free address in 10.0.1.0/24"},
                                       {"details", "254 of 254 in use"}}));
  PluginRun run = RunPlugin(AttachmentEnv("ADD"), Config("0.4.0").dump());
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_EQ(run.Output(), (json{{"cniVersion", "0.4.0"},
                                {"code", api::kSluicePoolExhausted},
                                {"msg", "no free address in 10.0.1.0/24"},
                                {"details", "254 of 254 in use"}}));
}

TEST_F(PluginTest, CheckSuccessPrintsNothing) {
  FakeAgent agent(SocketPath(), Reply({{"ok", true}}));
  json config = Config();
  config["prevResult"] = {{"cniVersion", "1.0.0"},
                          {"interfaces", {{{"name", "eth0"}}}},
                          {"ips", {{{"address", "10.0.1.5/24"}, {"interface", 0}}}}};
  PluginRun run = RunPlugin(AttachmentEnv("CHECK"), config.dump());
  EXPECT_EQ(run.exit_code, 0) << run.stdout_text << run.stderr_text;
  EXPECT_EQ(run.stdout_text, "");
  json request = agent.Request();
  EXPECT_EQ(request["command"], "CHECK");
  EXPECT_EQ(request["config"]["prevResult"], config["prevResult"]);
  EXPECT_EQ(request["netnsFd"], true);
  EXPECT_THAT(agent.ReceivedInodes(), ::testing::ElementsAre(PodInode()));
}

TEST_F(PluginTest, DelWithoutNetnsIsForwardedWithEmptyNetns) {
  FakeAgent agent(SocketPath(), Reply({{"ok", true}}));
  Env env = AttachmentEnv("DEL");
  env.erase("CNI_NETNS");
  PluginRun run = RunPlugin(env, Config().dump());
  EXPECT_EQ(run.exit_code, 0) << run.stdout_text << run.stderr_text;
  EXPECT_EQ(run.stdout_text, "");
  json request = agent.Request();
  EXPECT_EQ(request["command"], "DEL");
  EXPECT_EQ(request["netns"], "");
  EXPECT_FALSE(request.contains("netnsFd"));
  EXPECT_TRUE(agent.ReceivedInodes().empty());
  EXPECT_EQ(request["containerID"], "0123456789abcdef");
}

TEST_F(PluginTest, GcForwardsTheValidAttachments) {
  FakeAgent agent(SocketPath(), Reply({{"ok", true}}));
  json config = Config("1.1.0");
  config["cni.dev/valid-attachments"] = {{{"containerID", "c1"}, {"ifname", "eth0"}}};
  PluginRun run = RunPlugin({{"CNI_COMMAND", "GC"}, {"CNI_PATH", "/opt/cni/bin"}}, config.dump());
  EXPECT_EQ(run.exit_code, 0) << run.stdout_text << run.stderr_text;
  EXPECT_EQ(run.stdout_text, "");
  json request = agent.Request();
  EXPECT_EQ(request["command"], "GC");
  EXPECT_EQ(request["config"], config);
}

TEST_F(PluginTest, StatusNotReadyIsPassedThrough) {
  FakeAgent agent(
      SocketPath(),
      Reply({{"ok", false}, {"code", api::kCniNotAvailable}, {"msg", "datapath not loaded yet"}}));
  PluginRun run = RunPlugin({{"CNI_COMMAND", "STATUS"}}, Config("1.1.0").dump());
  ExpectCniError(run, api::kCniNotAvailable, "datapath not loaded yet", "1.1.0");
  EXPECT_EQ(agent.Request()["command"], "STATUS");
}

TEST_F(PluginTest, MalformedAgentReplyIsSluiceInternal) {
  FakeAgent agent(SocketPath(), [](const std::string&) { return std::string("ok!"); });
  ExpectCniError(RunPlugin(AttachmentEnv("ADD"), Config().dump()), api::kSluiceInternal,
                 "malformed reply");
}

TEST_F(PluginTest, AgentClosingWithoutReplyIsSluiceInternal) {
  FakeAgent agent(SocketPath(), [](const std::string&) { return std::string(); });
  ExpectCniError(RunPlugin(AttachmentEnv("ADD"), Config().dump()), api::kSluiceInternal,
                 "empty reply");
}

TEST_F(PluginTest, AddOkWithoutResultIsSluiceInternal) {
  FakeAgent agent(SocketPath(), Reply({{"ok", true}}));
  ExpectCniError(RunPlugin(AttachmentEnv("ADD"), Config().dump()), api::kSluiceInternal,
                 "without a result");
}

TEST_F(PluginTest, DiagnosticsGoToStderrOnly) {
  PluginRun run = RunPlugin(AttachmentEnv("ADD"), Config().dump());
  EXPECT_TRUE(run.Output().is_object()) << "stdout must be exactly one JSON document";
  EXPECT_THAT(run.stderr_text, HasSubstr("sluice-cni"));
}

}  // namespace
}  // namespace sluice::cni
