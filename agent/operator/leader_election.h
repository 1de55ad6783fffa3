// Leader election through a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it:
// a candidate takes the Lease when its holder has not renewed it for leaseDurationSeconds, as
// measured on the candidate's own clock from when it last saw the record change (holders' clocks
// are never compared); the holder renews every retry_period and steps down once it has failed to
// renew for renew_deadline. Every write carries the resourceVersion it read, so two candidates
// racing for one Lease cannot both win: the loser's write is a 409 Conflict.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "agent/base/clock.h"

namespace sluice::k8s {
class HttpClient;
}

namespace sluice::agent {

// The Lease's spec, plus the resourceVersion it was read at.
struct LeaseRecord {
  std::string holder;  // spec.holderIdentity ("" = released)
  absl::Duration lease_duration = absl::ZeroDuration();
  absl::Time acquire_time = absl::UnixEpoch();
  absl::Time renew_time = absl::UnixEpoch();
  int transitions = 0;
  std::string resource_version;

  bool operator==(const LeaseRecord&) const = default;
};

// Where the Lease lives. Create fails with AlreadyExists and Update with Aborted (409 Conflict)
// when someone else wrote first.
class LeaseClient {
 public:
  virtual ~LeaseClient() = default;
  // nullopt when the Lease does not exist.
  virtual absl::StatusOr<std::optional<LeaseRecord>> Get() = 0;
  virtual absl::StatusOr<LeaseRecord> Create(const LeaseRecord& record) = 0;
  virtual absl::StatusOr<LeaseRecord> Update(const LeaseRecord& record) = 0;
};

// The Lease NAMESPACE/NAME through the apiserver.
std::unique_ptr<LeaseClient> NewKubernetesLeaseClient(k8s::HttpClient* http, std::string ns,
                                                      std::string name);

struct ElectionOptions {
  std::string identity;
  absl::Duration lease_duration = absl::Seconds(15);
  absl::Duration renew_deadline = absl::Seconds(10);
  absl::Duration retry_period = absl::Seconds(2);
  const Clock* clock = RealClock::Get();

  // lease_duration > renew_deadline > retry_period > 0, identity set (client-go's checks).
  absl::Status Validate() const;
};

struct ElectionCounters {
  uint64_t attempts = 0;
  uint64_t acquisitions = 0;
  uint64_t renewals = 0;
  uint64_t failed_writes = 0;  // conflicts and errors
};

class LeaderElector {
 public:
  enum class State { kFollower, kLeader, kLost };

  LeaderElector(LeaseClient* client, ElectionOptions options);

  // One attempt to take or renew the Lease; true when this candidate holds it afterwards.
  bool TryAcquireOrRenew();
  // One step of the loop: a follower tries to acquire; a leader renews and becomes kLost once
  // it has not renewed for renew_deadline. kLost is final.
  State Tick();
  // Ticks every retry_period until `stop` (returns kFollower or kLeader) or the lease is lost
  // (kLost). `on_leading` runs on this thread once, when the Lease is first acquired.
  State Run(absl::Notification& stop, const std::function<void()>& on_leading);
  // Gives the Lease up (holder "", a 1 s duration) if this candidate holds it, so another takes
  // over at once (client-go's ReleaseOnCancel).
  absl::Status Release();

  State state() const { return state_; }
  const ElectionCounters& counters() const { return counters_; }
  const std::optional<LeaseRecord>& observed() const { return observed_; }

 private:
  LeaseClient* const client_;
  const ElectionOptions options_;
  State state_ = State::kFollower;
  std::optional<LeaseRecord> observed_;
  absl::Time observed_time_ = absl::InfinitePast();
  absl::Time last_renew_ = absl::InfinitePast();
  ElectionCounters counters_;
};

}  // namespace sluice::agent
