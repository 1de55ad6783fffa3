// The reconciler's write order, against a recording fake of the LB maps: every operation is
// logged as text ("slot+ 10.96.0.10:80/6#2 -> 3") and the fake holds the contents, so a second
// reconciler can restore from it.
#include "agent/service/reconciler.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/k8s/store.h"
#include "agent/metrics/registry.h"
#include "agent/service/sync.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

IpAddress Ip(const std::string& s) { return *IpAddress::Parse(s); }

std::string Addr(uint32_t be) {
  char buf[INET_ADDRSTRLEN];
  in_addr a{be};
  inet_ntop(AF_INET, &a, buf, sizeof(buf));
  return buf;
}

std::string Fe(const sluice_lb4_key& k) {
  return absl::StrCat(Addr(k.addr), ":", ntohs(k.dport), "/", k.proto,
                      k.scope ? absl::StrCat("@", k.scope) : "");
}

using SvcKey = std::tuple<uint32_t, uint16_t, uint8_t, uint8_t, uint16_t>;
SvcKey Tup(const sluice_lb4_key& k) { return {k.addr, k.dport, k.proto, k.scope, k.backend_slot}; }
sluice_lb4_key FromTup(const SvcKey& t) {
  sluice_lb4_key k{};
  std::tie(k.addr, k.dport, k.proto, k.scope, k.backend_slot) = t;
  return k;
}
using RangeTup = std::tuple<uint32_t, uint32_t, uint32_t>;

// In-memory maps that log every mutation.
class RecordingLbMaps : public LbMaps {
 public:
  std::vector<std::string> ops;
  std::map<SvcKey, sluice_lb4_service> svc;
  std::map<uint32_t, sluice_lb4_backend> be;
  std::map<uint32_t, sluice_lb4_revnat> rnat;
  std::map<RangeTup, bool> ranges;
  // Conntrack: key -> (rev_nat_id, backend_id); forward and reply entries alike.
  std::map<std::tuple<int, uint8_t>, std::pair<uint32_t, uint32_t>> ct;

  LbCapacity capacity;  // read by a reconciler when it is created

  std::vector<std::string> Take() { return std::exchange(ops, {}); }
  LbCapacity Capacity() const override { return capacity; }

  absl::Status UpdateService(const sluice_lb4_key& k, const sluice_lb4_service& v) override {
    if (k.backend_slot != 0) {
      ops.push_back(absl::StrCat("slot+ ", Fe(k), "#", k.backend_slot, " -> ", v.backend_id));
    } else if (k.dport == 0 && k.proto == 0) {
      ops.push_back(absl::StrCat("wild+ ", Addr(k.addr), " flags=", v.flags));
    } else {
      ops.push_back(absl::StrCat("master+ ", Fe(k), " count=", v.count, " flags=", v.flags,
                                 " rnat=", v.rev_nat_id));
    }
    svc[Tup(k)] = v;
    return absl::OkStatus();
  }
  absl::Status DeleteService(const sluice_lb4_key& k) override {
    if (k.backend_slot != 0) {
      ops.push_back(absl::StrCat("slot- ", Fe(k), "#", k.backend_slot));
    } else if (k.dport == 0 && k.proto == 0) {
      ops.push_back(absl::StrCat("wild- ", Addr(k.addr)));
    } else {
      ops.push_back(absl::StrCat("master- ", Fe(k)));
    }
    svc.erase(Tup(k));
    return absl::OkStatus();
  }
  absl::Status UpdateBackend(uint32_t id, const sluice_lb4_backend& v) override {
    ops.push_back(absl::StrCat("be+ ", id, " ", Addr(v.addr), ":", ntohs(v.port),
                               v.flags ? absl::StrCat(" flags=", v.flags) : ""));
    be[id] = v;
    return absl::OkStatus();
  }
  absl::Status DeleteBackend(uint32_t id) override {
    ops.push_back(absl::StrCat("be- ", id));
    be.erase(id);
    return absl::OkStatus();
  }
  absl::Status UpdateRevNat(uint32_t id, const sluice_lb4_revnat& v) override {
    ops.push_back(absl::StrCat("rnat+ ", id, " ", Addr(v.addr), ":", ntohs(v.port)));
    rnat[id] = v;
    return absl::OkStatus();
  }
  absl::Status DeleteRevNat(uint32_t id) override {
    ops.push_back(absl::StrCat("rnat- ", id));
    rnat.erase(id);
    return absl::OkStatus();
  }
  absl::Status UpdateSourceRange(const sluice_lb4_srcrange_key& k) override {
    ops.push_back(
        absl::StrCat("range+ ", ntohl(k.rev_nat_id), " ", Addr(k.addr), "/", k.prefixlen - 32));
    ranges[{k.prefixlen, k.rev_nat_id, k.addr}] = true;
    return absl::OkStatus();
  }
  absl::Status DeleteSourceRange(const sluice_lb4_srcrange_key& k) override {
    ops.push_back(
        absl::StrCat("range- ", ntohl(k.rev_nat_id), " ", Addr(k.addr), "/", k.prefixlen - 32));
    ranges.erase({k.prefixlen, k.rev_nat_id, k.addr});
    return absl::OkStatus();
  }
  absl::StatusOr<size_t> FlushUdpFlows(
      const absl::flat_hash_set<std::pair<uint32_t, uint32_t>>& flows) override {
    std::vector<std::pair<uint32_t, uint32_t>> sorted(flows.begin(), flows.end());
    std::sort(sorted.begin(), sorted.end());
    std::vector<std::string> parts;
    for (const auto& [r, b] : sorted) parts.push_back(absl::StrCat(r, "/", b));
    ops.push_back(absl::StrCat("flush-udp ", absl::StrJoin(parts, ",")));
    size_t n = 0;
    for (auto it = ct.begin(); it != ct.end();) {
      if (std::get<1>(it->first) == IPPROTO_UDP && flows.contains(it->second)) {
        it = ct.erase(it);
        ++n;
      } else {
        ++it;
      }
    }
    return n;
  }
  // Socket LB's closes, kept apart from `ops` (rev_nat_id, address and port in network order).
  std::vector<std::tuple<uint32_t, uint32_t, uint16_t>> closed_udp;
  bool close_udp_fails = false;  // as on a kernel without SOCK_DESTROY
  absl::StatusOr<size_t> CloseUdpSockets(
      const absl::flat_hash_set<std::tuple<uint32_t, uint32_t, uint16_t>>& backends) override {
    if (close_udp_fails) return absl::UnimplementedError("SOCK_DESTROY: operation not supported");
    closed_udp.assign(backends.begin(), backends.end());
    std::sort(closed_udp.begin(), closed_udp.end());
    return backends.size();
  }
  absl::Status FlushAffinity(
      const absl::flat_hash_set<uint32_t>& ids,
      const absl::flat_hash_set<std::pair<uint32_t, uint32_t>>& backends) override {
    std::vector<uint32_t> sorted(ids.begin(), ids.end());
    std::sort(sorted.begin(), sorted.end());
    std::vector<std::pair<uint32_t, uint32_t>> pairs(backends.begin(), backends.end());
    std::sort(pairs.begin(), pairs.end());
    std::vector<std::string> parts;
    for (const auto& [r, b] : pairs) parts.push_back(absl::StrCat(r, "/", b));
    ops.push_back(
        absl::StrCat("flush-aff ", absl::StrJoin(sorted, ","), " ", absl::StrJoin(parts, ",")));
    return absl::OkStatus();
  }
  // Maglev tables by master key: slot -> backend id.
  std::map<SvcKey, std::vector<uint32_t>> tables;
  absl::Status UpdateMaglevTable(const sluice_lb4_key& k, const std::vector<uint32_t>& backends,
                                 const std::vector<uint32_t>& table) override {
    ops.push_back(absl::StrCat("mag+ ", Fe(k), " m=", table.size(), " of ",
                               absl::StrJoin(backends, ",")));
    tables[Tup(k)] = table;
    return absl::OkStatus();
  }
  absl::Status DeleteMaglevTable(const sluice_lb4_key& k) override {
    ops.push_back(absl::StrCat("mag- ", Fe(k)));
    tables.erase(Tup(k));
    return absl::OkStatus();
  }
  absl::Status ForEachMaglevTable(const std::function<void(const sluice_lb4_key&)>& fn) override {
    for (const auto& [k, v] : tables) fn(FromTup(k));
    return absl::OkStatus();
  }
  absl::Status ForEachService(
      const std::function<void(const sluice_lb4_key&, const sluice_lb4_service&)>& fn) override {
    for (const auto& [k, v] : svc) fn(FromTup(k), v);
    return absl::OkStatus();
  }
  absl::Status ForEachBackend(
      const std::function<void(uint32_t, const sluice_lb4_backend&)>& fn) override {
    for (const auto& [k, v] : be) fn(k, v);
    return absl::OkStatus();
  }
  absl::Status ForEachRevNat(
      const std::function<void(uint32_t, const sluice_lb4_revnat&)>& fn) override {
    for (const auto& [k, v] : rnat) fn(k, v);
    return absl::OkStatus();
  }
  absl::Status ForEachSourceRange(
      const std::function<void(const sluice_lb4_srcrange_key&)>& fn) override {
    for (const auto& [k, v] : ranges) {
      sluice_lb4_srcrange_key key{};
      std::tie(key.prefixlen, key.rev_nat_id, key.addr) = k;
      fn(key);
    }
    return absl::OkStatus();
  }
};

