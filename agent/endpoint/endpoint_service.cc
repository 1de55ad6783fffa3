#include "agent/endpoint/endpoint_service.h"

#include <arpa/inet.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/base/deadline.h"
#include "agent/kernel/netns.h"
#include "cni/protocol/wire.h"
#include "loader/tc.h"
#include "nlohmann/json.hpp"
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

// Opens the pod's network namespace for a request, before any lock is taken: the descriptor
// sluice-cni passed (`netns_fd` >= 0), reopened through /proc/self/fd, or (a plugin from before
// descriptors were passed) the path itself. NetnsFd::Open never blocks (a FIFO or device is only
// looked at). Refuses, with code 4, whatever is not a network namespace and the namespaces that
// are not a pod's: the agent's own (the node's, which ADD would otherwise strip of its default
// route) and pid 1's. The path is only named in messages when a descriptor came.
absl::StatusOr<NetnsFd> OpenPodNetns(const std::string& path, int netns_fd) {
  const bool by_fd = netns_fd >= 0;
  const std::string named =
      by_fd ? absl::StrCat("CNI_NETNS ", path, " (the descriptor sluice-cni passed)")
            : absl::StrCat("CNI_NETNS ", path);
  auto ns = NetnsFd::Open(by_fd ? absl::StrCat("/proc/self/fd/", netns_fd) : path);
  if (!ns.ok()) {
    const absl::Status& st = ns.status();
    // A descriptor is whatever the client sent: anything it fails on is the client's doing.
    const bool callers_fault = by_fd || absl::IsNotFound(st) || absl::IsInvalidArgument(st) ||
                               absl::IsPermissionDenied(st);
    return cni::CniStatus(callers_fault ? api::kCniInvalidEnvironment : api::kSluiceInternal,
                          absl::StrCat(named, ": ", st.message()));
  }
  auto id = ns->identity();
  auto own = CurrentNetnsIdentity();
  struct stat process {};
  const bool is_process = ::stat("/proc/self/ns/net", &process) == 0 && id.ok() &&
                          static_cast<uint64_t>(process.st_dev) == id->dev &&
                          static_cast<uint64_t>(process.st_ino) == id->ino;
  if (!id.ok() || !own.ok()) {
    return WithCode(api::kSluiceInternal, id.ok() ? own.status() : id.status(),
                    absl::StrCat("identify the network namespace of ", named));
  }
  struct stat init {};
  const bool is_init = ::stat("/proc/1/ns/net", &init) == 0 &&
                       static_cast<uint64_t>(init.st_dev) == id->dev &&
                       static_cast<uint64_t>(init.st_ino) == id->ino;
  if (*id == *own || is_process || is_init) {
    return cni::CniStatus(
        api::kCniInvalidEnvironment, "plugin's netns and CNI_NETNS must not be the same",
        absl::StrCat(named, " is ",
                     *id == *own || is_process ? "sluice-agent's own network namespace (the node's)"
                                               : "the network namespace of pid 1",
                     ", inode ", id->ino, "; a pod needs a network namespace of its own"));
  }
  return ns;
}

// Whether `ep` is an attachment of network `name`. Records from before the network was recorded
// (no name) belong to whichever network asks.
bool OfNetwork(const Endpoint& ep, const std::string& name) {
  return ep.network_name.empty() || ep.network_name == name;
}

// Whether `link` (found by ep's host_ifname) is the host veth Sluice made for `ep`: it carries
// ep's mark, or, recorded by an agent from before links were marked, it is unmarked and still the
// very link the record names (same ifindex). Anything else is someone else's link.
bool IsEndpointLink(const LinkInfo& link, const Endpoint& ep) {
  if (link.alias == LinkMark(ep.container_id, ep.ifname)) return true;
  return link.alias.empty() && ep.host_ifindex > 0 && link.ifindex == ep.host_ifindex;
}

}  // namespace

// A pod's limit one way from runtimeConfig.bandwidth (rate in bits/s, burst in bits, 0: none
// given). The default bucket holds 10 ms at the rate, at least kMinDefaultBurstBytes (a few
// full-size frames, so TCP keeps its pace at low rates).
BandwidthLimit BandwidthLimitFor(uint64_t rate_bits, uint64_t burst_bits) {
  BandwidthLimit l;
  if (rate_bits == 0) return l;
  l.rate = rate_bits;
  uint64_t burst = burst_bits > 0 ? burst_bits / 8
                                  : std::max<uint64_t>(rate_bits / 8 / 100, kMinDefaultBurstBytes);
  l.burst_bytes = static_cast<uint32_t>(std::min<uint64_t>(burst, UINT32_MAX));
  return l;
}

// The tbf qdisc that enforces `l`: its bucket, and room to queue 25 ms at the rate behind it
// (what the reference bandwidth plugin queues) before dropping.
TbfSpec TbfFor(const BandwidthLimit& l) {
  TbfSpec t;
  t.rate_bytes = l.rate / 8;
  t.burst_bytes = l.burst_bytes;
  t.limit_bytes =
      static_cast<uint32_t>(std::min<uint64_t>(t.rate_bytes / 40 + l.burst_bytes, UINT32_MAX));
  return t;
}

namespace {

// Whether the tbf the kernel reports is the one `want` set: the kernel keeps the bucket as a
// time at the rate (64 ns steps), so it reads back within a little of what was set.
bool TbfMatches(const TbfSpec& got, const TbfSpec& want) {
  auto near = [](uint64_t a, uint64_t b) {
    uint64_t d = a > b ? a - b : b - a;
    return d <= std::max<uint64_t>(b / 100, 64);
  };
  return got.rate_bytes == want.rate_bytes && near(got.burst_bytes, want.burst_bytes) &&
         got.limit_bytes == want.limit_bytes;
}

}  // namespace

absl::Status BpfEndpointDatapath::UpsertEndpoint(const IpAddress& addr,
                                                 const sluice_endpoint& value) {
  return dp_.endpoint_table().Upsert(Ep4Key(addr).addr, value);
}

absl::Status BpfEndpointDatapath::DeleteEndpoint(const IpAddress& addr, int ifindex) {
  auto cur = dp_.endpoints().Lookup(Ep4Key(addr));
  if (!cur.ok()) return absl::IsNotFound(cur.status()) ? absl::OkStatus() : cur.status();
  if (ifindex >= 0 && static_cast<int>(cur->ifindex) != ifindex) return absl::OkStatus();
  return dp_.endpoint_table().Delete(Ep4Key(addr).addr);
}

absl::Status BpfEndpointDatapath::AttachPod(int host_ifindex) {
  return dp_.AttachPod(host_ifindex);
}

