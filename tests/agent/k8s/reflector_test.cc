// The reflector end to end against the lab's apiserver over HTTPS on loopback (TLS verified with
// the lab's CA, read from a file): pagination, ordered events, bookmarks, cut streams, 410 in both
// forms, an absent then present server, slow lists, back-off timing on a fake clock, token re-read
// on 401, x509 client authentication. The server holds only the Services a test creates.
#include "agent/k8s/reflector.h"

#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "agent/base/fake_clock.h"
#include "agent/lab/apiserver/apiserver.h"
#include "agent/lab/store/object_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "support/eventually.h"
#include "support/temp_dir.h"
#include "support/test_certs.h"

namespace sluice::k8s {
namespace {

using ::nlohmann::json;
using ::sluice::FakeClock;
using ::sluice::testing::Eventually;
using ::sluice::testing::ReadFile;
using ::sluice::testing::TempDir;
using ::sluice::testing::TestCerts;
using ::sluice::testing::WriteFile;
using ::testing::ElementsAre;

constexpr absl::Duration kDeadline = absl::Seconds(20);
constexpr char kServicesPath[] = "/api/v1/services";

// A lab apiserver serving one collection: no controllers (nothing else moves the
// resourceVersion), bookmarks only when a test sends them, every request logged.
lab::ApiServerOptions OneCollectionOptions() {
  lab::ApiServerOptions o;
  o.run_controllers = false;
  o.bookmark_interval = absl::Hours(1);
  o.request_log_limit = 100'000;
  return o;
}

// Start()s `server` and deletes the bootstrap's default/kubernetes Service, so the server holds
// exactly the Services the test makes.
void StartOneCollection(lab::ApiServer& server) {
  absl::Status s = server.Start();
  ASSERT_TRUE(s.ok()) << s;
  lab::ObjectStore::DeleteOptions now;
  now.grace_period_seconds = 0;
  auto r = server.store().Delete(lab::Resource("services"), "default", "kubernetes", now);
  ASSERT_TRUE(r.ok()) << r.status();
}

// Creates or updates default/<name> with a port (the port tells versions apart). Returns the new
// resourceVersion.
std::string UpsertService(lab::ApiServer& server, const std::string& name, int port) {
  const lab::ResourceType& services = lab::Resource("services");
  absl::StatusOr<json> r = server.store().Update(services, "default", name, [&](json& o) {
    o["spec"]["ports"][0]["port"] = port;
    return absl::OkStatus();
  });
  if (absl::IsNotFound(r.status())) {
    r = server.store().Create(
        services,
        {{"apiVersion", "v1"},
         {"kind", "Service"},
         {"metadata",
          {{"name", name},
           {"namespace", "default"},
           {"managedFields", json::array({{{"manager", "x"}}})}}},
         {"spec",
          {{"type", "ClusterIP"},
           {"ports", json::array({{{"name", "p"},
                                   {"port", port},
                                   {"protocol", "TCP"},
                                   {"targetPort", 8080}}})}}}});
  }
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? (*r)["metadata"].value("resourceVersion", "") : "";
}

class ReflectorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { certs_ = new TestCerts(); }
  static void TearDownTestSuite() {
    delete certs_;
    certs_ = nullptr;
  }

  void TearDown() override {
    if (reflector_) reflector_->Stop();
    server_->Stop();
  }

  void StartServer() {
    StartOneCollection(*server_);
    WriteFile(ca_file_, server_->ca_cert_pem());
  }

  // ---- the server's Services --------------------------------------------------------------
  std::string Upsert(const std::string& name, int port) {
    return UpsertService(*server_, name, port);
  }
  // Returns the resourceVersion after the delete.
  std::string Remove(const std::string& name) {
    lab::ObjectStore::DeleteOptions now;
    now.grace_period_seconds = 0;
    auto r = server_->store().Delete(lab::Resource("services"), "default", name, now);
    EXPECT_TRUE(r.ok()) << r.status();
    return ResourceVersion();
  }
  // A BOOKMARK at a fresh resourceVersion with no Service change: a write the Service watch does
  // not select moves the resourceVersion (as any write does in etcd), then the server bookmarks.
  std::string Bookmark() {
    auto r = server_->store().Create(
        lab::Resource("namespaces"),
        {{"metadata", {{"name", absl::StrCat("bookmark-", ++bookmark_namespaces_)}}}});
    EXPECT_TRUE(r.ok()) << r.status();
    server_->SendBookmarks();
    return ResourceVersion();
  }
  std::string ResourceVersion() const {
    return absl::StrCat(server_->store().CurrentResourceVersion());
  }
  // name -> port of the server's Services.
  std::map<std::string, int> Snapshot() const { return ServicePorts(*server_); }
  static std::map<std::string, int> ServicePorts(lab::ApiServer& server) {
    std::map<std::string, int> out;
    auto list = server.store().List(lab::Resource("services"), {});
    EXPECT_TRUE(list.ok()) << list.status();
    if (!list.ok()) return out;
    for (const auto& o : list->items) {
      const json& ports = (*o)["spec"]["ports"];
      out[(*o)["metadata"].value("name", "")] = ports.empty() ? 0 : ports[0].value("port", 0);
    }
    return out;
  }
  bool WaitOpenWatches(int n, absl::Duration timeout) const {
    return Eventually([&] { return server_->open_watches() >= n; }, timeout);
  }


