// Link changes inside the pods' network namespaces, heard from the agent's own: one rtnetlink
// socket with NETLINK_LISTEN_ALL_NSID receives RTM_NEWLINK of every netns this one has an id for
// (a pod's gets one when its veth is made), so a pod interface changed by anything (a chained
// plugin such as tuning setting its "mac", `ip link set` inside the pod) is known at once, with
// no socket per pod and no path to any pod's netns.
#ifndef SLUICE_AGENT_KERNEL_POD_LINK_WATCH_H_
#define SLUICE_AGENT_KERNEL_POD_LINK_WATCH_H_

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace sluice::agent {

// A link that changed in another netns: its ifindex there and the id the agent's netns knows
// that netns by (a host veth's IFLA_LINK_NETNSID names the same netns with the same id).
struct PeerLinkChange {
  int netnsid = -1;
  int ifindex = 0;
  friend bool operator==(const PeerLinkChange&, const PeerLinkChange&) = default;
};

class PodLinkWatch {
 public:
  // Called on the watch's own thread with every change read in one go; `lost` when the kernel
  // dropped notifications (the socket's buffer overflowed), so that every pod must be looked at.
  using Callback = std::function<void(const std::vector<PeerLinkChange>& changes, bool lost)>;

  // Opens the socket in the calling thread's network namespace and starts the thread.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<PodLinkWatch>> Start(Callback callback);
  ~PodLinkWatch();  // stops the thread (a callback running finishes first)

  PodLinkWatch(const PodLinkWatch&) = delete;
  PodLinkWatch& operator=(const PodLinkWatch&) = delete;

 private:
  PodLinkWatch(int sock, int wake, Callback callback);
  void Run();
  // Reads what is queued: false once the socket failed for good.
  bool Drain(std::vector<PeerLinkChange>* changes, bool* lost);

  const int sock_;
  const int wake_;  // eventfd written by the destructor
  Callback callback_;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace sluice::agent

#endif  // SLUICE_AGENT_KERNEL_POD_LINK_WATCH_H_
