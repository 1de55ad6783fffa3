// The policy reconciler's write order, against a recording fake of the three policy maps: every
// mutation is logged as text ("allow+ 7 ingress id300 6/80/24") and the fake holds the contents,
// so each Apply starts from what the previous one left. The reconciler reads the fake whole only
// at its first Apply (`reads`), not again after a write the fake refused (`fail_ipcache_upserts`).
#include "agent/policy/reconciler.h"

#include <netinet/in.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

IpPrefix Pfx(const std::string& s) { return *IpPrefix::Parse(s); }

std::string Show(uint32_t ep, const PolicyAllow& a) {
  return absl::StrCat(ep, a.direction == SLUICE_POLICY_INGRESS ? " ingress" : " egress", " id",
                      a.identity, " ", a.proto, "/", a.port, "/", a.proto_port_bits);
}

class RecordingPolicyMaps : public PolicyMaps {
 public:
  std::vector<std::string> ops;
  std::map<IpPrefix, uint32_t> ipcache;
  std::map<uint32_t, std::set<PolicyAllow>> allows;
  std::map<uint32_t, sluice_policy_ep_entry> endpoints;
  int reads = 0;                 // ForEach* calls
  int fail_ipcache_upserts = 0;  // the next n UpsertIpcache calls fail
  // When set, ForEachIpcache notifies `reading` and waits for `release` (a read that takes long).
  absl::Notification* reading = nullptr;
  absl::Notification* release = nullptr;

  absl::Status ForEachIpcache(const IpcacheFn& fn) override {
    ++reads;
    if (reading != nullptr) {
      reading->Notify();
      release->WaitForNotification();
    }
    for (const auto& [p, id] : ipcache) fn(p, id);
    return absl::OkStatus();
  }
  absl::Status UpsertIpcache(const IpPrefix& p, uint32_t id) override {
    if (fail_ipcache_upserts > 0) {
      --fail_ipcache_upserts;
      return absl::ResourceExhaustedError("map full");
    }
    ops.push_back(absl::StrCat("ipcache+ ", p.ToString(), " id", id));
    ipcache[p] = id;
    return absl::OkStatus();
  }
  absl::Status DeleteIpcache(const IpPrefix& p) override {
    ops.push_back(absl::StrCat("ipcache- ", p.ToString()));
    ipcache.erase(p);
    return absl::OkStatus();
  }
  absl::Status ForEachAllow(const AllowFn& fn) override {
    ++reads;
    for (const auto& [ep, set] : allows)
      for (const auto& a : set) fn(ep, a);
    return absl::OkStatus();
  }
  absl::Status UpsertAllow(uint32_t ep, const PolicyAllow& a) override {
    ops.push_back("allow+ " + Show(ep, a));
    allows[ep].insert(a);
    return absl::OkStatus();
  }
  absl::Status DeleteAllow(uint32_t ep, const PolicyAllow& a) override {
    ops.push_back("allow- " + Show(ep, a));
    allows[ep].erase(a);
    if (allows[ep].empty()) allows.erase(ep);
    return absl::OkStatus();
  }
  absl::Status ForEachEndpoint(const EndpointFn& fn) override {
    ++reads;
    for (const auto& [ep, e] : endpoints) fn(ep, e);
    return absl::OkStatus();
  }
  absl::Status UpsertEndpoint(uint32_t ep, const sluice_policy_ep_entry& e) override {
    ops.push_back(absl::StrCat("ep+ ", ep, " id", e.identity, " flags", e.flags));
    endpoints[ep] = e;
    return absl::OkStatus();
  }
  absl::Status DeleteEndpoint(uint32_t ep) override {
    ops.push_back(absl::StrCat("ep- ", ep));
    endpoints.erase(ep);
    return absl::OkStatus();
  }
};

PolicyAllow Allow(uint32_t identity, uint8_t dir, uint8_t proto = IPPROTO_TCP, uint16_t port = 80,
                  uint8_t bits = 24) {
  return PolicyAllow{identity, dir, proto, port, bits};
}

EndpointPolicy Ep(uint32_t id, uint32_t identity, bool in, bool eg,
                  std::vector<PolicyAllow> allows) {
  EndpointPolicy e;
  e.endpoint_id = id;
  e.identity = identity;
  e.enforce_ingress = in;
  e.enforce_egress = eg;
  e.allows = std::move(allows);
  e.pod = absl::StrCat("ns/p", id);
  return e;
}