absl::StatusOr<bool> BpfEndpointDatapath::PodProgramAttached(int host_ifindex) {
  // The pod's programs: what it sends (TC ingress) and its ingress policy point (TC egress).
  const std::pair<loader::TcDirection, int> programs[] = {
      {loader::TcDirection::kIngress, dp_.from_pod_fd()},
      {loader::TcDirection::kEgress, dp_.to_pod_fd()}};
  for (const auto& [dir, fd] : programs) {
    auto attached = loader::AttachedTcProgram(host_ifindex, dir);
    // No filter at Sluice's handle is ENOENT; no filter chain at its priority at all (the filter
    // was deleted) is EINVAL "Cannot find specified filter chain". Callers have checked that the
    // link itself exists.
    if (absl::IsNotFound(attached.status()) || absl::IsInvalidArgument(attached.status())) {
      return false;
    }
    if (!attached.ok()) return attached.status();
    auto current = loader::ProgramId(fd);
    if (!current.ok()) return current.status();
    if (*attached != *current) return false;
  }
  return true;
}

absl::StatusOr<std::optional<sluice_endpoint>> BpfEndpointDatapath::LookupEndpoint(
    const IpAddress& addr) {
  auto cur = dp_.endpoints().Lookup(Ep4Key(addr));
  if (absl::IsNotFound(cur.status())) return std::optional<sluice_endpoint>();
  if (!cur.ok()) return cur.status();
  return std::optional<sluice_endpoint>(*cur);
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

bool DeadlineSharedMutex::LockShared(absl::Time deadline) {
  absl::MutexLock l(&mu_);
  if (!mu_.AwaitWithDeadline(absl::Condition(this, &DeadlineSharedMutex::CanRead), deadline)) {
    return false;
  }
  ++readers_;
  return true;
}

void DeadlineSharedMutex::UnlockShared() {
  absl::MutexLock l(&mu_);
  --readers_;
}

bool DeadlineSharedMutex::Lock(absl::Time deadline) {
  absl::MutexLock l(&mu_);
  ++writers_waiting_;
  const bool got =
      mu_.AwaitWithDeadline(absl::Condition(this, &DeadlineSharedMutex::CanWrite), deadline);
  --writers_waiting_;  // a writer that gives up lets the readers it held back in
  if (got) writer_ = true;
  return got;
}

void DeadlineSharedMutex::Unlock() {
  absl::MutexLock l(&mu_);
  writer_ = false;
}

std::unique_ptr<AttachmentLocks::Held> AttachmentLocks::Lock(const std::string& container_id,
                                                             const std::string& ifname,
                                                             absl::Time deadline) {
  std::string key = absl::StrCat(container_id, "/", ifname);
  struct Free {
    AttachmentLocks* self;
    const std::string* key;
    static bool Check(Free* f) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return !f->self->held_.contains(*f->key);
    }
  } free{this, &key};
  absl::MutexLock l(&mu_);
  if (!mu_.AwaitWithDeadline(absl::Condition(&Free::Check, &free), deadline)) return nullptr;
  held_.insert(key);
  return std::make_unique<Held>(this, std::move(key));
}

void AttachmentLocks::Release(const std::string& key) {
  absl::MutexLock l(&mu_);
  held_.erase(key);
}

class EndpointService::Hold {
 public:
  Hold(DeadlineSharedMutex* node, bool exclusive) : node_(node), exclusive_(exclusive) {}
  Hold(const Hold&) = delete;
  Hold& operator=(const Hold&) = delete;
  ~Hold() {
    attachment_.reset();
    if (exclusive_) {
      node_->Unlock();
    } else {
      node_->UnlockShared();
    }
  }
  void set_attachment(std::unique_ptr<AttachmentLocks::Held> held) {
    attachment_ = std::move(held);
  }

 private:
  DeadlineSharedMutex* node_;
  bool exclusive_;
  std::unique_ptr<AttachmentLocks::Held> attachment_;
};

absl::StatusOr<std::unique_ptr<EndpointService::Hold>> EndpointService::Enter(
    bool exclusive, const cni::EndpointRequest* req) {
  const absl::Time deadline = WaitDeadline(options_.lock_timeout);
  auto busy = [&](absl::string_view what) {
    Count(&EndpointServiceStats::lock_timeouts);
    return cni::CniStatus(api::kCniTryAgainLater,
                          absl::StrCat("try again later: ", what, " stayed busy for ",
                                       absl::FormatDuration(options_.lock_timeout)));
  };
  const bool got = exclusive ? node_mu_.Lock(deadline) : node_mu_.LockShared(deadline);
  if (!got) return busy(exclusive ? "the node's endpoints" : "the node (a GC or restore)");
  auto hold = std::make_unique<Hold>(&node_mu_, exclusive);
  if (req != nullptr) {
    auto held = attachment_locks_.Lock(req->container_id, req->if_name, deadline);
    if (held == nullptr) {
      return busy(absl::StrCat("another request for ", req->container_id, "/", req->if_name));
    }
    hold->set_attachment(std::move(held));
  }
  return hold;
}

EndpointServiceStats EndpointService::stats() const {
  absl::MutexLock l(&stats_mu_);
  return stats_;
}

void EndpointService::Count(uint64_t EndpointServiceStats::*field) {
  absl::MutexLock l(&stats_mu_);
  ++(stats_.*field);
}

absl::Status EndpointService::CheckNetnsFd(const cni::EndpointRequest& req, int netns_fd) {
  if (netns_fd >= 0 && !req.netns_fd) {
    Count(&EndpointServiceStats::bad_netns);
    return cni::CniStatus(api::kCniInvalidEnvironment,
                          absl::StrCat(req.command,
                                       " came with a file descriptor it does not "
                                       "declare (\"netnsFd\"); refused"));
  }
  if (req.netns_fd && netns_fd < 0) {
    Count(&EndpointServiceStats::bad_netns);
    return cni::CniStatus(api::kCniInvalidEnvironment,
                          absl::StrCat(req.command, " declares the descriptor of CNI_NETNS ",
                                       req.netns, " (\"netnsFd\") but none came with it"));
  }
  if (!req.netns_fd && (req.command == cni::kCommandAdd || req.command == cni::kCommandCheck)) {
    Count(&EndpointServiceStats::netns_paths_opened);
    spdlog::warn(
        "{} {}/{}: the plugin passed no namespace descriptor (a sluice-cni older than the agent); "
        "opening CNI_NETNS {} in the agent's own mount namespace",
        req.command, req.container_id, req.if_name, req.netns);
  }
  return absl::OkStatus();
}