  static ReflectorOptions FastOptions() {
    ReflectorOptions o;
    o.backoff.initial = absl::Milliseconds(10);
    o.backoff.cap = absl::Milliseconds(100);
    o.min_watch_timeout = absl::Seconds(60);
    o.page_limit = 500;
    return o;
  }

  ClientConfig Config() {
    ClientConfig cfg;
    cfg.server = server_->url();
    cfg.ca_file = ca_file_;
    cfg.token = server_->token();
    return cfg;
  }

  void StartReflector(ReflectorOptions opts, ClientConfig cfg) {
    store_.AddListener([this](const Change<Service>& c) {
      absl::MutexLock lock(&changes_mu_);
      const Service& s = c.type == ChangeType::kDeleted ? *c.old_obj : *c.new_obj;
      changes_.push_back(absl::StrCat(c.type == ChangeType::kAdded     ? "add "
                                      : c.type == ChangeType::kUpdated ? "update "
                                                                       : "delete ",
                                      s.meta.name, " ", s.ports.empty() ? 0 : s.ports[0].port));
    });
    http_ = std::make_unique<HttpClient>(std::move(cfg));
    reflector_ = MakeReflector(http_.get(), &store_, std::move(opts));
    reflector_->Start();
  }
  void StartReflector(ReflectorOptions opts = FastOptions()) {
    StartReflector(std::move(opts), Config());
  }

  std::map<std::string, int> StoreContents() {
    std::map<std::string, int> out;
    for (const auto& s : store_.List()) out[s->meta.name] = s->ports.empty() ? 0 : s->ports[0].port;
    return out;
  }
  bool StoreMatchesServer() {
    return Eventually([&] { return StoreContents() == Snapshot(); });
  }
  std::vector<std::string> Changes() {
    absl::MutexLock lock(&changes_mu_);
    return changes_;
  }
  void ClearChanges() {
    absl::MutexLock lock(&changes_mu_);
    changes_.clear();
  }

