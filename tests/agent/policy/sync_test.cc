// PolicySync end to end without a kernel: real stores and endpoint store, the production
// translator, the reconciler on an in-memory fake of the policy maps. Changes to the watched
// objects reach the maps through the controller; new endpoints are closed until their policy is
// known; identities land in the state file; rejected rules are counted once.
#include "agent/policy/sync.h"

#include <netinet/in.h>

#include <atomic>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "agent/k8s/decode.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "support/eventually.h"
#include "support/temp_dir.h"

namespace sluice::agent {
namespace {

class MemoryPolicyMaps : public PolicyMaps {
 public:
  absl::Mutex mu;
  std::map<IpPrefix, uint32_t> ipcache ABSL_GUARDED_BY(mu);
  std::map<uint32_t, std::set<PolicyAllow>> allows ABSL_GUARDED_BY(mu);
  std::map<uint32_t, sluice_policy_ep_entry> endpoints ABSL_GUARDED_BY(mu);

  absl::Status ForEachIpcache(const IpcacheFn& fn) override {
    absl::MutexLock l(&mu);
    for (const auto& [p, id] : ipcache) fn(p, id);
    return absl::OkStatus();
  }
  absl::Status UpsertIpcache(const IpPrefix& p, uint32_t id) override {
    absl::MutexLock l(&mu);
    ipcache[p] = id;
    return absl::OkStatus();
  }
  absl::Status DeleteIpcache(const IpPrefix& p) override {
    absl::MutexLock l(&mu);
    ipcache.erase(p);
    return absl::OkStatus();
  }
  absl::Status ForEachAllow(const AllowFn& fn) override {
    absl::MutexLock l(&mu);
    for (const auto& [ep, set] : allows)
      for (const auto& a : set) fn(ep, a);
    return absl::OkStatus();
  }
  absl::Status UpsertAllow(uint32_t ep, const PolicyAllow& a) override {
    absl::MutexLock l(&mu);
    allows[ep].insert(a);
    return absl::OkStatus();
  }
  absl::Status DeleteAllow(uint32_t ep, const PolicyAllow& a) override {
    absl::MutexLock l(&mu);
    allows[ep].erase(a);
    return absl::OkStatus();
  }
  absl::Status ForEachEndpoint(const EndpointFn& fn) override {
    absl::MutexLock l(&mu);
    for (const auto& [ep, e] : endpoints) fn(ep, e);
    return absl::OkStatus();
  }
  absl::Status UpsertEndpoint(uint32_t ep, const sluice_policy_ep_entry& e) override {
    absl::MutexLock l(&mu);
    endpoints[ep] = e;
    return absl::OkStatus();
  }
  absl::Status DeleteEndpoint(uint32_t ep) override {
    absl::MutexLock l(&mu);
    endpoints.erase(ep);
    return absl::OkStatus();
  }
  std::atomic<uint64_t> capacity{UINT64_MAX};
  uint64_t AllowCapacity() const override { return capacity.load(); }
  // -1: no entry.
  int Flags(uint32_t ep) {
    absl::MutexLock l(&mu);
    auto it = endpoints.find(ep);
    return it == endpoints.end() ? -1 : it->second.flags;
  }
};

k8s::Pod MakePod(std::string ns, std::string name, std::string ip, k8s::StringMap labels) {
  k8s::Pod p;
  p.meta.namespace_ = std::move(ns);
  p.meta.name = std::move(name);
  p.meta.uid = absl::StrCat("uid-", p.meta.namespace_, "-", p.meta.name);
  p.meta.labels = std::move(labels);
  p.node_name = "n1";
  p.pod_ips = {std::move(ip)};
  p.phase = "Running";
  return p;
}

k8s::Namespace MakeNs(std::string name) {
  k8s::Namespace n;
  n.meta.name = name;
  n.meta.uid = "uid-ns-" + name;
  n.meta.labels = {{"kubernetes.io/metadata.name", name}};
  return n;
}

k8s::NetworkPolicy MakePolicy(const std::string& spec, const std::string& name = "p",
                              const std::string& ns = "x") {
  k8s::Decoder d;
  k8s::NetworkPolicy np;
  std::string json = absl::StrCat(R"({"metadata":{"name":")", name, R"(","namespace":")", ns,
                                  R"(","uid":"uid-np-)", name, R"("},"spec":)", spec, "}");
  absl::Status st = d.Decode(json, &np);
  EXPECT_TRUE(st.ok()) << st;
  return np;
}

class PolicySyncTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = EndpointStore::Open(dir_.path());
    ASSERT_TRUE(store.ok()) << store.status();
    eps_ = std::move(*store);
    k8s::Node node;
    node.meta.name = "n1";
    node.meta.uid = "uid-n1";
    node.internal_ips = {"192.168.1.1"};
    node.pod_cidrs = {"10.1.1.0/24"};
    nodes_.Replace({node}, "1");
    namespaces_.Replace({MakeNs("x"), MakeNs("z")}, "1");
    pods_.Replace({MakePod("x", "a", "10.1.1.10", {{"pod", "a"}}),
                   MakePod("x", "b", "10.1.1.11", {{"pod", "b"}})},
                  "1");
    policies_.Replace({}, "1");
    a_ = PutEndpoint("ctr-a", "x", "a", "10.1.1.10");
    sync_ = std::make_unique<PolicySync>(
        PolicySources{pods_, namespaces_, policies_, nodes_, *eps_},
        [this] { return synced_.load(); }, rec_, "n1", dir_.path());
  }
  void TearDown() override { sync_.reset(); }
  Endpoint PutEndpoint(const std::string& ctr, const std::string& ns, const std::string& pod,
                       const std::string& ip) {
    Endpoint ep;
    ep.container_id = ctr;
    ep.ifname = "eth0";
    ep.netns = "/var/run/netns/" + ctr;
    ep.network_name = "net";
    ep.pod_namespace = ns;
    ep.pod_name = pod;
    ep.host_ifname = "lxc" + ctr;
    ep.host_ifindex = 10;
    ep.ipv4 = ip;
    ep.mac = "02:00:00:00:00:01";
    ep.host_mac = "02:00:00:00:00:02";
    auto stored = eps_->Put(ep);
    EXPECT_TRUE(stored.ok()) << stored.status();
    return stored.ok() ? *stored : ep;
  }
  void Idle() { ASSERT_TRUE(sync_->WaitIdle(absl::Seconds(10))); }

  sluice::testing::TempDir dir_{"policy-sync"};
  std::unique_ptr<EndpointStore> eps_;
  k8s::Store<k8s::Pod> pods_;
  k8s::Store<k8s::Namespace> namespaces_;
  k8s::Store<k8s::NetworkPolicy> policies_;
  k8s::Store<k8s::Node> nodes_;
  MemoryPolicyMaps maps_;
  PolicyReconciler rec_{maps_};
  std::atomic<bool> synced_{false};
  Endpoint a_;
  std::unique_ptr<PolicySync> sync_;
};

TEST_F(PolicySyncTest, NothingIsWrittenBeforeTheWatchesSynced) {
  EXPECT_FALSE(sync_->WaitIdle(absl::Milliseconds(50)));
  EXPECT_EQ(maps_.Flags(a_.endpoint_id), -1);
  synced_ = true;
  Idle();
  EXPECT_EQ(maps_.Flags(a_.endpoint_id), 0) << "selected by no policy: an entry, open";
}

