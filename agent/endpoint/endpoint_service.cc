#include "agent/endpoint/endpoint_service.h"

#include <arpa/inet.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "agent/endpoint/api_protocol.h"
#include "spdlog/spdlog.h"

namespace sluice::agent {
namespace {

sluice_ep4_key Ep4Key(const IpAddress& addr) { return sluice_ep4_key{htonl(addr.v4_host_order())}; }

// CNI_ARGS keys Kubernetes runtimes pass.
constexpr char kPodNamespaceArg[] = "K8S_POD_NAMESPACE";
constexpr char kPodNameArg[] = "K8S_POD_NAME";

IpamOwner OwnerOf(const std::string& network, const std::string& container_id,
                  const std::string& ifname) {
  return IpamOwner{network, container_id, ifname};
}

absl::Status WithCode(int code, const absl::Status& st, absl::string_view what) {
  return cni::CniStatus(code, absl::StrCat(what, ": ", st.message()));
}

}  // namespace

absl::Status BpfEndpointDatapath::UpsertEndpoint(const IpAddress& addr,
                                                 const sluice_endpoint& value) {
  return dp_.endpoints().Update(Ep4Key(addr), value);
}

absl::Status BpfEndpointDatapath::DeleteEndpoint(const IpAddress& addr, int ifindex) {
  auto cur = dp_.endpoints().Lookup(Ep4Key(addr));
  if (!cur.ok()) return absl::IsNotFound(cur.status()) ? absl::OkStatus() : cur.status();
  if (ifindex >= 0 && static_cast<int>(cur->ifindex) != ifindex) return absl::OkStatus();
  return dp_.endpoints().Delete(Ep4Key(addr));
}

absl::Status BpfEndpointDatapath::AttachPod(int host_ifindex) {
  return dp_.AttachPod(host_ifindex);
}

absl::StatusOr<std::set<IpAddress>> BpfEndpointDatapath::EndpointAddresses() {
  std::set<IpAddress> out;
  auto st = dp_.endpoints().ForEach([&](const sluice_ep4_key& k, const sluice_endpoint&) {
    out.insert(IpAddress::V4(ntohl(k.addr)));
  });
  if (!st.ok()) return st;
  return out;
}

EndpointService::EndpointService(Netlink& netlink, Ipam& ipam, EndpointStore& store,
                                 EndpointDatapath& datapath, EndpointServiceOptions options)
    : netlink_(netlink), ipam_(ipam), store_(store), datapath_(datapath), options_(options) {}

std::unique_ptr<AttachmentLocks::Held> AttachmentLocks::Lock(const std::string& container_id,
                                                             const std::string& ifname) {
  std::string key = absl::StrCat(container_id, "/", ifname);
  Entry* e;
  {
    absl::MutexLock l(&mu_);
    auto& slot = entries_[key];
    if (!slot) slot = std::make_unique<Entry>();
    e = slot.get();
    ++e->users;
  }
  e->mu.Lock();
  return std::make_unique<Held>(this, std::move(key), &e->mu);
}

void AttachmentLocks::Release(const std::string& key, absl::Mutex* mu) {
  mu->Unlock();
  absl::MutexLock l(&mu_);
  auto it = entries_.find(key);
  if (it != entries_.end() && --it->second->users == 0) entries_.erase(it);
}

EndpointServiceStats EndpointService::stats() const {
  absl::MutexLock l(&stats_mu_);
  return stats_;
}

void EndpointService::Count(uint64_t EndpointServiceStats::*field) {
  absl::MutexLock l(&stats_mu_);
  ++(stats_.*field);
}

nlohmann::json EndpointService::Handle(const nlohmann::json& request) {
  auto req = cni::ParseEndpointRequest(request.dump());
  if (!req.ok()) return nlohmann::json::parse(cni::EncodeFailureReply(req.status()));
  auto conf = cni::NetConfFromJson(req->config);
  if (!conf.ok()) return nlohmann::json::parse(cni::EncodeFailureReply(conf.status()));

  absl::Status st;
  nlohmann::json result = nullptr;
  if (req->command == cni::kCommandAdd) {
    auto r = Add(*req, *conf);
    if (r.ok()) result = cni::FormatResult(*r, conf->cni_version);
    st = r.status();
  } else if (req->command == cni::kCommandDel) {
    st = Del(*req, *conf);
  } else if (req->command == cni::kCommandCheck) {
    st = Check(*req, *conf);
  } else if (req->command == cni::kCommandGc) {
    st = Gc(*conf);
  } else if (req->command == cni::kCommandStatus) {
    st = Status();
  } else {
    st = cni::CniStatus(api::kCniInvalidEnvironment,
                        absl::StrCat("unsupported command ", req->command));
  }
  if (!st.ok()) {
    spdlog::warn("{} {}/{}: {}", req->command, req->container_id, req->if_name, st.ToString());
    return nlohmann::json::parse(cni::EncodeFailureReply(st));
  }
  return nlohmann::json::parse(cni::EncodeSuccessReply(result));
}

cni::ResultV1 EndpointService::ResultFor(const Endpoint& ep) const {
  cni::ResultV1 r;
  r.interfaces.push_back({ep.host_ifname, ep.host_mac, "", 0});
  r.interfaces.push_back({ep.ifname, ep.mac, ep.netns, ep.mtu});
  r.ips.push_back({absl::StrCat(ep.ipv4, "/32"), ipam_.gateway().ToString(), 1});
  r.routes.push_back({"0.0.0.0/0", ipam_.gateway().ToString()});
  return r;
}

absl::Status EndpointService::Plumb(const Endpoint& ep) {
  auto addr = IpAddress::Parse(ep.ipv4);
  auto mac = MacAddress::Parse(ep.mac);
  auto host_mac = MacAddress::Parse(ep.host_mac);
  if (!addr.ok() || !mac.ok() || !host_mac.ok()) {
    return absl::InternalError(absl::StrCat("endpoint record of ", ep.container_id, "/",
                                            ep.ifname, " has a malformed address"));
  }
  sluice_endpoint value{};
  value.ifindex = ep.host_ifindex;
  std::memcpy(value.mac, mac->bytes.data(), 6);
  std::memcpy(value.host_mac, host_mac->bytes.data(), 6);
  value.endpoint_id = ep.endpoint_id;
  // The entry first: the program attached next finds the pod from its first packet.
  if (auto st = datapath_.UpsertEndpoint(*addr, value); !st.ok()) {
    return WithCode(api::kSluiceInternal, st, absl::StrCat("endpoint map entry for ", ep.ipv4));
  }
  if (auto st = datapath_.AttachPod(ep.host_ifindex); !st.ok()) {
    return WithCode(api::kSluiceInternal, st, absl::StrCat("attach to ", ep.host_ifname));
  }
  return absl::OkStatus();
}

absl::StatusOr<cni::ResultV1> EndpointService::Add(const cni::EndpointRequest& req,
                                                   const cni::NetConf& conf) {
  absl::ReaderMutexLock node(&node_mu_);
  auto held = attachment_locks_.Lock(req.container_id, req.if_name);
  Count(&EndpointServiceStats::adds);
  auto fail = [&](absl::Status st) {
    Count(&EndpointServiceStats::add_failures);
    return st;
  };
  auto args = cni::ParseCniArgs(req.args);
  if (!args.ok()) return fail(args.status());

  // An earlier ADD of this attachment that never got its DEL: a stale record whose interface is
  // gone is cleaned up; one whose interface exists makes this ADD an error.
  if (auto old = store_.Get(req.container_id, req.if_name)) {
    auto exists = netlink_.LinkExistsInNetns(req.netns, req.if_name);
    if (exists.ok() && *exists) {
      return fail(cni::CniStatus(api::kSluiceInterfaceExists,
                                 absl::StrCat("interface ", req.if_name, " already exists in ",
                                              req.netns, " (container ", req.container_id,
                                              " was added before)")));
    }
    if (auto st = RemoveEndpoint(*old); !st.ok()) return fail(st);
  }
  auto exists = netlink_.LinkExistsInNetns(req.netns, req.if_name);
  if (!exists.ok()) {
    return fail(cni::CniStatus(absl::IsNotFound(exists.status()) ? api::kCniInvalidEnvironment
                                                                 : api::kSluiceInternal,
                               absl::StrCat("CNI_NETNS ", req.netns, ": ",
                                            exists.status().message())));
  }
  if (*exists) {
    return fail(cni::CniStatus(api::kSluiceInterfaceExists,
                               absl::StrCat("interface ", req.if_name, " already exists in ",
                                            req.netns)));
  }

  const IpamOwner owner = OwnerOf(conf.name, req.container_id, req.if_name);
  auto addr = ipam_.Allocate(owner);
  if (!addr.ok()) {
    return fail(WithCode(absl::IsResourceExhausted(addr.status()) ? api::kSluicePoolExhausted
                                                                  : api::kSluiceInternal,
                         addr.status(), "allocate pod address"));
  }
  Endpoint ep;
  ep.container_id = req.container_id;
  ep.ifname = req.if_name;
  ep.netns = req.netns;
  ep.network_name = conf.name;
  if (auto it = args->find(kPodNamespaceArg); it != args->end()) ep.pod_namespace = it->second;
  if (auto it = args->find(kPodNameArg); it != args->end()) ep.pod_name = it->second;
  ep.host_ifname = HostInterfaceName(req.container_id, req.if_name);
  ep.ipv4 = addr->ToString();
  ep.mtu = conf.mtu > 0 ? conf.mtu : options_.default_mtu;
  ep.created = absl::Now();

  // From here on every failure undoes what was done, so a failed ADD leaves nothing behind.
  auto undo = [&](absl::Status st) {
    (void)netlink_.DeleteLink(ep.host_ifname);
    if (ep.host_ifindex > 0) (void)datapath_.DeleteEndpoint(*addr, ep.host_ifindex);
    (void)store_.Remove(ep.container_id, ep.ifname);
    (void)ipam_.Release(owner);
    return fail(st);
  };
  auto veth = netlink_.CreatePodVeth(
      {ep.host_ifname, req.netns, req.if_name, static_cast<uint32_t>(ep.mtu)});
  if (!veth.ok()) {
    int code = absl::IsAlreadyExists(veth.status()) ? api::kSluiceInterfaceExists
                                                    : api::kSluiceInternal;
    return undo(WithCode(code, veth.status(), "create veth"));
  }
  ep.host_ifindex = veth->host_ifindex;
  ep.mac = veth->pod_mac.ToString();
  ep.host_mac = veth->host_mac.ToString();
  if (auto st = netlink_.ConfigurePodInterface(
          {req.netns, req.if_name, *addr, ipam_.gateway(), static_cast<uint32_t>(ep.mtu)});
      !st.ok()) {
    return undo(WithCode(api::kSluiceInternal, st, "configure pod interface"));
  }
  if (auto st = netlink_.ConfigureHostVeth(ep.host_ifname, *addr, veth->pod_mac); !st.ok()) {
    return undo(WithCode(api::kSluiceInternal, st, "configure host veth"));
  }
  auto stored = store_.Put(ep);
  if (!stored.ok()) return undo(WithCode(api::kCniIoFailure, stored.status(), "record endpoint"));
  ep = *stored;
  if (auto st = Plumb(ep); !st.ok()) return undo(st);

  cni::ResultV1 result;
  // Chained after another plugin: keep what it reported and add this interface after it.
  if (!conf.prev_result.is_null()) {
    auto prev = cni::ParseResult(conf.prev_result);
    if (!prev.ok()) return undo(prev.status());
    result = *prev;
  }
  cni::ResultV1 mine = ResultFor(ep);
  int base = static_cast<int>(result.interfaces.size());
  for (auto& ip : mine.ips) {
    if (ip.interface) *ip.interface += base;
  }
  result.interfaces.insert(result.interfaces.end(), mine.interfaces.begin(),
                           mine.interfaces.end());
  result.ips.insert(result.ips.end(), mine.ips.begin(), mine.ips.end());
  result.routes.insert(result.routes.end(), mine.routes.begin(), mine.routes.end());
  spdlog::info("ADD {}/{} pod {}/{}: {} on {} (ifindex {}), endpoint {}", ep.container_id,
               ep.ifname, ep.pod_namespace, ep.pod_name, ep.ipv4, ep.host_ifname,
               ep.host_ifindex, ep.endpoint_id);
  return result;
}

absl::Status EndpointService::RemoveEndpoint(const Endpoint& ep) {
  absl::Status first;
  auto keep = [&](absl::Status st) {
    if (!st.ok() && first.ok()) first = st;
  };
  if (auto addr = IpAddress::Parse(ep.ipv4); addr.ok()) {
    keep(datapath_.DeleteEndpoint(*addr, ep.host_ifindex));
  }
  // Deleting the host side takes the pod side with it, wherever its netns is (or was).
  keep(netlink_.DeleteLink(ep.host_ifname));
  keep(ipam_.Release(OwnerOf(ep.network_name, ep.container_id, ep.ifname)));
  if (first.ok()) keep(store_.Remove(ep.container_id, ep.ifname));
  return first;
}

absl::Status EndpointService::Del(const cni::EndpointRequest& req, const cni::NetConf& conf) {
  absl::ReaderMutexLock node(&node_mu_);
  auto held = attachment_locks_.Lock(req.container_id, req.if_name);
  Count(&EndpointServiceStats::dels);
  if (auto ep = store_.Get(req.container_id, req.if_name)) {
    if (auto st = RemoveEndpoint(*ep); !st.ok()) {
      return WithCode(api::kSluiceInternal, st, "remove endpoint");
    }
    spdlog::info("DEL {}/{}: released {} and {}", ep->container_id, ep->ifname, ep->ipv4,
                 ep->host_ifname);
    return absl::OkStatus();
  }
  // Never added, or a record lost mid-ADD: make sure nothing of it is left either way.
  if (auto st = netlink_.DeleteLink(HostInterfaceName(req.container_id, req.if_name)); !st.ok()) {
    return WithCode(api::kSluiceInternal, st, "delete host veth");
  }
  if (auto st = ipam_.Release(OwnerOf(conf.name, req.container_id, req.if_name)); !st.ok()) {
    return WithCode(api::kCniIoFailure, st, "release address");
  }
  return absl::OkStatus();
}

absl::Status EndpointService::Check(const cni::EndpointRequest& req, const cni::NetConf& conf) {
  absl::ReaderMutexLock node(&node_mu_);
  auto held = attachment_locks_.Lock(req.container_id, req.if_name);
  Count(&EndpointServiceStats::checks);
  auto failed = [&](std::string msg) {
    Count(&EndpointServiceStats::check_failures);
    return cni::CniStatus(api::kSluiceCheckFailed, msg);
  };
  auto ep = store_.Get(req.container_id, req.if_name);
  if (!ep) {
    Count(&EndpointServiceStats::check_failures);
    return cni::CniStatus(api::kCniUnknownContainer,
                          absl::StrCat("no endpoint for container ", req.container_id, " ",
                                       req.if_name));
  }
  if (!conf.prev_result.is_null()) {
    auto prev = cni::ParseResult(conf.prev_result);
    if (!prev.ok()) return prev.status();
    bool listed = false;
    for (const auto& ip : prev->ips) listed |= ip.address == absl::StrCat(ep->ipv4, "/32");
    if (!listed) return failed(absl::StrCat("prevResult does not list ", ep->ipv4));
  }
  auto host = netlink_.LinkByName(ep->host_ifname);
  if (!host.ok()) return failed(absl::StrCat("host veth ", ep->host_ifname, " is missing"));
  if (host->ifindex != ep->host_ifindex) {
    return failed(absl::StrCat("host veth ", ep->host_ifname, " was recreated"));
  }
  auto pod = netlink_.GetPodInterface(req.netns, req.if_name);
  if (!pod.ok()) {
    return failed(absl::StrCat("pod interface ", req.if_name, ": ", pod.status().message()));
  }
  if (pod->link.mac.ToString() != ep->mac) return failed("pod interface MAC changed");
  bool has_addr = false;
  for (const auto& a : pod->addresses) has_addr |= a.address.ToString() == ep->ipv4;
  if (!has_addr) return failed(absl::StrCat("pod interface lost its address ", ep->ipv4));
  bool has_default = false;
  for (const auto& r : pod->routes) {
    has_default |= r.dst.length() == 0 && r.gateway && *r.gateway == ipam_.gateway();
  }
  if (!has_default) return failed("pod default route via the gateway is missing");
  auto addrs = datapath_.EndpointAddresses();
  if (!addrs.ok()) return addrs.status();
  auto addr = IpAddress::Parse(ep->ipv4);
  if (!addr.ok() || !addrs->contains(*addr)) return failed("endpoint map entry is missing");
  return absl::OkStatus();
}

absl::Status EndpointService::Gc(const cni::NetConf& conf) {
  absl::MutexLock node(&node_mu_);
  Count(&EndpointServiceStats::gcs);
  std::set<std::pair<std::string, std::string>> valid;
  for (const auto& a : conf.valid_attachments) valid.insert({a.container_id, a.ifname});
  absl::Status first;
  for (const auto& ep : store_.List()) {
    if (ep.network_name != conf.name || valid.contains({ep.container_id, ep.ifname})) continue;
    spdlog::info("GC {}/{}: not a valid attachment, removing {}", ep.container_id, ep.ifname,
                 ep.ipv4);
    if (auto st = RemoveEndpoint(ep); !st.ok() && first.ok()) first = st;
    Count(&EndpointServiceStats::gc_removed);
  }
  if (auto st = ReleaseLeakedAddresses(); !st.ok() && first.ok()) first = st;
  if (!first.ok()) return WithCode(api::kSluiceInternal, first, "garbage collection");
  return absl::OkStatus();
}

absl::Status EndpointService::ReleaseLeakedAddresses() {
  std::set<IpamOwner> live;
  for (const auto& ep : store_.List()) {
    live.insert(OwnerOf(ep.network_name, ep.container_id, ep.ifname));
  }
  auto freed = ipam_.ReleaseAllExcept(live);
  if (!freed.ok()) return freed.status();
  for (const auto& a : *freed) {
    spdlog::info("released leaked address {} of {}", a.address.ToString(), a.owner.ToString());
  }
  return absl::OkStatus();
}

absl::Status EndpointService::Status() {
  if (ipam_.Allocated().size() >= ipam_.capacity()) {
    return cni::CniStatus(api::kCniNotAvailable,
                          absl::StrCat("pod CIDR ", ipam_.cidr().ToString(),
                                       " has no free address"));
  }
  return absl::OkStatus();
}

absl::Status EndpointService::Restore() {
  absl::MutexLock node(&node_mu_);
  std::set<IpAddress> live_addrs;
  std::set<std::string> live_links;
  for (auto ep : store_.List()) {
    auto link = netlink_.LinkByName(ep.host_ifname);
    if (!link.ok()) {
      spdlog::info("restore {}/{}: veth {} is gone, removing the endpoint", ep.container_id,
                   ep.ifname, ep.host_ifname);
      if (auto st = RemoveEndpoint(ep); !st.ok()) return st;
      continue;
    }
    if (link->ifindex != ep.host_ifindex) {
      ep.host_ifindex = link->ifindex;
      auto stored = store_.Put(ep);
      if (!stored.ok()) return stored.status();
    }
    if (auto st = Plumb(ep); !st.ok()) return st;
    if (auto addr = IpAddress::Parse(ep.ipv4); addr.ok()) live_addrs.insert(*addr);
    live_links.insert(ep.host_ifname);
  }
  auto addrs = datapath_.EndpointAddresses();
  if (!addrs.ok()) return addrs.status();
  for (const auto& a : *addrs) {
    if (live_addrs.contains(a)) continue;
    spdlog::info("restore: removing stale endpoint map entry {}", a.ToString());
    if (auto st = datapath_.DeleteEndpoint(a, EndpointDatapath::kAnyIfindex); !st.ok()) return st;
  }
  auto links = netlink_.ListLinks("lxc");
  if (!links.ok()) return links.status();
  for (const auto& link : *links) {
    if (live_links.contains(link.name)) continue;
    spdlog::info("restore: deleting leaked veth {}", link.name);
    if (auto st = netlink_.DeleteLink(link.name); !st.ok()) return st;
  }
  return ReleaseLeakedAddresses();
}

}  // namespace sluice::agent