  static TestCerts* certs_;
  FakeClock clock_;  // outlives the reflector (stopped in TearDown)
  TempDir dir_{"sluice-reflector"};
  const std::string ca_file_ = dir_ / "lab-ca.crt";
  std::unique_ptr<lab::ApiServer> server_ =
      std::make_unique<lab::ApiServer>(OneCollectionOptions());
  int bookmark_namespaces_ = 0;
  SyncGate gate_;
  Store<Service> store_{&gate_};
  std::unique_ptr<HttpClient> http_;
  std::unique_ptr<Reflector> reflector_;
  absl::Mutex changes_mu_;
  std::vector<std::string> changes_;
};

TestCerts* ReflectorTest::certs_ = nullptr;

TEST_F(ReflectorTest, InitialPaginatedListEqualsServerObjects) {
  StartServer();
  for (int i = 0; i < 1234; ++i) Upsert(absl::StrCat("svc-", i), 1000 + i);
  ReflectorOptions o = FastOptions();
  o.page_limit = 100;
  EXPECT_FALSE(gate_.AllSynced());
  StartReflector(o);
  ASSERT_TRUE(gate_.WaitAllSynced(kDeadline)) << "pending: " << gate_.Pending().size();
  EXPECT_TRUE(store_.HasSynced());
  EXPECT_EQ(StoreContents(), Snapshot());
  const auto c = reflector_->counters();
  EXPECT_EQ(c.lists, 1u);
  EXPECT_EQ(c.list_pages, 13u);
  EXPECT_EQ(c.list_items, 1234u);
  EXPECT_EQ(store_.resource_version(), ResourceVersion());
  // The protocol as sent: first list RV "0" + limit, then continue tokens without RV, then a
  // watch from the list's RV with bookmarks.
  ASSERT_TRUE(WaitOpenWatches(1, kDeadline));
  const auto reqs = server_->requests();
  ASSERT_GE(reqs.size(), 14u);
  EXPECT_EQ(reqs[0].param("limit"), "100");
  EXPECT_EQ(reqs[0].param("resourceVersion"), "0");
  EXPECT_EQ(reqs[0].param("continue"), "");
  EXPECT_NE(reqs[1].param("continue"), "");
  EXPECT_EQ(reqs[1].param("resourceVersion"), "");
  EXPECT_TRUE(reqs[13].watch());
  EXPECT_EQ(reqs[13].param("resourceVersion"), ResourceVersion());
  EXPECT_EQ(reqs[13].param("allowWatchBookmarks"), "true");
  int timeout_s = 0;
  ASSERT_TRUE(absl::SimpleAtoi(reqs[13].param("timeoutSeconds"), &timeout_s));
  EXPECT_GE(timeout_s, 60);
  EXPECT_LT(timeout_s, 120);
}

TEST_F(ReflectorTest, SelectorsAreSentUrlEncoded) {
  StartServer();
  ReflectorOptions o = FastOptions();
  o.label_selector = kServiceProxyLabelSelector;
  o.field_selector = "spec.type!=ExternalName";  // a field selector Services support
  StartReflector(o);
  ASSERT_TRUE(store_.WaitSynced(kDeadline));
  const auto reqs = server_->requests();
  ASSERT_FALSE(reqs.empty());
  // httplib decodes the query, so this checks what the server understood.
  EXPECT_EQ(reqs[0].param("labelSelector"), kServiceProxyLabelSelector);
  EXPECT_EQ(reqs[0].param("fieldSelector"), "spec.type!=ExternalName");
  EXPECT_EQ(QueryEscape("!a/b,c=d"), "%21a%2Fb%2Cc%3Dd");
}

TEST_F(ReflectorTest, WatchEventsAreAppliedInOrder) {
  StartServer();
  Upsert("a", 1);
  StartReflector();
  ASSERT_TRUE(store_.WaitSynced(kDeadline));
  ASSERT_TRUE(WaitOpenWatches(1, kDeadline));
  ClearChanges();
  Upsert("b", 2);
  Upsert("a", 3);
  Remove("b");
  Upsert("c", 4);
  // The sink sees an event before the reflector counts it: wait for the count, which follows
  // the resourceVersion.
  ASSERT_TRUE(Eventually([&] { return reflector_->counters().events == 4; }));
  EXPECT_THAT(Changes(), ElementsAre("add b 2", "update a 3", "delete b 2", "add c 4"));
  EXPECT_EQ(StoreContents(), Snapshot());
  EXPECT_EQ(reflector_->last_resource_version(), ResourceVersion());
  EXPECT_EQ(reflector_->counters().events, 4u);
}

TEST_F(ReflectorTest, BookmarkAdvancesResourceVersion) {
  StartServer();
  Upsert("a", 1);
  StartReflector();
  ASSERT_TRUE(WaitOpenWatches(1, kDeadline));
  const std::string rv = Bookmark();
  ASSERT_TRUE(Eventually([&] { return reflector_->counters().bookmarks == 1; }));
  EXPECT_EQ(reflector_->last_resource_version(), rv);
  // A later re-watch starts from the bookmark's RV.
  server_->CutWatches();
  ASSERT_TRUE(Eventually([&] {
    auto reqs = server_->requests();
    return reqs.back().watch() && reqs.back().param("resourceVersion") == rv;
  }));
  EXPECT_EQ(reflector_->counters().lists, 1u);
}

TEST_F(ReflectorTest, StreamCutMidEventRewatchesFromLastAppliedEvent) {
  StartServer();
  Upsert("a", 1);
  StartReflector();
  ASSERT_TRUE(WaitOpenWatches(1, kDeadline));
  server_->CutNextWatchAfter(0);  // applies to the next watch
  server_->CutWatches();
  ASSERT_TRUE(Eventually([&] { return server_->watch_requests() >= 2; }));
  ASSERT_TRUE(WaitOpenWatches(1, kDeadline));
  ClearChanges();
  const std::string rv_b = Upsert("b", 2);  // sent half, then the connection drops
  Upsert("a", 3);
  ASSERT_TRUE(StoreMatchesServer());
  // Each change applied exactly once, the torn event never as garbage.
  EXPECT_THAT(Changes(), ElementsAre("add b 2", "update a 3"));
  const auto c = reflector_->counters();
  EXPECT_EQ(c.lists, 1u);
  EXPECT_GE(c.transport_errors, 1u);
  EXPECT_EQ(c.decode_errors, 0u);
}

TEST_F(ReflectorTest, HttpGoneRelistsAndDropsObjectsDeletedInTheGap) {
  server_->SetExpiredWatchReply(lab::ExpiredWatchReply::kHttpStatus);
  StartServer();
  for (const char* n : {"a", "b", "c"}) Upsert(n, 1);
  StartReflector();
  ASSERT_TRUE(WaitOpenWatches(1, kDeadline));
  server_->FreezeWatches();
  Remove("b");
  Upsert("a", 2);
  Remove("c");
  Upsert("c", 3);  // recreated: new UID
  Upsert("d", 4);
  server_->Compact();
  server_->CutWatches();
  ASSERT_TRUE(Eventually([&] { return reflector_->counters().relists >= 1; }));
  ASSERT_TRUE(StoreMatchesServer());
  const auto c = reflector_->counters();
  EXPECT_GE(c.expired, 1u);
  EXPECT_EQ(c.lists, 2u);
  auto changes = Changes();
  EXPECT_THAT(std::vector<std::string>(changes.begin() + 3, changes.end()),
              ::testing::UnorderedElementsAre("update a 2", "delete b 1", "delete c 1",
                                              "add c 3", "add d 4"));
}

TEST_F(ReflectorTest, InStreamExpiredErrorRelists) {
  server_->SetExpiredWatchReply(lab::ExpiredWatchReply::kErrorEvent);
  StartServer();
  Upsert("a", 1);
  Upsert("b", 1);
  StartReflector();
  ASSERT_TRUE(WaitOpenWatches(1, kDeadline));
  server_->FreezeWatches();
  Remove("a");
  server_->Compact();
  server_->CutWatches();
  ASSERT_TRUE(Eventually([&] { return reflector_->counters().relists >= 1; }));
  ASSERT_TRUE(StoreMatchesServer());
  EXPECT_EQ(StoreContents(), (std::map<std::string, int>{{"b", 1}}));
  EXPECT_GE(reflector_->counters().expired, 1u);
  // And it watches again from the new list.
  ASSERT_TRUE(WaitOpenWatches(1, kDeadline));
  Upsert("e", 5);
  ASSERT_TRUE(StoreMatchesServer());
}

TEST_F(ReflectorTest, ExpiredContinueTokenRestartsTheList) {
  StartServer();
  for (int i = 0; i < 30; ++i) Upsert(absl::StrCat("s", i), i);
  server_->ExpireNextContinues(1);
  ReflectorOptions o = FastOptions();
  o.page_limit = 10;
  StartReflector(o);
  ASSERT_TRUE(store_.WaitSynced(kDeadline));
  EXPECT_EQ(StoreContents(), Snapshot());
  EXPECT_EQ(reflector_->counters().expired, 1u);
  // The restart is a fresh list with RV "" (never stitched onto the expired snapshot).
  const auto reqs = server_->requests();
  ASSERT_GE(reqs.size(), 3u);
  EXPECT_EQ(reqs[2].param("continue"), "");
  EXPECT_EQ(reqs[2].param("resourceVersion"), "");
}

TEST_F(ReflectorTest, ServerAbsentAtStartThenAppears) {
  StartServer();
  const ClientConfig cfg = Config();
  server_->GoAway();
  StartReflector(FastOptions(), cfg);
  ASSERT_TRUE(Eventually([&] { return reflector_->counters().transport_errors >= 2; }));
  EXPECT_FALSE(gate_.AllSynced());
  Upsert("a", 1);
  ASSERT_TRUE(server_->ComeBack().ok());  // the same port
  ASSERT_TRUE(gate_.WaitAllSynced(kDeadline));
  EXPECT_EQ(StoreContents(), Snapshot());
  EXPECT_GE(reflector_->counters().backoffs, 2u);
}

TEST_F(ReflectorTest, SlowListStillSyncs) {
  StartServer();
  for (int i = 0; i < 40; ++i) Upsert(absl::StrCat("s", i), i);
  server_->SlowLists(512, absl::Milliseconds(5));
  StartReflector();
  ASSERT_TRUE(store_.WaitSynced(kDeadline));
  EXPECT_EQ(StoreContents(), Snapshot());
}

TEST_F(ReflectorTest, ImmediateStreamEndsBackOffOnTheClockWithoutATightLoop) {
  StartServer();
  Upsert("a", 1);
  server_->EndWatchesAtOnce(true);
  ReflectorOptions o;  // production back-off: 800 ms x2, cap 30 s
  o.clock = &clock_;
  o.random = [] { return 0.5; };
  StartReflector(o);
  ASSERT_TRUE(store_.WaitSynced(kDeadline));
  const std::vector<absl::Duration> expected = {
      absl::Milliseconds(1200), absl::Milliseconds(2400), absl::Milliseconds(4800),
      absl::Milliseconds(9600), absl::Milliseconds(19200), absl::Seconds(30), absl::Seconds(30)};
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_TRUE(clock_.WaitForSleeps(i + 1, kDeadline)) << i;
    // While it sleeps, exactly one watch per back-off has been made: no reconnect loop.
    EXPECT_EQ(server_->watch_requests(), static_cast<int>(i + 1));
    clock_.Advance(clock_.sleeps().back());
  }
  EXPECT_EQ(clock_.sleeps(), expected);
  EXPECT_GE(reflector_->counters().short_watches, expected.size());
  // Two quiet minutes later the back-off starts again from the beginning.
  ASSERT_TRUE(clock_.WaitForSleeps(expected.size() + 1, kDeadline));
  clock_.Advance(absl::Minutes(3));
  ASSERT_TRUE(clock_.WaitForSleeps(expected.size() + 2, kDeadline));
  EXPECT_EQ(clock_.sleeps().back(), absl::Milliseconds(1200));
}

