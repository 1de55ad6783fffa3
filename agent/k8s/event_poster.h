// Posts core/v1 Events (POST /api/v1/namespaces/NS/events) about objects the agent acts on, as a
// controller's event recorder does, so that `kubectl describe pod` and `kubectl get events` say
// what the agent could not do (a Pod whose policy does not fit its map, a NetworkPolicy it cannot
// translate). From a thread of its own, so that a slow or absent apiserver never holds up the
// caller (the policy controller), through a bounded queue: when it is full the oldest event is
// dropped and counted. A post the apiserver refuses is logged and counted, not retried; callers
// post on a change of state, not on every pass.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/base/clock.h"
#include "agent/k8s/http_client.h"

namespace sluice::k8s {

// The object an event is about (its involvedObject).
struct EventObject {
  std::string kind;         // "Pod", "NetworkPolicy"
  std::string api_version;  // "v1", "networking.k8s.io/v1"
  std::string namespace_;
  std::string name;
  std::string uid;  // may be empty
};

struct EventPosterStats {
  uint64_t posted = 0;
  uint64_t failed = 0;   // refused or unanswered
  uint64_t dropped = 0;  // queue full
};

// The Event object as posted (apiVersion v1): exposed for tests.
std::string EventJson(const EventObject& obj, const std::string& type, const std::string& reason,
                      const std::string& message, const std::string& host, absl::Time now);

class EventPoster {
 public:
  // `host`: this node's name (source.host, reportingInstance).
  EventPoster(HttpClient& http, std::string host, const Clock* clock = RealClock::Get(),
              size_t max_queued = 256);
  ~EventPoster();
  EventPoster(const EventPoster&) = delete;
  EventPoster& operator=(const EventPoster&) = delete;

  // `type`: "Normal" or "Warning"; `reason`: CamelCase (PolicyMapFull).
  void Post(const EventObject& obj, std::string type, std::string reason, std::string message)
      ABSL_LOCKS_EXCLUDED(mu_);
  EventPosterStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Pending {
    EventObject obj;
    std::string type, reason, message;
    absl::Time at;
  };
  void Run();
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); }

  HttpClient& http_;
  const std::string host_;
  const Clock* clock_;
  const size_t max_queued_;
  mutable absl::Mutex mu_;
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  EventPosterStats stats_ ABSL_GUARDED_BY(mu_);
  Canceller cancel_;
  std::thread thread_;  // last: runs Run, which uses everything above
};

}  // namespace sluice::k8s