// Every endpoint of the translations below is pod "ns/p<id>".
auto Owner = [](uint32_t id) -> std::optional<std::string> { return absl::StrCat("ns/p", id); };

class PolicyReconcilerTest : public ::testing::Test {
 protected:
  RecordingPolicyMaps maps_;
  PolicyReconciler rec_{maps_};
};

TEST_F(PolicyReconcilerTest, FirstApplyWritesAllowsThenIpcacheThenEnforceBits) {
  PolicyTranslation t;
  t.ipcache = {{Pfx("0.0.0.0/0"), SLUICE_IDENTITY_WORLD}, {Pfx("10.244.0.10/32"), 300}};
  t.endpoints = {Ep(7, 301, true, false, {Allow(300, SLUICE_POLICY_INGRESS)})};
  ASSERT_TRUE(rec_.Apply(t, Owner).ok());
  EXPECT_THAT(maps_.ops, ElementsAre("allow+ 7 ingress id300 6/80/24", "ipcache+ 0.0.0.0/0 id2",
                                     "ipcache+ 10.244.0.10/32 id300", "ep+ 7 id301 flags1"));
  maps_.ops.clear();
  ASSERT_TRUE(rec_.Apply(t, Owner).ok());
  EXPECT_THAT(maps_.ops, IsEmpty()) << "a second apply of the same translation writes nothing";
}

// A pod moves to a new identity (relabelled): the allows naming the new identity exist before
// the ipcache says so, those naming the old one go only after.
TEST_F(PolicyReconcilerTest, IdentityChangeAddsNewAllowsBeforeIpcacheAndDropsOldOnesAfter) {
  PolicyTranslation t;
  t.ipcache = {{Pfx("10.244.0.10/32"), 300}};
  t.endpoints = {Ep(7, 301, true, false, {Allow(300, SLUICE_POLICY_INGRESS)})};
  ASSERT_TRUE(rec_.Apply(t, Owner).ok());
  maps_.ops.clear();
  t.ipcache = {{Pfx("10.244.0.10/32"), 302}};
  t.endpoints = {Ep(7, 301, true, false, {Allow(302, SLUICE_POLICY_INGRESS)})};
  ASSERT_TRUE(rec_.Apply(t, Owner).ok());
  EXPECT_THAT(maps_.ops,
              ElementsAre("allow+ 7 ingress id302 6/80/24", "ipcache+ 10.244.0.10/32 id302",
                          "allow- 7 ingress id300 6/80/24"));
}

// Removing the last policy of a pod: the bit is cleared before the allows go, so the pod is
// never enforced without them.
TEST_F(PolicyReconcilerTest, UnselectedPodClearsItsBitBeforeItsAllowsAreDeleted) {
  PolicyTranslation t;
  t.endpoints = {Ep(7, 301, true, true,
                    {Allow(300, SLUICE_POLICY_INGRESS), Allow(0, SLUICE_POLICY_EGRESS, 0, 0, 0)})};
  ASSERT_TRUE(rec_.Apply(t, Owner).ok());
  maps_.ops.clear();
  t.endpoints = {Ep(7, 301, false, false, {})};
  ASSERT_TRUE(rec_.Apply(t, Owner).ok());
  EXPECT_THAT(maps_.ops, ElementsAre("ep+ 7 id301 flags0", "allow- 7 egress id0 0/0/0",
                                     "allow- 7 ingress id300 6/80/24"));
}

TEST_F(PolicyReconcilerTest, NewEndpointIsClosedButToItsNodeUntilApplyOpensIt) {
  ASSERT_TRUE(rec_.WriteNewEndpoint(9, /*open=*/false).ok());
  EXPECT_THAT(maps_.ops, ElementsAre("allow+ 9 ingress id1 0/0/0", "ep+ 9 id3 flags3"));
  maps_.ops.clear();
  PolicyTranslation t;
  t.endpoints = {Ep(9, 400, false, false, {})};
  ASSERT_TRUE(rec_.Apply(t, Owner).ok());
  EXPECT_THAT(maps_.ops, ElementsAre("ep+ 9 id400 flags0", "allow- 9 ingress id1 0/0/0"));
}

TEST_F(PolicyReconcilerTest, OpenNewEndpointGetsAnEntryWithoutEnforcedDirections) {
  ASSERT_TRUE(rec_.WriteNewEndpoint(9, /*open=*/true).ok());
  EXPECT_THAT(maps_.ops, ElementsAre("ep+ 9 id3 flags0"));
}

