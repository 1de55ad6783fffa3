// In-memory stand-ins for the agent's kernel boundary, for tests that check what the agent asks
// of the kernel rather than the kernel itself (the real implementations have privileged tests
// of their own): a Netlink that keeps links, pod namespaces, routes and sysctls in maps, and
// an endpoint datapath that keeps the endpoint map and attached programs. Both record every
// call in order and can be told to fail the next call of an operation.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "agent/endpoint/endpoint_service.h"
#include "agent/kernel/netlink.h"

namespace sluice::testing {

// Failures to inject: the next call of `op` (the method name, e.g. "CreatePodVeth") returns
// the given status.
class FailureScript {
 public:
  void FailNext(const std::string& op, absl::Status status) {
    absl::MutexLock l(&mu_);
    next_[op] = std::move(status);
  }
  // Records the call; returns the injected failure for it, if any.
  absl::Status Enter(const std::string& op) {
    absl::MutexLock l(&mu_);
    calls_.push_back(op);
    auto it = next_.find(op);
    if (it == next_.end()) return absl::OkStatus();
    absl::Status st = std::move(it->second);
    next_.erase(it);
    return st;
  }
  std::vector<std::string> calls() const {
    absl::MutexLock l(&mu_);
    return calls_;
  }

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, absl::Status> next_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> calls_ ABSL_GUARDED_BY(mu_);
};

class FakeNetlink final : public agent::Netlink {
 public:
  // A network namespace the fake knows: links by name, with the pod-side configuration.
  struct Netns {
    std::map<std::string, agent::LinkInfo> links;
    std::map<std::string, agent::PodInterfaceConfig> configured;  // by ifname
  };

  FakeNetlink() {
    agent::LinkInfo lo;
    lo.name = "lo";
    lo.ifindex = 1;
    lo.mtu = 65536;
    lo.up = true;
    host_.links["lo"] = lo;
  }

  // ---- set-up and inspection ----
  FailureScript& script() { return script_; }
  void AddNetns(const std::string& path) {
    absl::MutexLock l(&mu_);
    netns_[path];
  }
  void RemoveNetns(const std::string& path) {
    absl::MutexLock l(&mu_);
    netns_.erase(path);
  }
  agent::LinkInfo AddHostLink(const std::string& name, uint32_t mtu = 1500,
                              const std::string& alias = "") {
    absl::MutexLock l(&mu_);
    return NewLinkLocked(host_, name, mtu, alias);
  }
  void SetDefaultRoute(const std::string& dev, std::optional<agent::IpAddress> addr) {
    absl::MutexLock l(&mu_);
    default_dev_ = dev;
    if (addr) first_v4_[dev] = *addr;
  }
  bool HostLinkExists(const std::string& name) const {
    absl::MutexLock l(&mu_);
    return host_.links.contains(name);
  }
  std::set<std::string> HostLinkNames() const {
    absl::MutexLock l(&mu_);
    std::set<std::string> names;
    for (const auto& [n, _] : host_.links) names.insert(n);
    return names;
  }
  std::optional<Netns> NetnsAt(const std::string& path) const {
    absl::MutexLock l(&mu_);
    auto it = netns_.find(path);
    if (it == netns_.end()) return std::nullopt;
    return it->second;
  }
  // What `ip link set IFNAME address MAC` inside the pod netns does (tuning's "mac").
  void SetPodLinkMac(const std::string& netns_path, const std::string& ifname,
                     const agent::MacAddress& mac) {
    absl::MutexLock l(&mu_);
    netns_.at(netns_path).links.at(ifname).mac = mac;
  }
  // The MAC of the host veth's permanent neighbour entry for its pod.
  std::optional<agent::MacAddress> NeighbourMac(const std::string& host_ifname) const {
    absl::MutexLock l(&mu_);
    auto it = host_veth_macs_.find(host_ifname);
    if (it == host_veth_macs_.end()) return std::nullopt;
    return it->second;
  }
  std::map<std::string, agent::IpAddress> host_routes() const {  // pod /32 -> host veth
    absl::MutexLock l(&mu_);
    std::map<std::string, agent::IpAddress> out;
    for (const auto& [dev, addr] : host_veth_routes_) out.emplace(dev, addr);
    return out;
  }
  std::map<agent::IpPrefix, agent::IpAddress> peer_routes() const {
    absl::MutexLock l(&mu_);
    return peer_routes_;
  }
  std::map<std::string, std::string> sysctls() const {
    absl::MutexLock l(&mu_);
    return sysctls_;
  }