LbBackend Be(const std::string& addr, uint16_t port, uint8_t proto = IPPROTO_TCP) {
  return LbBackend{Ip(addr), port, proto, false, false};
}

LbFrontend Frontend(const std::string& addr, uint16_t port, std::vector<std::string> backends,
                    uint8_t proto = IPPROTO_TCP, uint16_t flags = 0) {
  LbFrontend f;
  f.addr = Ip(addr);
  f.port = port;
  f.proto = proto;
  f.flags = flags;
  for (const auto& b : backends) f.backends.push_back(Be(b, 8080, proto));
  std::sort(f.backends.begin(), f.backends.end());
  return f;
}

sluice_lb4_key LbKeyOf(const std::string& addr, uint16_t port, uint8_t proto = IPPROTO_TCP) {
  sluice_lb4_key k{};
  k.addr = htonl(Ip(addr).v4_host_order());
  k.dport = htons(port);
  k.proto = proto;
  return k;
}

ServiceTranslation T(std::vector<LbFrontend> frontends) {
  ServiceTranslation t;
  t.frontends = std::move(frontends);
  return t;
}

class ServiceReconcilerTest : public ::testing::Test {
 protected:
  void SetUp() override { r_ = *ServiceReconciler::Create(maps_); }
  void Apply(const std::string& svc, std::optional<ServiceTranslation> t) {
    ASSERT_TRUE(r_->Apply(svc, t).ok());
  }

  RecordingLbMaps maps_;
  std::unique_ptr<ServiceReconciler> r_;
};

TEST_F(ServiceReconcilerTest, NewServiceWritesBackendsThenRevNatThenSlotsThenMasterLast) {
  Apply("default/web", T({Frontend("10.96.0.10", 80, {"10.244.1.4", "10.244.2.5"})}));
  EXPECT_THAT(
      maps_.Take(),
      ElementsAre("be+ 1 10.244.1.4:8080", "be+ 2 10.244.2.5:8080", "rnat+ 1 10.96.0.10:80",
                  "slot+ 10.96.0.10:80/6#1 -> 1", "slot+ 10.96.0.10:80/6#2 -> 2",
                  "master+ 10.96.0.10:80/6 count=2 flags=0 rnat=1", "wild+ 10.96.0.10 flags=128"));
}

TEST_F(ServiceReconcilerTest, GrowWritesNewBackendAndSlotBeforeTheMaster) {
  Apply("default/web", T({Frontend("10.96.0.10", 80, {"10.244.1.4", "10.244.1.5"})}));
  maps_.Take();
  Apply("default/web", T({Frontend("10.96.0.10", 80, {"10.244.1.4", "10.244.1.5", "10.244.1.6"})}));
  EXPECT_THAT(maps_.Take(), ElementsAre("be+ 3 10.244.1.6:8080", "slot+ 10.96.0.10:80/6#3 -> 3",
                                        "master+ 10.96.0.10:80/6 count=3 flags=0 rnat=1"));
}

TEST_F(ServiceReconcilerTest, ShrinkWritesTheMasterBeforeDeletingSlotsAndOrphanBackends) {
  Apply("default/web", T({Frontend("10.96.0.10", 80, {"10.244.1.4", "10.244.1.5", "10.244.1.6"})}));
  maps_.Take();
  Apply("default/web", T({Frontend("10.96.0.10", 80, {"10.244.1.4"})}));
  EXPECT_THAT(maps_.Take(),
              ElementsAre("master+ 10.96.0.10:80/6 count=1 flags=0 rnat=1",
                          "slot- 10.96.0.10:80/6#3", "slot- 10.96.0.10:80/6#2", "be- 2", "be- 3"));
  EXPECT_THAT(maps_.be, ::testing::SizeIs(1));
}

TEST_F(ServiceReconcilerTest, ReplacedBackendIsWrittenInPlaceAndTheOldOneDeletedAfter) {
  Apply("default/web", T({Frontend("10.96.0.10", 80, {"10.244.1.4", "10.244.1.5"})}));
  maps_.Take();
  Apply("default/web", T({Frontend("10.96.0.10", 80, {"10.244.1.4", "10.244.1.9"})}));
  // Same count: the master is untouched.
  EXPECT_THAT(maps_.Take(),
              ElementsAre("be+ 3 10.244.1.9:8080", "slot+ 10.96.0.10:80/6#2 -> 3", "be- 2"));
}

TEST_F(ServiceReconcilerTest, DeletedServiceGoesMasterFirstThenSlotsRevNatBackendsWildcard) {
  Apply("default/web", T({Frontend("10.96.0.10", 80, {"10.244.1.4", "10.244.1.5"})}));
  maps_.Take();
  Apply("default/web", std::nullopt);
  EXPECT_THAT(maps_.Take(), ElementsAre("master- 10.96.0.10:80/6", "slot- 10.96.0.10:80/6#2",
                                        "slot- 10.96.0.10:80/6#1", "rnat- 1", "be- 1", "be- 2",
                                        "wild- 10.96.0.10"));
  EXPECT_THAT(maps_.svc, IsEmpty());
  EXPECT_THAT(maps_.be, IsEmpty());
  EXPECT_THAT(maps_.rnat, IsEmpty());
  EXPECT_THAT(r_->Services(), IsEmpty());
}

TEST_F(ServiceReconcilerTest, UnchangedServiceWritesNothing) {
  auto t = T({Frontend("10.96.0.10", 80, {"10.244.1.4", "10.244.1.5"}),
              Frontend("10.96.0.10", 53, {"10.244.1.4"}, IPPROTO_UDP)});
  Apply("default/web", t);
  maps_.Take();
  ServiceReconcilerStats before = r_->stats();
  Apply("default/web", t);
  EXPECT_THAT(maps_.Take(), IsEmpty());
  EXPECT_EQ(r_->stats().map_updates, before.map_updates);
  EXPECT_EQ(r_->stats().map_deletes, before.map_deletes);
}

