#include "agent/kernel/netlink.h"

#include <arpa/inet.h>
#include <linux/if.h>
#include <linux/if_link.h>
#include <linux/neighbour.h>
#include <linux/pkt_sched.h>
#include <linux/rtnetlink.h>
#include <netlink/addr.h>
#include <netlink/cache.h>
#include <netlink/errno.h>
#include <netlink/msg.h>
#include <netlink/netlink.h>
#include <netlink/object.h>
#include <netlink/route/addr.h>
#include <netlink/route/link.h>
#include <netlink/route/link/veth.h>
#include <netlink/route/link/vxlan.h>
#include <netlink/route/neighbour.h>
#include <netlink/route/nexthop.h>
#include <netlink/route/route.h>
#include <netlink/socket.h>

#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "agent/kernel/netns.h"
#include "spdlog/spdlog.h"

namespace sluice::agent {
namespace {

// ---- RAII over libnl objects -------------------------------------------------------------------

struct SockDeleter {
  void operator()(nl_sock* s) const { nl_socket_free(s); }
};
struct LinkDeleter {
  void operator()(rtnl_link* l) const { rtnl_link_put(l); }
};
struct AddrDeleter {
  void operator()(nl_addr* a) const { nl_addr_put(a); }
};
struct RtAddrDeleter {
  void operator()(rtnl_addr* a) const { rtnl_addr_put(a); }
};
struct RouteDeleter {
  void operator()(rtnl_route* r) const { rtnl_route_put(r); }
};
struct NeighDeleter {
  void operator()(rtnl_neigh* n) const { rtnl_neigh_put(n); }
};
struct CacheDeleter {
  void operator()(nl_cache* c) const { nl_cache_free(c); }
};
using Sock = std::unique_ptr<nl_sock, SockDeleter>;
using Link = std::unique_ptr<rtnl_link, LinkDeleter>;
using Addr = std::unique_ptr<nl_addr, AddrDeleter>;
using RtAddr = std::unique_ptr<rtnl_addr, RtAddrDeleter>;
using Route = std::unique_ptr<rtnl_route, RouteDeleter>;
using Neigh = std::unique_ptr<rtnl_neigh, NeighDeleter>;
using Cache = std::unique_ptr<nl_cache, CacheDeleter>;

// ---- errors ------------------------------------------------------------------------------------

bool IsNotFound(int nl_err) {
  int e = nl_err < 0 ? -nl_err : nl_err;
  return e == NLE_OBJ_NOTFOUND || e == NLE_NODEV;
}

// A libnl error (negative NLE_* code) as a status saying what was being done.
absl::Status NlStatus(int nl_err, absl::string_view what) {
  int e = nl_err < 0 ? -nl_err : nl_err;
  std::string msg = absl::StrCat(what, ": ", nl_geterror(e));
  switch (e) {
    case NLE_EXIST:
      return absl::AlreadyExistsError(msg);
    case NLE_OBJ_NOTFOUND:
    case NLE_NODEV:
      return absl::NotFoundError(msg);
    case NLE_PERM:
    case NLE_NOACCESS:
      return absl::PermissionDeniedError(msg);
    case NLE_INVAL:
    case NLE_RANGE:
    case NLE_AF_NOSUPPORT:
    case NLE_OPNOTSUPP:
      return absl::InvalidArgumentError(msg);
    case NLE_BUSY:
    case NLE_AGAIN:
      return absl::UnavailableError(msg);
    case NLE_NOMEM:
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::Status Annotate(const absl::Status& s, absl::string_view what) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

absl::Status ValidateIfname(absl::string_view name) {
  if (name.empty() || name.size() >= IFNAMSIZ || name.find('/') != absl::string_view::npos ||
      name == "." || name == "..") {
    return absl::InvalidArgumentError(absl::StrCat("invalid interface name \"", name, "\""));
  }
  return absl::OkStatus();
}

// ---- conversions -------------------------------------------------------------------------------

int AddressFamily(const IpAddress& ip) { return ip.is_v4() ? AF_INET : AF_INET6; }

absl::StatusOr<Addr> ToNlAddr(const IpAddress& ip, int prefix_len) {
  nl_addr* a = nl_addr_build(AddressFamily(ip), ip.bytes().data(), ip.is_v4() ? 4 : 16);
  if (a == nullptr) return absl::ResourceExhaustedError("allocate netlink address");
  nl_addr_set_prefixlen(a, prefix_len);
  return Addr(a);
}

absl::StatusOr<Addr> ToNlMac(const MacAddress& mac) {
  nl_addr* a = nl_addr_build(AF_LLC, mac.bytes.data(), mac.bytes.size());
  if (a == nullptr) return absl::ResourceExhaustedError("allocate netlink lladdr");
  return Addr(a);
}

// An IPv4/IPv6 nl_addr as (address, prefix length). libnl represents an absent RTA_DST (the
// default route) as an empty address of the route's family: that is 0.0.0.0/0 or ::/0.
std::optional<InterfaceAddress> FromNlAddr(nl_addr* a) {
  if (a == nullptr) return std::nullopt;
  int family = nl_addr_get_family(a);
  size_t len = nl_addr_get_len(a);
  InterfaceAddress out;
  out.prefix_len = static_cast<int>(nl_addr_get_prefixlen(a));
  if (family == AF_INET && (len == 4 || len == 0)) {
    uint32_t be = 0;
    if (len == 4) std::memcpy(&be, nl_addr_get_binary_addr(a), 4);
    out.address = IpAddress::V4(ntohl(be));
    return out;
  }
  if (family == AF_INET6 && (len == 16 || len == 0)) {
    std::array<uint8_t, 16> bytes{};
    if (len == 16) std::memcpy(bytes.data(), nl_addr_get_binary_addr(a), 16);
    char buf[INET6_ADDRSTRLEN] = {};
    if (inet_ntop(AF_INET6, bytes.data(), buf, sizeof(buf)) == nullptr) return std::nullopt;
    absl::StatusOr<IpAddress> ip = IpAddress::Parse(buf);
    if (!ip.ok()) return std::nullopt;
    out.address = *ip;
    return out;
  }
  return std::nullopt;
}

// ip/32 (or /128) as a route destination; a full-length prefix has no host bits to reject.
IpPrefix HostRoute(const IpAddress& ip) { return *IpPrefix::Make(ip, ip.bit_length()); }

}  // namespace

std::string HostDevicePeerName(absl::string_view name) {
  if (absl::EndsWith(name, "_host")) {
    return absl::StrCat(name.substr(0, name.size() - 5), "_net");
  }
  return absl::StrCat(name.substr(0, IFNAMSIZ - 1 - 4), "_net");
}

namespace {

LinkInfo ToLinkInfo(rtnl_link* l) {
  LinkInfo info;
  if (const char* name = rtnl_link_get_name(l)) info.name = name;
  info.ifindex = rtnl_link_get_ifindex(l);
  info.mtu = rtnl_link_get_mtu(l);
  info.up = (rtnl_link_get_flags(l) & IFF_UP) != 0;
  if (const char* alias = rtnl_link_get_ifalias(l)) info.alias = alias;
  nl_addr* ll = rtnl_link_get_addr(l);
  if (ll != nullptr && nl_addr_get_len(ll) == info.mac.bytes.size()) {
    std::memcpy(info.mac.bytes.data(), nl_addr_get_binary_addr(ll), info.mac.bytes.size());
  }
  info.peer_ifindex = rtnl_link_get_link(l);
  int32_t nsid = -1;
  if (rtnl_link_get_link_netnsid(l, &nsid) == 0) info.peer_netnsid = nsid;
  return info;
}

// ---- small libnl operations --------------------------------------------------------------------

// An rtnetlink socket in the netns of the calling thread.
absl::StatusOr<Sock> OpenSocket() {
  Sock sock(nl_socket_alloc());
  if (!sock) return absl::ResourceExhaustedError("allocate netlink socket");
  if (int err = nl_connect(sock.get(), NETLINK_ROUTE); err < 0) {
    return NlStatus(err, "connect rtnetlink socket");
  }
  return sock;
}

absl::StatusOr<Link> GetLink(nl_sock* sock, const std::string& name) {
  rtnl_link* l = nullptr;
  if (int err = rtnl_link_get_kernel(sock, 0, name.c_str(), &l); err < 0) {
    return NlStatus(err, absl::StrCat("get link ", name));
  }
  return Link(l);
}

absl::StatusOr<Link> GetLinkByIndex(nl_sock* sock, int ifindex) {
  rtnl_link* l = nullptr;
  if (int err = rtnl_link_get_kernel(sock, ifindex, nullptr, &l); err < 0) {
    return NlStatus(err, absl::StrCat("get link #", ifindex));
  }
  return Link(l);
}

// Sets the link up and (if mtu != 0) its MTU, skipping the request when nothing changes.
absl::Status SetLinkUp(nl_sock* sock, rtnl_link* orig, uint32_t mtu) {
  bool need_up = (rtnl_link_get_flags(orig) & IFF_UP) == 0;
  bool need_mtu = mtu != 0 && rtnl_link_get_mtu(orig) != mtu;
  if (!need_up && !need_mtu) return absl::OkStatus();
  Link change(rtnl_link_alloc());
  if (!change) return absl::ResourceExhaustedError("allocate link");
  if (need_up) rtnl_link_set_flags(change.get(), IFF_UP);
  if (need_mtu) rtnl_link_set_mtu(change.get(), mtu);
  if (int err = rtnl_link_change(sock, orig, change.get(), 0); err < 0) {
    return NlStatus(err, absl::StrCat("set link ", rtnl_link_get_name(orig), " up",
                                      need_mtu ? absl::StrCat(" mtu ", mtu) : ""));
  }
  return absl::OkStatus();
}

absl::Status DeleteLinkIn(nl_sock* sock, const std::string& ifname) {
  Link l(rtnl_link_alloc());
  if (!l) return absl::ResourceExhaustedError("allocate link");
  rtnl_link_set_name(l.get(), ifname.c_str());
  int err = rtnl_link_delete(sock, l.get());
  if (err < 0 && !IsNotFound(err)) return NlStatus(err, absl::StrCat("delete link ", ifname));
  return absl::OkStatus();
}

absl::Status DeleteLinkAt(nl_sock* sock, int ifindex) {
  Link l(rtnl_link_alloc());
  if (!l) return absl::ResourceExhaustedError("allocate link");
  rtnl_link_set_ifindex(l.get(), ifindex);
  int err = rtnl_link_delete(sock, l.get());
  if (err < 0 && !IsNotFound(err)) return NlStatus(err, absl::StrCat("delete link #", ifindex));
  return absl::OkStatus();
}

// IFLA_IFALIAS of `orig` (an RTM_NEWLINK on its ifindex; nothing else changes).
absl::Status SetAlias(nl_sock* sock, rtnl_link* orig, const std::string& alias) {
  const char* name = rtnl_link_get_name(orig);
  std::string what = absl::StrCat("set alias \"", alias, "\" on ", name ? name : "link");
  if (alias.size() >= IFALIASZ) return absl::InvalidArgumentError(absl::StrCat(what, ": too long"));
  Link change(rtnl_link_alloc());
  if (!change) return absl::ResourceExhaustedError(what);
  rtnl_link_set_ifalias(change.get(), alias.c_str());
  if (int err = rtnl_link_change(sock, orig, change.get(), 0); err < 0) return NlStatus(err, what);
  return absl::OkStatus();
}

// `addr` on ifindex; an identical address already present is not an error.
absl::Status AddAddress(nl_sock* sock, int ifindex, const InterfaceAddress& prefix,
                        absl::string_view dev) {
  std::string what = absl::StrCat("add address ", prefix.ToString(), " to ", dev);
  RtAddr a(rtnl_addr_alloc());
  if (!a) return absl::ResourceExhaustedError(what);
  absl::StatusOr<Addr> local = ToNlAddr(prefix.address, prefix.prefix_len);
  if (!local.ok()) return Annotate(local.status(), what);
  rtnl_addr_set_ifindex(a.get(), ifindex);
  rtnl_addr_set_family(a.get(), AddressFamily(prefix.address));
  if (int err = rtnl_addr_set_local(a.get(), local->get()); err < 0) return NlStatus(err, what);
  rtnl_addr_set_prefixlen(a.get(), prefix.prefix_len);
  // NLM_F_REPLACE makes re-adding the same address succeed (the kernel updates it in place).
  if (int err = rtnl_addr_add(sock, a.get(), NLM_F_REPLACE); err < 0) {
    return NlStatus(err, what);
  }
  return absl::OkStatus();
}

// Adds or replaces a main-table unicast route `dst [via gateway] dev ifindex scope scope`.
absl::Status ReplaceRoute(nl_sock* sock, const IpPrefix& dst, const std::optional<IpAddress>& gw,
                          int ifindex, uint8_t scope, absl::string_view dev,
                          uint8_t protocol = RTPROT_STATIC) {
  std::string what = absl::StrCat("replace route ", dst.ToString(),
                                  gw ? absl::StrCat(" via ", gw->ToString()) : "", " dev ", dev);
  Route r(rtnl_route_alloc());
  if (!r) return absl::ResourceExhaustedError(what);
  rtnl_route_set_family(r.get(), AddressFamily(dst.network()));
  rtnl_route_set_table(r.get(), RT_TABLE_MAIN);
  rtnl_route_set_type(r.get(), RTN_UNICAST);
  rtnl_route_set_protocol(r.get(), protocol);
  rtnl_route_set_scope(r.get(), scope);
  absl::StatusOr<Addr> nl_dst = ToNlAddr(dst.network(), dst.length());
  if (!nl_dst.ok()) return Annotate(nl_dst.status(), what);
  if (int err = rtnl_route_set_dst(r.get(), nl_dst->get()); err < 0) return NlStatus(err, what);

  rtnl_nexthop* nh = rtnl_route_nh_alloc();
  if (nh == nullptr) return absl::ResourceExhaustedError(what);
  if (ifindex > 0) rtnl_route_nh_set_ifindex(nh, ifindex);
  if (gw) {
    absl::StatusOr<Addr> nl_gw = ToNlAddr(*gw, gw->bit_length());
    if (!nl_gw.ok()) {
      rtnl_route_nh_free(nh);
      return Annotate(nl_gw.status(), what);
    }
    rtnl_route_nh_set_gateway(nh, nl_gw->get());  // takes its own reference
  }
  rtnl_route_add_nexthop(r.get(), nh);  // the route owns nh from here on

  if (int err = rtnl_route_add(sock, r.get(), NLM_F_REPLACE); err < 0) {
    return NlStatus(err, what);
  }
  return absl::OkStatus();
}

absl::Status ReplacePermanentNeighbour(nl_sock* sock, int ifindex, const IpAddress& ip,
                                       const MacAddress& mac, absl::string_view dev) {
  std::string what =
      absl::StrCat("replace neighbour ", ip.ToString(), " lladdr ", mac.ToString(), " dev ", dev);
  Neigh n(rtnl_neigh_alloc());
  if (!n) return absl::ResourceExhaustedError(what);
  absl::StatusOr<Addr> dst = ToNlAddr(ip, ip.bit_length());
  if (!dst.ok()) return Annotate(dst.status(), what);
  absl::StatusOr<Addr> ll = ToNlMac(mac);
  if (!ll.ok()) return Annotate(ll.status(), what);
  rtnl_neigh_set_ifindex(n.get(), ifindex);
  rtnl_neigh_set_family(n.get(), AddressFamily(ip));
  if (int err = rtnl_neigh_set_dst(n.get(), dst->get()); err < 0) return NlStatus(err, what);
  rtnl_neigh_set_lladdr(n.get(), ll->get());
  rtnl_neigh_set_state(n.get(), NUD_PERMANENT);
  if (int err = rtnl_neigh_add(sock, n.get(), NLM_F_CREATE | NLM_F_REPLACE); err < 0) {
    return NlStatus(err, what);
  }
  return absl::OkStatus();
}

// Calls fn(obj) for every object of a libnl cache.
template <typename T, typename Fn>
void ForEach(nl_cache* cache, Fn&& fn) {
  for (nl_object* o = nl_cache_get_first(cache); o != nullptr; o = nl_cache_get_next(o)) {
    fn(reinterpret_cast<T*>(o));
  }
}

absl::StatusOr<std::vector<InterfaceAddress>> AddressesOf(nl_sock* sock, int ifindex, int family) {
  nl_cache* raw = nullptr;
  if (int err = rtnl_addr_alloc_cache(sock, &raw); err < 0) {
    return NlStatus(err, "dump addresses");
  }
  Cache cache(raw);
  std::vector<InterfaceAddress> out;
  ForEach<rtnl_addr>(cache.get(), [&](rtnl_addr* a) {
    if (rtnl_addr_get_ifindex(a) != ifindex) return;
    if (family != AF_UNSPEC && rtnl_addr_get_family(a) != family) return;
    if (std::optional<InterfaceAddress> p = FromNlAddr(rtnl_addr_get_local(a))) {
      p->prefix_len = rtnl_addr_get_prefixlen(a);
      out.push_back(*p);
    }
  });
  return out;
}

absl::StatusOr<std::vector<RouteInfo>> MainIPv4Routes(nl_sock* sock) {
  nl_cache* raw = nullptr;
  if (int err = rtnl_route_alloc_cache(sock, AF_INET, 0, &raw); err < 0) {
    return NlStatus(err, "dump IPv4 routes");
  }
  Cache cache(raw);
  std::vector<RouteInfo> out;
  ForEach<rtnl_route>(cache.get(), [&](rtnl_route* r) {
    if (rtnl_route_get_table(r) != RT_TABLE_MAIN || rtnl_route_get_type(r) != RTN_UNICAST) return;
    std::optional<InterfaceAddress> dst = FromNlAddr(rtnl_route_get_dst(r));
    if (!dst) return;
    absl::StatusOr<IpPrefix> prefix = IpPrefix::Make(dst->address, dst->prefix_len);
    if (!prefix.ok()) return;  // the kernel only reports canonical destinations
    RouteInfo info;
    info.dst = *prefix;
    info.scope = rtnl_route_get_scope(r);
    info.table = rtnl_route_get_table(r);
    info.protocol = rtnl_route_get_protocol(r);
    if (rtnl_route_get_nnexthops(r) > 0) {
      rtnl_nexthop* nh = rtnl_route_nexthop_n(r, 0);
      info.oif = rtnl_route_nh_get_ifindex(nh);
      if (std::optional<InterfaceAddress> gw = FromNlAddr(rtnl_route_nh_get_gateway(nh))) {
        info.gateway = gw->address;
      }
    }
    out.push_back(info);
  });
  return out;
}

}  // namespace

// ---- value types -------------------------------------------------------------------------------

absl::StatusOr<InterfaceAddress> InterfaceAddress::Parse(absl::string_view text) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, absl::MaxSplits('/', 1));
  absl::StatusOr<IpAddress> addr = IpAddress::Parse(parts[0]);
  if (!addr.ok()) return addr.status();
  InterfaceAddress out = Host(*addr);
  if (parts.size() == 2) {
    int len = 0;
    if (!absl::SimpleAtoi(parts[1], &len) || len < 0 || len > out.prefix_len) {
      return absl::InvalidArgumentError(absl::StrCat("invalid interface address \"", text, "\""));
    }
    out.prefix_len = len;
  }
  return out;
}

InterfaceAddress InterfaceAddress::Host(const IpAddress& address) {
  return InterfaceAddress{address, address.bit_length()};
}

std::string InterfaceAddress::ToString() const {
  return absl::StrCat(address.ToString(), "/", prefix_len);
}

// ---- LibnlNetlink ------------------------------------------------------------------------------

absl::StatusOr<PodVeth> LibnlNetlink::CreatePodVeth(const PodVethSpec& spec) {
  const std::string what = absl::StrCat("create veth ", spec.host_ifname, "/", spec.pod_ifname,
                                        " in ", spec.pod_netns_path);
  if (absl::Status s = ValidateIfname(spec.host_ifname); !s.ok()) return Annotate(s, what);
  if (absl::Status s = ValidateIfname(spec.pod_ifname); !s.ok()) return Annotate(s, what);

  absl::StatusOr<bool> pod_side_exists = LinkExistsInNetns(spec.pod_netns_path, spec.pod_ifname);
  if (!pod_side_exists.ok()) return Annotate(pod_side_exists.status(), what);
  if (*pod_side_exists) {
    return absl::AlreadyExistsError(
        absl::StrCat(what, ": ", spec.pod_ifname, " already exists in the pod netns"));
  }
  absl::StatusOr<NetnsFd> pod_ns = NetnsFd::Open(spec.pod_netns_path);
  if (!pod_ns.ok()) return Annotate(pod_ns.status(), what);
  absl::StatusOr<Sock> sock = OpenSocket();
  if (!sock.ok()) return Annotate(sock.status(), what);

  for (int attempt = 0;; ++attempt) {
    Link veth(rtnl_link_veth_alloc());
    if (!veth) return absl::ResourceExhaustedError(what);
    rtnl_link_set_name(veth.get(), spec.host_ifname.c_str());
    rtnl_link_set_mtu(veth.get(), spec.mtu);
    {
      Link peer(rtnl_link_veth_get_peer(veth.get()));  // a new reference to the peer half
      rtnl_link_set_name(peer.get(), spec.pod_ifname.c_str());
      rtnl_link_set_mtu(peer.get(), spec.mtu);
      // IFLA_NET_NS_FD inside the peer's info: the kernel creates the peer in the pod netns.
      rtnl_link_set_ns_fd(peer.get(), pod_ns->get());
    }
    int err = rtnl_link_add(sock->get(), veth.get(), NLM_F_CREATE | NLM_F_EXCL);
    if (err >= 0) break;
    if (-err != NLE_EXIST || attempt > 0) return NlStatus(err, what);

    // EEXIST: a stale host end of this very attachment (a crashed attempt), the pod name raced
    // in, or a link that is not ours (another plugin's, or another pod's). Only the first is
    // deleted: it must be a veth carrying exactly this attachment's mark.
    absl::StatusOr<Link> stale = GetLink(sock->get(), spec.host_ifname);
    if (!stale.ok()) {
      if (absl::IsNotFound(stale.status())) return NlStatus(err, what);
      return Annotate(stale.status(), what);
    }
    LinkInfo existing = ToLinkInfo(stale->get());
    const char* type = rtnl_link_get_type(stale->get());
    const absl::string_view kind = type ? type : "no type";
    if (kind != "veth" || spec.alias.empty() || existing.alias != spec.alias) {
      return absl::AlreadyExistsError(absl::StrCat(
          what, ": ", spec.host_ifname, " (ifindex ", existing.ifindex, ", ", kind, ", alias \"",
          existing.alias, "\") exists and is not this endpoint's (its mark would be \"", spec.alias,
          "\"); leaving it alone"));
    }
    spdlog::warn("{}: deleting stale host interface {} (#{}, alias \"{}\") and retrying", what,
                 spec.host_ifname, existing.ifindex, existing.alias);
    if (absl::Status s = DeleteLinkAt(sock->get(), existing.ifindex); !s.ok()) {
      return Annotate(s, what);
    }
  }

  // From here on the pair exists; undo it on failure so a retry starts clean.
  auto rollback = [&](const absl::Status& s) {
    if (absl::Status d = DeleteLinkIn(sock->get(), spec.host_ifname); !d.ok()) {
      spdlog::error("{}: rollback failed: {}", what, d.ToString());
    }
    return Annotate(s, what);
  };
  PodVeth out;
  absl::StatusOr<Link> host = GetLink(sock->get(), spec.host_ifname);
  if (!host.ok()) return rollback(host.status());
  if (!spec.alias.empty()) {
    if (absl::Status s = SetAlias(sock->get(), host->get(), spec.alias); !s.ok()) {
      return rollback(s);
    }
  }
  LinkInfo host_info = ToLinkInfo(host->get());
  out.host_ifindex = host_info.ifindex;
  out.host_mac = host_info.mac;
  absl::Status pod_status = RunInNetns(spec.pod_netns_path, [&]() -> absl::Status {
    absl::StatusOr<Sock> pod_sock = OpenSocket();
    if (!pod_sock.ok()) return pod_sock.status();
    absl::StatusOr<Link> pod = GetLink(pod_sock->get(), spec.pod_ifname);
    if (!pod.ok()) return pod.status();
    if (!spec.alias.empty()) {
      if (absl::Status s = SetAlias(pod_sock->get(), pod->get(), spec.alias); !s.ok()) return s;
    }
    LinkInfo pod_info = ToLinkInfo(pod->get());
    out.pod_ifindex = pod_info.ifindex;
    out.pod_mac = pod_info.mac;
    return absl::OkStatus();
  });
  if (!pod_status.ok()) return rollback(pod_status);
  spdlog::info("created veth {} (#{}, {}) <-> {} (#{}, {}) in {}, mtu {}", spec.host_ifname,
               out.host_ifindex, out.host_mac.ToString(), spec.pod_ifname, out.pod_ifindex,
               out.pod_mac.ToString(), spec.pod_netns_path, spec.mtu);
  return out;
}

absl::Status LibnlNetlink::ConfigurePodInterface(const PodInterfaceConfig& config) {
  const std::string what = absl::StrCat("configure ", config.ifname, " in ", config.netns_path);
  if (!config.address.is_v4() || !config.gateway.is_v4()) {
    return absl::UnimplementedError(absl::StrCat(what, ": only IPv4 pod addressing is supported"));
  }
  absl::Status s = RunInNetns(config.netns_path, [&]() -> absl::Status {
    // IPv6 off before the link goes up: no link-local address, DAD or router solicitations.
    absl::Status v6 = WriteSysctl(InterfaceSysctlPath("ipv6", config.ifname, "disable_ipv6"), "1");
    if (!v6.ok() && !absl::IsNotFound(v6)) return v6;  // NotFound: IPv6 is off in the kernel

    absl::StatusOr<Sock> sock = OpenSocket();
    if (!sock.ok()) return sock.status();
    absl::StatusOr<Link> link = GetLink(sock->get(), config.ifname);
    if (!link.ok()) return link.status();
    int ifindex = rtnl_link_get_ifindex(link->get());
    if (absl::Status st = SetLinkUp(sock->get(), link->get(), config.mtu); !st.ok()) return st;
    if (absl::Status st =
            AddAddress(sock->get(), ifindex, InterfaceAddress::Host(config.address), config.ifname);
        !st.ok()) {
      return st;
    }
    // The gateway is not on any subnet of the pod: a host route makes it directly reachable, so
    // the default route needs no "onlink".
    if (absl::Status st = ReplaceRoute(sock->get(), HostRoute(config.gateway), std::nullopt,
                                       ifindex, RT_SCOPE_LINK, config.ifname);
        !st.ok()) {
      return st;
    }
    return ReplaceRoute(sock->get(), *IpPrefix::Make(IpAddress::V4(0), 0), config.gateway, ifindex,
                        RT_SCOPE_UNIVERSE, config.ifname);
  });
  if (!s.ok()) return Annotate(s, what);
  spdlog::info("configured {} in {}: {}/32 via {}, mtu {}", config.ifname, config.netns_path,
               config.address.ToString(), config.gateway.ToString(), config.mtu);
  return absl::OkStatus();
}

absl::Status LibnlNetlink::ConfigureHostVeth(const std::string& host_ifname,
                                             const IpAddress& pod_addr, const MacAddress& pod_mac) {
  const std::string what =
      absl::StrCat("configure host veth ", host_ifname, " for ", pod_addr.ToString());
  if (!pod_addr.is_v4()) {
    return absl::UnimplementedError(absl::StrCat(what, ": only IPv4 pod addressing is supported"));
  }
  absl::StatusOr<Sock> sock = OpenSocket();
  if (!sock.ok()) return Annotate(sock.status(), what);
  absl::StatusOr<Link> link = GetLink(sock->get(), host_ifname);
  if (!link.ok()) return Annotate(link.status(), what);
  int ifindex = rtnl_link_get_ifindex(link->get());

  for (auto [name, value] : {std::pair{"rp_filter", "0"}, std::pair{"forwarding", "1"}}) {
    if (absl::Status s = WriteSysctl(InterfaceSysctlPath("ipv4", host_ifname, name), value);
        !s.ok()) {
      return Annotate(s, what);
    }
  }
  if (absl::Status s = SetLinkUp(sock->get(), link->get(), 0); !s.ok()) return Annotate(s, what);
  if (absl::Status s = ReplaceRoute(sock->get(), HostRoute(pod_addr), std::nullopt, ifindex,
                                    RT_SCOPE_LINK, host_ifname);
      !s.ok()) {
    return Annotate(s, what);
  }
  if (absl::Status s =
          ReplacePermanentNeighbour(sock->get(), ifindex, pod_addr, pod_mac, host_ifname);
      !s.ok()) {
    return Annotate(s, what);
  }
  spdlog::info("configured host veth {}: route {}/32, neighbour {}", host_ifname,
               pod_addr.ToString(), pod_mac.ToString());
  return absl::OkStatus();
}

absl::Status LibnlNetlink::DeleteLink(const std::string& ifname) {
  if (absl::Status s = ValidateIfname(ifname); !s.ok()) {
    return Annotate(s, absl::StrCat("delete link ", ifname));
  }
  absl::StatusOr<Sock> sock = OpenSocket();
  if (!sock.ok()) return Annotate(sock.status(), absl::StrCat("delete link ", ifname));
  return DeleteLinkIn(sock->get(), ifname);
}

absl::Status LibnlNetlink::DeleteLinkByIndex(int ifindex) {
  if (ifindex <= 0) return absl::InvalidArgumentError(absl::StrCat("delete link #", ifindex));
  absl::StatusOr<Sock> sock = OpenSocket();
  if (!sock.ok()) return Annotate(sock.status(), absl::StrCat("delete link #", ifindex));
  return DeleteLinkAt(sock->get(), ifindex);
}

absl::Status LibnlNetlink::SetLinkDown(int ifindex) {
  std::string what = absl::StrCat("set link #", ifindex, " down");
  if (ifindex <= 0) return absl::InvalidArgumentError(what);
  absl::StatusOr<Sock> sock = OpenSocket();
  if (!sock.ok()) return Annotate(sock.status(), what);
  absl::StatusOr<Link> link = GetLinkByIndex(sock->get(), ifindex);
  if (absl::IsNotFound(link.status())) return absl::OkStatus();
  if (!link.ok()) return link.status();
  if ((rtnl_link_get_flags(link->get()) & IFF_UP) == 0) return absl::OkStatus();
  Link change(rtnl_link_alloc());
  if (!change) return absl::ResourceExhaustedError(what);
  rtnl_link_unset_flags(change.get(), IFF_UP);
  if (int err = rtnl_link_change(sock->get(), link->get(), change.get(), 0); err < 0) {
    return IsNotFound(err) ? absl::OkStatus() : NlStatus(err, what);
  }
  return absl::OkStatus();
}

absl::Status LibnlNetlink::SetLinkAlias(int ifindex, const std::string& alias) {
  absl::StatusOr<Sock> sock = OpenSocket();
  if (!sock.ok()) return sock.status();
  absl::StatusOr<Link> link = GetLinkByIndex(sock->get(), ifindex);
  if (!link.ok()) return link.status();
  return SetAlias(sock->get(), link->get(), alias);
}

absl::StatusOr<LinkInfo> LibnlNetlink::LinkByName(const std::string& ifname) {
  if (absl::Status s = ValidateIfname(ifname); !s.ok()) return s;
  absl::StatusOr<Sock> sock = OpenSocket();
  if (!sock.ok()) return sock.status();
  absl::StatusOr<Link> link = GetLink(sock->get(), ifname);
  if (!link.ok()) return link.status();
  return ToLinkInfo(link->get());
}

absl::StatusOr<bool> LibnlNetlink::LinkExistsInNetns(const std::string& netns_path,
                                                     const std::string& ifname) {
  if (absl::Status s = ValidateIfname(ifname); !s.ok()) return s;
  bool exists = false;
  absl::Status s = RunInNetns(netns_path, [&]() -> absl::Status {
    absl::StatusOr<Sock> sock = OpenSocket();
    if (!sock.ok()) return sock.status();
    absl::StatusOr<Link> link = GetLink(sock->get(), ifname);
    if (link.ok()) {
      exists = true;
      return absl::OkStatus();
    }
    return absl::IsNotFound(link.status()) ? absl::OkStatus() : link.status();
  });
  if (!s.ok()) return s;
  return exists;
}

absl::StatusOr<std::vector<LinkInfo>> LibnlNetlink::ListLinks(absl::string_view prefix) {
  absl::StatusOr<Sock> sock = OpenSocket();
  if (!sock.ok()) return sock.status();
  nl_cache* raw = nullptr;
  if (int err = rtnl_link_alloc_cache(sock->get(), AF_UNSPEC, &raw); err < 0) {
    return NlStatus(err, "dump links");
  }
  Cache cache(raw);
  std::vector<LinkInfo> out;
  ForEach<rtnl_link>(cache.get(), [&](rtnl_link* l) {
    const char* name = rtnl_link_get_name(l);
    if (name != nullptr && absl::StartsWith(name, prefix)) {
      out.push_back(ToLinkInfo(l));
    }
  });
  return out;
}

absl::StatusOr<LinkInfo> LibnlNetlink::PeerLink(const std::string& host_ifname) {
  if (absl::Status s = ValidateIfname(host_ifname); !s.ok()) return s;
  const std::string what = absl::StrCat("read the peer of ", host_ifname);
  absl::StatusOr<Sock> sock = OpenSocket();
  if (!sock.ok()) return Annotate(sock.status(), what);
  absl::StatusOr<Link> host = GetLink(sock->get(), host_ifname);
  if (!host.ok()) return Annotate(host.status(), what);
  const LinkInfo host_info = ToLinkInfo(host->get());
  if (host_info.peer_ifindex <= 0 || host_info.peer_netnsid < 0) {
    return absl::NotFoundError(absl::StrCat(what, ": its other end is in no other netns"));
  }
  // RTM_GETLINK for the peer's ifindex, answered from the netns this one knows by that id.
  std::unique_ptr<nl_msg, decltype(&nlmsg_free)> msg(nlmsg_alloc_simple(RTM_GETLINK, 0),
                                                     &nlmsg_free);
  if (!msg) return absl::ResourceExhaustedError(absl::StrCat(what, ": allocate a message"));
  ifinfomsg ifi{};
  ifi.ifi_family = AF_UNSPEC;
  ifi.ifi_index = host_info.peer_ifindex;
  if (nlmsg_append(msg.get(), &ifi, sizeof(ifi), NLMSG_ALIGNTO) < 0 ||
      nla_put_s32(msg.get(), IFLA_TARGET_NETNSID, host_info.peer_netnsid) < 0) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": build the request"));
  }
  if (int err = nl_send_auto(sock->get(), msg.get()); err < 0) return NlStatus(err, what);
  std::optional<LinkInfo> peer;
  auto valid = [](nl_msg* m, void* arg) -> int {
    auto store = [](nl_object* obj, void* out) {
      if (std::string_view(nl_object_get_type(obj)) != "route/link") return;
      *static_cast<std::optional<LinkInfo>*>(out) = ToLinkInfo(reinterpret_cast<rtnl_link*>(obj));
    };
    nl_msg_parse(m, +store, arg);
    return NL_OK;
  };
  nl_socket_modify_cb(sock->get(), NL_CB_VALID, NL_CB_CUSTOM, +valid, &peer);
  if (int err = nl_recvmsgs_default(sock->get()); err < 0) {
    return NlStatus(err, absl::StrCat(what, " (ifindex ", host_info.peer_ifindex, " in netns id ",
                                      host_info.peer_netnsid, ")"));
  }
  if (!peer) {
    return absl::NotFoundError(absl::StrCat(what, ": no answer for ifindex ",
                                            host_info.peer_ifindex, " in netns id ",
                                            host_info.peer_netnsid));
  }
  return *peer;
}

