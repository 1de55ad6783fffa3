// The agent's record of the pod endpoints it set up: one JSON file per endpoint under
// <state_dir>/endpoints, replaced atomically, reloaded on start so a restarted agent knows every
// veth, address and endpoint id it owns. Endpoint ids are small, stable and never shared.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/kernel/netlink.h"
#include "nlohmann/json_fwd.hpp"

namespace sluice::agent {

// A pod's bandwidth limit in one direction (CNI runtimeConfig "bandwidth"): the rate asked for
// and the bucket its tbf qdisc got (docs/operating.md, "Bandwidth limits"). rate 0: no limit.
struct BandwidthLimit {
  uint64_t rate = 0;         // bits per second
  uint32_t burst_bytes = 0;  // the tbf bucket

  bool limited() const { return rate > 0; }
  friend bool operator==(const BandwidthLimit&, const BandwidthLimit&) = default;
};

struct Endpoint {
  // Key: one interface of one container.
  std::string container_id;
  std::string ifname;  // inside the pod, e.g. "eth0"

  std::string netns;  // path of the pod's network namespace
  std::string network_name;
  std::string pod_namespace;
  std::string pod_name;
  std::string host_ifname;  // host side of the veth (HostInterfaceName)
  int host_ifindex = 0;
  std::string ipv4;      // dotted quad
  std::string mac;       // pod side, "aa:bb:cc:dd:ee:ff"
  std::string host_mac;  // host side: the gateway MAC the pod sees
  uint32_t endpoint_id = 0;  // 0 = "assign one" on Put
  int mtu = 0;
  absl::Time created = absl::UnixEpoch();
  // Shaped toward the pod (tbf on the host veth, which same-node senders then reach through the
  // veth rather than bpf_redirect_peer) and from it (tbf on its interface, inside its netns).
  BandwidthLimit ingress;
  BandwidthLimit egress;

  friend bool operator==(const Endpoint&, const Endpoint&) = default;
};

nlohmann::json EndpointToJson(const Endpoint& ep);
// Never throws; rejects missing keys and wrongly typed fields.
[[nodiscard]] absl::StatusOr<Endpoint> EndpointFromJson(const nlohmann::json& j);

// Every host veth Sluice names starts with this: not "lxc", which Cilium's pod veths and its
// lxc_health use.
inline constexpr char kHostInterfacePrefix[] = "slc";

// The host-side veth name for a pod interface: "slc" + the first 11 hex digits of
// SHA-256("<container_id>/<ifname>"). 14 characters (IFNAMSIZ allows 15), identical across
// processes, hosts and versions.
std::string HostInterfaceName(absl::string_view container_id, absl::string_view ifname);
// The name agents before the "slc" prefix gave the same interface ("lxc" + the same digits).
// Endpoints recorded with it keep it (the record names the link); no new link is named so.
std::string LegacyHostInterfaceName(absl::string_view container_id, absl::string_view ifname);

// The IFLA_IFALIAS Sluice sets on both ends of a pod veth: "sluice:<container_id>/<ifname>"
// (kSluiceLinkMarkPrefix), or "sluice:sha256:<64 hex digits>" of "<container_id>/<ifname>" when
// that would not fit the kernel's 255 bytes. A link without Sluice's mark is never deleted.
std::string LinkMark(absl::string_view container_id, absl::string_view ifname);

// Thread-safe.
class EndpointStore {
 public:
  // Loads every endpoint under <state_dir>/endpoints (creating the directory, mode 0700).
  // Unparsable files are logged, counted (corrupt_files()) and left on disk for inspection;
  // leftover temporary files from an interrupted write are removed.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<EndpointStore>> Open(
      absl::string_view state_dir);

  // Creates or replaces the endpoint for (container_id, ifname) and persists it before
  // returning. endpoint_id: 0 keeps the existing endpoint's id, or assigns the smallest unused
  // id >= 1 to a new one; non-zero must not belong to another endpoint. Returns the stored value.
  [[nodiscard]] absl::StatusOr<Endpoint> Put(Endpoint ep) ABSL_LOCKS_EXCLUDED(mu_);
  std::optional<Endpoint> Get(absl::string_view container_id, absl::string_view ifname) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Removes the endpoint and its file; absent: OK.
  [[nodiscard]] absl::Status Remove(absl::string_view container_id, absl::string_view ifname)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `ep`'s record is on disk as well as in memory (CHECK): NotFound when its file is
  // gone, DataLoss when the file is unreadable or names another address, veth or endpoint id.
  [[nodiscard]] absl::Status VerifyPersisted(const Endpoint& ep) const;
  // Ordered by (container_id, ifname).
  std::vector<Endpoint> List() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

  // Files that could not be loaded at Open.
  int corrupt_files() const { return corrupt_files_; }
  const std::string& dir() const { return dir_; }

  // "<container_id>-<ifname>.json".
  static std::string FileName(absl::string_view container_id, absl::string_view ifname);

 private:
  using Key = std::pair<std::string, std::string>;  // (container_id, ifname)

  explicit EndpointStore(std::string dir) : dir_(std::move(dir)) {}
  absl::Status Load() ABSL_LOCKS_EXCLUDED(mu_);
  uint32_t NextFreeId() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string dir_;
  int corrupt_files_ = 0;  // written only during Open

  mutable absl::Mutex mu_;
  std::map<Key, Endpoint> endpoints_ ABSL_GUARDED_BY(mu_);
  std::set<uint32_t> ids_ ABSL_GUARDED_BY(mu_);
  // File name -> key: "a-b" + "c" and "a" + "b-c" share a file name; the second Put is refused.
  std::map<std::string, Key> files_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> writing_ ABSL_GUARDED_BY(mu_);  // file names a Put is writing
};

}  // namespace sluice::agent
