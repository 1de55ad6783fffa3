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

#include "absl/strings/match.h"
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
  int allow_upserts_before_failure = -1;  // >= 0: one UpsertAllow fails after that many more
  int fail_endpoint_upserts = 0;          // the next n UpsertEndpoint calls fail
  uint64_t capacity = UINT64_MAX;         // AllowCapacity()
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
    if (allow_upserts_before_failure == 0) {
      allow_upserts_before_failure = -1;
      return absl::InternalError("injected ENOMEM");
    }
    if (allow_upserts_before_failure > 0) --allow_upserts_before_failure;
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
    if (fail_endpoint_upserts > 0) {
      --fail_endpoint_upserts;
      return absl::InternalError("injected EFAULT");
    }
    ops.push_back(absl::StrCat("ep+ ", ep, " id", e.identity, " flags", e.flags));
    endpoints[ep] = e;
    return absl::OkStatus();
  }
  absl::Status DeleteEndpoint(uint32_t ep) override {
    ops.push_back(absl::StrCat("ep- ", ep));
    endpoints.erase(ep);
    return absl::OkStatus();
  }
  uint64_t AllowCapacity() const override { return capacity; }
  size_t AllowCount() const {
    size_t n = 0;
    for (const auto& [ep, set] : allows) n += set.size();
    return n;
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

// ---- never partial, never empty: the transactional update per endpoint ----------------------

// Endpoint 7 enforces ingress and lets identity 300 in on TCP 80 (two entries with its host allow).
PolicyTranslation SmallPolicy() {
  PolicyTranslation t;
  t.ipcache = {{Pfx("10.244.0.10/32"), 300}, {Pfx("10.244.0.11/32"), 301}};
  t.endpoints = {Ep(7, 301, true, false,
                    {Allow(SLUICE_IDENTITY_HOST, SLUICE_POLICY_INGRESS, 0, 0, 0),
                     Allow(300, SLUICE_POLICY_INGRESS)})};
  t.endpoints[0].policies = {"ns/small"};
  return t;
}

// The same endpoint with `extra` more ports for identity 300 (ports 1000, 1001, ...).
PolicyTranslation GrownPolicy(int extra) {
  PolicyTranslation t = SmallPolicy();
  for (int i = 0; i < extra; ++i) {
    t.endpoints[0].allows.push_back(
        Allow(300, SLUICE_POLICY_INGRESS, IPPROTO_TCP, static_cast<uint16_t>(1000 + i)));
  }
  std::sort(t.endpoints[0].allows.begin(), t.endpoints[0].allows.end());
  t.endpoints[0].policies = {"ns/small", "ns/big"};
  return t;
}

TEST_F(PolicyReconcilerTest, PolicyThatDoesNotFitLeavesTheLastCompleteOneAndIsReported) {
  maps_.capacity = 4;
  ASSERT_TRUE(rec_.Apply(SmallPolicy(), Owner).ok());
  const auto last_good = maps_.allows;
  const auto last_entry = maps_.endpoints;
  ASSERT_EQ(maps_.AllowCount(), 2u);
  EXPECT_THAT(rec_.Degraded(), IsEmpty());

  maps_.ops.clear();
  ASSERT_TRUE(rec_.Apply(GrownPolicy(3), Owner).ok()) << "a full map is reported, not retried";
  EXPECT_EQ(maps_.allows, last_good) << "no allow of the new policy was written";
  EXPECT_EQ(maps_.endpoints.at(7).flags, last_entry.at(7).flags);
  for (const std::string& op : maps_.ops) {
    EXPECT_FALSE(absl::StartsWith(op, "allow")) << op;
    EXPECT_FALSE(absl::StartsWith(op, "ep")) << op;
  }
  auto degraded = rec_.Degraded();
  ASSERT_EQ(degraded.size(), 1u);
  const DegradedEndpoint& d = degraded.at(7);
  EXPECT_EQ(d.pod, "ns/p7");
  EXPECT_THAT(d.policies, ElementsAre("ns/small", "ns/big"));
  EXPECT_EQ(d.reason, "map_full");
  EXPECT_EQ(d.wanted, 5u);
  EXPECT_EQ(d.kept, 2u);
  EXPECT_EQ(d.missing, 3u);
  EXPECT_EQ(d.free, 2u);
  EXPECT_EQ(rec_.stats().allow_entries, 2u);
  EXPECT_EQ(rec_.stats().allow_capacity, 4u);

  // Room appears (a shrunk policy): the next Apply writes it and the endpoint is healthy again.
  ASSERT_TRUE(rec_.Apply(GrownPolicy(2), Owner).ok());
  EXPECT_THAT(rec_.Degraded(), IsEmpty());
  EXPECT_EQ(maps_.AllowCount(), 4u);
  EXPECT_TRUE(maps_.allows.at(7).contains(Allow(300, SLUICE_POLICY_INGRESS, IPPROTO_TCP, 1001)));
}

TEST_F(PolicyReconcilerTest, NewEndpointThatDoesNotFitStaysClosedButToItsNode) {
  maps_.capacity = 3;
  ASSERT_TRUE(rec_.WriteNewEndpoint(7, /*open=*/false).ok());
  ASSERT_TRUE(rec_.Apply(GrownPolicy(3), Owner).ok());
  EXPECT_THAT(maps_.allows.at(7),
              ElementsAre(Allow(SLUICE_IDENTITY_HOST, SLUICE_POLICY_INGRESS, 0, 0, 0)));
  EXPECT_EQ(maps_.endpoints.at(7).flags, SLUICE_POLICY_EP_F_INGRESS | SLUICE_POLICY_EP_F_EGRESS)
      << "closed as CNI ADD left it, never opened by a half-written policy";
  EXPECT_EQ(rec_.Degraded().at(7).reason, "map_full");
}

TEST_F(PolicyReconcilerTest, FailedAllowWriteIsRolledBackAndTheOtherEndpointsAreWritten) {
  PolicyTranslation t = SmallPolicy();
  t.endpoints.push_back(Ep(8, 301, true, false, {Allow(300, SLUICE_POLICY_INGRESS)}));
  ASSERT_TRUE(rec_.Apply(t, Owner).ok());
  const auto seven_before = maps_.allows.at(7);

  PolicyTranslation grown = GrownPolicy(3);
  grown.endpoints.push_back(
      Ep(8, 301, true, false,
         {Allow(300, SLUICE_POLICY_INGRESS), Allow(300, SLUICE_POLICY_INGRESS, IPPROTO_UDP, 53)}));
  maps_.allow_upserts_before_failure = 2;  // endpoint 7's third new allow fails
  maps_.ops.clear();
  absl::Status st = rec_.Apply(grown, Owner);
  EXPECT_FALSE(st.ok()) << "a refused write is retried by the controller";
  EXPECT_EQ(maps_.allows.at(7), seven_before) << "the two allows written went again";
  EXPECT_EQ(rec_.stats().rollbacks, 2u);
  EXPECT_EQ(rec_.Degraded().at(7).reason, "write_failed");
  EXPECT_THAT(rec_.Degraded().at(7).error, testing::HasSubstr("injected ENOMEM"));
  EXPECT_FALSE(rec_.Degraded().contains(8));
  // Endpoint 8 was written whole although 7 failed before it.
  EXPECT_TRUE(maps_.allows.at(8).contains(Allow(300, SLUICE_POLICY_INGRESS, IPPROTO_UDP, 53)));

  ASSERT_TRUE(rec_.Apply(grown, Owner).ok());
  EXPECT_THAT(rec_.Degraded(), IsEmpty());
  EXPECT_EQ(maps_.allows.at(7).size(), 5u);
}

TEST_F(PolicyReconcilerTest, RefusedEnforceBitRollsBackTheAllowsItNeeded) {
  // Endpoint 7 is open; its first policy's allows go in, the bit is refused: they go again, so
  // the endpoint is as open as before, not open with a half state.
  ASSERT_TRUE(rec_.WriteNewEndpoint(7, /*open=*/true).ok());
  maps_.fail_endpoint_upserts = 1;
  EXPECT_FALSE(rec_.Apply(SmallPolicy(), Owner).ok());
  EXPECT_FALSE(maps_.allows.contains(7));
  EXPECT_EQ(maps_.endpoints.at(7).flags, 0);
  EXPECT_EQ(rec_.Degraded().at(7).reason, "write_failed");
  ASSERT_TRUE(rec_.Apply(SmallPolicy(), Owner).ok());
  EXPECT_EQ(maps_.endpoints.at(7).flags, SLUICE_POLICY_EP_F_INGRESS);
  EXPECT_THAT(rec_.Degraded(), IsEmpty());
}

TEST_F(PolicyReconcilerTest, EndpointThatFitsOnlyAfterOthersShrinkIsWrittenInTheSameApply) {
  // 7 and 8 fill the map; then 7 grows by what 8 sheds: one Apply writes both.
  maps_.capacity = 6;
  PolicyTranslation t = SmallPolicy();
  t.endpoints.push_back(Ep(8, 301, true, false,
                           {Allow(300, SLUICE_POLICY_INGRESS, IPPROTO_TCP, 1),
                            Allow(300, SLUICE_POLICY_INGRESS, IPPROTO_TCP, 2),
                            Allow(300, SLUICE_POLICY_INGRESS, IPPROTO_TCP, 3),
                            Allow(300, SLUICE_POLICY_INGRESS, IPPROTO_TCP, 4)}));
  ASSERT_TRUE(rec_.Apply(t, Owner).ok());
  ASSERT_EQ(maps_.AllowCount(), 6u);
  PolicyTranslation next = GrownPolicy(3);
  next.endpoints.push_back(
      Ep(8, 301, true, false, {Allow(300, SLUICE_POLICY_INGRESS, IPPROTO_TCP, 1)}));
  maps_.ops.clear();
  ASSERT_TRUE(rec_.Apply(next, Owner).ok());
  EXPECT_THAT(rec_.Degraded(), IsEmpty());
  EXPECT_EQ(maps_.allows.at(7).size(), 5u);
  EXPECT_EQ(maps_.AllowCount(), 6u);
  // 8's stale allows went before 7's new ones were written.
  auto first_of = [&](const std::string& prefix) {
    return std::find_if(maps_.ops.begin(), maps_.ops.end(),
                        [&](const std::string& op) { return absl::StartsWith(op, prefix); }) -
           maps_.ops.begin();
  };
  EXPECT_LT(first_of("allow- 8"), first_of("allow+ 7")) << ::testing::PrintToString(maps_.ops);
  EXPECT_LT(first_of("allow+ 7"), static_cast<long>(maps_.ops.size()));
}

TEST_F(PolicyReconcilerTest, RemovedEndpointIsNoLongerDegraded) {
  maps_.capacity = 2;
  ASSERT_TRUE(rec_.Apply(SmallPolicy(), Owner).ok());
  ASSERT_TRUE(rec_.Apply(GrownPolicy(1), Owner).ok());
  ASSERT_TRUE(rec_.Degraded().contains(7));
  ASSERT_TRUE(rec_.RemoveEndpoint(7).ok());
  EXPECT_THAT(rec_.Degraded(), IsEmpty());
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