cni::EndpointReply EndpointService::Handle(const cni::EndpointRequest& req, int netns_fd) {
  // The server decoded `req` with these checks; they are repeated here, where the container ID
  // and interface name become file and link names, for whoever else builds a request.
  if (absl::Status valid = cni::ValidateAttachmentParameters(req); !valid.ok()) {
    return cni::FailureReply(valid);
  }
  auto conf = cni::NetConfFromJson(req.config);
  if (!conf.ok()) return cni::FailureReply(conf.status());

  absl::Status st = CheckNetnsFd(req, netns_fd);
  nlohmann::json result = nullptr;
  if (!st.ok()) {
    // Refused before any handler ran.
  } else if (req.command == cni::kCommandAdd) {
    auto r = Add(req, *conf, netns_fd);
    if (r.ok()) result = cni::FormatResult(*r, conf->cni_version);
    st = r.status();
  } else if (req.command == cni::kCommandDel) {
    st = Del(req, *conf);
  } else if (req.command == cni::kCommandCheck) {
    st = Check(req, *conf, netns_fd);
  } else if (req.command == cni::kCommandGc) {
    st = Gc(*conf);
  } else if (req.command == cni::kCommandStatus) {
    st = Status();
  } else {
    st = cni::CniStatus(api::kCniInvalidEnvironment,
                        absl::StrCat("unsupported command ", req.command));
  }
  if (!st.ok()) {
    spdlog::warn("{} {}/{}: {}", req.command, req.container_id, req.if_name, st.ToString());
    return cni::FailureReply(st);
  }
  return cni::SuccessReply(std::move(result));
}

cni::ResultV1 EndpointService::ResultFor(const Endpoint& ep) const {
  cni::ResultV1 r;
  r.interfaces.push_back({ep.host_ifname, ep.host_mac, "", 0});
  r.interfaces.push_back({ep.ifname, ep.mac, ep.netns, ep.mtu});
  r.ips.push_back({absl::StrCat(ep.ipv4, "/32"), ipam_.gateway().ToString(), 1});
  r.routes.push_back({"0.0.0.0/0", ipam_.gateway().ToString()});
  return r;
}

absl::Status EndpointService::WriteEndpointEntry(const Endpoint& ep) {
  auto addr = IpAddress::Parse(ep.ipv4);
  auto mac = MacAddress::Parse(ep.mac);
  auto host_mac = MacAddress::Parse(ep.host_mac);
  if (!addr.ok() || !mac.ok() || !host_mac.ok()) {
    return absl::InternalError(absl::StrCat("endpoint record of ", ep.container_id, "/", ep.ifname,
                                            " has a malformed address"));
  }
  sluice_endpoint value{};
  value.ifindex = ep.host_ifindex;
  std::memcpy(value.mac, mac->bytes.data(), 6);
  std::memcpy(value.host_mac, host_mac->bytes.data(), 6);
  value.endpoint_id = ep.endpoint_id;
  value.flags = ep.ingress.limited() ? SLUICE_EP_F_INGRESS_SHAPED : SLUICE_EP_F_NONE;
  if (auto st = datapath_.UpsertEndpoint(*addr, value); !st.ok()) {
    if (absl::IsResourceExhausted(st)) {  // E2BIG: one entry per local pod, and none is free
      return WithCode(api::kSluiceMapFull, st,
                      absl::StrCat("endpoint map entry for ", ep.ipv4, ": ", maps::name::sluice_ep4,
                                   " is full"));
    }
    return WithCode(api::kSluiceInternal, st, absl::StrCat("endpoint map entry for ", ep.ipv4));
  }
  return absl::OkStatus();
}

absl::Status EndpointService::Plumb(const Endpoint& ep) {
  // The entry first: the program attached next finds the pod from its first packet.
  if (auto st = WriteEndpointEntry(ep); !st.ok()) return st;
  if (auto st = datapath_.AttachPod(ep.host_ifindex); !st.ok()) {
    return WithCode(api::kSluiceInternal, st, absl::StrCat("attach to ", ep.host_ifname));
  }
  return absl::OkStatus();
}

absl::StatusOr<cni::ResultV1> EndpointService::ChainedResult(const Endpoint& ep,
                                                             const cni::NetConf& conf) const {
  cni::ResultV1 result;
  // Chained after another plugin: keep what it reported and add this interface after it.
  if (!conf.prev_result.is_null()) {
    auto prev = cni::ParseResult(conf.prev_result);
    if (!prev.ok()) return prev.status();
    result = *prev;
  }
  cni::ResultV1 mine = ResultFor(ep);
  int base = static_cast<int>(result.interfaces.size());
  for (auto& ip : mine.ips) {
    if (ip.interface) *ip.interface += base;
  }
  result.interfaces.insert(result.interfaces.end(), mine.interfaces.begin(), mine.interfaces.end());
  result.ips.insert(result.ips.end(), mine.ips.begin(), mine.ips.end());
  result.routes.insert(result.routes.end(), mine.routes.begin(), mine.routes.end());
  return result;
}

