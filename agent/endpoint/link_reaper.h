// Deletes the host veths of removed endpoints off the request path. Deleting a veth waits in the
// kernel for an RCU grace period (10-30 ms here), most of a CNI DEL's time; setting it down takes
// well under a millisecond and already drops its route and neighbour entry and stops all traffic
// through it. So DEL sets the veth down, queues it here and answers; this thread deletes it.
//
// A queued veth keeps its name and its Sluice mark until it is gone: an ADD that wants the name
// back (a retried ADD of the same attachment) waits for it first (AwaitGone), and an agent that
// dies with veths queued finds them at its next start as marked links without a record, which
// Restore deletes.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/kernel/netlink.h"
#include "agent/kernel/netns.h"

namespace sluice::agent {

struct LinkReaperStats {
  uint64_t queued = 0;   // veths handed over
  uint64_t deleted = 0;  // deleted by the reaper
  uint64_t gone = 0;     // already gone, or the name now belongs to another link: not touched
  uint64_t failed = 0;   // the delete failed (logged); Restore retries at the next start
};

class LinkReaper {
 public:
  explicit LinkReaper(Netlink& netlink);
  // Deletes what is still queued, then stops the thread.
  ~LinkReaper();
  LinkReaper(const LinkReaper&) = delete;
  LinkReaper& operator=(const LinkReaper&) = delete;

  // Queues the veth `link` (already down, its ownership checked by the caller) of the calling
  // thread's network namespace for deletion. If that namespace cannot be opened the veth is
  // deleted now, on the caller's thread.
  [[nodiscard]] absl::Status Enqueue(const LinkInfo& link);

  // Waits until no veth named `ifname` is queued or being deleted (it is moved to the front of
  // the queue). False if one still is at `deadline`.
  [[nodiscard]] bool AwaitGone(const std::string& ifname, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until the queue is empty and nothing is being deleted. False at `deadline`.
  [[nodiscard]] bool AwaitIdle(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

  size_t pending() const ABSL_LOCKS_EXCLUDED(mu_);
  LinkReaperStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Item {
    int ifindex = 0;
    std::string name;
    std::string alias;
    NetnsFd netns;  // where the veth is
  };
  void Run();
  // Deletes `item`'s veth when the link of that name in its namespace is still the queued one.
  // Returns the counter of the outcome.
  uint64_t LinkReaperStats::*Delete(const Item& item);
  bool QueuedOrInFlight(const std::string& ifname) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Netlink& netlink_;
  mutable absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  std::string in_flight_ ABSL_GUARDED_BY(mu_);  // the name being deleted, or empty
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  LinkReaperStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace sluice::agent