  // ---- agent::Netlink ----
  absl::StatusOr<agent::PodVeth> CreatePodVeth(const agent::PodVethSpec& spec) override {
    if (auto st = script_.Enter("CreatePodVeth"); !st.ok()) return st;
    absl::MutexLock l(&mu_);
    auto ns = netns_.find(spec.pod_netns_path);
    if (ns == netns_.end()) {
      return absl::NotFoundError(absl::StrCat("netns ", spec.pod_netns_path, " not found"));
    }
    if (ns->second.links.contains(spec.pod_ifname)) {
      return absl::AlreadyExistsError(
          absl::StrCat(spec.pod_ifname, " exists in ", spec.pod_netns_path));
    }
    // A stale host end carrying this very mark is replaced, as the real one does; any other link
    // of that name is left alone.
    if (auto it = host_.links.find(spec.host_ifname); it != host_.links.end()) {
      if (spec.alias.empty() || it->second.alias != spec.alias) {
        return absl::AlreadyExistsError(
            absl::StrCat(spec.host_ifname, " exists (alias \"", it->second.alias, "\")"));
      }
      host_.links.erase(it);
    }
    agent::LinkInfo host = NewLinkLocked(host_, spec.host_ifname, spec.mtu, spec.alias);
    agent::LinkInfo pod = NewLinkLocked(ns->second, spec.pod_ifname, spec.mtu, spec.alias);
    peer_of_[spec.host_ifname] = {spec.pod_netns_path, spec.pod_ifname};
    return agent::PodVeth{host.ifindex, host.mac, pod.ifindex, pod.mac};
  }

  absl::Status ConfigurePodInterface(const agent::PodInterfaceConfig& config) override {
    if (auto st = script_.Enter("ConfigurePodInterface"); !st.ok()) return st;
    absl::MutexLock l(&mu_);
    auto ns = netns_.find(config.netns_path);
    if (ns == netns_.end()) return absl::NotFoundError("netns not found");
    auto link = ns->second.links.find(config.ifname);
    if (link == ns->second.links.end()) return absl::NotFoundError("pod link not found");
    link->second.up = true;
    link->second.mtu = config.mtu;
    ns->second.configured[config.ifname] = config;
    return absl::OkStatus();
  }

  absl::Status ConfigureHostVeth(const std::string& host_ifname, const agent::IpAddress& pod_addr,
                                 const agent::MacAddress& pod_mac) override {
    if (auto st = script_.Enter("ConfigureHostVeth"); !st.ok()) return st;
    absl::MutexLock l(&mu_);
    auto link = host_.links.find(host_ifname);
    if (link == host_.links.end()) return absl::NotFoundError("host link not found");
    link->second.up = true;
    host_veth_routes_[host_ifname] = pod_addr;
    host_veth_macs_[host_ifname] = pod_mac;
    return absl::OkStatus();
  }

  absl::Status DeleteLink(const std::string& ifname) override {
    if (auto st = script_.Enter("DeleteLink"); !st.ok()) return st;
    absl::MutexLock l(&mu_);
    host_.links.erase(ifname);
    host_veth_routes_.erase(ifname);
    // Deleting the host end of a veth removes the pod end, as in the kernel.
    if (auto it = peer_of_.find(ifname); it != peer_of_.end()) {
      if (auto ns = netns_.find(it->second.first); ns != netns_.end()) {
        ns->second.links.erase(it->second.second);
        ns->second.configured.erase(it->second.second);
      }
      peer_of_.erase(it);
    }
    return absl::OkStatus();
  }

  absl::Status DeleteLinkByIndex(int ifindex) override {
    if (auto st = script_.Enter("DeleteLinkByIndex"); !st.ok()) return st;
    std::string name;
    {
      absl::MutexLock l(&mu_);
      for (const auto& [n, link] : host_.links) {
        if (link.ifindex == ifindex) name = n;
      }
    }
    if (name.empty()) return absl::OkStatus();
    return DeleteLink(name);
  }

  absl::Status SetLinkDown(int ifindex) override {
    if (auto st = script_.Enter("SetLinkDown"); !st.ok()) return st;
    absl::MutexLock l(&mu_);
    for (auto& [n, link] : host_.links) {
      if (link.ifindex != ifindex) continue;
      link.up = false;
      host_veth_routes_.erase(n);  // the kernel drops the routes through a link set down
    }
    return absl::OkStatus();
  }