// ADD wrote the entry after the translation's snapshot was taken: Apply must not open (or
// remove) it; an endpoint that is really gone loses its entry and allows.
TEST_F(PolicyReconcilerTest, EndpointNewerThanTheTranslationKeepsItsClosedEntry) {
  ASSERT_TRUE(rec_.WriteNewEndpoint(9, /*open=*/false).ok());
  ASSERT_TRUE(rec_.WriteNewEndpoint(10, /*open=*/false).ok());
  maps_.ops.clear();
  ASSERT_TRUE(rec_.Apply(PolicyTranslation{},
                         [](uint32_t id) -> std::optional<std::string> {
                           if (id == 9) return "ns/p9";
                           return std::nullopt;
                         })
                  .ok());
  EXPECT_THAT(maps_.ops, ElementsAre("ep- 10", "allow- 10 ingress id1 0/0/0"));
  EXPECT_TRUE(maps_.endpoints.contains(9));
  EXPECT_EQ(maps_.endpoints[9].flags, SLUICE_POLICY_EP_F_INGRESS | SLUICE_POLICY_EP_F_EGRESS);
  EXPECT_EQ(maps_.allows[9].size(), 1u);
}

// The translation saw pod p7 on endpoint 7; by the time it is applied p7 is gone and another
// pod got the id (closed by its ADD). The old pod's open state must not land on it.
TEST_F(PolicyReconcilerTest, ReusedEndpointIdIsNotGivenTheOldPodsState) {
  ASSERT_TRUE(rec_.WriteNewEndpoint(7, /*open=*/false).ok());
  maps_.ops.clear();
  PolicyTranslation t;
  t.endpoints = {Ep(7, 301, false, false, {Allow(300, SLUICE_POLICY_INGRESS)})};
  ASSERT_TRUE(
      rec_.Apply(t, [](uint32_t) -> std::optional<std::string> { return "ns/other"; }).ok());
  EXPECT_THAT(maps_.ops, IsEmpty());
  EXPECT_EQ(maps_.endpoints[7].flags, SLUICE_POLICY_EP_F_INGRESS | SLUICE_POLICY_EP_F_EGRESS);
}

TEST_F(PolicyReconcilerTest, StaleIpcachePrefixesGoLast) {
  PolicyTranslation t;
  t.ipcache = {{Pfx("10.244.0.10/32"), 300}, {Pfx("192.168.0.0/16"), 500}};
  t.endpoints = {Ep(7, 301, true, false, {Allow(500, SLUICE_POLICY_INGRESS)})};
  ASSERT_TRUE(rec_.Apply(t, Owner).ok());
  maps_.ops.clear();
  t.ipcache = {{Pfx("10.244.0.10/32"), 300}};
  t.endpoints = {Ep(7, 301, true, false, {})};
  ASSERT_TRUE(rec_.Apply(t, Owner).ok());
  EXPECT_THAT(maps_.ops, ElementsAre("allow- 7 ingress id500 6/80/24", "ipcache- 192.168.0.0/16"));
}

TEST_F(PolicyReconcilerTest, RemovedEndpointLosesItsEntryBeforeItsAllows) {
  PolicyTranslation t;
  t.endpoints = {Ep(7, 301, true, false, {Allow(300, SLUICE_POLICY_INGRESS)})};
  ASSERT_TRUE(rec_.Apply(t, Owner).ok());
  maps_.ops.clear();
  ASSERT_TRUE(rec_.RemoveEndpoint(7).ok());
  EXPECT_THAT(maps_.ops, ElementsAre("ep- 7", "allow- 7 ingress id300 6/80/24"));
}

