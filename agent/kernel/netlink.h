// The agent's kernel-networking boundary: links, addresses, routes, neighbours and sysctls for
// pod veths and the node's own devices. `Netlink` is the interface the rest of the agent uses
// (fakes in unit tests); `LibnlNetlink` is the real implementation over libnl-route-3.
#ifndef SLUICE_AGENT_NETLINK_H_
#define SLUICE_AGENT_NETLINK_H_

#include <array>
#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/base/net.h"

namespace sluice::agent {

// An address assigned to an interface: unlike IpPrefix (a canonical network), the host bits are
// kept ("172.31.0.2/24").
struct InterfaceAddress {
  IpAddress address;
  int prefix_len = 32;

  // Parses "10.244.0.7/32"; without "/len" the full length of the family is used.
  [[nodiscard]] static absl::StatusOr<InterfaceAddress> Parse(absl::string_view text);
  // `address` with the full length of its family (/32 or /128).
  static InterfaceAddress Host(const IpAddress& address);

  std::string ToString() const;

  friend bool operator==(const InterfaceAddress&, const InterfaceAddress&) = default;
};

struct LinkInfo {
  std::string name;
  int ifindex = 0;
  MacAddress mac;
  uint32_t mtu = 0;
  bool up = false;    // IFF_UP (administratively up)
  std::string alias;  // IFLA_IFALIAS (`ip link set NAME alias ...`); Sluice's links carry its mark
  // A veth's other end (IFLA_LINK) and, when that end is in another netns, the id this netns
  // knows that netns by (IFLA_LINK_NETNSID; -1: the same netns, or not a veth).
  int peer_ifindex = 0;
  int peer_netnsid = -1;
};

// Every link Sluice creates for a pod carries an IFLA_IFALIAS starting with this ("sluice:" +
// container id + "/" + ifname, see LinkMark in agent/endpoint/endpoint_store.h); the agent never
// deletes a link without it. Other plugins' links (Cilium's lxc*, lxc_health) have none.
inline constexpr char kSluiceLinkMarkPrefix[] = "sluice:";

struct PodVethSpec {
  std::string host_ifname;     // e.g. "slc1a2b3c4d5e6" (<= 15 bytes), in the caller's netns
  std::string pod_netns_path;  // e.g. "/var/run/netns/p1" or "/proc/1234/ns/net"
  std::string pod_ifname;      // e.g. "eth0", created directly in the pod netns
  uint32_t mtu = 1500;         // applied to both ends
  std::string alias;           // Sluice's mark, set as IFLA_IFALIAS on both ends (< 256 bytes)
};

struct PodVeth {
  int host_ifindex = 0;
  MacAddress host_mac;
  int pod_ifindex = 0;
  MacAddress pod_mac;
};

struct PodInterfaceConfig {
  std::string netns_path;
  std::string ifname;
  IpAddress address;  // configured as address/32
  IpAddress gateway;  // reached through a scope-link host route on ifname
  uint32_t mtu = 1500;
};

struct RouteInfo {
  IpPrefix dst;                      // 0.0.0.0/0 for the default route
  std::optional<IpAddress> gateway;  // unset for a directly connected route
  int oif = 0;                       // ifindex of the (first) next hop
  uint8_t scope = 0;                 // RT_SCOPE_*
  uint32_t table = 0;                // RT_TABLE_*
  uint8_t protocol = 0;              // RTPROT_*; kSluiceRouteProtocol for Sluice's own
};

// The rtm_protocol of routes Sluice installs (to other nodes' pod CIDRs), so it can tell its own
// routes from everyone else's: `ip route show proto 181`.
inline constexpr uint8_t kSluiceRouteProtocol = 181;

// The node's VXLAN device in tunnel mode (docs/routing.md): collect_md ("external", the tunnel
// key of each packet names the remote end), no learning, UDP `port`.
struct VxlanSpec {
  std::string name;  // e.g. "sluice_vxlan"
  uint16_t port = 8472;
  uint32_t mtu = 1450;
  std::string alias;  // Sluice's mark on the device (IFLA_IFALIAS)
};

// What a pod interface looks like from inside its netns (for CNI CHECK).
struct PodInterface {
  LinkInfo link;
  std::vector<InterfaceAddress> addresses;  // of every family, in kernel order
  std::vector<RouteInfo> routes;  // main-table IPv4 routes whose next hop is this interface
};

// A neighbour entry the kernel holds for an interface.
struct NeighbourInfo {
  IpAddress address;
  MacAddress mac;
  bool permanent = false;  // NUD_PERMANENT
};

// What the host side of a pod veth looks like (for CNI CHECK).
struct HostVeth {
  LinkInfo link;
  std::vector<RouteInfo> routes;          // main-table IPv4 routes whose next hop is this link
  std::vector<NeighbourInfo> neighbours;  // IPv4 neighbour entries on this link
};

// A token-bucket (tbf) root qdisc shaping what an interface sends: a pod's bandwidth limit in one
// direction (docs/operating.md, "Bandwidth limits").
struct TbfSpec {
  uint64_t rate_bytes = 0;   // bytes per second
  uint32_t burst_bytes = 0;  // the bucket: sent at line rate before the rate applies
  uint32_t limit_bytes = 0;  // bytes queued waiting for tokens; more are dropped