// A watch that has delivered events is healthy: the cut that ends it starts the back-off from
// the beginning (before: 1.2, 2.4, 4.8, 9.6, 19.2, 30 s for one cut every few seconds).
TEST_F(ReflectorTest, WatchThatDeliveredEventsResetsTheBackoff) {
  StartServer();
  Upsert("a", 1);
  ReflectorOptions o;
  o.clock = &clock_;
  o.random = [] { return 0.5; };
  o.backoff.unreachable_cap = absl::Seconds(30);  // the reset alone, not the cut cap, is tested
  StartReflector(o);
  ASSERT_TRUE(store_.WaitSynced(kDeadline));
  for (int i = 0; i < 6; ++i) {
    const std::string name = absl::StrCat("cut-", i);
    Upsert(name, 100 + i);
    ASSERT_TRUE(Eventually([&] { return StoreContents().contains(name); })) << i;
    server_->CutWatches();
    ASSERT_TRUE(clock_.WaitForSleeps(i + 1, kDeadline)) << i;
    EXPECT_EQ(clock_.sleeps().back(), absl::Milliseconds(1200)) << "after cut " << i;
    clock_.Advance(clock_.sleeps().back());
  }
  EXPECT_EQ(reflector_->counters().lists, 1u);  // every cut re-watched, none relisted
  ASSERT_TRUE(StoreMatchesServer());
}