absl::StatusOr<cni::ResultV1> EndpointService::Add(const cni::EndpointRequest& req,
                                                   const cni::NetConf& conf, int netns_fd) {
  Count(&EndpointServiceStats::adds);
  auto fail = [&](absl::Status st) {
    Count(&EndpointServiceStats::add_failures);
    return st;
  };
  auto args = cni::ParseCniArgs(req.args);
  if (!args.ok()) return fail(args.status());
  // Opened once, before any lock, and used through its fd for the whole request: the path
  // cannot be swapped for another namespace half-way.
  auto pod_ns = OpenPodNetns(req.netns, netns_fd);
  if (!pod_ns.ok()) {
    Count(&EndpointServiceStats::bad_netns);
    return fail(pod_ns.status());
  }
  const std::string ns_path = pod_ns->fd_path();
  auto hold = Enter(/*exclusive=*/false, &req);
  if (!hold.ok()) return fail(hold.status());

  // An earlier ADD of this attachment that never got its DEL. Most often this is the retry of an
  // ADD the plugin gave up on (its deadline, code 11, or killed) that completed here afterwards:
  // when everything it made is in place in the same netns, answer with it again. Anything less
  // (a half-made or damaged attachment, another netns) is removed and made anew.
  if (auto old = store_.Get(req.container_id, req.if_name)) {
    if (!OfNetwork(*old, conf.name)) {
      // The spec: an ADD whose interface already exists in the container must fail. It is
      // another network's attachment, and a live pod's: nothing of it is touched.
      return fail(cni::CniStatus(
          api::kSluiceInterfaceExists,
          absl::StrCat("interface ", req.if_name, " of container ", req.container_id,
                       " already exists: network ", old->network_name, " attached it (", old->ipv4,
                       " on ", old->host_ifname, "), not ", conf.name)));
    }
    if (old->netns == req.netns) {
      absl::Status in_place = Verify(*old, ns_path);
      if (in_place.ok()) {
        auto result = ChainedResult(*old, conf);
        if (!result.ok()) return fail(result.status());
        Count(&EndpointServiceStats::add_retries_in_place);
        spdlog::info("ADD {}/{}: already in place ({} on {}); answering the retry with it",
                     old->container_id, old->ifname, old->ipv4, old->host_ifname);
        return result;
      }
      spdlog::info("ADD {}/{}: redoing an incomplete earlier ADD: {}", old->container_id,
                   old->ifname, std::string(in_place.message()));
      // Same owner: the address stays reserved and is handed out again below.
      if (auto st = RemoveEndpoint(*old, VethRemoval::kNow, /*release_address=*/false); !st.ok()) {
        return fail(WithCode(api::kSluiceInternal, st, "remove the incomplete earlier attachment"));
      }
    } else {
      spdlog::info("ADD {}/{}: replacing the attachment recorded in {} (network {})",
                   old->container_id, old->ifname, old->netns, old->network_name);
      if (auto st = RemoveEndpoint(*old, VethRemoval::kNow); !st.ok()) {
        return fail(WithCode(api::kSluiceInternal, st, "remove the earlier attachment"));
      }
    }
  }
  // A DEL of this attachment (or GC) may have left its veth with the reaper: its name and its pod
  // end are still taken until it is gone.
  const std::string host_ifname = HostInterfaceName(req.container_id, req.if_name);
  if (!reaper_.AwaitGone(host_ifname, WaitDeadline(options_.lock_timeout))) {
    Count(&EndpointServiceStats::lock_timeouts);
    return fail(cni::CniStatus(api::kCniTryAgainLater,
                               absl::StrCat("the removed veth ", host_ifname, " is not gone yet")));
  }
  auto exists = netlink_.LinkExistsInNetns(ns_path, req.if_name);
  if (exists.ok() && *exists && reaper_.pending() > 0) {
    // Another attachment's veth that ended in this netns may still hold the name there.
    if (reaper_.AwaitIdle(WaitDeadline(options_.lock_timeout))) {
      exists = netlink_.LinkExistsInNetns(ns_path, req.if_name);
    }
  }
  if (!exists.ok()) {
    return fail(cni::CniStatus(
        absl::IsNotFound(exists.status()) ? api::kCniInvalidEnvironment : api::kSluiceInternal,
        absl::StrCat("CNI_NETNS ", req.netns, ": ", exists.status().message())));
  }
  if (*exists) {
    return fail(
        cni::CniStatus(api::kSluiceInterfaceExists,
                       absl::StrCat("interface ", req.if_name, " already exists in ", req.netns)));
  }

  // Bandwidth limits: refused before anything is made when they are malformed or a bucket cannot
  // hold one frame.
  if (!conf.bandwidth_status.ok()) return fail(conf.bandwidth_status);
  const int mtu = conf.mtu > 0 ? conf.mtu : options_.default_mtu;
  const BandwidthLimit ingress =
      BandwidthLimitFor(conf.bandwidth.ingress_rate, conf.bandwidth.ingress_burst);
  const BandwidthLimit egress =
      BandwidthLimitFor(conf.bandwidth.egress_rate, conf.bandwidth.egress_burst);
  for (auto [dir, l] : {std::pair{"ingress", ingress}, std::pair{"egress", egress}}) {
    if (l.limited() && l.burst_bytes < static_cast<uint32_t>(mtu) + kEthernetHeaderBytes) {
      return fail(cni::CniStatus(
          api::kCniInvalidNetworkConfig,
          absl::StrCat("runtimeConfig bandwidth: ", dir, "Burst ", uint64_t{l.burst_bytes} * 8,
                       " bits is less than one frame of the pod's MTU ", mtu),
          absl::StrCat("a burst must hold at least ", (mtu + kEthernetHeaderBytes) * 8, " bits")));
    }
  }

  const IpamOwner owner = OwnerOf(conf.name, req.container_id, req.if_name);
  auto addr = ipam_.Allocate(owner);
  if (!addr.ok()) {
    return fail(WithCode(
        absl::IsResourceExhausted(addr.status()) ? api::kSluicePoolExhausted : api::kSluiceInternal,
        addr.status(), "allocate pod address"));
  }
  Endpoint ep;
  ep.container_id = req.container_id;
  ep.ifname = req.if_name;
  ep.netns = req.netns;
  ep.network_name = conf.name;
  if (auto it = args->find(kPodNamespaceArg); it != args->end()) ep.pod_namespace = it->second;
  if (auto it = args->find(kPodNameArg); it != args->end()) ep.pod_name = it->second;
  ep.host_ifname = host_ifname;
  ep.ipv4 = addr->ToString();
  ep.mtu = mtu;
  ep.created = options_.clock->Now();
  ep.ingress = ingress;
  ep.egress = egress;

  // From here on every failure undoes what was done, so a failed ADD leaves nothing behind.
  // Only the link this ADD created is deleted (by its ifindex): when the name was taken by a
  // link that is not ours, CreatePodVeth failed and nothing of it is touched.
  auto undo = [&](absl::Status st) {
    if (ep.host_ifindex > 0) {
      (void)netlink_.DeleteLinkByIndex(ep.host_ifindex);
      (void)datapath_.DeleteEndpoint(*addr, ep.host_ifindex);
    }
    (void)store_.Remove(ep.container_id, ep.ifname);
    (void)ipam_.Release(owner);
    return fail(st);
  };
  auto veth =
      netlink_.CreatePodVeth({ep.host_ifname, ns_path, req.if_name, static_cast<uint32_t>(ep.mtu),
                              LinkMark(ep.container_id, ep.ifname)});
  if (!veth.ok()) {
    int code =
        absl::IsAlreadyExists(veth.status()) ? api::kSluiceInterfaceExists : api::kSluiceInternal;
    return undo(WithCode(code, veth.status(), "create veth"));
  }
  ep.host_ifindex = veth->host_ifindex;
  ep.mac = veth->pod_mac.ToString();
  ep.host_mac = veth->host_mac.ToString();
  if (auto st = netlink_.ConfigurePodInterface(
          {ns_path, req.if_name, *addr, ipam_.gateway(), static_cast<uint32_t>(ep.mtu)});
      !st.ok()) {
    return undo(WithCode(api::kSluiceInternal, st, "configure pod interface"));
  }
  if (auto st = netlink_.ConfigureHostVeth(ep.host_ifname, *addr, veth->pod_mac); !st.ok()) {
    return undo(WithCode(api::kSluiceInternal, st, "configure host veth"));
  }
  // What the pod receives is shaped leaving the host veth (Plumb then marks the endpoint so the
  // datapath sends through it); what it sends, leaving its own interface.
  if (ep.ingress.limited()) {
    if (auto st = netlink_.ReplaceRootTbf("", ep.host_ifname, TbfFor(ep.ingress)); !st.ok()) {
      return undo(WithCode(api::kSluiceInternal, st, "ingress bandwidth limit"));
    }
  }
  if (ep.egress.limited()) {
    if (auto st = netlink_.ReplaceRootTbf(ns_path, req.if_name, TbfFor(ep.egress)); !st.ok()) {
      return undo(WithCode(api::kSluiceInternal, st, "egress bandwidth limit"));
    }
  }
  auto stored = store_.Put(ep);
  if (!stored.ok()) return undo(WithCode(api::kCniIoFailure, stored.status(), "record endpoint"));
  ep = *stored;
  if (policy_hook_ != nullptr) {
    if (auto st = policy_hook_->EndpointAdded(ep); !st.ok()) {
      absl::Status failed =
          undo(WithCode(api::kSluiceInternal, st, "write the pod's policy state"));
      (void)policy_hook_->EndpointRemoved(ep);  // after the record is gone (RemoveEndpoint)
      return failed;
    }
  }
  if (auto st = Plumb(ep); !st.ok()) {
    absl::Status failed = undo(st);
    if (policy_hook_ != nullptr) (void)policy_hook_->EndpointRemoved(ep);
    return failed;
  }

  auto result = ChainedResult(ep, conf);
  if (!result.ok()) return undo(result.status());
  spdlog::info("ADD {}/{} pod {}/{}: {} on {} (ifindex {}), endpoint {}", ep.container_id,
               ep.ifname, ep.pod_namespace, ep.pod_name, ep.ipv4, ep.host_ifname, ep.host_ifindex,
               ep.endpoint_id);
  return result;
}