// Reading the maps is the dearest part of a batch: they are read at the first Apply only, and
// what the reconciler writes afterwards (Apply, new and removed endpoints) keeps its view right.
TEST_F(PolicyReconcilerTest, MapsAreReadOnceAndTheWritesKeepItsViewOfThem) {
  PolicyTranslation t;
  t.ipcache = {{Pfx("10.244.0.10/32"), 300}, {Pfx("192.168.0.0/16"), 500}};
  t.endpoints = {Ep(7, 301, true, false, {Allow(300, SLUICE_POLICY_INGRESS)})};
  ASSERT_TRUE(rec_.Apply(t, Owner).ok());
  EXPECT_EQ(maps_.reads, 3);
  ASSERT_TRUE(rec_.WriteNewEndpoint(9, /*open=*/false).ok());
  ASSERT_TRUE(rec_.RemoveEndpoint(9).ok());
  maps_.ops.clear();
  t.ipcache = {{Pfx("10.244.0.10/32"), 302}};
  t.endpoints = {Ep(7, 301, true, false, {Allow(302, SLUICE_POLICY_INGRESS)})};
  ASSERT_TRUE(rec_.Apply(t, Owner).ok());
  EXPECT_THAT(maps_.ops,
              ElementsAre("allow+ 7 ingress id302 6/80/24", "ipcache+ 10.244.0.10/32 id302",
                          "allow- 7 ingress id300 6/80/24", "ipcache- 192.168.0.0/16"));
  maps_.ops.clear();
  ASSERT_TRUE(rec_.Apply(t, Owner).ok());
  EXPECT_THAT(maps_.ops, IsEmpty());
  EXPECT_EQ(maps_.reads, 3) << "no Apply after the first read the maps";
  EXPECT_EQ(rec_.stats().map_reads, 1u);
  EXPECT_FALSE(maps_.allows.contains(9)) << "the removed endpoint's host allow is gone";
}

// A write refused by a full map leaves the maps holding a part of the batch, which the copy
// knows: the retry completes it without reading the maps again (a full sluice_policy4 takes
// ~25 s to read, which made the controller's 1 s retries come every 20-28 s).
TEST_F(PolicyReconcilerTest, FailedWriteKeepsTheCopyAndTheRetryCompletesTheBatch) {
  PolicyTranslation t;
  t.ipcache = {{Pfx("10.244.0.10/32"), 300}, {Pfx("10.244.0.11/32"), 301}};
  t.endpoints = {Ep(7, 301, true, false, {Allow(300, SLUICE_POLICY_INGRESS)})};
  maps_.fail_ipcache_upserts = 1;
  EXPECT_FALSE(rec_.Apply(t, Owner).ok());
  EXPECT_TRUE(maps_.allows.contains(7)) << "the allows were written before the failure";
  maps_.ops.clear();
  ASSERT_TRUE(rec_.Apply(t, Owner).ok());
  EXPECT_EQ(maps_.reads, 3);
  EXPECT_EQ(rec_.stats().map_reads, 1u);
  EXPECT_THAT(maps_.ops, ElementsAre("ipcache+ 10.244.0.10/32 id300",
                                     "ipcache+ 10.244.0.11/32 id301", "ep+ 7 id301 flags1"));
}

// /metrics reads the reconciler's counters: a scrape must not wait for an Apply under way (a
// first read of full maps takes ~25 s, and a big batch of writes seconds).
TEST_F(PolicyReconcilerTest, StatsDoNotWaitForAnApplyUnderWay) {
  absl::Notification reading, release;
  maps_.reading = &reading;
  maps_.release = &release;
  PolicyTranslation t;
  t.ipcache = {{Pfx("10.244.0.10/32"), 300}};
  std::thread apply([&] { EXPECT_TRUE(rec_.Apply(t, Owner).ok()); });
  reading.WaitForNotification();  // Apply holds the reconciler's lock, reading the maps
  absl::Notification got;
  std::thread scrape([&] {
    EXPECT_EQ(rec_.stats().map_reads, 0u);
    got.Notify();
  });
  EXPECT_TRUE(got.WaitForNotificationWithTimeout(absl::Seconds(10)))
      << "stats() waited for the Apply";
  release.Notify();
  apply.join();
  scrape.join();
  EXPECT_EQ(rec_.stats().map_reads, 1u);
  EXPECT_EQ(rec_.stats().ipcache_writes, 1u);
}

TEST(PolicyAllowKeyTest, KeyRoundTripsThroughAllowOfKey) {
  PolicyAllow a{300, SLUICE_POLICY_EGRESS, IPPROTO_UDP, 80, 8 + 14};
  uint32_t ep = 0;
  PolicyAllow back = AllowOfKey(
      maps::MakePolicy4Key(7, a.identity, a.direction, a.proto, a.port, a.proto_port_bits), &ep);
  EXPECT_EQ(ep, 7u);
  EXPECT_EQ(back, a);
}

}  // namespace
}  // namespace sluice::agent
