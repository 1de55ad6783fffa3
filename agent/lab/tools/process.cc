#include "agent/lab/tools/process.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "agent/base/deadline.h"
#include "agent/base/errno.h"

extern char** environ;

namespace sluice::lab {
namespace {

std::string ResolveExecutable(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = getenv("PATH");
  std::string dirs = path ? path : "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  for (absl::string_view dir : absl::StrSplit(dirs, ':')) {
    std::string candidate = absl::StrCat(dir, "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return name;
}

// argv / envp arrays prepared before fork(): the child of a threaded process may only make
// async-signal-safe calls.
struct ExecImage {
  std::string path;
  std::vector<std::string> args;
  std::vector<std::string> envs;
  std::vector<char*> argv;
  std::vector<char*> envp;
  bool inherit_env = true;

  explicit ExecImage(const ProcessSpec& spec) : path(ResolveExecutable(spec.argv.at(0))) {
    args = spec.argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (spec.env) {
      inherit_env = false;
      envs = *spec.env;
      for (auto& e : envs) envp.push_back(e.data());
      envp.push_back(nullptr);
    }
  }
  char* const* env() const { return inherit_env ? environ : const_cast<char* const*>(envp.data()); }
};

// In the child: clean signal state, join the netns, exec. Never returns.
[[noreturn]] void ExecChild(const ExecImage& image, int netns_fd) {
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  signal(SIGPIPE, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  signal(SIGINT, SIG_DFL);
  signal(SIGCHLD, SIG_DFL);
  if (netns_fd >= 0 && setns(netns_fd, CLONE_NEWNET) != 0) _exit(126);
  execve(image.path.c_str(), image.argv.data(), image.env());
  _exit(127);
}

absl::StatusOr<int> OpenNetns(const std::string& path) {
  if (path.empty()) return -1;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open netns ", path));
  return fd;
}

int ExitCode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

absl::StatusOr<ProcessResult> RunProcess(const ProcessSpec& spec, absl::Duration timeout) {
  if (spec.argv.empty()) return absl::InvalidArgumentError("empty command");
  ExecImage image(spec);
  auto netns = OpenNetns(spec.netns_path);
  if (!netns.ok()) return netns.status();
  int in[2], out[2], err[2];
  if (pipe2(in, O_CLOEXEC) != 0) return ErrnoStatus(errno, "pipe");
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    return ErrnoStatus(errno, "pipe");
  }
  pid_t pid = fork();
  if (pid < 0) return ErrnoStatus(errno, "fork");
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    ExecChild(image, *netns);
  }
  if (*netns >= 0) close(*netns);
  close(in[0]);
  close(out[1]);
  close(err[1]);
  fcntl(in[1], F_SETFL, O_NONBLOCK);
  ProcessResult result;
  size_t written = 0;
  int fds[3] = {in[1], out[0], err[0]};
  if (spec.stdin_data.empty()) {
    close(fds[0]);
    fds[0] = -1;
  }
  absl::Time deadline = absl::Now() + timeout;
  bool timed_out = false;
  while (fds[1] >= 0 || fds[2] >= 0) {
    pollfd p[3];
    for (int i = 0; i < 3; ++i) p[i] = {fds[i], static_cast<short>(i == 0 ? POLLOUT : POLLIN), 0};
    const int ms = PollTimeoutMs(deadline, absl::Now());
    if (ms == 0) {
      timed_out = true;
      break;
    }
    int n = poll(p, 3, ms < 0 ? 1000 : std::min(ms, 1000));
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    if (fds[0] >= 0 && p[0].revents) {
      ssize_t w = write(fds[0], spec.stdin_data.data() + written, spec.stdin_data.size() - written);
      if (w > 0) written += w;
      if (w < 0 && errno != EAGAIN && errno != EINTR) written = spec.stdin_data.size();
      if (written >= spec.stdin_data.size()) {
        close(fds[0]);
        fds[0] = -1;
      }
    }
    for (int i = 1; i < 3; ++i) {
      if (fds[i] < 0 || !p[i].revents) continue;
      char buf[4096];
      ssize_t r = read(fds[i], buf, sizeof(buf));
      if (r > 0) {
        (i == 1 ? result.out : result.err).append(buf, r);
      } else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
        close(fds[i]);
        fds[i] = -1;
      }
    }
  }
  for (int fd : fds) {
    if (fd >= 0) close(fd);
  }
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return absl::DeadlineExceededError(absl::StrCat(
        absl::StrJoin(spec.argv, " "), ": no exit after ", absl::FormatDuration(timeout)));
  }
  result.exit_code = ExitCode(status);
  return result;
}

absl::Status RunChecked(const std::vector<std::string>& argv, absl::Duration timeout) {
  auto r = RunProcess({.argv = argv}, timeout);
  if (!r.ok()) return r.status();
  if (r->exit_code != 0) {
    std::string err(absl::StripTrailingAsciiWhitespace(r->err));
    return absl::InternalError(
        absl::StrCat(absl::StrJoin(argv, " "), ": exit ", r->exit_code, ": ", err));
  }
  return absl::OkStatus();
}

absl::StatusOr<pid_t> StartProcess(const ProcessSpec& spec) {
  if (spec.argv.empty()) return absl::InvalidArgumentError("empty command");
  ExecImage image(spec);
  auto netns = OpenNetns(spec.netns_path);
  if (!netns.ok()) return netns.status();
  std::string log = spec.log_path.empty() ? "/dev/null" : spec.log_path;
  int log_fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    if (*netns >= 0) close(*netns);
    return ErrnoStatus(errno, absl::StrCat("open ", log));
  }
  int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  pid_t pid = fork();
  if (pid < 0) return ErrnoStatus(errno, "fork");
  if (pid == 0) {
    setsid();
    dup2(null_fd, 0);
    dup2(log_fd, 1);
    dup2(log_fd, 2);
    ExecChild(image, *netns);
  }
  if (*netns >= 0) close(*netns);
  close(log_fd);
  close(null_fd);
  return pid;
}

std::optional<int> ReapIfExited(pid_t pid) {
  int status = 0;
  pid_t r = waitpid(pid, &status, WNOHANG);
  if (r == pid) return ExitCode(status);
  if (r < 0 && errno == ECHILD) return -1;
  return std::nullopt;
}

int StopProcess(pid_t pid, absl::Duration grace) {
  if (pid <= 0) return -1;
  if (auto code = ReapIfExited(pid)) {
    kill(-pid, SIGKILL);  // whatever is left of its group
    return *code;
  }
  kill(-pid, SIGTERM);
  kill(pid, SIGTERM);
  absl::Time deadline = absl::Now() + grace;
  while (absl::Now() < deadline) {
    if (auto code = ReapIfExited(pid)) {
      kill(-pid, SIGKILL);
      return *code;
    }
    usleep(10'000);
  }
  kill(-pid, SIGKILL);
  kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return ExitCode(status);
}

bool ProcessAlive(pid_t pid) {
  if (pid <= 0) return false;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return false;
  size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return false;
  char state = line[paren + 2];
  return state != 'Z' && state != 'X';
}

std::string SelfExe() {
  char buf[PATH_MAX] = {};
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : std::string();
}

std::string SelfExeDir() { return std::filesystem::path(SelfExe()).parent_path(); }

}  // namespace sluice::lab