TEST_F(ServiceReconcilerTest, BackendSharedByTwoServicesHasOneIdAndLivesUntilTheLastGoes) {
  Apply("default/a", T({Frontend("10.96.0.10", 80, {"10.244.1.4"})}));
  Apply("default/b", T({Frontend("10.96.0.11", 80, {"10.244.1.4"})}));
  EXPECT_EQ(r_->BackendId(Ip("10.244.1.4"), 8080, IPPROTO_TCP), 1u);
  maps_.Take();
  Apply("default/a", std::nullopt);
  EXPECT_THAT(maps_.Take(), ElementsAre("master- 10.96.0.10:80/6", "slot- 10.96.0.10:80/6#1",
                                        "rnat- 1", "wild- 10.96.0.10"));
  EXPECT_EQ(maps_.be.count(1), 1u);
  Apply("default/b", std::nullopt);
  EXPECT_THAT(maps_.Take(), ElementsAre("master- 10.96.0.11:80/6", "slot- 10.96.0.11:80/6#1",
                                        "rnat- 2", "be- 1", "wild- 10.96.0.11"));
}

TEST_F(ServiceReconcilerTest, RemovedUdpBackendFlowsAreFlushedTcpOnesAreNot) {
  Apply("default/dns", T({Frontend("10.96.0.10", 53, {"10.244.1.4", "10.244.1.5"}, IPPROTO_UDP),
                          Frontend("10.96.0.10", 53, {"10.244.1.4", "10.244.1.5"})}));
  uint32_t udp_r = r_->RevNatId(Ip("10.96.0.10"), 53, IPPROTO_UDP, 0);
  uint32_t tcp_r = r_->RevNatId(Ip("10.96.0.10"), 53, IPPROTO_TCP, 0);
  uint32_t gone = r_->BackendId(Ip("10.244.1.5"), 8080, IPPROTO_UDP);
  ASSERT_NE(udp_r, tcp_r);
  // One UDP flow and one TCP flow on the backend that goes, one UDP flow on the one that stays.
  maps_.ct[{1, IPPROTO_UDP}] = {udp_r, gone};
  maps_.ct[{2, IPPROTO_UDP}] = {udp_r, gone};  // a second flow to it
  maps_.ct[{3, IPPROTO_TCP}] = {tcp_r, r_->BackendId(Ip("10.244.1.5"), 8080, IPPROTO_TCP)};
  maps_.ct[{4, IPPROTO_UDP}] = {udp_r, r_->BackendId(Ip("10.244.1.4"), 8080, IPPROTO_UDP)};
  maps_.Take();
  Apply("default/dns", T({Frontend("10.96.0.10", 53, {"10.244.1.4"}, IPPROTO_UDP),
                          Frontend("10.96.0.10", 53, {"10.244.1.4"})}));
  std::vector<std::string> ops = maps_.Take();
  ASSERT_FALSE(ops.empty());
  EXPECT_EQ(ops.back(), absl::StrCat("flush-udp ", udp_r, "/", gone));
  EXPECT_EQ(maps_.ct.size(), 2u);
  EXPECT_EQ(maps_.ct.count({3, IPPROTO_TCP}), 1u);
  EXPECT_EQ(maps_.ct.count({4, IPPROTO_UDP}), 1u);
  EXPECT_EQ(r_->stats().ct_flushed, 2u);
  // Socket LB: the node's connected UDP sockets sent to the removed UDP backend are closed (its
  // TCP twin is left to TCP).
  EXPECT_THAT(maps_.closed_udp,
              ElementsAre(std::tuple{udp_r, htonl(Ip("10.244.1.5").v4_host_order()),
                                     htons(uint16_t{8080})}));
  EXPECT_EQ(r_->stats().udp_sockets_closed, 1u);
}

// externalTrafficPolicy: Local: the in-cluster twin of a NodePort (scope internal) is a frontend
// of its own (master, slots, rev_nat_id) next to the local-only one, and goes with the Service.
TEST_F(ServiceReconcilerTest, InClusterFrontendsAreProgrammedInTheInternalScope) {
  ServiceTranslation t = T({Frontend("192.168.0.10", 30080, {}, IPPROTO_TCP,
                                     SLUICE_SVC_F_NODEPORT | SLUICE_SVC_F_ETP_LOCAL)});
  LbFrontend in_cluster = Frontend("192.168.0.10", 30080, {"10.244.1.4", "10.244.2.5"}, IPPROTO_TCP,
                                   SLUICE_SVC_F_NODEPORT);
  in_cluster.scope = SLUICE_LB_SCOPE_INTERNAL;
  t.in_cluster_frontends = {in_cluster};
  Apply("default/web", t);
  std::vector<std::string> ops = maps_.Take();
  EXPECT_THAT(ops, ::testing::Contains("master+ 192.168.0.10:30080/6 count=0 flags=17 rnat=1"));
  EXPECT_THAT(ops, ::testing::Contains("master+ 192.168.0.10:30080/6@1 count=2 flags=1 rnat=2"));
  EXPECT_THAT(ops, ::testing::Contains("slot+ 192.168.0.10:30080/6@1#2 -> 2"));
  EXPECT_EQ(r_->RevNatId(Ip("192.168.0.10"), 30080, IPPROTO_TCP, SLUICE_LB_SCOPE_INTERNAL), 2u);
  Apply("default/web", t);
  EXPECT_THAT(maps_.Take(), IsEmpty()) << "unchanged: nothing written";
  Apply("default/web", std::nullopt);
  EXPECT_THAT(maps_.svc, IsEmpty());
}

TEST_F(ServiceReconcilerTest, OneWildcardMasterPerClusterIpNoneForNodePorts) {
  // Two ports on one ClusterIP, plus a NodePort frontend on the node address.
  Apply("default/web",
        T({Frontend("10.96.0.10", 80, {"10.244.1.4"}), Frontend("10.96.0.10", 443, {"10.244.1.4"}),
           Frontend("192.168.0.10", 30080, {"10.244.1.4"}, IPPROTO_TCP, SLUICE_SVC_F_NODEPORT)}));
  std::vector<std::string> ops = maps_.Take();
  EXPECT_EQ(std::count_if(ops.begin(), ops.end(),
                          [](const std::string& o) { return o.rfind("wild+", 0) == 0; }),
            1);
  EXPECT_EQ(ops.back(), "wild+ 10.96.0.10 flags=128");
  // One port goes: the address is still in use.
  Apply("default/web",
        T({Frontend("10.96.0.10", 80, {"10.244.1.4"}),
           Frontend("192.168.0.10", 30080, {"10.244.1.4"}, IPPROTO_TCP, SLUICE_SVC_F_NODEPORT)}));
  ops = maps_.Take();
  EXPECT_THAT(ops, ElementsAre("master- 10.96.0.10:443/6", "slot- 10.96.0.10:443/6#1", "rnat- 2"));
  Apply("default/web", std::nullopt);
  ops = maps_.Take();
  ASSERT_FALSE(ops.empty());
  EXPECT_EQ(ops.back(), "wild- 10.96.0.10");
  EXPECT_THAT(maps_.svc, IsEmpty());
}

TEST_F(ServiceReconcilerTest, SourceRangesAreWrittenBeforeSlotsAndStaleOnesDeletedAfterMaster) {
  LbFrontend f = Frontend("203.0.113.7", 80, {"10.244.1.4"}, IPPROTO_TCP,
                          SLUICE_SVC_F_LOADBALANCER | SLUICE_SVC_F_SOURCE_RANGES);
  f.source_ranges = {*IpPrefix::Parse("198.51.100.0/24")};
  Apply("default/lb", T({f}));
  EXPECT_THAT(maps_.Take(), ElementsAre("be+ 1 10.244.1.4:8080", "rnat+ 1 203.0.113.7:80",
                                        "range+ 1 198.51.100.0/24", "slot+ 203.0.113.7:80/6#1 -> 1",
                                        "master+ 203.0.113.7:80/6 count=1 flags=68 rnat=1"));
  f.source_ranges = {*IpPrefix::Parse("192.0.2.0/25")};
  Apply("default/lb", T({f}));
  EXPECT_THAT(maps_.Take(), ElementsAre("range+ 1 192.0.2.0/25", "range- 1 198.51.100.0/24"));
}