absl::Status EndpointService::RemoveEndpoint(const Endpoint& ep, VethRemoval veth,
                                             bool release_address) {
  absl::Status first;
  auto keep = [&](absl::Status st) {
    if (!st.ok() && first.ok()) first = st;
  };
  if (auto addr = IpAddress::Parse(ep.ipv4); addr.ok()) {
    keep(datapath_.DeleteEndpoint(*addr, ep.host_ifindex));
  }
  // Deleting the host side takes the pod side with it, wherever its netns is (or was).
  keep(DeleteHostVeth(ep, veth));
  if (release_address) keep(ipam_.Release(OwnerOf(ep.network_name, ep.container_id, ep.ifname)));
  if (first.ok()) keep(store_.Remove(ep.container_id, ep.ifname));
  // Policy last, once the record is gone: the hook deletes the endpoint's entries and asks for a
  // policy reconcile, which must not find the endpoint still recorded (it would write the
  // entries back, with the pod's address as unmanaged in the ipcache, and nothing would ask
  // again). A crash before this line leaves entries of an unrecorded endpoint: the next policy
  // reconcile prunes those.
  if (policy_hook_ != nullptr) keep(policy_hook_->EndpointRemoved(ep));
  return first;
}

absl::Status EndpointService::DeleteHostVeth(const Endpoint& ep, VethRemoval veth) {
  auto link = netlink_.LinkByName(ep.host_ifname);
  if (absl::IsNotFound(link.status())) return absl::OkStatus();
  if (!link.ok()) return link.status();
  if (!IsEndpointLink(*link, ep)) {
    Count(&EndpointServiceStats::foreign_links_kept);
    spdlog::warn(
        "{}/{}: {} (ifindex {}, alias \"{}\") is not the veth Sluice made for it "
        "(mark \"{}\", ifindex {}); leaving it alone",
        ep.container_id, ep.ifname, ep.host_ifname, link->ifindex, link->alias,
        LinkMark(ep.container_id, ep.ifname), ep.host_ifindex);
    return absl::OkStatus();
  }
  if (veth == VethRemoval::kNow) return netlink_.DeleteLinkByIndex(link->ifindex);
  // Down first: the route and neighbour entry of the pod's address go now, with the address.
  if (auto st = netlink_.SetLinkDown(link->ifindex); !st.ok()) return st;
  return reaper_.Enqueue(*link);
}

absl::Status EndpointService::Del(const cni::EndpointRequest& req, const cni::NetConf& conf) {
  Count(&EndpointServiceStats::dels);
  // DEL never opens the netns (it may be gone, and the host side is enough to remove it all).
  auto hold = Enter(/*exclusive=*/false, &req);
  if (!hold.ok()) return hold.status();
  if (auto ep = store_.Get(req.container_id, req.if_name)) {
    if (!OfNetwork(*ep, conf.name)) {
      // This network never attached the interface (another one did): nothing of this network
      // is left to remove, and the other network's pod stays as it is.
      Count(&EndpointServiceStats::other_network_requests);
      spdlog::warn("DEL {}/{} of network {}: the interface belongs to network {}; left alone",
                   req.container_id, req.if_name, conf.name, ep->network_name);
      if (auto st = ipam_.Release(OwnerOf(conf.name, req.container_id, req.if_name)); !st.ok()) {
        return WithCode(api::kCniIoFailure, st, "release address");
      }
      return absl::OkStatus();
    }
    if (auto st = RemoveEndpoint(*ep, VethRemoval::kInBackground); !st.ok()) {
      return WithCode(api::kSluiceInternal, st, "remove endpoint");
    }
    spdlog::info("DEL {}/{}: released {} and {}", ep->container_id, ep->ifname, ep->ipv4,
                 ep->host_ifname);
    return absl::OkStatus();
  }
  // Never added, or a record lost mid-ADD: make sure nothing of it is left either way. Without a
  // record only a link carrying this attachment's mark is ours.
  Endpoint unrecorded;
  unrecorded.container_id = req.container_id;
  unrecorded.ifname = req.if_name;
  unrecorded.host_ifname = HostInterfaceName(req.container_id, req.if_name);
  if (auto st = DeleteHostVeth(unrecorded, VethRemoval::kInBackground); !st.ok()) {
    return WithCode(api::kSluiceInternal, st, "delete host veth");
  }
  if (auto st = ipam_.Release(OwnerOf(conf.name, req.container_id, req.if_name)); !st.ok()) {
    return WithCode(api::kCniIoFailure, st, "release address");
  }
  return absl::OkStatus();
}

