// libFuzzer target: what a container runtime hands sluice-cni, through the plugin's own code
// (cni/main.cc's Run(), compiled in here): the CNI_* environment and the network configuration on
// stdin, validated by cni/protocol/ (netconf.*, messages.*), encoded as an endpoint request.
//
// Input format, like /proc/<pid>/environ followed by stdin:
//   NAME=VALUE \0 NAME=VALUE \0 ... \0 \0 <stdin bytes>
// Only the variables the plugin reads are set (CNI_COMMAND, CNI_CONTAINERID, CNI_NETNS,
// CNI_IFNAME, CNI_ARGS, CNI_PATH); the others of the process are left alone. Without the empty
// entry the whole input is environment and stdin is empty.
//
// The agent is replaced by CallAgent below, which never touches a socket: it checks that what the
// plugin forwards is a request the agent's decoding accepts (the plugin validated it, so a
// mismatch is a bug) and answers like the agent would, so the plugin's reply and result printing
// run too. stdout (results, error objects) goes to /dev/null.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#define main sluice_cni_main
#include "cni/main.cc"
#undef main

namespace sluice::cni {

// The agent's side of one exchange, as agent/endpoint/api_server.cc and EndpointService::Handle decode it.
absl::StatusOr<std::string> CallAgent(std::string_view socket_path, std::string_view request,
                                      const AgentCallTimeouts&, int pass_fd) {
  (void)socket_path;
  const nlohmann::json parsed = nlohmann::json::parse(request, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    fprintf(stderr, "cni_input_fuzzer: the plugin sent a request the agent cannot parse\n");
    abort();
  }
  absl::StatusOr<EndpointRequest> req = ParseEndpointRequest(parsed.dump());
  if (!req.ok()) {
    fprintf(stderr, "cni_input_fuzzer: the agent refuses a request the plugin accepted: %s\n",
            req.status().ToString().c_str());
    abort();
  }
  // ADD and CHECK come with the namespace the plugin opened, and say so; nothing else does.
  const bool wants_fd = req->command == kCommandAdd || req->command == kCommandCheck;
  if (wants_fd != (pass_fd >= 0) || wants_fd != req->netns_fd) {
    fprintf(stderr, "cni_input_fuzzer: %s sent with descriptor %d, netnsFd %d\n",
            req->command.c_str(), pass_fd, req->netns_fd ? 1 : 0);
    abort();
  }
  absl::StatusOr<NetConf> conf = NetConfFromJson(req->config);
  if (!conf.ok()) {
    fprintf(stderr, "cni_input_fuzzer: the agent refuses a config the plugin accepted: %s\n",
            conf.status().ToString().c_str());
    abort();
  }
  if (req->command != kCommandAdd) return EncodeSuccessReply();
  // An ADD result carrying the caller's names back, as EndpointService::ResultFor does.
  ResultV1 result;
  result.interfaces.push_back({"lxc0", "02:00:00:00:00:01", "", 0});
  result.interfaces.push_back({req->if_name, "02:00:00:00:00:02", req->netns, conf->mtu});
  result.ips.push_back({"10.0.0.2/32", "10.0.0.1", 1});
  result.routes.push_back({"0.0.0.0/0", "10.0.0.1"});
  return EncodeSuccessReply(FormatResult(result, conf->cni_version));
}

}  // namespace sluice::cni

namespace {

constexpr const char* kVariables[] = {"CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS",
                                      "CNI_IFNAME",  "CNI_ARGS",        "CNI_PATH"};

int stdin_fd = -1;

void SetEnvironment(std::string_view env) {
  for (const char* name : kVariables) unsetenv(name);
  while (!env.empty()) {
    const size_t end = std::min(env.find('\0'), env.size());
    const std::string_view entry = env.substr(0, end);
    env.remove_prefix(std::min(end + 1, env.size()));
    const size_t eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string name(entry.substr(0, eq));
    for (const char* known : kVariables) {
      if (name == known) setenv(known, std::string(entry.substr(eq + 1)).c_str(), 1);
    }
  }
}

// Makes fd 0 a file holding exactly `bytes`, positioned at its start.
void SetStdin(std::string_view bytes) {
  if (ftruncate(stdin_fd, 0) != 0 ||
      pwrite(stdin_fd, bytes.data(), bytes.size(), 0) != static_cast<ssize_t>(bytes.size())) {
    perror("cni_input_fuzzer: stdin memfd");
    abort();
  }
  if (lseek(STDIN_FILENO, 0, SEEK_SET) != 0) {
    perror("cni_input_fuzzer: lseek stdin");
    abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  stdin_fd = memfd_create("cni_input_fuzzer_stdin", MFD_CLOEXEC);
  if (stdin_fd < 0 || dup2(stdin_fd, STDIN_FILENO) < 0) {
    perror("cni_input_fuzzer: stdin");
    abort();
  }
  // Results and error objects: the plugin's stdout is not what is being checked.
  if (freopen("/dev/null", "w", stdout) == nullptr) {
    perror("cni_input_fuzzer: stdout");
    abort();
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::string_view env = input, stdin_bytes;
  // The environment ends at the first empty entry: "\0\0" (or a leading "\0").
  size_t split = std::string_view::npos;
  if (!input.empty() && input[0] == '\0') {
    split = 0;
  } else if (size_t pos = input.find(std::string_view("\0\0", 2)); pos != std::string_view::npos) {
    split = pos + 1;
  }
  if (split != std::string_view::npos) {
    env = input.substr(0, split);
    stdin_bytes = input.substr(split + 1);
  }
  SetEnvironment(env);
  SetStdin(stdin_bytes);
  // As a runtime runs the plugin: no arguments, everything in the environment and stdin.
  char name[] = "sluice-cni";
  char* argv[] = {name, nullptr};
  (void)sluice_cni_main(1, argv);
  return 0;
}