TEST_F(ServiceReconcilerTest, RestartedReconcilerRestoresIdsAndRewritesNothing) {
  auto web = T({Frontend("10.96.0.10", 80, {"10.244.1.4", "10.244.1.5"})});
  auto dns = T({Frontend("10.96.0.20", 53, {"10.244.1.5", "10.244.2.7"}, IPPROTO_UDP)});
  Apply("default/web", web);
  Apply("kube-system/dns", dns);
  uint32_t web_r = r_->RevNatId(Ip("10.96.0.10"), 80, IPPROTO_TCP, 0);
  uint32_t be5 = r_->BackendId(Ip("10.244.1.5"), 8080, IPPROTO_TCP);
  maps_.Take();

  auto again = *ServiceReconciler::Create(maps_);
  EXPECT_EQ(again->RevNatId(Ip("10.96.0.10"), 80, IPPROTO_TCP, 0), web_r);
  EXPECT_EQ(again->BackendId(Ip("10.244.1.5"), 8080, IPPROTO_TCP), be5);
  ASSERT_TRUE(again->Apply("default/web", web).ok());
  ASSERT_TRUE(again->Apply("kube-system/dns", dns).ok());
  ASSERT_TRUE(again->PruneStale().ok());
  EXPECT_THAT(maps_.Take(), IsEmpty());
  // New ids do not collide with restored ones.
  ASSERT_TRUE(again->Apply("default/new", T({Frontend("10.96.0.30", 80, {"10.244.3.3"})})).ok());
  EXPECT_EQ(again->RevNatId(Ip("10.96.0.30"), 80, IPPROTO_TCP, 0), 3u);
  EXPECT_EQ(again->BackendId(Ip("10.244.3.3"), 8080, IPPROTO_TCP), 5u);
}

TEST_F(ServiceReconcilerTest, RestoredStateIsDeletedOnlyByPruneStale) {
  Apply("default/web", T({Frontend("10.96.0.10", 80, {"10.244.1.4"})}));
  Apply("default/gone", T({Frontend("10.96.0.99", 80, {"10.244.9.9", "10.244.1.4"})}));
  maps_.Take();

  auto again = *ServiceReconciler::Create(maps_);
  // Before the watches have synced only web is known; its apply deletes nothing of "gone".
  ASSERT_TRUE(again->Apply("default/web", T({Frontend("10.96.0.10", 80, {"10.244.1.4"})})).ok());
  EXPECT_THAT(maps_.Take(), IsEmpty());
  ASSERT_TRUE(again->PruneStale().ok());
  EXPECT_THAT(maps_.Take(),
              ElementsAre("master- 10.96.0.99:80/6", "slot- 10.96.0.99:80/6#2",
                          "slot- 10.96.0.99:80/6#1", "rnat- 2", "be- 2", "wild- 10.96.0.99"));
  EXPECT_EQ(maps_.be.count(1), 1u);  // still web's
  ASSERT_TRUE(again->PruneStale().ok());
  EXPECT_THAT(maps_.Take(), IsEmpty());
}

TEST_F(ServiceReconcilerTest, PruneDeletesEntriesNothingRefersTo) {
  Apply("default/web", T({Frontend("10.96.0.10", 80, {"10.244.1.4"})}));
  // Leftovers of a crash: a slot without master, a backend, rnat and range nobody names, and a
  // wildcard for an address no Service has.
  sluice_lb4_key slot{};
  slot.addr = htonl(0x0a600063);
  slot.dport = htons(81);
  slot.proto = IPPROTO_TCP;
  slot.backend_slot = 1;
  maps_.svc[Tup(slot)] = sluice_lb4_service{7, 0, 0, 0, 0};
  sluice_lb4_key wild{};
  wild.addr = htonl(0x0a600064);
  maps_.svc[Tup(wild)] = sluice_lb4_service{0, 0, SLUICE_SVC_F_REJECT, 0, 0};
  maps_.be[7] = sluice_lb4_backend{htonl(0x0af40909), htons(80), IPPROTO_TCP, 0};
  maps_.rnat[9] = sluice_lb4_revnat{htonl(0x0a600063), htons(81), 0};
  maps_.ranges[{40, htonl(9), htonl(0xc0000200)}] = true;
  maps_.Take();

  auto again = *ServiceReconciler::Create(maps_);
  ASSERT_TRUE(again->Apply("default/web", T({Frontend("10.96.0.10", 80, {"10.244.1.4"})})).ok());
  EXPECT_THAT(maps_.Take(), IsEmpty());
  ASSERT_TRUE(again->PruneStale().ok());
  EXPECT_THAT(maps_.Take(), ElementsAre("slot- 10.96.0.99:81/6#1", "rnat- 9",
                                        "range- 9 192.0.2.0/8", "be- 7", "wild- 10.96.0.100"));
  // A new frontend does not reuse the id of the stale rnat entry seen at restore.
  ASSERT_TRUE(again->Apply("default/x", T({Frontend("10.96.0.50", 80, {"10.244.1.4"})})).ok());
  EXPECT_EQ(again->RevNatId(Ip("10.96.0.50"), 80, IPPROTO_TCP, 0), 10u);
}

TEST_F(ServiceReconcilerTest, AffinityOfRemovedBackendsAndFrontendsIsFlushed) {
  LbFrontend f =
      Frontend("10.96.0.10", 80, {"10.244.1.4", "10.244.1.5"}, IPPROTO_TCP, SLUICE_SVC_F_AFFINITY);
  f.affinity_timeout = 10800;
  Apply("default/sticky", T({f}));
  maps_.Take();
  f.backends.pop_back();
  Apply("default/sticky", T({f}));
  std::vector<std::string> ops = maps_.Take();
  ASSERT_FALSE(ops.empty());
  EXPECT_EQ(ops.back(), "flush-aff  1/2");
  Apply("default/sticky", std::nullopt);
  ops = maps_.Take();
  ASSERT_FALSE(ops.empty());
  EXPECT_EQ(ops.back(), "flush-aff 1 ");
}

TEST_F(ServiceReconcilerTest, FrontendOfAnotherServiceIsNotTakenOver) {
  Apply("default/a", T({Frontend("10.96.0.10", 80, {"10.244.1.4"})}));
  maps_.Take();
  Apply("default/b", T({Frontend("10.96.0.10", 80, {"10.244.1.5"})}));
  EXPECT_THAT(maps_.Take(), IsEmpty());
  EXPECT_EQ(r_->stats().conflicts, 1u);
  Apply("default/b", std::nullopt);
  EXPECT_THAT(maps_.Take(), IsEmpty());
  EXPECT_THAT(r_->Services(), ElementsAre("default/a"));
  Apply("default/b", T({Frontend("10.96.0.10", 80, {"10.244.1.5"})}));
  EXPECT_THAT(r_->BlockedServices(), ElementsAre("default/b"));
  // Once a lets go, b's next apply takes the key.
  Apply("default/a", std::nullopt);
  maps_.Take();
  Apply("default/b", T({Frontend("10.96.0.10", 80, {"10.244.1.5"})}));
  EXPECT_THAT(r_->BlockedServices(), IsEmpty());
  EXPECT_THAT(r_->Services(), ElementsAre("default/b"));
  EXPECT_THAT(maps_.Take(), ::testing::Contains("master+ 10.96.0.10:80/6 count=1 flags=0 rnat=2"));
}

// ServiceSync: stores in, maps out; nothing is applied before every watch has synced.

k8s::Service Svc(const std::string& name, const std::string& ip) {
  k8s::Service s;
  s.meta.namespace_ = "default";
  s.meta.name = name;
  s.meta.uid = name;
  s.type = "ClusterIP";
  s.cluster_ips = {ip};
  k8s::ServicePort p;
  p.name = "http";
  p.port = 80;
  p.target_port.number = 8080;
  s.ports = {p};
  return s;
}