absl::Status EndpointService::Verify(const Endpoint& ep, const std::string& pod_netns_path) {
  std::vector<std::string> missing;
  auto addr = IpAddress::Parse(ep.ipv4);
  auto mac = MacAddress::Parse(ep.mac);
  if (!addr.ok() || !mac.ok()) {
    return cni::CniStatus(api::kSluiceCheckFailed, "the endpoint record is malformed",
                          absl::StrCat(ep.ipv4, " ", ep.mac));
  }
  const IpAddress gateway = ipam_.gateway();

  // The record and the address reservation, in the agent and in the state directory (where a
  // restarted agent finds them).
  if (auto st = store_.VerifyPersisted(ep); !st.ok()) {
    missing.push_back(absl::StrCat("the endpoint record: ", st.message()));
  }
  const IpamOwner owner = OwnerOf(ep.network_name, ep.container_id, ep.ifname);
  if (auto held = ipam_.Lookup(owner); !held.has_value()) {
    missing.push_back(absl::StrCat("the IPAM reservation of ", ep.ipv4, " is gone"));
  } else if (*held != *addr) {
    missing.push_back(absl::StrCat("IPAM reserves ", held->ToString(), " for it, not ", ep.ipv4));
  } else if (auto st = ipam_.VerifyPersisted(owner, *addr); !st.ok()) {
    missing.push_back(absl::StrCat("the IPAM reservation of ", ep.ipv4, ": ", st.message()));
  }

  // Host side: the veth, its /32 route and its permanent neighbour entry.
  auto host = netlink_.GetHostVeth(ep.host_ifname);
  if (!host.ok()) {
    missing.push_back(absl::StrCat("host veth ", ep.host_ifname, " is missing"));
  } else if (host->link.ifindex != ep.host_ifindex) {
    missing.push_back(absl::StrCat("host veth ", ep.host_ifname, " was recreated (ifindex ",
                                   host->link.ifindex, ", recorded ", ep.host_ifindex, ")"));
  } else {
    if (!host->link.up) missing.push_back(absl::StrCat("host veth ", ep.host_ifname, " is down"));
    bool route = false;
    for (const auto& r : host->routes) {
      route |= r.dst.length() == 32 && r.dst.network() == *addr && !r.gateway;
    }
    if (!route) {
      missing.push_back(
          absl::StrCat("host route ", ep.ipv4, "/32 dev ", ep.host_ifname, " is missing"));
    }
    bool neighbour = false;
    for (const auto& n : host->neighbours) {
      neighbour |= n.address == *addr && n.mac == *mac && n.permanent;
    }
    if (!neighbour) {
      missing.push_back(absl::StrCat("permanent neighbour ", ep.ipv4, " lladdr ", ep.mac, " on ",
                                     ep.host_ifname, " is missing"));
    }
  }

  // Pod side: the interface, its address and both routes.
  auto pod = netlink_.GetPodInterface(pod_netns_path, ep.ifname);
  if (!pod.ok()) {
    missing.push_back(
        absl::StrCat("pod interface ", ep.ifname, " in ", ep.netns, ": ", pod.status().message()));
  } else {
    if (pod->link.mac != *mac) {
      missing.push_back(
          absl::StrCat("pod interface MAC is ", pod->link.mac.ToString(), ", recorded ", ep.mac));
    }
    if (!pod->link.up) missing.push_back(absl::StrCat("pod interface ", ep.ifname, " is down"));
    bool has_addr = false;
    for (const auto& a : pod->addresses) has_addr |= a.address == *addr;
    if (!has_addr) missing.push_back(absl::StrCat("pod interface lost its address ", ep.ipv4));
    bool has_gateway = false, has_default = false;
    for (const auto& r : pod->routes) {
      has_gateway |= r.dst.length() == 32 && r.dst.network() == gateway && !r.gateway;
      has_default |= r.dst.length() == 0 && r.gateway && *r.gateway == gateway;
    }
    if (!has_gateway) {
      missing.push_back(
          absl::StrCat("pod route to the gateway ", gateway.ToString(), "/32 is missing"));
    }
    if (!has_default) missing.push_back("pod default route via the gateway is missing");
  }

  // Bandwidth limits: the tbf qdiscs ADD set, on the host veth (ingress) and the pod interface.
  for (auto [dir, l, ns, ifname] :
       {std::tuple{"ingress", ep.ingress, std::string(), ep.host_ifname},
        std::tuple{"egress", ep.egress, pod_netns_path, ep.ifname}}) {
    if (!l.limited()) continue;
    auto tbf = netlink_.RootTbf(ns, ifname);
    if (!tbf.ok()) {
      missing.push_back(absl::StrCat(dir, " limit: ", tbf.status().message()));
    } else if (!tbf->has_value() || !TbfMatches(**tbf, TbfFor(l))) {
      missing.push_back(absl::StrCat("the ", dir, " limit's tbf qdisc on ", ifname, " (", l.rate,
                                     " bit/s) is ", tbf->has_value() ? "changed" : "missing"));
    }
  }

  // Datapath: the endpoint map entry pointing at this veth, and the program on it.
  auto entry = datapath_.LookupEndpoint(*addr);
  if (!entry.ok()) {
    missing.push_back(absl::StrCat("endpoint map lookup failed: ", entry.status().message()));
  } else if (!entry->has_value()) {
    missing.push_back(absl::StrCat("endpoint map entry for ", ep.ipv4, " is missing"));
  } else if (static_cast<int>((*entry)->ifindex) != ep.host_ifindex ||
             std::memcmp((*entry)->mac, mac->bytes.data(), 6) != 0) {
    missing.push_back(absl::StrCat("endpoint map entry for ", ep.ipv4,
                                   " points at another interface (ifindex ", (*entry)->ifindex,
                                   ")"));
  } else if (bool shaped = ((*entry)->flags & SLUICE_EP_F_INGRESS_SHAPED) != 0;
             shaped != ep.ingress.limited()) {
    missing.push_back(absl::StrCat("endpoint map entry for ", ep.ipv4,
                                   ep.ingress.limited() ? " lost" : " has",
                                   " the ingress limit's flag"));
  }
  if (host.ok() && host->link.ifindex == ep.host_ifindex) {
    auto attached = datapath_.PodProgramAttached(ep.host_ifindex);
    if (!attached.ok()) {
      missing.push_back(
          absl::StrCat("tc query on ", ep.host_ifname, " failed: ", attached.status().message()));
    } else if (!*attached) {
      missing.push_back(absl::StrCat("the pod program is not attached at tc ingress and egress of ",
                                     ep.host_ifname));
    }
  }
  if (missing.empty()) return absl::OkStatus();
  return cni::CniStatus(api::kSluiceCheckFailed,
                        absl::StrCat("endpoint ", ep.container_id, "/", ep.ifname, ": ",
                                     absl::StrJoin(missing, "; ")));
}

