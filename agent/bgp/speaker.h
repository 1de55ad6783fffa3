// The node's BGP speaker, BIRD, as the agent runs it: the configuration rendered from the node's
// pod CIDR(s) and the peers (bird_config.h) is written under <state_dir>/bgp/, then a BIRD that
// is already running there (started by an earlier agent) is adopted and told to reload, or a new
// one is started. BIRD daemonizes: it outlives the agent, so an agent restart or upgrade never
// touches the sessions, as the pinned maps outlive it. While the agent runs it supervises BIRD:
// a BIRD that died is started again with -R (graceful restart recovery), and the peers, which
// kept its routes as stale meanwhile, learn them again without a withdrawal.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/base/net.h"
#include "agent/bgp/bird_config.h"
#include "agent/bgp/bird_control.h"

namespace sluice::agent::bgp {

struct SpeakerOptions {
  BgpOptions bgp;
  IpAddress router_id;              // the node's address
  std::vector<IpPrefix> pod_cidrs;  // what is announced
  std::string dir;                  // <state_dir>/bgp: bird.conf, bird.ctl, bird.pid
  std::string bird_binary = "bird";
  absl::Duration check_interval = absl::Seconds(1);
};

class Speaker {
 public:
  // Renders and writes the configuration, adopts or starts BIRD and waits until its control
  // socket answers; then supervises it from a thread of its own.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Speaker>> Start(SpeakerOptions options);
  // Stops supervising; BIRD keeps running with its sessions (graceful to the agent's restart).
  ~Speaker();

  std::string control_socket() const { return options_.dir + "/bird.ctl"; }
  // The sessions as the last check read them, and whether BIRD answered then.
  std::vector<BgpSession> sessions() const;
  bool speaker_up() const;
  uint64_t speaker_restarts() const;
  const SpeakerOptions& options() const { return options_; }

 private:
  explicit Speaker(SpeakerOptions options) : options_(std::move(options)) {}
  absl::Status Launch(bool recovery);
  void Supervise();

  const SpeakerOptions options_;
  pid_t pid_ = 0;  // BIRD's, from its pid file; only the supervising thread changes it after Start
  mutable absl::Mutex mu_;
  std::vector<BgpSession> sessions_ ABSL_GUARDED_BY(mu_);
  bool up_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t restarts_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace sluice::agent::bgp