k8s::EndpointSlice Slice(const std::string& svc, std::vector<std::string> addrs) {
  k8s::EndpointSlice s;
  s.meta.namespace_ = "default";
  s.meta.name = svc + "-x";
  s.meta.uid = svc + "-x";
  s.service_name = svc;
  s.address_type = "IPv4";
  for (auto& a : addrs) {
    k8s::Endpoint e;
    e.address = a;
    e.node_name = "node-b";
    s.endpoints.push_back(e);
  }
  s.ports = {{"http", k8s::Protocol::kTCP, 8080}};
  return s;
}

// ---- Maglev: the table comes after the backends it names and before the master that sets the
// flag; it goes after the master that no longer does. A change swaps a whole new table in. ----

constexpr uint16_t kMaglev = SLUICE_SVC_F_MAGLEV;

// Slots per backend id of a table.
std::map<uint32_t, int> Shares(const std::vector<uint32_t>& table) {
  std::map<uint32_t, int> n;
  for (uint32_t id : table) ++n[id];
  return n;
}

TEST_F(ServiceReconcilerTest, MaglevTableIsWrittenAfterItsBackendsAndBeforeTheMaster) {
  r_->SetMaglevTableSize(251);
  Apply("default/web",
        T({Frontend("10.96.0.10", 80, {"10.244.1.4", "10.244.2.5"}, IPPROTO_TCP, kMaglev)}));
  EXPECT_THAT(maps_.Take(),
              ElementsAre("be+ 1 10.244.1.4:8080", "be+ 2 10.244.2.5:8080",
                          "rnat+ 1 10.96.0.10:80", "slot+ 10.96.0.10:80/6#1 -> 1",
                          "slot+ 10.96.0.10:80/6#2 -> 2", "mag+ 10.96.0.10:80/6 m=251 of 1,2",
                          "master+ 10.96.0.10:80/6 count=2 flags=256 rnat=1",
                          "wild+ 10.96.0.10 flags=128"));
  const auto& table = maps_.tables.at(Tup(LbKeyOf("10.96.0.10", 80)));
  EXPECT_EQ(Shares(table), (std::map<uint32_t, int>{{1, 126}, {2, 125}}));
  // The same again writes nothing.
  Apply("default/web",
        T({Frontend("10.96.0.10", 80, {"10.244.1.4", "10.244.2.5"}, IPPROTO_TCP, kMaglev)}));
  EXPECT_THAT(maps_.Take(), IsEmpty());
}

TEST_F(ServiceReconcilerTest, MaglevBackendLeavingSwapsANewTableInBeforeItsBackendGoes) {
  r_->SetMaglevTableSize(251);
  Apply("default/web", T({Frontend("10.96.0.10", 80, {"10.244.1.4", "10.244.1.5", "10.244.1.6"},
                                   IPPROTO_TCP, kMaglev)}));
  const auto before = maps_.tables.at(Tup(LbKeyOf("10.96.0.10", 80)));
  maps_.Take();
  Apply("default/web",
        T({Frontend("10.96.0.10", 80, {"10.244.1.4", "10.244.1.6"}, IPPROTO_TCP, kMaglev)}));
  EXPECT_THAT(maps_.Take(),
              ElementsAre("slot+ 10.96.0.10:80/6#2 -> 3", "mag+ 10.96.0.10:80/6 m=251 of 1,3",
                          "master+ 10.96.0.10:80/6 count=2 flags=256 rnat=1",
                          "slot- 10.96.0.10:80/6#3", "be- 2"));
  const auto& after = maps_.tables.at(Tup(LbKeyOf("10.96.0.10", 80)));
  EXPECT_EQ(Shares(after).count(2), 0u);
  // Maglev's promise: the slots of the backends that stayed mostly stay theirs.
  int kept = 0, theirs = 0;
  for (size_t s = 0; s < before.size(); ++s) {
    if (before[s] == 2) continue;
    ++theirs;
    kept += after[s] == before[s];
  }
  EXPECT_GE(kept, theirs * 9 / 10);
}

TEST_F(ServiceReconcilerTest, MaglevOffWritesTheMasterFirstAndDeletionDeletesTheTableLast) {
  r_->SetMaglevTableSize(251);
  Apply("default/web",
        T({Frontend("10.96.0.10", 80, {"10.244.1.4"}, IPPROTO_TCP, kMaglev)}));
  maps_.Take();
  Apply("default/web", T({Frontend("10.96.0.10", 80, {"10.244.1.4"})}));
  EXPECT_THAT(maps_.Take(), ElementsAre("master+ 10.96.0.10:80/6 count=1 flags=0 rnat=1",
                                        "mag- 10.96.0.10:80/6"));
  Apply("default/web",
        T({Frontend("10.96.0.10", 80, {"10.244.1.4"}, IPPROTO_TCP, kMaglev)}));
  maps_.Take();
  Apply("default/web", std::nullopt);
  std::vector<std::string> ops = maps_.Take();
  auto master = std::find(ops.begin(), ops.end(), "master- 10.96.0.10:80/6");
  auto table = std::find(ops.begin(), ops.end(), "mag- 10.96.0.10:80/6");
  auto backend = std::find(ops.begin(), ops.end(), "be- 1");
  ASSERT_NE(master, ops.end());
  ASSERT_NE(table, ops.end());
  ASSERT_NE(backend, ops.end());
  EXPECT_LT(master, table);
  EXPECT_LT(table, backend);
  EXPECT_THAT(maps_.tables, IsEmpty());
}

TEST_F(ServiceReconcilerTest, RestartedReconcilerRewritesClaimedTablesAndPrunesTheRest) {
  r_->SetMaglevTableSize(251);
  Apply("default/web",
        T({Frontend("10.96.0.10", 80, {"10.244.1.4"}, IPPROTO_TCP, kMaglev)}));
  Apply("default/old",
        T({Frontend("10.96.0.11", 80, {"10.244.1.5"}, IPPROTO_TCP, kMaglev)}));
  const auto table = maps_.tables.at(Tup(LbKeyOf("10.96.0.10", 80)));
  maps_.Take();
  auto again = ServiceReconciler::Create(maps_);
  ASSERT_TRUE(again.ok());
  (*again)->SetMaglevTableSize(251);
  ASSERT_TRUE((*again)
                  ->Apply("default/web", T({Frontend("10.96.0.10", 80, {"10.244.1.4"},
                                                     IPPROTO_TCP, kMaglev)}))
                  .ok());
  ASSERT_TRUE((*again)->PruneStale().ok());
  EXPECT_EQ(maps_.tables.at(Tup(LbKeyOf("10.96.0.10", 80))), table);
  EXPECT_EQ(maps_.tables.count(Tup(LbKeyOf("10.96.0.11", 80))), 0u);
}

