// The node's pod endpoints: what CNI ADD, DEL, CHECK, GC and STATUS do, from the address to the
// veth, the endpoint map entry and the attached program. The endpoint API server decodes each
// request (cni/protocol/messages.h) and calls Handle() with it; ADD answers only once the pod's
// datapath is in place.
#pragma once

#include <memory>
#include <optional>
#include <set>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/base/clock.h"
#include "agent/endpoint/endpoint_store.h"
#include "agent/endpoint/ipam.h"
#include "agent/endpoint/link_reaper.h"
#include "agent/kernel/netlink.h"
#include "agent/kernel/pod_link_watch.h"
#include "cni/protocol/messages.h"
#include "cni/protocol/netconf.h"
#include "loader/datapath.h"

namespace sluice::agent {

// Bandwidth limits (docs/operating.md, "Bandwidth limits"): the bucket a limit gets when the
// runtime gave none, at least this many bytes or 10 ms at the rate.
inline constexpr uint64_t kMinDefaultBurstBytes = 32 * 1024;
inline constexpr uint32_t kEthernetHeaderBytes = 14;
// A limit from runtimeConfig.bandwidth's rate (bits/s) and burst (bits; 0: none given).
BandwidthLimit BandwidthLimitFor(uint64_t rate_bits, uint64_t burst_bits);
// The tbf qdisc enforcing it.
TbfSpec TbfFor(const BandwidthLimit& limit);

// The parts of the node an endpoint needs to be plumbed into.
class EndpointDatapath {
 public:
  virtual ~EndpointDatapath() = default;
  [[nodiscard]] virtual absl::Status UpsertEndpoint(const IpAddress& addr,
                                                    const sluice_endpoint& value) = 0;
  // Deletes the entry for `addr` only while it still belongs to `ifindex` (a reused address may
  // already point at a newer endpoint); kAnyIfindex deletes it whatever it points at.
  static constexpr int kAnyIfindex = -1;
  [[nodiscard]] virtual absl::Status DeleteEndpoint(const IpAddress& addr, int ifindex) = 0;
  [[nodiscard]] virtual absl::Status AttachPod(int host_ifindex) = 0;
  // Whether the current pod programs are the ones attached at TC ingress and egress of
  // `host_ifindex`.
  [[nodiscard]] virtual absl::StatusOr<bool> PodProgramAttached(int host_ifindex) = 0;
  // The entry for `addr`; nullopt when there is none.
  [[nodiscard]] virtual absl::StatusOr<std::optional<sluice_endpoint>> LookupEndpoint(
      const IpAddress& addr) = 0;
  // Every IPv4 address in the endpoint map.
  [[nodiscard]] virtual absl::StatusOr<std::set<IpAddress>> EndpointAddresses() = 0;
};

// EndpointDatapath over the loaded BPF datapath.
class BpfEndpointDatapath final : public EndpointDatapath {
 public:
  explicit BpfEndpointDatapath(loader::Datapath& dp) : dp_(dp) {}
  absl::Status UpsertEndpoint(const IpAddress& addr, const sluice_endpoint& value) override;
  absl::Status DeleteEndpoint(const IpAddress& addr, int ifindex) override;
  absl::Status AttachPod(int host_ifindex) override;
  absl::StatusOr<bool> PodProgramAttached(int host_ifindex) override;
  absl::StatusOr<std::optional<sluice_endpoint>> LookupEndpoint(const IpAddress& addr) override;
  absl::StatusOr<std::set<IpAddress>> EndpointAddresses() override;

 private:
  loader::Datapath& dp_;
};

// A reader/writer lock whose every wait ends at a deadline: one request stuck while holding it
// turns later requests into "try again later" answers instead of hanging them. A waiting writer
// (GC) keeps new readers out until it gets the lock or gives up.
class DeadlineSharedMutex {
 public:
  [[nodiscard]] bool LockShared(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  void UnlockShared() ABSL_LOCKS_EXCLUDED(mu_);
  [[nodiscard]] bool Lock(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  void Unlock() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  bool CanRead() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !writer_ && writers_waiting_ == 0;
  }
  bool CanWrite() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !writer_ && readers_ == 0; }

  absl::Mutex mu_;  // held only for the bookkeeping, never across a request
  int readers_ ABSL_GUARDED_BY(mu_) = 0;
  int writers_waiting_ ABSL_GUARDED_BY(mu_) = 0;
  bool writer_ ABSL_GUARDED_BY(mu_) = false;
};

// Serialises operations on one attachment (container ID, interface name) while operations on
// other attachments proceed; a wait ends at its deadline.
class AttachmentLocks {
 public:
  class Held {
   public:
    Held(AttachmentLocks* owner, std::string key) : owner_(owner), key_(std::move(key)) {}
    Held(const Held&) = delete;
    Held& operator=(const Held&) = delete;
    ~Held() { owner_->Release(key_); }

