// sluice-cni: a CNI 1.1.0 plugin. It validates what the runtime passed (environment and the
// network configuration on stdin), forwards the request to sluice-agent's endpoint socket and
// prints the agent's answer. VERSION is answered locally. Results and CNI errors go to stdout,
// diagnostics to stderr.
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/base/version.h"
#include "cni/agent_client.h"
#include "cni/protocol/messages.h"
#include "cni/protocol/netconf.h"
#include "cni/protocol/strings.h"
#include "cni/protocol/wire.h"
#include "nlohmann/json.hpp"

namespace sluice::cni {
namespace {

using json = nlohmann::json;

std::string Getenv(const char* name) {
  const char* value = getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

// Largest network configuration read from stdin; the agent refuses bigger requests anyway.
constexpr size_t kMaxConfigBytes = 1 << 20;

absl::StatusOr<std::string> ReadStdin() {
  std::string bytes;
  if (isatty(STDIN_FILENO)) return bytes;  // run by hand (e.g. VERSION): no configuration
  char buffer[64 * 1024];
  while (true) {
    const ssize_t n = read(STDIN_FILENO, buffer, sizeof(buffer));
    if (n > 0) {
      if (bytes.size() + static_cast<size_t>(n) > kMaxConfigBytes) {
        return CniStatus(api::kCniDecodeFailure,
                         StrCat("the network configuration on stdin exceeds ", kMaxConfigBytes,
                                " bytes"));
      }
      bytes.append(buffer, static_cast<size_t>(n));
    } else if (n == 0) {
      return bytes;
    } else if (errno == EBADF) {
      return bytes;  // no stdin at all: same as empty
    } else if (errno != EINTR) {
      return CniStatus(api::kCniIoFailure,
                       StrCat("reading the network configuration from stdin: ", strerror(errno)));
    }
  }
}

void PrintJson(const json& value) {
  const std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  fwrite(text.data(), 1, text.size(), stdout);
  fputc('\n', stdout);
  fflush(stdout);
}

// Prints `status` as a CNI error object and returns the exit code.
int Fail(const absl::Status& status, std::string_view cni_version, std::string_view command) {
  const CniFailure failure = CniFailureFromStatus(status);
  fprintf(stderr, "sluice-cni: %.*s failed: code %d: %s%s%s\n", static_cast<int>(command.size()),
          command.data(), failure.code, failure.msg.c_str(), failure.details.empty() ? "" : ": ",
          failure.details.c_str());
  PrintJson(FormatError(failure, cni_version));
  return 1;
}

bool IsKnownCommand(std::string_view command) {
  return command == kCommandAdd || command == kCommandDel || command == kCommandCheck ||
         command == kCommandGc || command == kCommandStatus || command == kCommandVersion;
}

bool IsPerAttachment(std::string_view command) {
  return command == kCommandAdd || command == kCommandDel || command == kCommandCheck;
}

// Environment checks that need only the variables: presence per command (the messages name the
// variable), then the syntax of each value.
absl::Status ValidateEnvironment(const EndpointRequest& request, bool has_cni_path) {
  const std::string_view command = request.command;
  auto missing = [&](std::string_view variable) {
    return CniStatus(api::kCniInvalidEnvironment,
                     StrCat(variable, " is required for ", command, " but is not set"));
  };
  if (IsPerAttachment(command)) {
    if (request.container_id.empty()) return missing("CNI_CONTAINERID");
    if (command != kCommandDel && request.netns.empty()) return missing("CNI_NETNS");
    if (request.if_name.empty()) return missing("CNI_IFNAME");
    if (!has_cni_path) return missing("CNI_PATH");
  }
  return ValidateAttachmentParameters(request);
}

const char* FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "directory";
  if (S_ISFIFO(mode)) return "named pipe";
  if (S_ISCHR(mode)) return "character device";
  if (S_ISBLK(mode)) return "block device";
  if (S_ISSOCK(mode)) return "socket";
  return "special file";
}

// The pod's network namespace, opened by the plugin where the runtime's path is valid: the agent
// may run in another mount namespace (a container of the chart without the host's /run/netns,
// or a runtime's private mount such as podman's /run/user/...), so it gets the descriptor, never
// the path. O_PATH opens nothing for I/O (a FIFO does not wait for a writer, a device driver is
// not called); the agent checks the descriptor is a network namespace. Refused here: a path that
// does not exist, what is not a regular file (nsfs presents a namespace as one), and the network
// namespace the plugin itself runs in, which is the node's (libcni's skel refuses the same).
absl::StatusOr<int> OpenNetns(const std::string& netns) {
  const int fd = open(netns.c_str(), O_PATH | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return CniStatus(api::kCniInvalidEnvironment,
                     err == ENOENT ? StrCat("CNI_NETNS ", netns, " does not exist")
                                   : StrCat("CNI_NETNS ", netns, ": ", strerror(err)));
  }
  auto refuse = [fd](absl::Status status) {
    close(fd);
    return status;
  };
  struct stat target = {};
  if (fstat(fd, &target) != 0) {
    return refuse(CniStatus(api::kCniInvalidEnvironment,
                            StrCat("CNI_NETNS ", netns, ": ", strerror(errno))));
  }
  if (!S_ISREG(target.st_mode)) {
    return refuse(CniStatus(api::kCniInvalidEnvironment,
                            StrCat("CNI_NETNS ", netns, " is not a network namespace (it is a ",
                                   FileKind(target.st_mode), ")")));
  }
  struct stat own = {};
  if (stat("/proc/self/ns/net", &own) == 0 && own.st_dev == target.st_dev &&
      own.st_ino == target.st_ino) {
    return refuse(CniStatus(api::kCniInvalidEnvironment,
                            "plugin's netns and CNI_NETNS must not be the same",
                            StrCat("CNI_NETNS ", netns,
                                   " is the network namespace sluice-cni runs in (the node's, "
                                   "inode ",
                                   own.st_ino, "): a pod needs its own")));
  }
  return fd;
}

// Version gates of the verbs added after 0.3.x (as libcni's skel applies them).
absl::Status CheckCommandAllowedByVersion(std::string_view command, std::string_view version) {
  std::string_view minimum;
  if (command == kCommandCheck) minimum = "0.4.0";
  if (command == kCommandGc || command == kCommandStatus) minimum = "1.1.0";
  if (minimum.empty() || VersionAtLeast(version, minimum)) return absl::OkStatus();
  return CniStatus(api::kCniIncompatibleVersion,
                   StrCat("config version \"", version, "\" does not allow ", command,
                          " (needs cniVersion ", minimum, " or later)"));
}

// Maps a transport failure to the CNI error the runtime should see.
absl::Status AgentUnreachable(const absl::Status& transport, std::string_view command,
                              std::string_view socket_path) {
  const std::string details(transport.message());
  if (command == kCommandStatus) {
    return CniStatus(api::kCniNotAvailable,
                     StrCat("not available: sluice-agent not reachable at ", socket_path), details);
  }
  switch (transport.code()) {
    case absl::StatusCode::kUnavailable:
      return CniStatus(api::kCniTryAgainLater,
                       StrCat("try again later: sluice-agent not reachable at ", socket_path),
                       details);
    case absl::StatusCode::kDeadlineExceeded:
      return CniStatus(
          api::kCniTryAgainLater,
          StrCat("try again later: sluice-agent at ", socket_path, " did not answer in time"),
          details);
    default:
      return CniStatus(api::kCniIoFailure,
                       StrCat("talking to sluice-agent at ", socket_path, " failed"), details);
  }
}

int Run() {
  const std::string command = Getenv("CNI_COMMAND");
  absl::StatusOr<std::string> stdin_bytes = ReadStdin();
  const std::string error_version =
      stdin_bytes.ok() ? SupportedVersionIn(*stdin_bytes).value_or(kLatestCniVersion)
                       : std::string(kLatestCniVersion);

  if (command.empty()) {
    fprintf(stderr, "sluice-cni: the Sluice CNI plugin; CNI protocol versions supported: ");
    for (std::string_view version : SupportedVersions()) {
      fprintf(stderr, "%.*s ", static_cast<int>(version.size()), version.data());
    }
    fputc('\n', stderr);
    return Fail(CniStatus(api::kCniInvalidEnvironment, "CNI_COMMAND is not set"), error_version,
                "(none)");
  }
  if (!IsKnownCommand(command)) {
    return Fail(CniStatus(api::kCniInvalidEnvironment,
                          StrCat("CNI_COMMAND \"", command,
                                 "\" is not one of ADD, DEL, CHECK, GC, STATUS, VERSION")),
                error_version, command);
  }
  if (!stdin_bytes.ok()) return Fail(stdin_bytes.status(), error_version, command);

  if (command == kCommandVersion) {
    PrintJson(FormatVersionInfo(error_version));
    return 0;
  }

  EndpointRequest request;
  request.command = command;
  request.container_id = Getenv("CNI_CONTAINERID");
  request.netns = Getenv("CNI_NETNS");
  request.if_name = Getenv("CNI_IFNAME");
  request.args = Getenv("CNI_ARGS");
  if (absl::Status s = ValidateEnvironment(request, !Getenv("CNI_PATH").empty()); !s.ok()) {
    return Fail(s, error_version, command);
  }
  // DEL never opens the namespace: it may be gone, and the agent needs only the host side.
  struct OwnedFd {
    int fd = -1;
    ~OwnedFd() {
      if (fd >= 0) close(fd);
    }
  } netns;
  if (command == kCommandAdd || command == kCommandCheck) {
    absl::StatusOr<int> opened = OpenNetns(request.netns);
    if (!opened.ok()) return Fail(opened.status(), error_version, command);
    netns.fd = *opened;
    request.netns_fd = true;
  }

  absl::StatusOr<NetConf> conf = ParseNetConf(*stdin_bytes);
  if (!conf.ok()) return Fail(conf.status(), error_version, command);
  const std::string& version = conf->cni_version;
  if (absl::Status s = CheckCommandAllowedByVersion(command, version); !s.ok()) {
    return Fail(s, version, command);
  }
  request.config = conf->raw;

  absl::StatusOr<std::string> raw_reply =
      CallAgent(conf->socket_path,
                EncodeRequest(request).dump(-1, ' ', false, json::error_handler_t::replace),
                AgentCallTimeouts{}, netns.fd);
  if (!raw_reply.ok()) {
    return Fail(AgentUnreachable(raw_reply.status(), command, conf->socket_path), version, command);
  }
  absl::StatusOr<EndpointReply> reply = ParseEndpointReply(*raw_reply);
  if (!reply.ok()) return Fail(reply.status(), version, command);
  if (!reply->ok) {
    return Fail(CniStatus(reply->failure.code, reply->failure.msg, reply->failure.details), version,
                command);
  }
  if (command == kCommandAdd) {
    if (!reply->result.is_object()) {
      return Fail(CniStatus(api::kSluiceInternal, "sluice-agent answered ADD without a result"),
                  version, command);
    }
    json result = reply->result;
    if (!result.contains("cniVersion")) result["cniVersion"] = version;
    PrintJson(result);
  }
  return 0;
}

// Run() handles every input it can name; this is the last line of defence, so that even a bug
// answers the runtime with an error object instead of a crash.
int RunGuarded() {
  try {
    return Run();
  } catch (const std::exception& e) {
    return Fail(CniStatus(api::kSluiceInternal, StrCat("sluice-cni internal error: ", e.what())),
                kLatestCniVersion, Getenv("CNI_COMMAND"));
  } catch (...) {
    return Fail(CniStatus(api::kSluiceInternal, "sluice-cni internal error"), kLatestCniVersion,
                Getenv("CNI_COMMAND"));
  }
}

}  // namespace
}  // namespace sluice::cni