  absl::Status SetLinkAlias(int ifindex, const std::string& alias) override {
    if (auto st = script_.Enter("SetLinkAlias"); !st.ok()) return st;
    absl::MutexLock l(&mu_);
    for (auto& [n, link] : host_.links) {
      if (link.ifindex == ifindex) {
        link.alias = alias;
        return absl::OkStatus();
      }
    }
    return absl::NotFoundError(absl::StrCat("link #", ifindex));
  }

  absl::StatusOr<agent::LinkInfo> LinkByName(const std::string& ifname) override {
    if (auto st = script_.Enter("LinkByName"); !st.ok()) return st;
    absl::MutexLock l(&mu_);
    auto it = host_.links.find(ifname);
    if (it == host_.links.end()) return absl::NotFoundError(absl::StrCat("link ", ifname));
    return it->second;
  }

  absl::StatusOr<bool> LinkExistsInNetns(const std::string& netns_path,
                                         const std::string& ifname) override {
    if (auto st = script_.Enter("LinkExistsInNetns"); !st.ok()) return st;
    absl::MutexLock l(&mu_);
    auto ns = netns_.find(netns_path);
    if (ns == netns_.end()) return absl::NotFoundError(absl::StrCat("netns ", netns_path));
    return ns->second.links.contains(ifname);
  }

  absl::StatusOr<std::vector<agent::LinkInfo>> ListLinks(absl::string_view prefix) override {
    if (auto st = script_.Enter("ListLinks"); !st.ok()) return st;
    absl::MutexLock l(&mu_);
    std::vector<agent::LinkInfo> out;
    for (const auto& [name, link] : host_.links) {
      if (absl::StartsWith(name, prefix)) out.push_back(link);
    }
    return out;
  }

  absl::StatusOr<agent::PodInterface> GetPodInterface(const std::string& netns_path,
                                                      const std::string& ifname) override {
    if (auto st = script_.Enter("GetPodInterface"); !st.ok()) return st;
    absl::MutexLock l(&mu_);
    auto ns = netns_.find(netns_path);
    if (ns == netns_.end()) return absl::NotFoundError(absl::StrCat("netns ", netns_path));
    auto link = ns->second.links.find(ifname);
    if (link == ns->second.links.end()) return absl::NotFoundError(absl::StrCat("link ", ifname));
    agent::PodInterface out;
    out.link = link->second;
    if (auto c = ns->second.configured.find(ifname); c != ns->second.configured.end()) {
      out.addresses.push_back(agent::InterfaceAddress::Host(c->second.address));
      agent::RouteInfo gw;
      gw.dst = *agent::IpPrefix::Make(c->second.gateway, 32);
      gw.oif = link->second.ifindex;
      gw.scope = 253;  // RT_SCOPE_LINK
      gw.table = 254;  // RT_TABLE_MAIN
      out.routes.push_back(gw);
      agent::RouteInfo def;
      def.dst = *agent::IpPrefix::Parse("0.0.0.0/0");
      def.gateway = c->second.gateway;
      def.oif = link->second.ifindex;
      def.table = 254;
      out.routes.push_back(def);
    }
    return out;
  }

  absl::StatusOr<agent::LinkInfo> PeerLink(const std::string& host_ifname) override {
    if (auto st = script_.Enter("PeerLink"); !st.ok()) return st;
    absl::MutexLock l(&mu_);
    auto peer = peer_of_.find(host_ifname);
    if (peer == peer_of_.end()) return absl::NotFoundError(absl::StrCat("peer of ", host_ifname));
    auto ns = netns_.find(peer->second.first);
    if (ns == netns_.end()) return absl::NotFoundError(absl::StrCat("netns of ", host_ifname));
    auto link = ns->second.links.find(peer->second.second);
    if (link == ns->second.links.end()) return absl::NotFoundError("pod link not found");
    return link->second;
  }

  absl::StatusOr<agent::HostVeth> GetHostVeth(const std::string& host_ifname) override {
    if (auto st = script_.Enter("GetHostVeth"); !st.ok()) return st;
    absl::MutexLock l(&mu_);
    auto link = host_.links.find(host_ifname);
    if (link == host_.links.end()) return absl::NotFoundError(absl::StrCat("link ", host_ifname));
    agent::HostVeth out;
    out.link = link->second;
    if (auto r = host_veth_routes_.find(host_ifname); r != host_veth_routes_.end()) {
      agent::RouteInfo route;
      route.dst = *agent::IpPrefix::Make(r->second, 32);
      route.oif = link->second.ifindex;
      route.scope = 253;  // RT_SCOPE_LINK
      route.table = 254;  // RT_TABLE_MAIN
      out.routes.push_back(route);
      agent::NeighbourInfo neigh;
      neigh.address = r->second;
      neigh.mac = host_veth_macs_[host_ifname];
      neigh.permanent = true;
      out.neighbours.push_back(neigh);
    }
    return out;
  }