// 410 Gone relists at once the first time since a healthy watch (a compaction is no failure),
// and after a jittered back-off of its own every further time: a server that answers every watch
// with 410 gets one list per back-off (1.2, 2.4, 4.8, 9.6 s with the jitter at its middle), never
// a watch -> 410 -> list loop (29 cycles in 0.21 s before). A watch that delivered events, or
// streamed for a second, restarts the sequence. Only the fake clock moves: no sleeps.
TEST_F(ReflectorTest, ExpiredWatchesRelistAfterAGrowingJitteredBackoff) {
  for (auto reply : {lab::ExpiredWatchReply::kHttpStatus, lab::ExpiredWatchReply::kErrorEvent}) {
    SCOPED_TRACE(reply == lab::ExpiredWatchReply::kHttpStatus ? "HTTP 410" : "ERROR event");
    server_ = std::make_unique<lab::ApiServer>(OneCollectionOptions());
    server_->SetExpiredWatchReply(reply);
    StartServer();
    Upsert("a", 1);
    server_->FailNextWatches(5);
    FakeClock clock;
    ReflectorOptions o;  // production back-off: 800 ms x2, cap 30 s
    o.clock = &clock;
    o.random = [] { return 0.5; };
    http_ = std::make_unique<HttpClient>(Config());
    Store<Service> store;
    auto reflector = MakeReflector(http_.get(), &store, o);
    reflector->Start();
    ASSERT_TRUE(store.WaitSynced(kDeadline));
    // Watches 1-5 expire: the first relists at once, the next four back off.
    const std::vector<absl::Duration> expected = {
        absl::Milliseconds(1200), absl::Milliseconds(2400), absl::Milliseconds(4800),
        absl::Milliseconds(9600)};
    for (size_t i = 0; i < expected.size(); ++i) {
      ASSERT_TRUE(clock.WaitForSleeps(i + 1, kDeadline)) << i;
      // While it backs off, one list per expired watch has been made (and the first one).
      EXPECT_EQ(reflector->counters().lists, i + 2);
      EXPECT_EQ(server_->watch_requests(), static_cast<int>(i + 2));
      clock.Advance(clock.sleeps().back());
    }
    EXPECT_EQ(clock.sleeps(), expected);
    EXPECT_EQ(reflector->counters().expired, 5u);
    // Watch 6 holds and delivers an event: healthy. A compaction expires it in-stream, and the
    // relist goes at once; watch 7 expires too, and the back-off starts again from its beginning.
    ASSERT_TRUE(WaitOpenWatches(1, kDeadline));
    Upsert("b", 2);
    ASSERT_TRUE(Eventually([&] { return store.Get("default/b") != nullptr; }));
    server_->FailNextWatches(1);
    server_->Compact();
    ASSERT_TRUE(clock.WaitForSleeps(expected.size() + 1, kDeadline));
    EXPECT_EQ(clock.sleeps().back(), absl::Milliseconds(1200));
    EXPECT_EQ(reflector->counters().lists, 7u) << "the relist after watch 6 waited";
    clock.Advance(clock.sleeps().back());
    // Watch 8 streams for 2 s without an event (a quiet kind): healthy too. It is cut (the
    // re-watch backs off as for any cut), watch 9 expires, and the relist goes at once.
    ASSERT_TRUE(
        Eventually([&] { return server_->watch_requests() >= 8 && server_->open_watches() >= 1; }));
    clock.Advance(absl::Seconds(2));
    server_->FailNextWatches(1);
    server_->CutWatches();
    ASSERT_TRUE(clock.WaitForSleeps(expected.size() + 2, kDeadline));
    clock.Advance(clock.sleeps().back());
    ASSERT_TRUE(Eventually([&] { return reflector->counters().lists == 9; }))
        << "lists " << reflector->counters().lists;
    ASSERT_TRUE(WaitOpenWatches(1, kDeadline));
    EXPECT_EQ(clock.sleeps().size(), expected.size() + 2) << "the relist after watch 9 waited";
    reflector->Stop();
    server_->Stop();
  }
}