TEST(ServiceSyncTest, AppliesAfterSyncPrunesOnceThenFollowsChanges) {
  RecordingLbMaps maps;
  // State of an earlier run: "web" with one backend and "old", which no longer exists.
  {
    auto before = *ServiceReconciler::Create(maps);
    ASSERT_TRUE(before->Apply("default/web", T({Frontend("10.96.0.10", 80, {"10.244.1.4"})})).ok());
    ASSERT_TRUE(before->Apply("default/old", T({Frontend("10.96.0.99", 80, {"10.244.9.9"})})).ok());
  }
  maps.Take();
  auto r = *ServiceReconciler::Create(maps);
  k8s::SyncGate gate;
  k8s::Store<k8s::Service> services(&gate);
  k8s::Store<k8s::EndpointSlice> slices(&gate);
  ServiceSync sync(
      services, slices, [&] { return gate.AllSynced(); }, *r, nullptr,
      NodeContext{"node-a", {Ip("192.168.0.10")}});
  // Services listed, slices not yet: applying now would empty web. Nothing may be written.
  services.Replace({Svc("web", "10.96.0.10")}, "1");
  EXPECT_FALSE(sync.WaitIdle(absl::Milliseconds(300)));
  EXPECT_THAT(maps.ops, IsEmpty());
  slices.Replace({Slice("web", {"10.244.1.4", "10.244.1.5"})}, "2");
  ASSERT_TRUE(sync.WaitIdle(absl::Seconds(10)));
  EXPECT_TRUE(sync.pruned());
  std::vector<std::string> ops = maps.Take();
  // web grows to two backends; old is pruned.
  EXPECT_THAT(ops, ::testing::Contains("master+ 10.96.0.10:80/6 count=2 flags=0 rnat=1"));
  EXPECT_THAT(ops, ::testing::Contains("master- 10.96.0.99:80/6"));
  EXPECT_EQ(r->RevNatId(Ip("10.96.0.10"), 80, IPPROTO_TCP, 0), 1u);
  // An EndpointSlice change re-applies web only.
  slices.Upsert(Slice("web", {"10.244.1.5"}));
  ASSERT_TRUE(sync.WaitIdle(absl::Seconds(10)));
  EXPECT_THAT(maps.Take(), ElementsAre("slot+ 10.96.0.10:80/6#1 -> 3",
                                       "master+ 10.96.0.10:80/6 count=1 flags=0 rnat=1",
                                       "slot- 10.96.0.10:80/6#2", "be- 1"));
  services.Delete(Svc("web", "10.96.0.10"));
  ASSERT_TRUE(sync.WaitIdle(absl::Seconds(10)));
  EXPECT_THAT(maps.svc, IsEmpty());
  EXPECT_THAT(maps.be, IsEmpty());
}

// Refused backends (loopback here) are left out, counted once per object however often the
// Service is re-applied, and a valid Service next to it is untouched.
TEST(ServiceSyncTest, RefusedBackendsAreCountedOncePerObjectAcrossReapplies) {
  RecordingLbMaps maps;
  auto r = *ServiceReconciler::Create(maps);
  k8s::SyncGate gate;
  k8s::Store<k8s::Service> services(&gate);
  k8s::Store<k8s::EndpointSlice> slices(&gate);
  ServiceSync sync(
      services, slices, [&] { return gate.AllSynced(); }, *r, nullptr,
      NodeContext{"node-a", {Ip("192.168.0.10")}});
  services.Replace({Svc("web", "10.96.0.10"), Svc("ok", "10.96.0.11")}, "1");
  slices.Replace({Slice("web", {"127.0.0.1", "10.244.1.4"}), Slice("ok", {"10.244.1.5"})}, "2");
  ASSERT_TRUE(sync.WaitIdle(absl::Seconds(10)));
  std::vector<std::string> ops = maps.Take();
  // The two Services are applied in the controller's (hash) order, so which one gets
  // reverse-NAT id 1 is not fixed: only that each has one backend.
  EXPECT_THAT(ops, ::testing::Contains(::testing::StartsWith(
                       "master+ 10.96.0.10:80/6 count=1 flags=0 rnat=")));
  EXPECT_THAT(ops, ::testing::Contains(::testing::StartsWith(
                       "master+ 10.96.0.11:80/6 count=1 flags=0 rnat=")));
  EXPECT_EQ(sync.refusals().of(RefusalReason::kBackendLoopback), 1u);
  EXPECT_EQ(sync.refusals().total(), 1u);
  // Re-applied (the same slice again, as after a resync): not counted again, nothing written.
  for (int i = 0; i < 3; ++i) {
    slices.Upsert(Slice("web", {"127.0.0.1", "10.244.1.4"}));
    ASSERT_TRUE(sync.WaitIdle(absl::Seconds(10)));
  }
  EXPECT_THAT(maps.Take(), IsEmpty());
  EXPECT_EQ(sync.refusals().total(), 1u);
  // A new refused address is news.
  slices.Upsert(Slice("web", {"127.0.0.1", "0.0.0.0", "10.244.1.4"}));
  ASSERT_TRUE(sync.WaitIdle(absl::Seconds(10)));
  EXPECT_THAT(maps.Take(), IsEmpty());
  EXPECT_EQ(sync.refusals().of(RefusalReason::kBackendUnspecified), 1u);
  EXPECT_EQ(sync.refusals().ToString(), "backend_loopback=1 backend_unspecified=1");
}

TEST(ServiceSyncTest, ServiceRefusedAFrontendGetsItWhenTheHolderGoes) {
  RecordingLbMaps maps;
  auto r = *ServiceReconciler::Create(maps);
  k8s::SyncGate gate;
  k8s::Store<k8s::Service> services(&gate);
  k8s::Store<k8s::EndpointSlice> slices(&gate);
  ServiceSync sync(
      services, slices, [&] { return gate.AllSynced(); }, *r, nullptr,
      NodeContext{"node-a", {Ip("192.168.0.10")}});
  // Two Services on one ClusterIP (an apiserver does not allow it; ExternalIPs can collide).
  services.Replace({Svc("one", "10.96.0.10"), Svc("two", "10.96.0.10")}, "1");
  slices.Replace({Slice("one", {"10.244.1.4"}), Slice("two", {"10.244.1.5"})}, "2");
  ASSERT_TRUE(sync.WaitIdle(absl::Seconds(10)));
  ASSERT_EQ(r->Services().size(), 1u);
  const std::string holder = r->Services()[0];
  const std::string other = holder == "default/one" ? "two" : "one";
  services.Delete(Svc(holder.substr(std::string("default/").size()), "10.96.0.10"));
  ASSERT_TRUE(sync.WaitIdle(absl::Seconds(10)));
  EXPECT_THAT(r->Services(), ElementsAre("default/" + other));
}

// Full Service maps: what fits is decided before writing, in the order of the Services' names,
// whole frontends only; what is programmed stays; room made by a deletion goes to the next.

std::vector<std::pair<std::string, std::optional<ServiceTranslation>>> Numbered(
    const std::vector<int>& order) {
  std::vector<std::pair<std::string, std::optional<ServiceTranslation>>> out;
  for (int i : order) {
    out.emplace_back(absl::StrCat("default/s", i),
                     T({Frontend(absl::StrCat("10.96.0.", i), 80,
                                 {absl::StrCat("10.244.1.", i), absl::StrCat("10.244.2.", i)})}));
  }
  return out;
}

std::vector<std::string> RefusedServices(const ServiceReconciler& r) {
  std::vector<std::string> out;
  for (const UnprogrammedFrontend& u : r.Unprogrammed()) {
    out.push_back(absl::StrCat(
        u.service, " ", u.addr.ToString(), ":", u.port, " ", u.map,
        u.truncated ? absl::StrCat(" truncated ", u.backends_programmed, "/", u.backends_wanted)
                    : ""));
  }
  return out;
}

std::vector<std::string> Dump(const std::map<SvcKey, sluice_lb4_service>& svc) {
  std::vector<std::string> out;
  for (const auto& [k, v] : svc) {
    out.push_back(absl::StrCat(Fe(FromTup(k)), "#", std::get<4>(k), " count=", v.count,
                               " be=", v.backend_id, " rnat=", v.rev_nat_id, " flags=", v.flags));
  }
  return out;
}

TEST(ServiceCapacityTest, WhatFitsIsTheSameWhateverTheOrderOfTheChanges) {
  std::vector<std::string> first;
  for (const std::vector<int>& order :
       {std::vector<int>{1, 2, 3, 4, 5}, std::vector<int>{5, 4, 3, 2, 1},
        std::vector<int>{3, 5, 1, 4, 2}}) {
    RecordingLbMaps maps;
    maps.capacity.rev_nat = 3;  // three frontends
    auto r = *ServiceReconciler::Create(maps);
    ASSERT_TRUE(r->ApplyAll(Numbered(order)).ok());
    EXPECT_THAT(r->Services(), ElementsAre("default/s1", "default/s2", "default/s3"));
    EXPECT_THAT(RefusedServices(*r), ElementsAre("default/s4 10.96.0.4:80 sluice_lb4_rnat",
                                                 "default/s5 10.96.0.5:80 sluice_lb4_rnat"));
    EXPECT_EQ(r->stats().unprogrammed, 2u);
    // Nothing of a refused frontend was written: no backend, no slot.
    EXPECT_THAT(maps.be, ::testing::SizeIs(6));
    EXPECT_THAT(maps.rnat, ::testing::SizeIs(3));
    for (const std::string& op : maps.ops) {
      EXPECT_THAT(op, ::testing::Not(::testing::HasSubstr("10.96.0.4"))) << op;
      EXPECT_THAT(op, ::testing::Not(::testing::HasSubstr("10.244.1.5"))) << op;
    }
    // The same entries whatever the order (ids included: they are given in the same order).
    if (first.empty()) {
      first = Dump(maps.svc);
    } else {
      EXPECT_EQ(Dump(maps.svc), first);
    }
  }
}

