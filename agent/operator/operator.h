// sluice-operator: cluster-pool IPAM behind a Lease. The elected replica watches Nodes and writes
// each Node without one a spec.podCIDR (and spec.podCIDRs) carved out of the cluster pool by
// AllocateNodeCidrs; agents keep reading spec.podCIDR (ipam_mode=kubernetes). The API is the only
// state: every round allocates from a fresh LIST (not the watch cache, which may lag behind the
// previous leader's last writes) and every PATCH carries the Node's resourceVersion, so a Node
// that changed since the LIST is a 409 and is redone next round, never given a second CIDR.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "agent/k8s/model.h"
#include "agent/k8s/store.h"
#include "agent/operator/cluster_pool.h"
#include "agent/operator/leader_election.h"

namespace sluice::k8s {
class HttpClient;
class Reflector;
}  // namespace sluice::k8s

namespace sluice::agent {

struct OperatorOptions {
  ClusterPool pool;
  ElectionOptions election;
  std::string lease_namespace = "kube-system";
  std::string lease_name = "sluice-operator";
  absl::Duration resync = absl::Seconds(30);  // a round at least this often while leading
  bool release_on_stop = true;                // Stop() gives the Lease up for a fast handover
};

struct OperatorCounters {
  uint64_t rounds = 0;           // allocation rounds run
  uint64_t patched = 0;          // Nodes given a pod CIDR
  uint64_t patch_conflicts = 0;  // 409: the Node changed since the LIST; redone next round
  uint64_t patch_errors = 0;     // other failures (and failed LISTs)
  uint64_t exhausted_nodes = 0;  // Nodes the last round left without a CIDR: the pool is full
  uint64_t foreign_nodes = 0;    // Nodes whose spec.podCIDR the pool does not account for
  uint64_t free_cidrs = 0;       // node CIDRs still free after the last round
};

class Operator {
 public:
  Operator(k8s::HttpClient* http, OperatorOptions options);
  ~Operator();
  Operator(const Operator&) = delete;
  Operator& operator=(const Operator&) = delete;

  void Start();
  // Stops electing and allocating (thread-safe; returns once stopped); with release_on_stop and
  // the Lease held, releases it.
  // `release` false: leave the Lease to expire (what a crash looks like to the others).
  void Stop(bool release = true);
  // Blocks until the election ends: kLost (renewal failed: the binary exits non-zero) or, after
  // Stop(), the last state.
  LeaderElector::State Wait();

  bool leading() const { return leading_.load(); }
  OperatorCounters counters() const;
  // The election loop has ended (the Lease was lost, or Stop()).
  bool election_ended() const;
  // Why the leader's last allocation round failed to list the Nodes; "" when it did not.
  std::string last_error() const;

 private:
  void ElectionLoop();
  void StartLeading();
  void StopLeading();
  void AllocateLoop();
  void AllocateRound();
  void Poke();

  k8s::HttpClient* const http_;
  const OperatorOptions options_;
  std::unique_ptr<LeaseClient> lease_client_;
  LeaderElector elector_;
  std::mutex stop_mu_;
  absl::Notification stop_;
  std::atomic<bool> release_{true};
  std::atomic<bool> leading_{false};
  std::thread election_thread_;
  std::thread allocate_thread_;
  std::unique_ptr<k8s::Store<k8s::Node>> nodes_;  // the watch: a change starts a round
  std::unique_ptr<k8s::Reflector> reflector_;
  absl::Notification allocate_stop_;

  mutable absl::Mutex mu_;
  bool dirty_ ABSL_GUARDED_BY(mu_) = true;
  bool retry_soon_ ABSL_GUARDED_BY(mu_) = false;  // the last round failed: again in retry_period
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  LeaderElector::State final_state_ ABSL_GUARDED_BY(mu_) = LeaderElector::State::kFollower;
  OperatorCounters counters_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> last_exhausted_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::agent