  absl::Status EnsureDummyWithAddress(const std::string& name,
                                      const agent::InterfaceAddress& addr) override {
    if (auto st = script_.Enter("EnsureDummyWithAddress"); !st.ok()) return st;
    absl::MutexLock l(&mu_);
    if (!host_.links.contains(name)) NewLinkLocked(host_, name, 1500);
    first_v4_.emplace(name, addr.address);
    return absl::OkStatus();
  }

  absl::StatusOr<agent::LinkInfo> EnsureVxlanDevice(const agent::VxlanSpec& spec) override {
    if (auto st = script_.Enter("EnsureVxlanDevice"); !st.ok()) return st;
    absl::MutexLock l(&mu_);
    if (!host_.links.contains(spec.name)) NewLinkLocked(host_, spec.name, spec.mtu);
    agent::LinkInfo& link = host_.links[spec.name];
    link.mtu = spec.mtu;
    link.alias = spec.alias;
    link.up = true;
    return link;
  }

  absl::Status ReplacePeerRoute(const agent::IpPrefix& dst, const agent::IpAddress& via) override {
    if (auto st = script_.Enter("ReplacePeerRoute"); !st.ok()) return st;
    absl::MutexLock l(&mu_);
    peer_routes_[dst] = via;
    return absl::OkStatus();
  }

  absl::Status DeletePeerRoute(const agent::IpPrefix& dst) override {
    if (auto st = script_.Enter("DeletePeerRoute"); !st.ok()) return st;
    absl::MutexLock l(&mu_);
    peer_routes_.erase(dst);
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<agent::RouteInfo>> ListPeerRoutes() override {
    if (auto st = script_.Enter("ListPeerRoutes"); !st.ok()) return st;
    absl::MutexLock l(&mu_);
    std::vector<agent::RouteInfo> out;
    for (const auto& [dst, via] : peer_routes_) {
      agent::RouteInfo r;
      r.dst = dst;
      r.gateway = via;
      r.table = 254;
      r.protocol = agent::kSluiceRouteProtocol;
      out.push_back(r);
    }
    return out;
  }

  absl::StatusOr<std::string> DefaultRouteDevice() override {
    if (auto st = script_.Enter("DefaultRouteDevice"); !st.ok()) return st;
    absl::MutexLock l(&mu_);
    if (default_dev_.empty()) return absl::NotFoundError("no IPv4 default route");
    return default_dev_;
  }

  absl::StatusOr<agent::IpAddress> FirstIPv4Address(const std::string& ifname) override {
    if (auto st = script_.Enter("FirstIPv4Address"); !st.ok()) return st;
    absl::MutexLock l(&mu_);
    auto it = first_v4_.find(ifname);
    if (it == first_v4_.end()) return absl::NotFoundError(absl::StrCat(ifname, " has no IPv4"));
    return it->second;
  }

  absl::Status SetSysctl(absl::string_view key, absl::string_view value) override {
    if (auto st = script_.Enter("SetSysctl"); !st.ok()) return st;
    absl::MutexLock l(&mu_);
    sysctls_[std::string(key)] = std::string(value);
    return absl::OkStatus();
  }

  absl::Status ReplaceRootTbf(const std::string& netns_path, const std::string& ifname,
                              const agent::TbfSpec& spec) override {
    if (auto st = script_.Enter("ReplaceRootTbf"); !st.ok()) return st;
    absl::MutexLock l(&mu_);
    tbfs_[{netns_path, ifname}] = spec;
    return absl::OkStatus();
  }
  absl::StatusOr<std::optional<agent::TbfSpec>> RootTbf(const std::string& netns_path,
                                                        const std::string& ifname) override {
    if (auto st = script_.Enter("RootTbf"); !st.ok()) return st;
    absl::MutexLock l(&mu_);
    auto it = tbfs_.find({netns_path, ifname});
    if (it == tbfs_.end()) return std::optional<agent::TbfSpec>();
    return std::optional<agent::TbfSpec>(it->second);
  }
  // Root tbf qdiscs set, by (netns path, "" for the host; ifname).
  std::map<std::pair<std::string, std::string>, agent::TbfSpec> tbfs() const {
    absl::MutexLock l(&mu_);
    return tbfs_;
  }

 private:
  std::map<std::pair<std::string, std::string>, agent::TbfSpec> tbfs_ ABSL_GUARDED_BY(mu_);
  agent::LinkInfo NewLinkLocked(Netns& ns, const std::string& name, uint32_t mtu,
                                const std::string& alias = "") ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    agent::LinkInfo link;
    link.name = name;
    link.alias = alias;
    link.ifindex = next_ifindex_++;
    link.mtu = mtu;
    link.mac.bytes = {0x02,
                      0x00,
                      0x00,
                      0x00,
                      static_cast<uint8_t>(link.ifindex >> 8),
                      static_cast<uint8_t>(link.ifindex)};
    ns.links[name] = link;
    return link;
  }