// The apiserver is gone for 40 s (of back-off time, on the fake clock), then returns: every retry
// while it is gone waits at most the unreachable cap, so a change made while it was away reaches
// the store within that cap plus one request. The figure is printed for the report.
TEST_F(ReflectorTest, ConvergesWithinTwoSecondsAfterAFortySecondOutage) {
  StartServer();
  Upsert("a", 1);
  ReflectorOptions o;  // production back-off
  o.clock = &clock_;
  o.random = [] { return 0.99; };  // the longest jitter
  StartReflector(o);
  ASSERT_TRUE(store_.WaitSynced(kDeadline));
  ASSERT_TRUE(WaitOpenWatches(1, kDeadline));
  server_->GoAway();
  absl::Duration outage;
  size_t n = 0;
  while (outage < absl::Seconds(40)) {
    ASSERT_TRUE(clock_.WaitForSleeps(++n, kDeadline)) << n;
    const absl::Duration d = clock_.sleeps().back();
    EXPECT_LE(d, absl::Milliseconds(1500)) << "sleep " << n;
    outage += d;
    clock_.Advance(d);
  }
  ASSERT_TRUE(clock_.WaitForSleeps(++n, kDeadline));
  const absl::Duration pending = clock_.sleeps().back();  // the worst case: it began just now
  Upsert("made-while-away", 2);
  ASSERT_TRUE(server_->ComeBack().ok());
  const absl::Time start = absl::Now();
  clock_.Advance(pending);
  ASSERT_TRUE(Eventually([&] { return StoreContents().contains("made-while-away"); }));
  const absl::Duration converge = pending + (absl::Now() - start);
  std::printf("convergence after a %s outage (%zu failed attempts): %s (back-off %s + %s)\n",
              absl::FormatDuration(outage).c_str(), n, absl::FormatDuration(converge).c_str(),
              absl::FormatDuration(pending).c_str(),
              absl::FormatDuration(converge - pending).c_str());
  RecordProperty("convergence_ms", static_cast<int>(absl::ToInt64Milliseconds(converge)));
  EXPECT_LT(converge, absl::Seconds(2));
  EXPECT_GE(reflector_->counters().transport_errors, n - 1);
  ASSERT_TRUE(StoreMatchesServer());
}

// sessionAffinityConfig.clientIP.timeoutSeconds 2^40: the lab apiserver (like a lax one) stores
// it, the agent's decoder refuses it (outside int32).
void MakeUndecodable(lab::ApiServer& server, const std::string& name) {
  auto r = server.store().Update(lab::Resource("services"), "default", name, [](json& o) {
    o["spec"]["sessionAffinity"] = "ClientIP";
    o["spec"]["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"] = int64_t{1099511627776};
    return absl::OkStatus();
  });
  ASSERT_TRUE(r.ok()) << r.status();
}