absl::StatusOr<PodInterface> LibnlNetlink::GetPodInterface(const std::string& netns_path,
                                                           const std::string& ifname) {
  if (absl::Status s = ValidateIfname(ifname); !s.ok()) return s;
  PodInterface out;
  absl::Status s = RunInNetns(netns_path, [&]() -> absl::Status {
    absl::StatusOr<Sock> sock = OpenSocket();
    if (!sock.ok()) return sock.status();
    absl::StatusOr<Link> link = GetLink(sock->get(), ifname);
    if (!link.ok()) return link.status();
    out.link = ToLinkInfo(link->get());
    absl::StatusOr<std::vector<InterfaceAddress>> addrs =
        AddressesOf(sock->get(), out.link.ifindex, AF_UNSPEC);
    if (!addrs.ok()) return addrs.status();
    out.addresses = *std::move(addrs);
    absl::StatusOr<std::vector<RouteInfo>> routes = MainIPv4Routes(sock->get());
    if (!routes.ok()) return routes.status();
    for (RouteInfo& r : *routes) {
      if (r.oif == out.link.ifindex) out.routes.push_back(r);
    }
    return absl::OkStatus();
  });
  if (!s.ok()) return Annotate(s, absl::StrCat("inspect ", ifname, " in ", netns_path));
  return out;
}