  friend bool operator==(const TbfSpec&, const TbfSpec&) = default;
};

// The kernel-networking operations of the agent. Host-side operations act in the network
// namespace of the calling thread (the agent itself may run inside a node netns); pod-side
// operations take the path of the pod's netns and never move the calling thread.
// Errors: NotFound (missing link or netns), AlreadyExists (a name is taken), otherwise the libnl
// or errno text plus what was being done.
class Netlink {
 public:
  virtual ~Netlink() = default;

  // Creates a veth pair whose peer is created directly inside the pod netns (one RTM_NEWLINK;
  // never created in the host netns and moved), then marks both ends with spec.alias (the kernel
  // ignores IFLA_IFALIAS in a create request, so this is a second request; a failure removes the
  // pair). AlreadyExists if pod_ifname exists in the pod netns. A host_ifname that exists is
  // deleted and the creation retried once only when it is a stale veth carrying exactly
  // spec.alias (left by a crashed attempt); any other link of that name is left alone and the
  // call fails with AlreadyExists naming it.
  [[nodiscard]] virtual absl::StatusOr<PodVeth> CreatePodVeth(const PodVethSpec& spec) = 0;

  // Inside the pod netns: MTU, address/32, link up, `gateway/32 dev ifname scope link`,
  // `default via gateway dev ifname`, IPv6 disabled on ifname. lo is left to the runtime.
  // Idempotent.
  [[nodiscard]] virtual absl::Status ConfigurePodInterface(const PodInterfaceConfig& config) = 0;

  // On the host side of a pod veth: link up, `pod_addr/32 dev host_ifname scope link`
  // (replaced if present), rp_filter=0, forwarding=1, and a permanent neighbour entry
  // pod_addr -> pod_mac so the node never ARPs for its pods. Idempotent.
  [[nodiscard]] virtual absl::Status ConfigureHostVeth(const std::string& host_ifname,
                                                       const IpAddress& pod_addr,
                                                       const MacAddress& pod_mac) = 0;

  // Deletes a link of the caller's netns; an absent link is OK. Deleting either end of a veth
  // removes the other end too.
  [[nodiscard]] virtual absl::Status DeleteLink(const std::string& ifname) = 0;
  // The same by ifindex, for a link whose ownership the caller has just checked: a link that
  // took the name since is not touched. An absent ifindex is OK.
  [[nodiscard]] virtual absl::Status DeleteLinkByIndex(int ifindex) = 0;
  // Sets the link `ifindex` of the caller's netns down: the kernel drops the routes through it and
  // its neighbour entries at once, and no packet crosses it any more (a down veth carries nothing
  // either way). Much cheaper than deleting it, whose unregister waits for an RCU grace period.
  // An absent ifindex is OK.
  [[nodiscard]] virtual absl::Status SetLinkDown(int ifindex) = 0;