TEST_F(ReflectorTest, ServicePatchedToAnUndecodableValueIsRemovedThenItsDeleteApplied) {
  StartServer();
  Upsert("upd", 80);
  Upsert("other", 81);
  StartReflector();
  ASSERT_TRUE(store_.WaitSynced(kDeadline));
  ASSERT_TRUE(StoreMatchesServer());
  MakeUndecodable(*server_, "upd");
  // What the previous version programmed goes: a Service the agent cannot read is not kept.
  ASSERT_TRUE(Eventually([&] { return reflector_->counters().undecodable_removals == 1; }));
  EXPECT_EQ(StoreContents(), (std::map<std::string, int>{{"other", 81}}));
  Upsert("upd", 90);  // still undecodable: removed (a miss), counted again
  ASSERT_TRUE(Eventually([&] { return reflector_->counters().undecodable_removals == 2; }));
  Remove("upd");  // a DELETED event whose object does not decode either
  ASSERT_TRUE(Eventually([&] { return reflector_->counters().undecodable_deletes == 1; }));
  EXPECT_EQ(StoreContents(), (std::map<std::string, int>{{"other", 81}}));
  // The events were acted on, so the resourceVersion moved past them.
  EXPECT_EQ(reflector_->last_resource_version(), ResourceVersion());
  // The name is free again: a new Service with it is taken as usual.
  Upsert("upd", 82);
  ASSERT_TRUE(StoreMatchesServer());
  const auto c = reflector_->counters();
  EXPECT_EQ(c.decode_errors, 3u);
  EXPECT_EQ(c.lists, 1u);
  EXPECT_EQ(c.events, 4u);  // 2 refused MODIFIED, 1 DELETED, 1 ADDED: all acted on
}

TEST_F(ReflectorTest, UndecodableObjectInTheListIsAbsentUntilItDecodes) {
  StartServer();
  Upsert("bad", 80);
  Upsert("good", 81);
  MakeUndecodable(*server_, "bad");
  StartReflector();
  ASSERT_TRUE(store_.WaitSynced(kDeadline));
  EXPECT_EQ(StoreContents(), (std::map<std::string, int>{{"good", 81}}));
  EXPECT_EQ(reflector_->counters().undecodable_removals, 1u);
  // Fixed by its owner: the next version decodes and is taken.
  auto r = server_->store().Update(lab::Resource("services"), "default", "bad", [](json& o) {
    o["spec"]["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"] = 600;
    return absl::OkStatus();
  });
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(StoreMatchesServer());
  EXPECT_EQ(store_.Get("default/bad")->session_affinity_timeout_seconds, 600);
}

// A DELETED event needs only the identity: the store drops the object whatever else fails.
TEST(StoreSinkTest, DeletedEventThatDoesNotDecodeDeletesByName) {
  Store<Service> store;
  StoreSink<Service> sink(&store);
  Decoder decoder;
  std::string rv;
  const std::string good =
      R"({"metadata":{"namespace":"default","name":"upd","uid":"u1","resourceVersion":"5"},)"
      R"("spec":{"clusterIP":"10.96.0.10","ports":[{"port":80}]}})";
  SinkOutcome added = sink.ApplyEvent(EventType::kAdded, good, decoder, &rv);
  ASSERT_TRUE(added.decode_error.ok()) << added.decode_error;
  ASSERT_NE(store.Get("default/upd"), nullptr);
  const std::string bad =
      R"({"metadata":{"namespace":"default","name":"upd","uid":"u1","resourceVersion":"7"},)"
      R"("spec":{"sessionAffinityConfig":{"clientIP":{"timeoutSeconds":1099511627776}}}})";
  SinkOutcome deleted = sink.ApplyEvent(EventType::kDeleted, bad, decoder, &rv);
  EXPECT_FALSE(deleted.decode_error.ok());
  EXPECT_TRUE(deleted.applied);
  EXPECT_TRUE(deleted.by_identity);
  EXPECT_EQ(deleted.key, "default/upd");
  EXPECT_EQ(rv, "7");
  EXPECT_EQ(store.Get("default/upd"), nullptr);
  EXPECT_EQ(store.resource_version(), "7");
  // Not even a name: nothing to act on, reported as not applied.
  SinkOutcome garbage =
      sink.ApplyEvent(EventType::kDeleted, R"({"metadata":{"uid":1}})", decoder, &rv);
  EXPECT_FALSE(garbage.applied);
}

TEST(StoreSinkTest, RefusedObjectIsReportedOncePerError) {
  Store<Service> store;
  StoreSink<Service> sink(&store);
  Decoder decoder;
  std::string rv;
  const std::string bad = R"({"metadata":{"namespace":"default","name":"x","resourceVersion":"1"},)"
                          R"("spec":{"ports":[{"port":4294967296}]}})";
  EXPECT_TRUE(sink.ApplyEvent(EventType::kAdded, bad, decoder, &rv).first_report);
  EXPECT_FALSE(sink.ApplyEvent(EventType::kModified, bad, decoder, &rv).first_report);
  // A relist that still holds it does not report it again ...
  sink.BeginList();
  EXPECT_FALSE(sink.AddListItem(bad, decoder).first_report);
  sink.CommitList("2");
  EXPECT_EQ(sink.refused_objects(), 1u);
  // ... one without it forgets it, so a later refusal is news.
  sink.BeginList();
  sink.CommitList("3");
  EXPECT_EQ(sink.refused_objects(), 0u);
  EXPECT_TRUE(sink.ApplyEvent(EventType::kAdded, bad, decoder, &rv).first_report);
}