namespace {

// A CNI plugin's contract is its environment and stdin, not flags. Run by hand with --help or
// --version it says so instead of answering as a plugin.
constexpr char kHelp[] =
    "sluice-cni: Sluice's CNI 1.1.0 plugin. It takes no flags: a container runtime runs it with\n"
    "CNI_COMMAND (ADD, DEL, CHECK, GC, STATUS, VERSION), CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME,\n"
    "CNI_ARGS and CNI_PATH in the environment and the network configuration on stdin; it forwards\n"
    "the request to sluice-agent's endpoint socket (the configuration's \"socketPath\", default\n"
    "/run/sluice/sluice.sock) and prints the result or a CNI error object on stdout. For ADD and\n"
    "CHECK it opens CNI_NETNS itself and passes the namespace to the agent with the request.\n"
    "sluice-agent installs it as <cni_bin_dir>/sluice with 05-sluice.conflist.\n"
    "  sluice-cni --version   prints the build's version\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && getenv("CNI_COMMAND") == nullptr) {
    std::string_view a = argv[1];
    if (a == "--help" || a == "-h" || a == "help") {
      fputs(kHelp, stdout);
      return 0;
    }
    if (a == "--version" || a == "version") {
      printf("sluice-cni %s\n", SLUICE_VERSION_STRING);
      return 0;
    }
    fprintf(stderr, "sluice-cni: unknown argument %s (a CNI plugin takes no flags; see --help)\n",
            argv[1]);
    return 2;
  }
  return sluice::cni::RunGuarded();
}