absl::StatusOr<HostVeth> LibnlNetlink::GetHostVeth(const std::string& host_ifname) {
  if (absl::Status s = ValidateIfname(host_ifname); !s.ok()) return s;
  const std::string what = absl::StrCat("inspect host veth ", host_ifname);
  absl::StatusOr<Sock> sock = OpenSocket();
  if (!sock.ok()) return Annotate(sock.status(), what);
  absl::StatusOr<Link> link = GetLink(sock->get(), host_ifname);
  if (!link.ok()) return Annotate(link.status(), what);
  HostVeth out;
  out.link = ToLinkInfo(link->get());
  absl::StatusOr<std::vector<RouteInfo>> routes = MainIPv4Routes(sock->get());
  if (!routes.ok()) return Annotate(routes.status(), what);
  for (RouteInfo& r : *routes) {
    if (r.oif == out.link.ifindex) out.routes.push_back(r);
  }
  nl_cache* raw = nullptr;
  if (int err = rtnl_neigh_alloc_cache(sock->get(), &raw); err < 0) {
    return NlStatus(err, absl::StrCat(what, ": dump neighbours"));
  }
  Cache cache(raw);
  ForEach<rtnl_neigh>(cache.get(), [&](rtnl_neigh* n) {
    if (rtnl_neigh_get_ifindex(n) != out.link.ifindex || rtnl_neigh_get_family(n) != AF_INET) {
      return;
    }
    std::optional<InterfaceAddress> dst = FromNlAddr(rtnl_neigh_get_dst(n));
    nl_addr* ll = rtnl_neigh_get_lladdr(n);
    if (!dst) return;
    NeighbourInfo info;
    info.address = dst->address;
    if (ll != nullptr && nl_addr_get_len(ll) == info.mac.bytes.size()) {
      std::memcpy(info.mac.bytes.data(), nl_addr_get_binary_addr(ll), info.mac.bytes.size());
    }
    info.permanent = (rtnl_neigh_get_state(n) & NUD_PERMANENT) != 0;
    out.neighbours.push_back(info);
  });
  return out;
}

