// Child processes of the lab: commands run to completion with their output captured (ip, the CNI
// plugin) and long-lived ones (agents, pod servers), optionally inside a network namespace.
// Everything is fork+exec with an argv; no shell ever parses a command line.
#ifndef SLUICE_AGENT_LAB_TOOLS_PROCESS_H_
#define SLUICE_AGENT_LAB_TOOLS_PROCESS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sluice::lab {

struct ProcessSpec {
  std::vector<std::string> argv;                // argv[0] is looked up in PATH when it has no '/'
  std::optional<std::vector<std::string>> env;  // "K=V" entries; nullopt: inherit ours
  std::string netns_path;  // non-empty: the child joins this network namespace before exec
  std::string stdin_data;  // RunProcess only
  std::string log_path;    // StartProcess only: stdout and stderr appended here (else /dev/null)
};

struct ProcessResult {
  int exit_code = -1;  // 128 + signal when killed by one
  std::string out;
  std::string err;
};

// Runs to completion, feeding stdin_data and capturing stdout and stderr; the child is killed
// once `timeout` passes (DeadlineExceeded).
absl::StatusOr<ProcessResult> RunProcess(const ProcessSpec& spec,
                                         absl::Duration timeout = absl::Seconds(30));
// RunProcess that also fails (with the command and its stderr) on a non-zero exit.
absl::Status RunChecked(const std::vector<std::string>& argv,
                        absl::Duration timeout = absl::Seconds(30));

// Starts in the background as the leader of a new session (so its whole process group can be
// signalled). Returns its pid; the caller reaps it (StopProcess / ReapIfExited).
absl::StatusOr<pid_t> StartProcess(const ProcessSpec& spec);
// SIGTERM to the process group, SIGKILL after `grace`, then reaps the leader. Returns the exit
// code.
int StopProcess(pid_t pid, absl::Duration grace = absl::Seconds(5));
// Non-blocking: the exit code if the child has exited (and is now reaped).
std::optional<int> ReapIfExited(pid_t pid);
// Is `pid` a live process (not gone, not a zombie)? Works for processes that are not our children.
bool ProcessAlive(pid_t pid);

// The directory of the running binary (/proc/self/exe).
std::string SelfExeDir();
std::string SelfExe();

}  // namespace sluice::lab

#endif  // SLUICE_AGENT_LAB_TOOLS_PROCESS_H_