  // Sets IFLA_IFALIAS of the link `ifindex` of the caller's netns (adopting a link created before
  // Sluice marked its links).
  [[nodiscard]] virtual absl::Status SetLinkAlias(int ifindex, const std::string& alias) = 0;

  // The link `ifname` of the caller's netns, or NotFound.
  [[nodiscard]] virtual absl::StatusOr<LinkInfo> LinkByName(const std::string& ifname) = 0;

  // Whether `ifname` exists in the netns at `netns_path` (NotFound if the netns does not).
  [[nodiscard]] virtual absl::StatusOr<bool> LinkExistsInNetns(const std::string& netns_path,
                                                               const std::string& ifname) = 0;

  // Links of the caller's netns whose name starts with `prefix` ("" for all), with their
  // aliases, by ifindex.
  [[nodiscard]] virtual absl::StatusOr<std::vector<LinkInfo>> ListLinks(
      absl::string_view prefix) = 0;

  // The other end of the veth `host_ifname` (a pod interface), read from the caller's netns
  // through the id it knows the pod's netns by (RTM_GETLINK with IFLA_TARGET_NETNSID): no path to
  // the pod's netns is needed, so it works for every live pod, also after an agent restart.
  // NotFound if either end is gone.
  [[nodiscard]] virtual absl::StatusOr<LinkInfo> PeerLink(const std::string& host_ifname) = 0;

  // The link, its addresses and its IPv4 main-table routes, seen from inside the pod netns.
  [[nodiscard]] virtual absl::StatusOr<PodInterface> GetPodInterface(const std::string& netns_path,
                                                                     const std::string& ifname) = 0;

  // The host side of a pod veth in the caller's netns: the link, its routes and neighbours;
  // NotFound if the link does not exist.
  [[nodiscard]] virtual absl::StatusOr<HostVeth> GetHostVeth(const std::string& host_ifname) = 0;

  // Ensures a dummy device `name` exists, is up and carries `addr` (e.g. the pods' gateway as
  // /32). On kernels without CONFIG_DUMMY the device is one end of a veth pair whose idle peer is
  // HostDevicePeerName(name) (both up), like Cilium's cilium_host/cilium_net. Other addresses on
  // it are left alone. FailedPrecondition if `name` exists and is neither a dummy nor that pair.
  // Idempotent.
  [[nodiscard]] virtual absl::Status EnsureDummyWithAddress(const std::string& name,
                                                            const InterfaceAddress& addr) = 0;

  // Ensures the VXLAN device of `spec` exists, is up, has spec.mtu and carries spec.alias. A
  // device of that name carrying the alias (or an unmarked collect_md VXLAN device, left by a
  // crash between create and mark) is kept when it matches and replaced when its port or mode
  // differ; any other link of that name fails with FailedPrecondition and is not touched.
  // Idempotent.
  [[nodiscard]] virtual absl::StatusOr<LinkInfo> EnsureVxlanDevice(const VxlanSpec& spec) = 0;

  // Routes to other nodes' pod CIDRs via their addresses on a shared L2 (direct routing), tagged
  // kSluiceRouteProtocol. Replace is idempotent; deleting an absent route is OK.
  [[nodiscard]] virtual absl::Status ReplacePeerRoute(const IpPrefix& dst,
                                                      const IpAddress& via) = 0;
  [[nodiscard]] virtual absl::Status DeletePeerRoute(const IpPrefix& dst) = 0;
  [[nodiscard]] virtual absl::StatusOr<std::vector<RouteInfo>> ListPeerRoutes() = 0;

  // The device of the caller's netns' IPv4 default route (lowest metric, main table), or
  // NotFound.
  [[nodiscard]] virtual absl::StatusOr<std::string> DefaultRouteDevice() = 0;