absl::Status LibnlNetlink::EnsureDummyWithAddress(const std::string& name,
                                                  const InterfaceAddress& addr) {
  const std::string what = absl::StrCat("ensure dummy ", name, " with ", addr.ToString());
  if (absl::Status s = ValidateIfname(name); !s.ok()) return Annotate(s, what);
  absl::StatusOr<Sock> sock = OpenSocket();
  if (!sock.ok()) return Annotate(sock.status(), what);
  const std::string peer_name = HostDevicePeerName(name);

  absl::StatusOr<Link> link = GetLink(sock->get(), name);
  if (!link.ok() && !absl::IsNotFound(link.status())) return Annotate(link.status(), what);
  if (!link.ok()) {
    Link tmpl(rtnl_link_alloc());
    if (!tmpl) return absl::ResourceExhaustedError(what);
    rtnl_link_set_name(tmpl.get(), name.c_str());
    if (int err = rtnl_link_set_type(tmpl.get(), "dummy"); err < 0) return NlStatus(err, what);
    int err = rtnl_link_add(sock->get(), tmpl.get(), NLM_F_CREATE | NLM_F_EXCL);
    if (-err == NLE_OPNOTSUPP) {
      // Kernels built without CONFIG_DUMMY answer "Unknown device type" (EOPNOTSUPP). A veth
      // pair with an idle peer gives the same thing: a local device that owns the address
      // (Cilium's cilium_host/cilium_net are such a pair).
      spdlog::info("{}: kernel has no dummy devices, using a veth pair {}/{}", what, name,
                   peer_name);
      Link veth(rtnl_link_veth_alloc());
      if (!veth) return absl::ResourceExhaustedError(what);
      rtnl_link_set_name(veth.get(), name.c_str());
      Link peer(rtnl_link_veth_get_peer(veth.get()));
      rtnl_link_set_name(peer.get(), peer_name.c_str());
      err = rtnl_link_add(sock->get(), veth.get(), NLM_F_CREATE | NLM_F_EXCL);
    }
    if (err < 0 && -err != NLE_EXIST) return NlStatus(err, what);  // EXIST: lost a race
    link = GetLink(sock->get(), name);
    if (!link.ok()) return Annotate(link.status(), what);
  }

  const char* type = rtnl_link_get_type(link->get());
  absl::string_view kind = type ? type : "no type";
  if (kind == "veth") {
    // Only our own fallback pair is acceptable, not some pod's veth that happens to be there.
    absl::StatusOr<Link> peer = GetLinkByIndex(sock->get(), rtnl_link_get_link(link->get()));
    if (!peer.ok() || peer_name != rtnl_link_get_name(peer->get())) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": ", name, " exists and is a veth whose peer is not ", peer_name));
    }
    if (absl::Status s = SetLinkUp(sock->get(), peer->get(), 0); !s.ok()) {
      return Annotate(s, what);
    }
  } else if (kind != "dummy") {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": ", name, " exists and is not a dummy (", kind, ")"));
  }
  if (absl::Status s = SetLinkUp(sock->get(), link->get(), 0); !s.ok()) return Annotate(s, what);
  if (absl::Status s = AddAddress(sock->get(), rtnl_link_get_ifindex(link->get()), addr, name);
      !s.ok()) {
    return Annotate(s, what);
  }
  return absl::OkStatus();
}

