// The lab's stand-in for a DaemonSet's restartPolicy: Always. The control plane restarts a node's
// agent whenever it exits (kill -9, crash, SIGTERM), after a back-off that doubles while the
// agent keeps dying young and resets once it has stayed up; a hold file
// (<node>/agent.hold, written by `sluice-lab agent stop`) keeps it down until `agent start`.
#ifndef SLUICE_AGENT_LAB_WORKLOADS_SUPERVISOR_H_
#define SLUICE_AGENT_LAB_WORKLOADS_SUPERVISOR_H_

#include <string>

#include "absl/time/time.h"
#include "agent/base/backoff.h"

namespace sluice::lab {

struct RestartPolicy {
  absl::Duration initial = absl::Milliseconds(200);  // first restart after an exit
  absl::Duration cap = absl::Seconds(5);             // kubelet's is 5 min; the lab is impatient
  // An agent that ran at least this long before exiting restarts after `initial` again.
  absl::Duration stable_after = absl::Seconds(3);
};

// When one agent is due to be started again: the project's back-off (doubling, no jitter),
// restarted by the agent's own uptime rather than by a clock. Pure (time is passed in), so it is
// unit-tested.
class RestartBackoff {
 public:
  RestartBackoff() : RestartBackoff(RestartPolicy{}) {}
  explicit RestartBackoff(RestartPolicy policy)
      : policy_(policy),
        backoff_({.initial = policy.initial,
                  .factor = 2.0,
                  .cap = policy.cap,
                  .jitter = 0.0,
                  .reset_after = absl::InfiniteDuration()},
                 /*clock=*/nullptr, /*random=*/nullptr) {}
  void Started(absl::Time now) { started_ = now; }
  // The agent exited at `now`: returns when to start it again.
  absl::Time Exited(absl::Time now) {
    if (now - started_ >= policy_.stable_after) backoff_.Reset();
    ++restarts_;
    return now + backoff_.Next();
  }
  int restarts() const { return restarts_; }

 private:
  RestartPolicy policy_;
  Backoff backoff_;
  absl::Time started_ = absl::InfinitePast();
  int restarts_ = 0;
};

// <node dir>/agent.hold: present while the agent is meant to stay down.
inline std::string AgentHoldPath(const std::string& node_dir) { return node_dir + "/agent.hold"; }

}  // namespace sluice::lab

#endif  // SLUICE_AGENT_LAB_WORKLOADS_SUPERVISOR_H_