   private:
    AttachmentLocks* owner_;
    std::string key_;
  };
  // nullptr if another holder still has the attachment at `deadline`.
  [[nodiscard]] std::unique_ptr<Held> Lock(const std::string& container_id,
                                           const std::string& ifname, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Release(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Mutex mu_;
  std::set<std::string> held_ ABSL_GUARDED_BY(mu_);
};

// Policy's part in an endpoint's life (agent/policy/sync.h). EndpointAdded runs before the
// endpoint's map entry and programs exist, so the pod's first packet already meets its policy
// state (ADD fails if it cannot be written); EndpointRemoved after its map entry is gone.
class EndpointPolicyHook {
 public:
  virtual ~EndpointPolicyHook() = default;
  [[nodiscard]] virtual absl::Status EndpointAdded(const Endpoint& ep) = 0;
  [[nodiscard]] virtual absl::Status EndpointRemoved(const Endpoint& ep) = 0;
};

struct EndpointServiceOptions {
  int default_mtu = 1500;  // pod MTU when the network configuration sets none
  // How long a request waits for the node (held exclusively by GC) or for another request on the
  // same attachment before it answers code 11 "try again later". Shorter than the plugin's own
  // deadline, so the runtime gets an answer rather than a timeout.
  absl::Duration lock_timeout = absl::Seconds(30);
  const Clock* clock = RealClock::Get();  // stamps Endpoint::created; borrowed
};

struct EndpointServiceStats {
  uint64_t adds = 0, add_failures = 0, dels = 0, checks = 0, check_failures = 0, gcs = 0;
  uint64_t gc_removed = 0;
  uint64_t add_retries_in_place = 0;    // a retried ADD answered with the existing attachment
  uint64_t lock_timeouts = 0;           // requests answered 11 because the node or attachment
                                        // stayed busy past lock_timeout
  uint64_t foreign_links_kept = 0;      // a record's host veth name held by a link that is not the
                                        // one Sluice made: left alone instead of deleted
  uint64_t other_network_requests = 0;  // DEL/CHECK naming an interface another network attached
                                        // (left alone); such an ADD counts as an add_failure
  uint64_t bad_netns = 0;               // ADD/CHECK refused (code 4) for their network namespace:
                                        // a descriptor missing, undeclared or not a network
                                        // namespace (or the node's)
  uint64_t netns_paths_opened = 0;      // ADD/CHECK of an older plugin, without a descriptor: the
                                        // agent opened CNI_NETNS itself
  uint64_t pod_mac_changes = 0;         // a pod interface's MAC changed after ADD (a chained
                                        // plugin's "mac", or anything in the pod) and the endpoint
                                        // followed it
};

class EndpointService {
 public:
  EndpointService(Netlink& netlink, Ipam& ipam, EndpointStore& store, EndpointDatapath& datapath,
                  EndpointServiceOptions options);

  // Set once, before serving (after Restore: restored endpoints keep their pinned state).
  void SetPolicyHook(EndpointPolicyHook* hook) { policy_hook_ = hook; }

  // The endpoint API handler: one decoded request in, one reply out. Never throws. `netns_fd`
  // is the descriptor the request carried (-1: none), the pod's network namespace as sluice-cni
  // opened it: ADD and CHECK use it and never open CNI_NETNS themselves; the caller closes it.
  // A request that declares one ("netnsFd") must carry it, and one that does not must carry
  // none (code 4). ADD and CHECK of a plugin that passes none (older than this agent) open the
  // path, as before.
  [[nodiscard]] cni::EndpointReply Handle(const cni::EndpointRequest& request, int netns_fd = -1);

  [[nodiscard]] absl::StatusOr<cni::ResultV1> Add(const cni::EndpointRequest& req,
                                                  const cni::NetConf& conf, int netns_fd = -1);
  [[nodiscard]] absl::Status Del(const cni::EndpointRequest& req, const cni::NetConf& conf);
  [[nodiscard]] absl::Status Check(const cni::EndpointRequest& req, const cni::NetConf& conf,
                                   int netns_fd = -1);
  [[nodiscard]] absl::Status Gc(const cni::NetConf& conf);
  [[nodiscard]] absl::Status Status();

  // After a (re)start, before serving: re-attaches the current program to every recorded pod,
  // rewrites its map entry, and removes what belongs to no live pod (records whose veth is gone,
  // map entries, links carrying Sluice's mark and addresses without a record). Recorded links
  // from before links were marked (the old "lxc" names) are adopted: marked in place.
  [[nodiscard]] absl::Status Restore();

  // The pod interfaces named by `changes` (every recorded one when `all`), read through their
  // host veths: where one's MAC is no longer the recorded one (a chained plugin such as tuning
  // set its "mac", or anything in the pod changed it), the endpoint follows it: its map entry
  // (the MAC the datapath writes on packets it delivers to the pod), the node's permanent
  // neighbour entry (node -> pod traffic, kubelet probes) and its record. The pod link watch
  // calls it as soon as a pod's link changes, so nothing waits for a CHECK.
  void FollowPodLinks(const std::vector<PeerLinkChange>& changes, bool all);

  EndpointServiceStats stats() const;
  // The background deletion of removed endpoints' veths (tests wait on it; metrics read it).
  LinkReaper& link_reaper() { return reaper_; }

 private:
  EndpointPolicyHook* policy_hook_ = nullptr;
  // A descriptor where the request declares none, or none where it declares one: code 4.
  [[nodiscard]] absl::Status CheckNetnsFd(const cni::EndpointRequest& req, int netns_fd);
  // Holds the node (shared, or exclusively for GC/Restore) and, for per-attachment requests, the
  // attachment, until destroyed; built by Enter().
  class Hold;
  [[nodiscard]] absl::StatusOr<std::unique_ptr<Hold>> Enter(bool exclusive,
                                                            const cni::EndpointRequest* req);
  // Every resource ADD made for `ep`, looked at from the node and from the pod netns (reached
  // through `pod_netns_path`): OK, or kSluiceCheckFailed naming everything missing or changed.
  [[nodiscard]] absl::Status Verify(const Endpoint& ep, const std::string& pod_netns_path);
  // The result ADD reports for `ep`, after conf's prevResult when chained.
  [[nodiscard]] absl::StatusOr<cni::ResultV1> ChainedResult(const Endpoint& ep,
                                                            const cni::NetConf& conf) const;
  // How a removed endpoint's host veth goes: deleted before the call returns (an ADD about to
  // reuse its name), or set down at once and deleted by reaper_ (DEL, GC: the answer does not
  // wait for the kernel's unregister).
  enum class VethRemoval { kNow, kInBackground };
  // Removes what ADD made for `ep`; with release_address false the IPAM reservation is kept (an
  // ADD redone for the same owner gets the same address back).
  [[nodiscard]] absl::Status RemoveEndpoint(const Endpoint& ep, VethRemoval veth,
                                            bool release_address = true);
  // Deletes the host veth named ep.host_ifname when it is the one Sluice made for `ep` (its mark,
  // or the recorded ifindex of an unmarked legacy link); any other link of that name is logged,
  // counted and left. Absent: OK.
  [[nodiscard]] absl::Status DeleteHostVeth(const Endpoint& ep, VethRemoval veth);
  [[nodiscard]] absl::Status Plumb(const Endpoint& ep);
  // The endpoint map entry of `ep` (sluice_ep4), written as recorded.
  [[nodiscard]] absl::Status WriteEndpointEntry(const Endpoint& ep);
  // With the node and `ep`'s attachment held: `ep` once it follows its pod interface's MAC as the
  // kernel has it now (unchanged when it is the recorded one).
  [[nodiscard]] absl::StatusOr<Endpoint> FollowPodMac(const Endpoint& ep);
  cni::ResultV1 ResultFor(const Endpoint& ep) const;
  [[nodiscard]] absl::Status ReleaseLeakedAddresses();
  // Endpoint map entries for addresses no recorded endpoint has.
  [[nodiscard]] absl::Status RemoveLeakedEndpointEntries();
  void Count(uint64_t EndpointServiceStats::*field);

  Netlink& netlink_;
  Ipam& ipam_;
  EndpointStore& store_;
  EndpointDatapath& datapath_;
  const EndpointServiceOptions options_;

  // ADD, DEL and CHECK of different attachments run side by side (shared hold on node_mu_, plus
  // the attachment's own lock); GC and Restore look at the whole node and hold it exclusively.
  DeadlineSharedMutex node_mu_;
  AttachmentLocks attachment_locks_;

  mutable absl::Mutex stats_mu_;
  EndpointServiceStats stats_ ABSL_GUARDED_BY(stats_mu_);

  // Last: destroyed first, deleting the veths still queued while everything above exists.
  LinkReaper reaper_{netlink_};
};

}  // namespace sluice::agent