TEST_F(PolicySyncTest, PolicyCreatedUpdatedAndDeletedReachesTheEndpointsEntry) {
  synced_ = true;
  Idle();
  policies_.Upsert(MakePolicy(R"({"podSelector":{},"policyTypes":["Ingress"]})"));
  Idle();
  EXPECT_EQ(maps_.Flags(a_.endpoint_id), SLUICE_POLICY_EP_F_INGRESS);
  policies_.Upsert(MakePolicy(R"({"podSelector":{},"policyTypes":["Ingress","Egress"]})"));
  Idle();
  EXPECT_EQ(maps_.Flags(a_.endpoint_id), SLUICE_POLICY_EP_F_INGRESS | SLUICE_POLICY_EP_F_EGRESS);
  policies_.Delete(MakePolicy(R"({"podSelector":{}})"));
  Idle();
  EXPECT_EQ(maps_.Flags(a_.endpoint_id), 0);
  auto saved = LoadIdentities(dir_.path());
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_FALSE(saved->empty()) << "the pods' identities are in the state file";
  EXPECT_EQ(*saved, sync_->Identities());
}

TEST_F(PolicySyncTest, NewEndpointIsClosedWhereAPolicyCouldSelectItAndOpenElsewhere) {
  synced_ = true;
  policies_.Upsert(MakePolicy(R"({"podSelector":{"matchLabels":{"pod":"zzz"}}})"));
  Idle();
  // x has a policy (selecting nobody yet): closed until the controller knows better.
  Endpoint b = PutEndpoint("ctr-b", "x", "b", "10.1.1.11");
  ASSERT_TRUE(sync_->EndpointAdded(b).ok());
  // z has none: open from the start.
  Endpoint c = PutEndpoint("ctr-c", "z", "c", "10.1.1.12");
  ASSERT_TRUE(sync_->EndpointAdded(c).ok());
  Idle();
  EXPECT_EQ(maps_.Flags(b.endpoint_id), 0) << "the controller opened it: no policy selects b";
  EXPECT_EQ(maps_.Flags(c.endpoint_id), 0);
  // In EndpointService::RemoveEndpoint's order: the record goes first, so the reconcile the hook
  // asks for cannot find the endpoint and write its entry back.
  ASSERT_TRUE(eps_->Remove(c.container_id, c.ifname).ok());
  ASSERT_TRUE(sync_->EndpointRemoved(c).ok());
  Idle();
  EXPECT_EQ(maps_.Flags(c.endpoint_id), -1);
}

// Before the watches synced nobody knows which policies exist: a new pod starts closed (but to
// its node) and stays so until the first translation.
TEST_F(PolicySyncTest, EndpointAddedBeforeSyncIsClosedUntilTheFirstTranslation) {
  Endpoint c = PutEndpoint("ctr-c", "z", "c", "10.1.1.12");
  ASSERT_TRUE(sync_->EndpointAdded(c).ok());
  EXPECT_EQ(maps_.Flags(c.endpoint_id), SLUICE_POLICY_EP_F_INGRESS | SLUICE_POLICY_EP_F_EGRESS);
  {
    absl::MutexLock l(&maps_.mu);
    PolicyAllow host{SLUICE_IDENTITY_HOST, SLUICE_POLICY_INGRESS, 0, 0, 0};
    EXPECT_TRUE(maps_.allows[c.endpoint_id].contains(host));
  }
  synced_ = true;
  Idle();
  EXPECT_EQ(maps_.Flags(c.endpoint_id), 0);
}