TEST_F(ReflectorTest, TokenIsReReadAfter401) {
  const std::string token_file = dir_ / "token";
  WriteFile(token_file, "first-token\n");
  server_->SetToken("first-token");
  StartServer();
  Upsert("a", 1);
  ClientConfig cfg = Config();
  cfg.token.clear();
  cfg.token_file = token_file;
  cfg.token_refresh = absl::Hours(1);  // only the 401 can make it re-read
  StartReflector(FastOptions(), cfg);
  ASSERT_TRUE(WaitOpenWatches(1, kDeadline));
  const uint64_t reads = http_->tokens()->file_reads();
  // Rotation: the old token stops working, the file has the new one.
  WriteFile(token_file, "second-token\n");
  server_->SetToken("second-token");
  server_->CutWatches();
  // The re-watch gets 401, re-reads the file and comes back with the new token. (An event
  // written before the cut took effect may still arrive on the old stream: wait for the
  // re-watch itself, not for the store.)
  ASSERT_TRUE(Eventually([&] { return http_->tokens()->file_reads() > reads; }));
  ASSERT_TRUE(WaitOpenWatches(1, kDeadline));
  Upsert("b", 2);
  ASSERT_TRUE(StoreMatchesServer());
  EXPECT_GT(http_->tokens()->file_reads(), reads);
  const auto reqs = server_->requests();
  EXPECT_EQ(reqs.back().authorization, "Bearer second-token");
  EXPECT_EQ(reflector_->counters().lists, 1u);
}

TEST_F(ReflectorTest, StopIsPromptDuringAnIdleWatch) {
  StartServer();
  StartReflector();
  ASSERT_TRUE(WaitOpenWatches(1, kDeadline));
  const absl::Time start = absl::Now();
  reflector_->Stop();
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
}

TEST_F(ReflectorTest, SyncGateWaitsForEveryStore) {
  StartServer();
  Upsert("a", 1);
  Store<Service> never_listed(&gate_, "other");
  StartReflector();
  ASSERT_TRUE(store_.WaitSynced(kDeadline));
  EXPECT_FALSE(gate_.AllSynced());
  EXPECT_THAT(gate_.Pending(), ElementsAre("other"));
  never_listed.Replace({}, "1");
  EXPECT_TRUE(gate_.AllSynced());
}

TEST_F(ReflectorTest, ServerSignedByAnotherCaIsRejected) {
  StartServer();
  ClientConfig cfg = Config();
  cfg.ca_file = certs_->other_ca_crt;
  StartReflector(FastOptions(), cfg);
  ASSERT_TRUE(Eventually([&] { return reflector_->counters().transport_errors >= 1; }));
  EXPECT_FALSE(store_.HasSynced());
}

TEST(ClientCertTest, ClientCertificateFromPemBlobs) {
  TestCerts certs;
  lab::ApiServerOptions o = OneCollectionOptions();
  o.client_ca_pem = ReadFile(certs.ca_crt);  // kube-apiserver's --client-ca-file
  lab::ApiServer server(o);
  StartOneCollection(server);
  UpsertService(server, "a", 7);
  ClientConfig cfg;  // no token: only the certificate can authenticate
  cfg.server = server.url();
  cfg.ca_pem = server.ca_cert_pem();
  HttpClient no_cert(cfg);
  HttpResult r = no_cert.Get({kServicesPath}, [](std::string_view) { return true; });
  EXPECT_FALSE(r.ok()) << r.Describe();

  cfg.client_cert_pem = ReadFile(certs.client_crt);
  cfg.client_key_pem = ReadFile(certs.client_key);
  HttpClient with_cert(cfg);
  std::string body;
  r = with_cert.Get({kServicesPath}, [&](std::string_view b) {
    body.append(b);
    return true;
  });
  EXPECT_TRUE(r.ok()) << r.Describe();
  ListMeta meta;
  ListDecodeStats stats;
  std::vector<Service> items;
  ASSERT_TRUE(DecodeListBody<Service>(
                  body, &meta, [&](Service&& s) { items.push_back(std::move(s)); }, &stats)
                  .ok());
  ASSERT_EQ(items.size(), 1u);
  EXPECT_EQ(items[0].ports[0].port, 7);
  server.Stop();
}

}  // namespace
}  // namespace sluice::k8s
