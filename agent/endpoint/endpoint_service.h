// The node's pod endpoints: what CNI ADD, DEL, CHECK, GC and STATUS do, from the address to the
// veth, the endpoint map entry and the attached program. The endpoint API server calls Handle();
// ADD answers only once the pod's datapath is in place.
#pragma once

#include <memory>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "agent/endpoint/endpoint_store.h"
#include "agent/endpoint/ipam.h"
#include "agent/kernel/netlink.h"
#include "cni/endpoint_protocol.h"
#include "cni/netconf.h"
#include "loader/datapath.h"
#include "nlohmann/json.hpp"

namespace sluice::agent {

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
  absl::StatusOr<std::set<IpAddress>> EndpointAddresses() override;

 private:
  loader::Datapath& dp_;
};

// Serialises operations on one attachment (container ID, interface name) while operations on
// other attachments proceed.
class AttachmentLocks {
 public:
  class Held {
   public:
    Held(AttachmentLocks* owner, std::string key, absl::Mutex* mu)
        : owner_(owner), key_(std::move(key)), mu_(mu) {}
    Held(const Held&) = delete;
    Held& operator=(const Held&) = delete;
    ~Held() { owner_->Release(key_, mu_); }

   private:
    AttachmentLocks* owner_;
    std::string key_;
    absl::Mutex* mu_;
  };
  [[nodiscard]] std::unique_ptr<Held> Lock(const std::string& container_id,
                                           const std::string& ifname);

 private:
  struct Entry {
    absl::Mutex mu;
    int users = 0;
  };
  void Release(const std::string& key, absl::Mutex* mu);
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
};

struct EndpointServiceOptions {
  int default_mtu = 1500;  // pod MTU when the network configuration sets none
};

struct EndpointServiceStats {
  uint64_t adds = 0, add_failures = 0, dels = 0, checks = 0, check_failures = 0, gcs = 0;
  uint64_t gc_removed = 0;
};

class EndpointService {
 public:
  EndpointService(Netlink& netlink, Ipam& ipam, EndpointStore& store, EndpointDatapath& datapath,
                  EndpointServiceOptions options);

  // The endpoint API handler: one protocol request in, one reply out. Never throws.
  nlohmann::json Handle(const nlohmann::json& request);

  [[nodiscard]] absl::StatusOr<cni::ResultV1> Add(const cni::EndpointRequest& req,
                                                  const cni::NetConf& conf);
  [[nodiscard]] absl::Status Del(const cni::EndpointRequest& req, const cni::NetConf& conf);
  [[nodiscard]] absl::Status Check(const cni::EndpointRequest& req, const cni::NetConf& conf);
  [[nodiscard]] absl::Status Gc(const cni::NetConf& conf);
  [[nodiscard]] absl::Status Status();

  // After a (re)start, before serving: re-attaches the current program to every recorded pod,
  // rewrites its map entry, and removes what belongs to no live pod (records whose veth is gone,
  // map entries, lxc links and addresses without a record).
  [[nodiscard]] absl::Status Restore();

  EndpointServiceStats stats() const;

 private:
  [[nodiscard]] absl::Status RemoveEndpoint(const Endpoint& ep);
  [[nodiscard]] absl::Status Plumb(const Endpoint& ep);
  cni::ResultV1 ResultFor(const Endpoint& ep) const;
  [[nodiscard]] absl::Status ReleaseLeakedAddresses();
  void Count(uint64_t EndpointServiceStats::*field);

  Netlink& netlink_;
  Ipam& ipam_;
  EndpointStore& store_;
  EndpointDatapath& datapath_;
  const EndpointServiceOptions options_;

  // ADD, DEL and CHECK of different attachments run side by side (shared hold on node_mu_, plus
  // the attachment's own lock); GC and Restore look at the whole node and hold it exclusively.
  absl::Mutex node_mu_;
  AttachmentLocks attachment_locks_;

  mutable absl::Mutex stats_mu_;
  EndpointServiceStats stats_ ABSL_GUARDED_BY(stats_mu_);
};

}  // namespace sluice::agent