// sluicectl reads <state_dir>/policy-status.json: the degraded endpoint with the policies that
// select it, the invalid policies; rewritten when the endpoint is whole again.
TEST_F(PolicySyncTest, DegradedEndpointAndInvalidPolicyAreSavedForSluicectl) {
  maps_.capacity = 8;
  synced_ = true;
  std::string ports;
  for (int i = 0; i < 10; ++i)
    absl::StrAppend(&ports, i ? "," : "", R"({"port":)", 2000 + 2 * i, "}");
  policies_.Upsert(
      MakePolicy(absl::StrCat(R"({"podSelector":{"matchLabels":{"pod":"a"}},"ingress":[{"ports":[)",
                              ports, "]}]}"),
                 "big"));
  policies_.Upsert(MakePolicy(
      R"({"podSelector":{"matchLabels":{"pod":"b"}},"ingress":[{"from":[{"ipBlock":{"cidr":"10.1.2.0"}}]}]})",
      "bad"));
  Idle();
  PolicyHealth h = sync_->health();
  ASSERT_EQ(h.degraded.size(), 1u);
  const DegradedEndpoint& d = h.degraded.begin()->second;
  EXPECT_EQ(d.endpoint_id, a_.endpoint_id);
  EXPECT_EQ(d.pod, "x/a");
  EXPECT_THAT(d.policies, ::testing::ElementsAre("x/big"));
  EXPECT_EQ(d.reason, "map_full");
  EXPECT_EQ(maps_.Flags(a_.endpoint_id), -1) << "still without an entry (open), as before";
  auto read_status = [&] {
    std::ifstream in(dir_.path() + "/" + kPolicyStatusFile);
    std::stringstream buf;
    buf << in.rdbuf();
    return nlohmann::json::parse(buf.str(), nullptr, false);
  };
  nlohmann::json st = read_status();
  ASSERT_TRUE(st.is_object());
  ASSERT_EQ(st["degraded"].size(), 1u);
  EXPECT_EQ(st["degraded"][0]["pod"], "x/a");
  EXPECT_EQ(st["degraded"][0]["policies"][0], "x/big");
  EXPECT_THAT(st["degraded"][0]["message"].get<std::string>(),
              ::testing::HasSubstr("NetworkPolicy x/big does not fit sluice_policy4"));
  ASSERT_EQ(st["invalid"].size(), 1u);
  EXPECT_EQ(st["invalid"][0]["policy"], "x/bad");
  EXPECT_EQ(st["invalid"][0]["where"], "ingress[0]");

  maps_.capacity = 64;  // room appears: the next batch (any change) writes it whole
  policies_.Delete(MakePolicy("{}", "bad"));
  Idle();
  EXPECT_TRUE(sync_->health().degraded.empty());
  EXPECT_EQ(maps_.Flags(a_.endpoint_id), SLUICE_POLICY_EP_F_INGRESS);
  st = read_status();
  EXPECT_TRUE(st["degraded"].empty());
  EXPECT_TRUE(st["invalid"].empty());
}

TEST_F(PolicySyncTest, RejectedRuleIsCountedOnceAndDeniesWhatItWouldHaveAllowed) {
  synced_ = true;
  policies_.Upsert(
      MakePolicy(R"({"podSelector":{},"ingress":[{"from":[{"ipBlock":{"cidr":"not-a-cidr"}}]}]})"));
  Idle();
  EXPECT_EQ(sync_->stats().problems, 1u);
  EXPECT_EQ(maps_.Flags(a_.endpoint_id), SLUICE_POLICY_EP_F_INGRESS);
  pods_.Upsert(MakePod("x", "b", "10.1.1.11", {{"pod", "b"}, {"v", "2"}}));
  Idle();
  EXPECT_EQ(sync_->stats().problems, 1u) << "the same problem again is not counted again";
}