  FailureScript script_;
  mutable absl::Mutex mu_;
  Netns host_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Netns> netns_ ABSL_GUARDED_BY(mu_);
  // host veth -> (pod netns path, pod ifname)
  std::map<std::string, std::pair<std::string, std::string>> peer_of_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, agent::IpAddress> host_veth_routes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, agent::MacAddress> host_veth_macs_ ABSL_GUARDED_BY(mu_);
  std::map<agent::IpPrefix, agent::IpAddress> peer_routes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, agent::IpAddress> first_v4_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> sysctls_ ABSL_GUARDED_BY(mu_);
  std::string default_dev_ ABSL_GUARDED_BY(mu_);
  int next_ifindex_ ABSL_GUARDED_BY(mu_) = 100;
};

// The endpoint datapath in memory: the endpoint map and the set of host ifindexes with the pod
// program attached.
class FakeEndpointDatapath final : public agent::EndpointDatapath {
 public:
  FailureScript& script() { return script_; }
  std::map<agent::IpAddress, sluice_endpoint> endpoints() const {
    absl::MutexLock l(&mu_);
    return endpoints_;
  }
  std::set<int> attached() const {
    absl::MutexLock l(&mu_);
    return attached_;
  }
  void Detach(int ifindex) {
    absl::MutexLock l(&mu_);
    attached_.erase(ifindex);
  }

  absl::Status UpsertEndpoint(const agent::IpAddress& addr, const sluice_endpoint& value) override {
    if (auto st = script_.Enter("UpsertEndpoint"); !st.ok()) return st;
    absl::MutexLock l(&mu_);
    endpoints_[addr] = value;
    return absl::OkStatus();
  }
  absl::Status DeleteEndpoint(const agent::IpAddress& addr, int ifindex) override {
    if (auto st = script_.Enter("DeleteEndpoint"); !st.ok()) return st;
    absl::MutexLock l(&mu_);
    auto it = endpoints_.find(addr);
    if (it != endpoints_.end() &&
        (ifindex == kAnyIfindex || static_cast<int>(it->second.ifindex) == ifindex)) {
      endpoints_.erase(it);
    }
    return absl::OkStatus();
  }
  absl::Status AttachPod(int host_ifindex) override {
    if (auto st = script_.Enter("AttachPod"); !st.ok()) return st;
    absl::MutexLock l(&mu_);
    attached_.insert(host_ifindex);
    return absl::OkStatus();
  }
  absl::StatusOr<bool> PodProgramAttached(int host_ifindex) override {
    if (auto st = script_.Enter("PodProgramAttached"); !st.ok()) return st;
    absl::MutexLock l(&mu_);
    return attached_.contains(host_ifindex);
  }
  absl::StatusOr<std::optional<sluice_endpoint>> LookupEndpoint(
      const agent::IpAddress& addr) override {
    if (auto st = script_.Enter("LookupEndpoint"); !st.ok()) return st;
    absl::MutexLock l(&mu_);
    auto it = endpoints_.find(addr);
    if (it == endpoints_.end()) return std::optional<sluice_endpoint>();
    return std::optional<sluice_endpoint>(it->second);
  }
  absl::StatusOr<std::set<agent::IpAddress>> EndpointAddresses() override {
    if (auto st = script_.Enter("EndpointAddresses"); !st.ok()) return st;
    absl::MutexLock l(&mu_);
    std::set<agent::IpAddress> out;
    for (const auto& [addr, _] : endpoints_) out.insert(addr);
    return out;
  }

 private:
  FailureScript script_;
  mutable absl::Mutex mu_;
  std::map<agent::IpAddress, sluice_endpoint> endpoints_ ABSL_GUARDED_BY(mu_);
  std::set<int> attached_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::testing