absl::Status EndpointService::Check(const cni::EndpointRequest& req, const cni::NetConf& conf,
                                    int netns_fd) {
  Count(&EndpointServiceStats::checks);
  auto failed = [&](absl::Status st) {
    Count(&EndpointServiceStats::check_failures);
    return st;
  };
  auto pod_ns = OpenPodNetns(req.netns, netns_fd);
  if (!pod_ns.ok()) {
    Count(&EndpointServiceStats::bad_netns);
    return failed(pod_ns.status());
  }
  auto hold = Enter(/*exclusive=*/false, &req);
  if (!hold.ok()) return failed(hold.status());
  auto ep = store_.Get(req.container_id, req.if_name);
  if (!ep) {
    return failed(cni::CniStatus(
        api::kCniUnknownContainer,
        absl::StrCat("no endpoint for container ", req.container_id, " ", req.if_name)));
  }
  if (!OfNetwork(*ep, conf.name)) {
    Count(&EndpointServiceStats::other_network_requests);
    return failed(cni::CniStatus(
        api::kCniUnknownContainer,
        absl::StrCat("no endpoint for container ", req.container_id, " ", req.if_name,
                     " in network ", conf.name, " (network ", ep->network_name, " has it)")));
  }
  if (!conf.prev_result.is_null()) {
    auto prev = cni::ParseResult(conf.prev_result);
    if (!prev.ok()) return failed(prev.status());
    bool listed = false;
    for (const auto& ip : prev->ips) listed |= ip.address == absl::StrCat(ep->ipv4, "/32");
    if (!listed) {
      return failed(cni::CniStatus(api::kSluiceCheckFailed,
                                   absl::StrCat("prevResult does not list ", ep->ipv4)));
    }
  }
  // The endpoint follows its pod interface's MAC (the pod link watch does so as it changes; this
  // covers a notification the kernel dropped). What is left to check is that the chain's result
  // says the same: a MAC changed behind the runtime's back shows here.
  if (auto followed = FollowPodMac(*ep); followed.ok()) {
    ep = *followed;
  } else {
    spdlog::debug("CHECK {}/{}: pod interface MAC not read: {}", req.container_id, req.if_name,
                  followed.status().ToString());
  }
  if (!conf.prev_result.is_null()) {
    auto prev = cni::ParseResult(conf.prev_result);
    if (!prev.ok()) return failed(prev.status());
    for (const auto& iface : prev->interfaces) {
      if (iface.name != ep->ifname || iface.sandbox != ep->netns || iface.mac.empty()) continue;
      auto said = MacAddress::Parse(iface.mac);
      if (!said.ok()) {
        return failed(cni::CniStatus(api::kSluiceCheckFailed,
                                     absl::StrCat("prevResult gives interface ", iface.name,
                                                  " a malformed mac ", iface.mac)));
      }
      if (said->ToString() != ep->mac) {
        return failed(
            cni::CniStatus(api::kSluiceCheckFailed,
                           absl::StrCat("endpoint ", ep->container_id, "/", ep->ifname,
                                        ": pod interface ", ep->ifname, " has MAC ", ep->mac,
                                        ", prevResult says ", said->ToString())));
      }
    }
  }
  if (auto st = Verify(*ep, pod_ns->fd_path()); !st.ok()) return failed(st);
  return absl::OkStatus();
}

absl::Status EndpointService::Gc(const cni::NetConf& conf) {
  Count(&EndpointServiceStats::gcs);
  auto hold = Enter(/*exclusive=*/true, nullptr);
  if (!hold.ok()) return hold.status();
  absl::Status first;
  if (conf.has_valid_attachments) {
    std::set<std::pair<std::string, std::string>> valid;
    for (const auto& a : conf.valid_attachments) valid.insert({a.container_id, a.ifname});
    for (const auto& ep : store_.List()) {
      if (ep.network_name != conf.name || valid.contains({ep.container_id, ep.ifname})) continue;
      spdlog::info("GC {}/{}: not a valid attachment, removing {}", ep.container_id, ep.ifname,
                   ep.ipv4);
      if (auto st = RemoveEndpoint(ep, VethRemoval::kInBackground); !st.ok() && first.ok()) {
        first = st;
      }
      Count(&EndpointServiceStats::gc_removed);
    }
  } else {
    // No list (the key missing or null): the runtime said nothing about which attachments are
    // valid, so every recorded one is kept; only what belongs to no record is collected.
    spdlog::info(
        "GC of network {} without cni.dev/valid-attachments: keeping every recorded "
        "endpoint, releasing only leaked resources",
        conf.name);
  }
  if (auto st = ReleaseLeakedAddresses(); !st.ok() && first.ok()) first = st;
  if (auto st = RemoveLeakedEndpointEntries(); !st.ok() && first.ok()) first = st;
  if (!first.ok()) return WithCode(api::kSluiceInternal, first, "garbage collection");
  return absl::OkStatus();
}