// Status churn (readiness, resourceVersion, host IP) runs no translation; what the translator
// reads (labels, addresses, named ports, terminal phase, deletion) does, and lands in the maps.
TEST_F(PolicySyncTest, StatusOnlyUpdatesRunNoTranslationAndRelevantOnesDo) {
  synced_ = true;
  policies_.Upsert(MakePolicy(R"({"podSelector":{},"ingress":[{"from":[{"podSelector":{"matchLabels":{"pod":"b"}}}]}]})"));
  Idle();
  const uint64_t applies = sync_->stats().applies;
  k8s::Pod b = MakePod("x", "b", "10.1.1.11", {{"pod", "b"}});
  b.ready = true;
  b.host_ip = "192.168.1.1";
  b.meta.resource_version = "7";
  b.meta.annotations = {{"note", "status only"}};
  pods_.Upsert(b);
  k8s::Namespace x = MakeNs("x");
  x.meta.resource_version = "8";
  namespaces_.Upsert(x);
  k8s::Node n1 = *nodes_.List()[0];
  n1.ready = !n1.ready;
  nodes_.Upsert(n1);
  Idle();
  EXPECT_EQ(sync_->stats().applies, applies) << "no batch for status-only updates";
  EXPECT_EQ(sync_->stats().skipped_updates, 3u);

  // b's label changes: it stops matching the rule, a batch runs and the allow of its identity
  // goes.
  auto allowed = [&] {
    absl::MutexLock l(&maps_.mu);
    return maps_.allows[a_.endpoint_id].size();
  };
  const size_t before = allowed();
  b.meta.labels["pod"] = "b2";
  pods_.Upsert(b);
  Idle();
  EXPECT_GT(sync_->stats().applies, applies);
  EXPECT_LT(allowed(), before) << "b's identity no longer allowed";
  // Each field the translator reads is a change.
  const uint64_t skipped = sync_->stats().skipped_updates;
  for (int field = 0; field < 4; ++field) {
    k8s::Pod c = b;
    if (field == 0) c.pod_ips = {"10.1.1.12"};
    if (field == 1) c.container_ports = {{"serve-80-tcp", 80, k8s::Protocol::kTCP}};
    if (field == 2) c.phase = "Succeeded";
    if (field == 3) c.meta.deleting = true;
    pods_.Upsert(c);
    Idle();
    EXPECT_EQ(sync_->stats().skipped_updates, skipped) << "field " << field;
    pods_.Upsert(b);
    Idle();
  }
}

// The Pod object of a terminating pod can leave the API before the runtime's CNI DEL (force
// deletion; the lab's kubelet): while its endpoint still serves, it keeps its identity and its
// policy's allows, as last seen. Only the endpoint's removal ends them.
TEST_F(PolicySyncTest, EndpointWhosePodLeftTheApiKeepsItsAllowsUntilItIsRemoved) {
  synced_ = true;
  policies_.Upsert(MakePolicy(
      R"({"podSelector":{"matchLabels":{"pod":"a"}},"ingress":[{"from":[{"podSelector":{"matchLabels":{"pod":"b"}}}]}]})"));
  Idle();
  ASSERT_EQ(maps_.Flags(a_.endpoint_id), SLUICE_POLICY_EP_F_INGRESS);
  std::set<PolicyAllow> before;
  std::map<IpPrefix, uint32_t> ipcache_before;
  {
    absl::MutexLock l(&maps_.mu);
    before = maps_.allows[a_.endpoint_id];
    ipcache_before = maps_.ipcache;
  }
  ASSERT_GT(before.size(), 1u) << "pod b's allow besides the node's";

  pods_.Delete(MakePod("x", "a", "10.1.1.10", {{"pod", "a"}}));
  Idle();
  EXPECT_EQ(maps_.Flags(a_.endpoint_id), SLUICE_POLICY_EP_F_INGRESS);
  {
    absl::MutexLock l(&maps_.mu);
    EXPECT_EQ(maps_.allows[a_.endpoint_id], before) << "pod b still reaches the terminating pod";
    EXPECT_EQ(maps_.ipcache, ipcache_before) << "its address keeps its identity";
  }

  ASSERT_TRUE(eps_->Remove(a_.container_id, a_.ifname).ok());
  ASSERT_TRUE(sync_->EndpointRemoved(a_).ok());
  Idle();
  EXPECT_EQ(maps_.Flags(a_.endpoint_id), -1);
  {
    absl::MutexLock l(&maps_.mu);
    EXPECT_FALSE(maps_.ipcache.contains(*IpPrefix::Parse("10.1.1.10/32")))
        << "the departed pod's address is forgotten with its endpoint";
  }
}

}  // namespace
}  // namespace sluice::agent