absl::StatusOr<LinkInfo> LibnlNetlink::EnsureVxlanDevice(const VxlanSpec& spec) {
  const std::string what = absl::StrCat("ensure vxlan ", spec.name, " port ", spec.port);
  if (absl::Status s = ValidateIfname(spec.name); !s.ok()) return Annotate(s, what);
  absl::StatusOr<Sock> sock = OpenSocket();
  if (!sock.ok()) return Annotate(sock.status(), what);

  absl::StatusOr<Link> link = GetLink(sock->get(), spec.name);
  if (!link.ok() && !absl::IsNotFound(link.status())) return Annotate(link.status(), what);
  if (link.ok()) {
    const char* alias = rtnl_link_get_ifalias(link->get());
    bool marked = alias != nullptr && spec.alias == alias;
    bool is_vxlan = rtnl_link_is_vxlan(link->get());
    bool external = is_vxlan && rtnl_link_vxlan_get_collect_metadata(link->get()) == 1;
    uint32_t port = 0;
    if (is_vxlan && rtnl_link_vxlan_get_port(link->get(), &port) < 0) port = 0;
    if (!marked && !external) {
      return absl::FailedPreconditionError(absl::StrCat(what, ": ", spec.name,
                                                        " exists and is not Sluice's (alias \"",
                                                        alias ? alias : "", "\")"));
    }
    if (!external || port != spec.port) {
      spdlog::info("{}: replacing {} (collect_md {}, port {})", what, spec.name, external, port);
      if (absl::Status s = DeleteLinkAt(sock->get(), rtnl_link_get_ifindex(link->get())); !s.ok()) {
        return Annotate(s, what);
      }
      link = absl::NotFoundError("replaced");
    }
  }
  if (!link.ok()) {
    Link tmpl(rtnl_link_vxlan_alloc());
    if (!tmpl) return absl::ResourceExhaustedError(what);
    rtnl_link_set_name(tmpl.get(), spec.name.c_str());
    rtnl_link_set_mtu(tmpl.get(), spec.mtu);
    if (int err = rtnl_link_vxlan_set_collect_metadata(tmpl.get(), 1); err < 0) {
      return NlStatus(err, what);
    }
    if (int err = rtnl_link_vxlan_set_port(tmpl.get(), spec.port); err < 0) {
      return NlStatus(err, what);
    }
    if (int err = rtnl_link_vxlan_set_learning(tmpl.get(), 0); err < 0) {
      return NlStatus(err, what);
    }
    int err = rtnl_link_add(sock->get(), tmpl.get(), NLM_F_CREATE | NLM_F_EXCL);
    if (err < 0) return NlStatus(err, what);
    link = GetLink(sock->get(), spec.name);
    if (!link.ok()) return Annotate(link.status(), what);
  }
  const char* alias = rtnl_link_get_ifalias(link->get());
  if (alias == nullptr || spec.alias != alias) {
    if (absl::Status s = SetAlias(sock->get(), link->get(), spec.alias); !s.ok()) {
      return Annotate(s, what);
    }
  }
  if (absl::Status s = SetLinkUp(sock->get(), link->get(), spec.mtu); !s.ok()) {
    return Annotate(s, what);
  }
  link = GetLink(sock->get(), spec.name);
  if (!link.ok()) return Annotate(link.status(), what);
  return ToLinkInfo(link->get());
}

