#include "agent/bgp/speaker.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "agent/base/deadline.h"
#include "agent/base/errno.h"
#include "agent/base/files.h"
#include "spdlog/spdlog.h"

extern char** environ;

namespace sluice::agent::bgp {
namespace {

// A live process (not a zombie) whose command is BIRD's: a pid file left by a BIRD that is gone
// may name a pid the kernel has since given to another process.
bool BirdAlive(pid_t pid, const std::string& binary) {
  if (pid <= 1 || kill(pid, 0) != 0) return false;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  std::getline(stat, line);
  size_t close_paren = line.rfind(')');
  if (close_paren == std::string::npos || close_paren + 2 >= line.size() ||
      line[close_paren + 2] == 'Z') {
    return false;
  }
  size_t open_paren = line.find('(');
  std::string comm = line.substr(open_paren + 1, close_paren - open_paren - 1);
  std::string base = binary.substr(binary.rfind('/') + 1);
  return comm == base.substr(0, 15);
}

pid_t ReadPidFile(const std::string& path) {
  auto text = ReadSmallFile(path);
  int pid = 0;
  if (!text.ok() || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &pid)) return 0;
  return pid;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Speaker>> Speaker::Start(SpeakerOptions options) {
  auto config = RenderBirdConfig(options.bgp, options.router_id, options.pod_cidrs);
  if (!config.ok()) return config.status();
  if (auto st = MakeDirs(options.dir); !st.ok()) return st;
  // 0600: it may hold the sessions' password.
  if (auto st =
          WriteFileAtomically(options.dir, "bird.conf", *config, 0600, Durability::kProcessCrash);
      !st.ok()) {
    return st;
  }
  std::unique_ptr<Speaker> speaker(new Speaker(std::move(options)));
  Speaker& s = *speaker;
  s.pid_ = ReadPidFile(s.options_.dir + "/bird.pid");
  if (BirdAlive(s.pid_, s.options_.bird_binary)) {
    auto reply = BirdCommand(s.control_socket(), "configure");
    if (!reply.ok()) {
      return absl::Status(reply.status().code(), absl::StrCat("reload BIRD (pid ", s.pid_,
                                                              "): ", reply.status().message()));
    }
    spdlog::info("BGP: adopted BIRD (pid {}) with its sessions: {}", s.pid_,
                 absl::StrJoin(*reply, "; "));
  } else {
    // No BIRD: a first start, or one that died with the node's routes still in the kernel and
    // the peers holding ours as stale; recovery mode in both cases costs nothing.
    if (auto st = s.Launch(/*recovery=*/true); !st.ok()) return st;
  }
  {
    absl::MutexLock lock(&s.mu_);
    s.up_ = true;
  }
  s.thread_ = std::thread([&s] { s.Supervise(); });
  return speaker;
}

Speaker::~Speaker() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status Speaker::Launch(bool recovery) {
  std::string conf = options_.dir + "/bird.conf";
  std::string pidfile = options_.dir + "/bird.pid";
  std::vector<std::string> args = {options_.bird_binary, "-c", conf,   "-s",
                                   control_socket(),     "-P", pidfile};
  if (recovery) args.push_back("-R");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // The agent blocks its stop signals (to sigwait them): BIRD gets the default mask and
  // dispositions, so SIGTERM stops it as it would anywhere.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t child = 0;
  // BIRD forks itself into the background: the child we spawn exits once its daemon runs.
  int err = posix_spawnp(&child, args[0].c_str(), nullptr, &attr, argv.data(), environ);
  posix_spawnattr_destroy(&attr);
  if (err != 0) return ErrnoStatus(err, absl::StrCat("start ", args[0]));
  int status = 0;
  while (waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) return ErrnoStatus(errno, "wait for BIRD to daemonize");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat("`", absl::StrJoin(args, " "), "` failed (status ",
                                            status, "): see its log (syslog or stderr)"));
  }
  const absl::Time deadline = WaitDeadline(absl::Seconds(10));
  absl::Status last;
  while (!WaitDeadlinePassed(deadline)) {
    auto reply = BirdCommand(control_socket(), "show status", absl::Seconds(1));
    if (reply.ok()) {
      pid_ = ReadPidFile(pidfile);
      spdlog::info("BGP: started BIRD (pid {}{}), {} peer(s), announcing {}", pid_,
                   recovery ? ", graceful restart recovery" : "", options_.bgp.peers.size(),
                   absl::StrJoin(options_.pod_cidrs, ", ", [](std::string* out, const IpPrefix& p) {
                     out->append(p.ToString());
                   }));
      return absl::OkStatus();
    }
    last = reply.status();
    usleep(50'000);
  }
  return absl::DeadlineExceededError(
      absl::StrCat("BIRD's control socket never answered: ", last.ToString()));
}

void Speaker::Supervise() {
  std::vector<std::string> last_states;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.check_interval)) return;
    }
    bool alive = BirdAlive(pid_, options_.bird_binary);
    if (!alive) {
      spdlog::warn("BGP: BIRD (pid {}) is gone: starting it again (graceful restart recovery)",
                   pid_);
      {
        absl::MutexLock lock(&mu_);
        ++restarts_;
        up_ = false;
        sessions_.clear();
      }
      if (auto st = Launch(/*recovery=*/true); !st.ok()) {
        spdlog::error("BGP: {}", st.ToString());
        continue;
      }
    }
    auto reply = BirdCommand(control_socket(), "show protocols");
    std::vector<BgpSession> sessions;
    if (reply.ok()) sessions = ParseBgpSessions(*reply);
    std::vector<std::string> states;
    for (const auto& s : sessions) states.push_back(absl::StrCat(s.name, " ", s.info));
    if (states != last_states) {
      spdlog::info("BGP sessions: {}", states.empty() ? "none" : absl::StrJoin(states, ", "));
      last_states = states;
    }
    absl::MutexLock lock(&mu_);
    up_ = reply.ok();
    sessions_ = std::move(sessions);
  }
}

std::vector<BgpSession> Speaker::sessions() const {
  absl::MutexLock lock(&mu_);
  return sessions_;
}

bool Speaker::speaker_up() const {
  absl::MutexLock lock(&mu_);
  return up_;
}

uint64_t Speaker::speaker_restarts() const {
  absl::MutexLock lock(&mu_);
  return restarts_;
}

}  // namespace sluice::agent::bgp