absl::Status EndpointService::RemoveLeakedEndpointEntries() {
  std::set<IpAddress> live;
  for (const auto& ep : store_.List()) {
    if (auto addr = IpAddress::Parse(ep.ipv4); addr.ok()) live.insert(*addr);
  }
  auto addrs = datapath_.EndpointAddresses();
  if (!addrs.ok()) return addrs.status();
  for (const auto& a : *addrs) {
    if (live.contains(a)) continue;
    spdlog::info("removing endpoint map entry {}: no endpoint owns it", a.ToString());
    if (auto st = datapath_.DeleteEndpoint(a, EndpointDatapath::kAnyIfindex); !st.ok()) return st;
  }
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
    return cni::CniStatus(api::kCniNotAvailable, absl::StrCat("pod CIDR ", ipam_.cidr().ToString(),
                                                              " has no free address"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Endpoint> EndpointService::FollowPodMac(const Endpoint& ep) {
  auto peer = netlink_.PeerLink(ep.host_ifname);
  if (!peer.ok()) return peer.status();
  if (peer->mac.ToString() == ep.mac) return ep;
  auto addr = IpAddress::Parse(ep.ipv4);
  if (!addr.ok()) return addr.status();
  Endpoint next = ep;
  next.mac = peer->mac.ToString();
  // The map entry first (packets the datapath delivers to the pod carry its MAC from now on),
  // then the node's neighbour entry, the record last: a restart reads the interface again.
  if (auto st = WriteEndpointEntry(next); !st.ok()) return st;
  if (auto st = netlink_.ConfigureHostVeth(next.host_ifname, *addr, peer->mac); !st.ok()) {
    return st;
  }
  auto stored = store_.Put(next);
  if (!stored.ok()) return stored.status();
  Count(&EndpointServiceStats::pod_mac_changes);
  spdlog::info(
      "{}/{}: pod interface {} changed its MAC {} -> {}; the endpoint map entry, the neighbour "
      "entry on {} and the record follow",
      ep.container_id, ep.ifname, ep.ifname, ep.mac, next.mac, ep.host_ifname);
  return *stored;
}

void EndpointService::FollowPodLinks(const std::vector<PeerLinkChange>& changes, bool all) {
  auto hold = Enter(/*exclusive=*/false, nullptr);
  if (!hold.ok()) {
    spdlog::warn("pod link changes not followed: {}", hold.status().ToString());
    return;
  }
  std::vector<Endpoint> targets;
  if (all) {
    targets = store_.List();
  } else {
    // The host veths whose other end changed: a pod's ifindex alone is not unique (each netns
    // numbers its own links), with the id of its netns it is.
    auto links = netlink_.ListLinks("");
    if (!links.ok()) {
      spdlog::warn("pod link changes not followed: {}", links.status().ToString());
      return;
    }
    std::set<int> host_ifindexes;
    for (const auto& link : *links) {
      for (const auto& c : changes) {
        if (link.peer_netnsid == c.netnsid && link.peer_ifindex == c.ifindex) {
          host_ifindexes.insert(link.ifindex);
        }
      }
    }
    if (host_ifindexes.empty()) return;
    for (const auto& ep : store_.List()) {
      if (host_ifindexes.contains(ep.host_ifindex)) targets.push_back(ep);
    }
  }
  for (const auto& ep : targets) {
    auto held =
        attachment_locks_.Lock(ep.container_id, ep.ifname, WaitDeadline(options_.lock_timeout));
    if (held == nullptr) {
      spdlog::warn("{}/{}: pod link change not followed: the attachment stayed busy",
                   ep.container_id, ep.ifname);
      continue;
    }
    // Looked up again under the attachment's lock: a DEL or a new ADD may have come between.
    auto current = store_.Get(ep.container_id, ep.ifname);
    if (!current || current->host_ifindex != ep.host_ifindex) continue;
    if (auto followed = FollowPodMac(*current);
        !followed.ok() && !absl::IsNotFound(followed.status())) {
      spdlog::warn("{}/{}: pod link change not followed: {}", ep.container_id, ep.ifname,
                   followed.status().ToString());
    }
  }
}

absl::Status EndpointService::Restore() {
  auto hold = Enter(/*exclusive=*/true, nullptr);
  if (!hold.ok()) return hold.status();
  std::set<IpAddress> live_addrs;
  std::set<int> live_links;  // ifindexes
  for (auto ep : store_.List()) {
    auto link = netlink_.LinkByName(ep.host_ifname);
    if (!link.ok() && !absl::IsNotFound(link.status())) return link.status();
    if (!link.ok() || !IsEndpointLink(*link, ep)) {
      if (link.ok()) {
        spdlog::warn(
            "restore {}/{}: {} (ifindex {}, alias \"{}\") is not the veth recorded "
            "(ifindex {}); leaving it and removing the endpoint",
            ep.container_id, ep.ifname, ep.host_ifname, link->ifindex, link->alias,
            ep.host_ifindex);
      } else {
        spdlog::info("restore {}/{}: veth {} is gone, removing the endpoint", ep.container_id,
                     ep.ifname, ep.host_ifname);
      }
      if (auto st = RemoveEndpoint(ep, VethRemoval::kNow); !st.ok()) return st;
      continue;
    }
    if (link->alias.empty()) {
      // Made by an agent from before links were marked (an "lxc" name): adopt it, so from now on
      // it is told apart from other plugins' links by its mark like every other.
      const std::string mark = LinkMark(ep.container_id, ep.ifname);
      if (auto st = netlink_.SetLinkAlias(link->ifindex, mark); !st.ok()) return st;
      spdlog::info("restore {}/{}: adopted recorded veth {} (ifindex {}), marked \"{}\"",
                   ep.container_id, ep.ifname, ep.host_ifname, link->ifindex, mark);
    }
    if (link->ifindex != ep.host_ifindex) {
      ep.host_ifindex = link->ifindex;
      auto stored = store_.Put(ep);
      if (!stored.ok()) return stored.status();
    }
    // A MAC changed while no agent heard it: the entry written next carries the pod's own.
    if (auto followed = FollowPodMac(ep); followed.ok()) {
      ep = *followed;
    } else {
      spdlog::warn("restore {}/{}: pod interface MAC not read, keeping {}: {}", ep.container_id,
                   ep.ifname, ep.mac, followed.status().ToString());
    }
    // The ingress limit's qdisc before the entry that sends through it (it outlives an agent
    // restart on its veth; set again in case someone replaced it meanwhile).
    if (ep.ingress.limited()) {
      if (auto st = netlink_.ReplaceRootTbf("", ep.host_ifname, TbfFor(ep.ingress)); !st.ok()) {
        spdlog::error("restore {}/{}: ingress limit on {}: {}", ep.container_id, ep.ifname,
                      ep.host_ifname, st.ToString());
      }
    }
    if (auto st = Plumb(ep); !st.ok()) return st;
    if (auto addr = IpAddress::Parse(ep.ipv4); addr.ok()) {
      live_addrs.insert(*addr);
      // The live pod keeps its address whatever the IPAM directory lost: it is never handed to
      // another pod.
      if (auto st = ipam_.Reserve(OwnerOf(ep.network_name, ep.container_id, ep.ifname), *addr);
          !st.ok()) {
        spdlog::error("restore {}/{}: cannot hold {} for it: {}", ep.container_id, ep.ifname,
                      ep.ipv4, st.ToString());
      }
    }
    live_links.insert(ep.host_ifindex);
  }
  auto addrs = datapath_.EndpointAddresses();
  if (!addrs.ok()) return addrs.status();
  for (const auto& a : *addrs) {
    if (live_addrs.contains(a)) continue;
    spdlog::info("restore: removing stale endpoint map entry {}", a.ToString());
    if (auto st = datapath_.DeleteEndpoint(a, EndpointDatapath::kAnyIfindex); !st.ok()) return st;
  }
  // Leaked veths: links carrying Sluice's mark that no record names. Whatever else is on the
  // node (another plugin's lxc* veths, lxc_health, anything unmarked) is not looked at.
  auto links = netlink_.ListLinks("");
  if (!links.ok()) return links.status();
  for (const auto& link : *links) {
    if (!absl::StartsWith(link.alias, kSluiceLinkMarkPrefix)) continue;
    if (live_links.contains(link.ifindex)) continue;
    spdlog::info("restore: deleting leaked veth {} (ifindex {}, alias \"{}\")", link.name,
                 link.ifindex, link.alias);
    if (auto st = netlink_.DeleteLinkByIndex(link.ifindex); !st.ok()) return st;
  }
  return ReleaseLeakedAddresses();
}

}  // namespace sluice::agent