  // The first (primary) IPv4 address of `ifname`, or NotFound.
  [[nodiscard]] virtual absl::StatusOr<IpAddress> FirstIPv4Address(const std::string& ifname) = 0;

  // Writes a sysctl of the caller's netns; see WriteSysctl in agent/kernel/netns.h for `key`.
  [[nodiscard]] virtual absl::Status SetSysctl(absl::string_view key, absl::string_view value) = 0;

  // Makes a tbf qdisc of `spec` the root qdisc of `ifname` (replacing the one there, or changing
  // it in place), in the netns at `netns_path` ("" : the caller's). The clsact qdisc (Sluice's
  // programs) is a separate hook and stays. Idempotent.
  [[nodiscard]] virtual absl::Status ReplaceRootTbf(const std::string& netns_path,
                                                    const std::string& ifname,
                                                    const TbfSpec& spec) = 0;
  // The root tbf qdisc of `ifname` in the netns at `netns_path` ("": the caller's); nullopt when
  // the root qdisc is not a tbf.
  [[nodiscard]] virtual absl::StatusOr<std::optional<TbfSpec>> RootTbf(
      const std::string& netns_path, const std::string& ifname) = 0;
};

// The idle peer of the veth that stands in for a dummy device on kernels without CONFIG_DUMMY:
// "sluice_host" -> "sluice_net"; other names get "_net" appended (truncated to fit IFNAMSIZ).
std::string HostDevicePeerName(absl::string_view name);

// Netlink over libnl-route-3. Stateless and thread-safe: every call opens its own rtnetlink
// socket in the netns it works in.
class LibnlNetlink final : public Netlink {
 public:
  LibnlNetlink() = default;

  absl::StatusOr<PodVeth> CreatePodVeth(const PodVethSpec& spec) override;
  absl::Status ConfigurePodInterface(const PodInterfaceConfig& config) override;
  absl::Status ConfigureHostVeth(const std::string& host_ifname, const IpAddress& pod_addr,
                                 const MacAddress& pod_mac) override;
  absl::Status DeleteLink(const std::string& ifname) override;
  absl::Status DeleteLinkByIndex(int ifindex) override;
  absl::Status SetLinkDown(int ifindex) override;
  absl::Status SetLinkAlias(int ifindex, const std::string& alias) override;
  absl::StatusOr<LinkInfo> LinkByName(const std::string& ifname) override;
  absl::StatusOr<bool> LinkExistsInNetns(const std::string& netns_path,
                                         const std::string& ifname) override;
  absl::StatusOr<std::vector<LinkInfo>> ListLinks(absl::string_view prefix) override;
  absl::StatusOr<LinkInfo> PeerLink(const std::string& host_ifname) override;
  absl::StatusOr<PodInterface> GetPodInterface(const std::string& netns_path,
                                               const std::string& ifname) override;
  absl::StatusOr<HostVeth> GetHostVeth(const std::string& host_ifname) override;
  absl::Status EnsureDummyWithAddress(const std::string& name,
                                      const InterfaceAddress& addr) override;
  absl::StatusOr<LinkInfo> EnsureVxlanDevice(const VxlanSpec& spec) override;
  absl::Status ReplacePeerRoute(const IpPrefix& dst, const IpAddress& via) override;
  absl::Status DeletePeerRoute(const IpPrefix& dst) override;
  absl::StatusOr<std::vector<RouteInfo>> ListPeerRoutes() override;
  absl::StatusOr<std::string> DefaultRouteDevice() override;
  absl::StatusOr<IpAddress> FirstIPv4Address(const std::string& ifname) override;
  absl::Status SetSysctl(absl::string_view key, absl::string_view value) override;
  absl::Status ReplaceRootTbf(const std::string& netns_path, const std::string& ifname,
                              const TbfSpec& spec) override;
  absl::StatusOr<std::optional<TbfSpec>> RootTbf(const std::string& netns_path,
                                                 const std::string& ifname) override;
};

}  // namespace sluice::agent

#endif  // SLUICE_AGENT_NETLINK_H_