TEST(ServiceCapacityTest, ProgrammedFrontendsAreNeverEvictedDeletionLetsTheNextInOrderIn) {
  RecordingLbMaps maps;
  maps.capacity.rev_nat = 2;
  auto r = *ServiceReconciler::Create(maps);
  // One at a time, the last names first: the first two to come stay.
  for (int i : {5, 4, 3, 2, 1}) ASSERT_TRUE(r->ApplyAll(Numbered({i})).ok());
  EXPECT_THAT(r->Services(), ElementsAre("default/s4", "default/s5"));
  EXPECT_EQ(r->stats().unprogrammed, 3u);
  // Applied again, changed or not, refused frontends are no error (no retry, no back-off) and
  // write nothing.
  maps.Take();
  ASSERT_TRUE(r->ApplyAll(Numbered({1, 2, 3})).ok());
  EXPECT_THAT(maps.Take(), IsEmpty());
  // s5 goes: the first in order of those waiting (s1) takes its place, whole.
  ASSERT_TRUE(r->Apply("default/s5", std::nullopt).ok());
  EXPECT_THAT(r->Services(), ElementsAre("default/s1", "default/s4"));
  EXPECT_THAT(RefusedServices(*r), ElementsAre("default/s2 10.96.0.2:80 sluice_lb4_rnat",
                                               "default/s3 10.96.0.3:80 sluice_lb4_rnat"));
  std::vector<std::string> ops = maps.Take();
  EXPECT_THAT(ops, ::testing::Contains("master+ 10.96.0.1:80/6 count=2 flags=0 rnat=3"));
  // The room was made (s5's entries deleted) before s1's were written.
  auto at = [&](const std::string& op) {
    return std::find(ops.begin(), ops.end(), op) - ops.begin();
  };
  EXPECT_LT(at("rnat- 1"), at("rnat+ 3 10.96.0.1:80"));
  // A waiting Service that goes is forgotten.
  ASSERT_TRUE(r->Apply("default/s2", std::nullopt).ok());
  EXPECT_THAT(RefusedServices(*r), ElementsAre("default/s3 10.96.0.3:80 sluice_lb4_rnat"));
  EXPECT_EQ(r->stats().errors, 0u);
}

TEST(ServiceCapacityTest, ServiceMapCountsMastersSlotsAndWildcards) {
  RecordingLbMaps maps;
  // s1: master, two slots, the ClusterIP's wildcard = 4; s2 needs 4 more.
  maps.capacity.services = 7;
  auto r = *ServiceReconciler::Create(maps);
  ASSERT_TRUE(r->ApplyAll(Numbered({2, 1})).ok());
  EXPECT_THAT(r->Services(), ElementsAre("default/s1"));
  EXPECT_THAT(RefusedServices(*r), ElementsAre("default/s2 10.96.0.2:80 sluice_lb4_svc"));
  EXPECT_THAT(maps.svc, ::testing::SizeIs(4));
  EXPECT_THAT(maps.be, ::testing::SizeIs(2));
  // With one more entry s2 fits; a frontend without backends needs its master only (and the
  // wildcard of a new ClusterIP).
  maps.capacity.services = 8;
  auto r2 = *ServiceReconciler::Create(maps);
  ASSERT_TRUE(r2->ApplyAll(Numbered({1, 2})).ok());
  ASSERT_TRUE(r2->PruneStale().ok());
  EXPECT_THAT(r2->Services(), ElementsAre("default/s1", "default/s2"));
  EXPECT_THAT(maps.svc, ::testing::SizeIs(8));
  EXPECT_EQ(r->stats().errors, 0u);
  EXPECT_EQ(r2->stats().errors, 0u);
}

TEST(ServiceCapacityTest, BackendMapFullRefusesNewFrontendsAndTruncatesGrowingOnes) {
  RecordingLbMaps maps;
  maps.capacity.backends = 3;
  auto r = *ServiceReconciler::Create(maps);
  ASSERT_TRUE(r->ApplyAll(Numbered({1, 2})).ok());
  EXPECT_THAT(r->Services(), ElementsAre("default/s1"));
  EXPECT_THAT(RefusedServices(*r), ElementsAre("default/s2 10.96.0.2:80 sluice_lb4_be"));
  // A frontend sharing s1's backends needs no new backend entry: it fits.
  ASSERT_TRUE(
      r->Apply("default/s9", T({Frontend("10.96.0.9", 80, {"10.244.1.1", "10.244.2.1"})})).ok());
  EXPECT_THAT(r->Services(), ElementsAre("default/s1", "default/s9"));
  // s1 grows by three backends: it keeps its place with the one that fits.
  maps.Take();
  ASSERT_TRUE(r->Apply("default/s1", T({Frontend("10.96.0.1", 80,
                                                 {"10.244.1.1", "10.244.2.1", "10.244.3.1",
                                                  "10.244.4.1", "10.244.5.1"})}))
                  .ok());
  EXPECT_THAT(maps.Take(), ElementsAre("be+ 3 10.244.3.1:8080", "slot+ 10.96.0.1:80/6#3 -> 3",
                                       "master+ 10.96.0.1:80/6 count=3 flags=0 rnat=1"));
  EXPECT_THAT(RefusedServices(*r),
              ElementsAre("default/s1 10.96.0.1:80 sluice_lb4_be truncated 3/5",
                          "default/s2 10.96.0.2:80 sluice_lb4_be"));
  EXPECT_EQ(r->stats().truncated, 1u);
  auto by_map = r->UnprogrammedByMap();
  EXPECT_EQ(by_map["sluice_lb4_be"].refused, 1u);
  EXPECT_EQ(by_map["sluice_lb4_be"].truncated, 1u);
  EXPECT_EQ(by_map["sluice_lb4_rnat"].refused, 0u);
  // s9 goes (its backends are s1's: no room made); s1 shrinks to one backend, freeing two:
  // s2 gets in.
  ASSERT_TRUE(r->Apply("default/s9", std::nullopt).ok());
  EXPECT_THAT(r->Services(), ElementsAre("default/s1"));
  EXPECT_THAT(RefusedServices(*r), ::testing::SizeIs(2));
  ASSERT_TRUE(r->Apply("default/s1", T({Frontend("10.96.0.1", 80, {"10.244.1.1"})})).ok());
  EXPECT_THAT(r->Services(), ElementsAre("default/s1", "default/s2"));
  EXPECT_THAT(RefusedServices(*r), IsEmpty());
  EXPECT_THAT(maps.be, ::testing::SizeIs(3));
  // Ids index sluice_lb4_be (a slot array of capacity + 1): s2's backends took freed ids.
  for (const auto& [id, v] : maps.be) {
    EXPECT_GE(id, 1u);
    EXPECT_LE(id, 3u);
  }
  EXPECT_EQ(r->stats().errors, 0u);  // the room counters agree with a walk of the frontends
}