absl::Status LibnlNetlink::ReplacePeerRoute(const IpPrefix& dst, const IpAddress& via) {
  absl::StatusOr<Sock> sock = OpenSocket();
  if (!sock.ok()) return sock.status();
  // No device: the kernel takes it from the connected route that reaches `via`, and refuses a
  // gateway that is not on a directly connected network.
  return ReplaceRoute(sock->get(), dst, via, 0, RT_SCOPE_UNIVERSE, "(via gateway)",
                      kSluiceRouteProtocol);
}

absl::Status LibnlNetlink::DeletePeerRoute(const IpPrefix& dst) {
  std::string what = absl::StrCat("delete route ", dst.ToString());
  absl::StatusOr<Sock> sock = OpenSocket();
  if (!sock.ok()) return sock.status();
  Route r(rtnl_route_alloc());
  if (!r) return absl::ResourceExhaustedError(what);
  rtnl_route_set_family(r.get(), AddressFamily(dst.network()));
  rtnl_route_set_table(r.get(), RT_TABLE_MAIN);
  rtnl_route_set_protocol(r.get(), kSluiceRouteProtocol);
  // "Any scope": otherwise libnl guesses one, and a guess that differs matches no route.
  rtnl_route_set_scope(r.get(), RT_SCOPE_NOWHERE);
  absl::StatusOr<Addr> nl_dst = ToNlAddr(dst.network(), dst.length());
  if (!nl_dst.ok()) return Annotate(nl_dst.status(), what);
  if (int err = rtnl_route_set_dst(r.get(), nl_dst->get()); err < 0) return NlStatus(err, what);
  int err = rtnl_route_delete(sock->get(), r.get(), 0);
  if (err < 0 && err != -NLE_OBJ_NOTFOUND && err != -NLE_NOADDR) return NlStatus(err, what);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<RouteInfo>> LibnlNetlink::ListPeerRoutes() {
  absl::StatusOr<Sock> sock = OpenSocket();
  if (!sock.ok()) return sock.status();
  auto all = MainIPv4Routes(sock->get());
  if (!all.ok()) return all.status();
  std::vector<RouteInfo> out;
  for (const auto& r : *all) {
    if (r.protocol == kSluiceRouteProtocol) out.push_back(r);
  }
  return out;
}

absl::StatusOr<std::string> LibnlNetlink::DefaultRouteDevice() {
  absl::StatusOr<Sock> sock = OpenSocket();
  if (!sock.ok()) return sock.status();
  nl_cache* raw = nullptr;
  if (int err = rtnl_route_alloc_cache(sock->get(), AF_INET, 0, &raw); err < 0) {
    return NlStatus(err, "dump IPv4 routes");
  }
  Cache cache(raw);
  int best_oif = 0;
  uint32_t best_metric = std::numeric_limits<uint32_t>::max();
  bool found = false;
  ForEach<rtnl_route>(cache.get(), [&](rtnl_route* r) {
    if (rtnl_route_get_table(r) != RT_TABLE_MAIN || rtnl_route_get_type(r) != RTN_UNICAST) return;
    nl_addr* dst = rtnl_route_get_dst(r);
    if (dst != nullptr && nl_addr_get_prefixlen(dst) != 0) return;
    if (rtnl_route_get_nnexthops(r) == 0) return;
    uint32_t metric = rtnl_route_get_priority(r);
    if (found && metric >= best_metric) return;
    found = true;
    best_metric = metric;
    best_oif = rtnl_route_nh_get_ifindex(rtnl_route_nexthop_n(r, 0));
  });
  if (!found) return absl::NotFoundError("no IPv4 default route in the main table");
  absl::StatusOr<Link> link = GetLinkByIndex(sock->get(), best_oif);
  if (!link.ok()) return Annotate(link.status(), "resolve the default route's device");
  return std::string(rtnl_link_get_name(link->get()));
}

absl::StatusOr<IpAddress> LibnlNetlink::FirstIPv4Address(const std::string& ifname) {
  if (absl::Status s = ValidateIfname(ifname); !s.ok()) return s;
  absl::StatusOr<Sock> sock = OpenSocket();
  if (!sock.ok()) return sock.status();
  absl::StatusOr<Link> link = GetLink(sock->get(), ifname);
  if (!link.ok()) return link.status();
  absl::StatusOr<std::vector<InterfaceAddress>> addrs =
      AddressesOf(sock->get(), rtnl_link_get_ifindex(link->get()), AF_INET);
  if (!addrs.ok()) return addrs.status();
  if (addrs->empty()) return absl::NotFoundError(absl::StrCat(ifname, " has no IPv4 address"));
  return addrs->front().address;
}

absl::Status LibnlNetlink::SetSysctl(absl::string_view key, absl::string_view value) {
  return WriteSysctl(key, value);
}

namespace {

// Runs `fn` in the netns at `netns_path`, or in the caller's when it is "".
absl::Status InNetnsOrHere(const std::string& netns_path, absl::FunctionRef<absl::Status()> fn) {
  if (netns_path.empty()) return fn();
  return RunInNetns(netns_path, fn);
}

// The kernel keeps tbf's bucket as time (psched ticks of 64 ns) at the rate; the dump gives it
// back so.
constexpr int kPschedShift = 6;

absl::Status ReplaceRootTbfIn(nl_sock* sock, int ifindex, const TbfSpec& spec,
                              absl::string_view what) {
  std::unique_ptr<nl_msg, decltype(&nlmsg_free)> msg(
      nlmsg_alloc_simple(RTM_NEWQDISC, NLM_F_CREATE | NLM_F_REPLACE), &nlmsg_free);
  if (!msg) return absl::ResourceExhaustedError(absl::StrCat(what, ": allocate message"));
  tcmsg tcm{};
  tcm.tcm_family = AF_UNSPEC;
  tcm.tcm_ifindex = ifindex;
  tcm.tcm_parent = TC_H_ROOT;
  tc_tbf_qopt qopt{};
  // A link layer given: the kernel computes packet times itself and needs no rate table.
  qopt.rate.linklayer = TC_LINKLAYER_ETHERNET;
  qopt.rate.rate = static_cast<uint32_t>(
      std::min<uint64_t>(spec.rate_bytes, std::numeric_limits<uint32_t>::max()));
  qopt.limit = spec.limit_bytes;
  int err = nlmsg_append(msg.get(), &tcm, sizeof(tcm), NLMSG_ALIGNTO);
  if (err == 0) err = nla_put_string(msg.get(), TCA_KIND, "tbf");
  nlattr* options = err == 0 ? nla_nest_start(msg.get(), TCA_OPTIONS) : nullptr;
  if (options == nullptr) return NlStatus(err < 0 ? err : -NLE_NOMEM, what);
  err = nla_put(msg.get(), TCA_TBF_PARMS, sizeof(qopt), &qopt);
  if (err == 0 && spec.rate_bytes > std::numeric_limits<uint32_t>::max()) {
    err = nla_put_u64(msg.get(), TCA_TBF_RATE64, spec.rate_bytes);
  }
  if (err == 0) err = nla_put_u32(msg.get(), TCA_TBF_BURST, spec.burst_bytes);
  if (err == 0) err = nla_nest_end(msg.get(), options);
  if (err < 0) return NlStatus(err, what);
  // nl_send_sync frees the message and waits for the kernel's acknowledgement.
  if (int e = nl_send_sync(sock, msg.release()); e < 0) return NlStatus(e, what);
  return absl::OkStatus();
}

struct RootQdiscDump {
  int ifindex = 0;
  bool found = false;
  std::optional<TbfSpec> tbf;
};

int OnQdisc(nl_msg* msg, void* arg) {
  auto* dump = static_cast<RootQdiscDump*>(arg);
  nlmsghdr* h = nlmsg_hdr(msg);
  if (h->nlmsg_type != RTM_NEWQDISC || !nlmsg_valid_hdr(h, sizeof(tcmsg))) return NL_OK;
  const auto* t = static_cast<const tcmsg*>(nlmsg_data(h));
  if (t->tcm_ifindex != dump->ifindex || t->tcm_parent != TC_H_ROOT) return NL_OK;
  dump->found = true;
  nlattr* tb[TCA_MAX + 1] = {};
  if (nlmsg_parse(h, sizeof(tcmsg), tb, TCA_MAX, nullptr) < 0 || tb[TCA_KIND] == nullptr ||
      std::string_view(nla_get_string(tb[TCA_KIND])) != "tbf" || tb[TCA_OPTIONS] == nullptr) {
    return NL_OK;
  }
  nlattr* opts[TCA_TBF_MAX + 1] = {};
  if (nla_parse_nested(opts, TCA_TBF_MAX, tb[TCA_OPTIONS], nullptr) < 0 ||
      opts[TCA_TBF_PARMS] == nullptr ||
      nla_len(opts[TCA_TBF_PARMS]) < static_cast<int>(sizeof(tc_tbf_qopt))) {
    return NL_OK;
  }
  tc_tbf_qopt qopt;
  std::memcpy(&qopt, nla_data(opts[TCA_TBF_PARMS]), sizeof(qopt));
  TbfSpec spec;
  spec.rate_bytes =
      opts[TCA_TBF_RATE64] != nullptr ? nla_get_u64(opts[TCA_TBF_RATE64]) : qopt.rate.rate;
  spec.limit_bytes = qopt.limit;
  const unsigned __int128 bucket_ns = static_cast<unsigned __int128>(qopt.buffer) << kPschedShift;
  spec.burst_bytes = static_cast<uint32_t>(std::min<unsigned __int128>(
      bucket_ns * spec.rate_bytes / 1000000000u, std::numeric_limits<uint32_t>::max()));
  dump->tbf = spec;
  return NL_OK;
}

}  // namespace

absl::Status LibnlNetlink::ReplaceRootTbf(const std::string& netns_path, const std::string& ifname,
                                          const TbfSpec& spec) {
  const std::string what =
      absl::StrCat("set tbf root qdisc (", spec.rate_bytes, " B/s, burst ", spec.burst_bytes,
                   " B) on ", ifname, netns_path.empty() ? "" : " in ", netns_path);
  return InNetnsOrHere(netns_path, [&]() -> absl::Status {
    absl::StatusOr<Sock> sock = OpenSocket();
    if (!sock.ok()) return Annotate(sock.status(), what);
    absl::StatusOr<Link> link = GetLink(sock->get(), ifname);
    if (!link.ok()) return Annotate(link.status(), what);
    return ReplaceRootTbfIn(sock->get(), rtnl_link_get_ifindex(link->get()), spec, what);
  });
}

absl::StatusOr<std::optional<TbfSpec>> LibnlNetlink::RootTbf(const std::string& netns_path,
                                                             const std::string& ifname) {
  const std::string what =
      absl::StrCat("read the root qdisc of ", ifname, netns_path.empty() ? "" : " in ", netns_path);
  RootQdiscDump dump;
  absl::Status s = InNetnsOrHere(netns_path, [&]() -> absl::Status {
    absl::StatusOr<Sock> sock = OpenSocket();
    if (!sock.ok()) return Annotate(sock.status(), what);
    absl::StatusOr<Link> link = GetLink(sock->get(), ifname);
    if (!link.ok()) return Annotate(link.status(), what);
    dump.ifindex = rtnl_link_get_ifindex(link->get());
    tcmsg req{};
    req.tcm_family = AF_UNSPEC;
    req.tcm_ifindex = dump.ifindex;
    if (int e = nl_socket_modify_cb(sock->get(), NL_CB_VALID, NL_CB_CUSTOM, OnQdisc, &dump);
        e < 0) {
      return NlStatus(e, what);
    }
    if (int e = nl_send_simple(sock->get(), RTM_GETQDISC, NLM_F_DUMP, &req, sizeof(req)); e < 0) {
      return NlStatus(e, what);
    }
    if (int e = nl_recvmsgs_default(sock->get()); e < 0) return NlStatus(e, what);
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return dump.tbf;
}

}  // namespace sluice::agent
