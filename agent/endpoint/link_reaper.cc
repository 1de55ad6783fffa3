#include "agent/endpoint/link_reaper.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "spdlog/spdlog.h"

namespace sluice::agent {

LinkReaper::LinkReaper(Netlink& netlink) : netlink_(netlink), thread_([this] { Run(); }) {}

LinkReaper::~LinkReaper() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

absl::Status LinkReaper::Enqueue(const LinkInfo& link) {
  absl::StatusOr<NetnsFd> netns = NetnsFd::Open("/proc/thread-self/ns/net");
  if (!netns.ok()) {
    spdlog::warn("deleting {} now: cannot open this thread's network namespace: {}", link.name,
                 std::string(netns.status().message()));
    return netlink_.DeleteLinkByIndex(link.ifindex);
  }
  absl::MutexLock l(&mu_);
  queue_.push_back(Item{link.ifindex, link.name, link.alias, *std::move(netns)});
  ++stats_.queued;
  return absl::OkStatus();
}

bool LinkReaper::QueuedOrInFlight(const std::string& ifname) const {
  if (in_flight_ == ifname) return true;
  return std::any_of(queue_.begin(), queue_.end(),
                     [&](const Item& item) { return item.name == ifname; });
}

bool LinkReaper::AwaitGone(const std::string& ifname, absl::Time deadline) {
  absl::MutexLock l(&mu_);
  auto it = std::find_if(queue_.begin(), queue_.end(),
                         [&](const Item& item) { return item.name == ifname; });
  if (it != queue_.end() && it != queue_.begin()) {
    Item item = std::move(*it);
    queue_.erase(it);
    queue_.push_front(std::move(item));
  }
  auto gone = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !QueuedOrInFlight(ifname); };
  return mu_.AwaitWithDeadline(absl::Condition(&gone), deadline);
}

bool LinkReaper::AwaitIdle(absl::Time deadline) {
  absl::MutexLock l(&mu_);
  auto idle = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.empty() && in_flight_.empty();
  };
  return mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

size_t LinkReaper::pending() const {
  absl::MutexLock l(&mu_);
  return queue_.size() + (in_flight_.empty() ? 0 : 1);
}

LinkReaperStats LinkReaper::stats() const {
  absl::MutexLock l(&mu_);
  return stats_;
}

void LinkReaper::Run() {
  for (;;) {
    Item item;
    {
      absl::MutexLock l(&mu_);
      auto ready = [&]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      // Stopping drains the queue first: the agent's veths of removed pods go with it.
      if (queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
      in_flight_ = item.name;
    }
    uint64_t LinkReaperStats::*outcome = Delete(item);
    // Counted and no longer in flight at once: a reader never sees one without the other.
    absl::MutexLock l(&mu_);
    ++(stats_.*outcome);
    in_flight_.clear();
  }
}

uint64_t LinkReaperStats::*LinkReaper::Delete(const Item& item) {
  // This thread is the reaper's own: it joins the veth's namespace when it is not in it already
  // (an agent serves one; tests serve several) so the netlink calls below, which act on the
  // calling thread's, reach it.
  absl::StatusOr<NetnsFd::Identity> here = CurrentNetnsIdentity();
  absl::StatusOr<NetnsFd::Identity> there = item.netns.identity();
  bool same = here.ok() && there.ok() && *here == *there;
  if (!same && setns(item.netns.get(), CLONE_NEWNET) != 0) {
    spdlog::warn("cannot delete {} (ifindex {}): setns: {}", item.name, item.ifindex,
                 std::strerror(errno));
    return &LinkReaperStats::failed;
  }
  // Only the veth that was queued: one that took its name since is another's business.
  absl::StatusOr<LinkInfo> now = netlink_.LinkByName(item.name);
  if (!now.ok() && !absl::IsNotFound(now.status())) {
    spdlog::warn("cannot look at {} (ifindex {}): {}; the agent's next start removes it", item.name,
                 item.ifindex, std::string(now.status().message()));
    return &LinkReaperStats::failed;
  }
  if (!now.ok() || now->ifindex != item.ifindex || now->alias != item.alias) {
    return &LinkReaperStats::gone;
  }
  if (absl::Status st = netlink_.DeleteLinkByIndex(item.ifindex); !st.ok()) {
    spdlog::warn("cannot delete {} (ifindex {}): {}; the agent's next start removes it", item.name,
                 item.ifindex, std::string(st.message()));
    return &LinkReaperStats::failed;
  }
  return &LinkReaperStats::deleted;
}

}  // namespace sluice::agent