TEST(ServiceCapacityTest, TruncatedFrontendGrowsWhenBackendsFreeUpThoughEveryRevNatIsTaken) {
  RecordingLbMaps maps;
  maps.capacity.rev_nat = 2;
  maps.capacity.backends = 3;
  auto r = *ServiceReconciler::Create(maps);
  ASSERT_TRUE(
      r->Apply("default/s1", T({Frontend("10.96.0.1", 80, {"10.244.1.1", "10.244.1.2"})})).ok());
  ASSERT_TRUE(r->Apply("default/s2", T({Frontend("10.96.0.2", 80, {"10.244.2.1"})})).ok());
  ASSERT_TRUE(r->Apply("default/s1",
                       T({Frontend("10.96.0.1", 80,
                                   {"10.244.1.1", "10.244.1.2", "10.244.1.3", "10.244.1.4"})}))
                  .ok());
  EXPECT_THAT(RefusedServices(*r),
              ElementsAre("default/s1 10.96.0.1:80 sluice_lb4_be truncated 2/4"));
  // s2 moves to one of s1's backends: its own leaves sluice_lb4_be, and s1 takes the room.
  ASSERT_TRUE(r->Apply("default/s2", T({Frontend("10.96.0.2", 80, {"10.244.1.1"})})).ok());
  EXPECT_EQ(maps.svc[Tup(sluice_lb4_key{
                         .addr = htonl(0x0a600001), .dport = htons(80), .proto = IPPROTO_TCP})]
                .count,
            3);
  EXPECT_THAT(RefusedServices(*r),
              ElementsAre("default/s1 10.96.0.1:80 sluice_lb4_be truncated 3/4"));
  EXPECT_EQ(r->stats().errors, 0u);
}

TEST(ServiceCapacityTest, StaleStateRestoredFromTheMapsMakesRoomOnlyWhenPruned) {
  RecordingLbMaps maps;
  maps.capacity.rev_nat = 3;
  {
    auto before = *ServiceReconciler::Create(maps);
    ASSERT_TRUE(before->ApplyAll(Numbered({1, 2, 3})).ok());
  }
  // Restarted: s1 and s2 were deleted while the agent was down, s4 and s5 created.
  auto r = *ServiceReconciler::Create(maps);
  ASSERT_TRUE(r->ApplyAll(Numbered({5, 3, 4})).ok());
  EXPECT_THAT(r->Services(), ElementsAre("default/s3"));
  EXPECT_EQ(r->stats().unprogrammed, 2u);
  ASSERT_TRUE(r->PruneStale().ok());
  EXPECT_THAT(r->Services(), ElementsAre("default/s3", "default/s4", "default/s5"));
  EXPECT_THAT(RefusedServices(*r), IsEmpty());
  EXPECT_THAT(maps.rnat, ::testing::SizeIs(3));
  EXPECT_EQ(r->stats().errors, 0u);
}

TEST(ServiceSyncTest, UnprogrammedFrontendsAreGaugedPerMap) {
  RecordingLbMaps maps;
  maps.capacity.rev_nat = 1;
  auto r = *ServiceReconciler::Create(maps);
  k8s::SyncGate gate;
  k8s::Store<k8s::Service> services(&gate);
  k8s::Store<k8s::EndpointSlice> slices(&gate);
  ServiceSync sync(
      services, slices, [&] { return gate.AllSynced(); }, *r, nullptr,
      NodeContext{"node-a", {Ip("192.168.0.10")}});
  services.Replace({Svc("b", "10.96.0.11"), Svc("a", "10.96.0.10"), Svc("c", "10.96.0.12")}, "1");
  slices.Replace({Slice("a", {"10.244.1.4"}), Slice("b", {"10.244.1.5"})}, "2");
  ASSERT_TRUE(sync.WaitIdle(absl::Seconds(10)));
  EXPECT_THAT(r->Services(), ElementsAre("default/a"));
  std::string text = metrics::Default().Expose();
  EXPECT_THAT(text, ::testing::HasSubstr(
                        "sluice_services_unprogrammed{reason=\"map_full\",map_name=\"sluice_lb4_"
                        "rnat\"} 2"));
  EXPECT_THAT(text, ::testing::HasSubstr(
                        "sluice_services_unprogrammed{reason=\"map_full\",map_name=\"sluice_lb4_"
                        "svc\"} 0"));
  EXPECT_THAT(sync.UnprogrammedJson(), ::testing::HasSubstr("\"service\": \"default/b\""));
  services.Delete(Svc("a", "10.96.0.10"));
  ASSERT_TRUE(sync.WaitIdle(absl::Seconds(10)));
  EXPECT_THAT(r->Services(), ElementsAre("default/b"));
  EXPECT_THAT(metrics::Default().Expose(),
              ::testing::HasSubstr("sluice_services_unprogrammed{reason=\"map_full\",map_name="
                                   "\"sluice_lb4_rnat\"} 1"));
}

// What a removed UDP backend takes with it (its conntrack flows, the node's connected sockets to
// it) is counted on /metrics, as is a close that failed.
TEST(ServiceSyncTest, RemovedUdpBackendsFlowsAndSocketsAreCountedOnMetrics) {
  RecordingLbMaps maps;
  auto r = *ServiceReconciler::Create(maps);
  k8s::SyncGate gate;
  k8s::Store<k8s::Service> services(&gate);
  k8s::Store<k8s::EndpointSlice> slices(&gate);
  ServiceSync sync(
      services, slices, [&] { return gate.AllSynced(); }, *r, nullptr,
      NodeContext{"node-a", {Ip("192.168.0.10")}});
  k8s::Service dns = Svc("dns", "10.96.0.10");
  dns.ports[0].protocol = k8s::Protocol::kUDP;
  k8s::EndpointSlice slice = Slice("dns", {"10.244.1.4", "10.244.1.5"});
  slice.ports = {{"http", k8s::Protocol::kUDP, 8080}};
  services.Replace({dns}, "1");
  slices.Replace({slice}, "2");
  ASSERT_TRUE(sync.WaitIdle(absl::Seconds(10)));
  const uint32_t rnat = r->RevNatId(Ip("10.96.0.10"), 80, IPPROTO_UDP, 0);
  const uint32_t gone = r->BackendId(Ip("10.244.1.5"), 8080, IPPROTO_UDP);
  ASSERT_NE(rnat, 0u);
  ASSERT_NE(gone, 0u);
  maps.ct[{1, IPPROTO_UDP}] = {rnat, gone};
  maps.ct[{2, IPPROTO_UDP}] = {rnat, gone};
  EXPECT_THAT(metrics::Default().Expose(),
              ::testing::HasSubstr("sluice_service_udp_flows_flushed_total 0\n"));

  slice.endpoints.pop_back();
  slices.Replace({slice}, "3");
  ASSERT_TRUE(sync.WaitIdle(absl::Seconds(10)));
  std::string text = metrics::Default().Expose();
  EXPECT_THAT(text, ::testing::HasSubstr("sluice_service_udp_flows_flushed_total 2\n"));
  EXPECT_THAT(text, ::testing::HasSubstr("sluice_service_udp_sockets_closed_total 1\n"));
  EXPECT_THAT(text, ::testing::HasSubstr("sluice_service_udp_socket_close_failures_total 0\n"));
  EXPECT_THAT(text, ::testing::HasSubstr("sluice_service_map_errors_total 0\n"));

  // The other backend goes where sockets cannot be closed: counted, and nothing retried.
  maps.close_udp_fails = true;
  slice.endpoints = {};
  slice.endpoints.push_back(k8s::Endpoint{});
  slice.endpoints.back().address = "10.244.1.6";
  slice.endpoints.back().node_name = "node-b";
  slices.Replace({slice}, "4");
  ASSERT_TRUE(sync.WaitIdle(absl::Seconds(10)));
  text = metrics::Default().Expose();
  EXPECT_THAT(text, ::testing::HasSubstr("sluice_service_udp_sockets_closed_total 1\n"));
  EXPECT_THAT(text, ::testing::HasSubstr("sluice_service_udp_socket_close_failures_total 1\n"));
  EXPECT_THAT(text, ::testing::HasSubstr("sluice_service_map_errors_total 0\n"));
}

}  // namespace
}  // namespace sluice::agent
