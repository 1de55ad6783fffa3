// The reflector end to end against a real HTTPS apiserver in the test (TLS verified with a CA made
// for the test): pagination, ordered events, bookmarks, cut streams, 410 in both forms, an absent
// then present server, slow lists, back-off timing on a fake clock, token re-read on 401.
#include "agent/k8s/reflector.h"

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "agent/base/fake_clock.h"
#include "agent/k8s/test_apiserver.h"
#include "support/eventually.h"

namespace sluice::k8s {
namespace {

using ::sluice::FakeClock;
using ::sluice::testing::Eventually;
using testing::TestApiServer;
using testing::TestCerts;
using ::testing::ElementsAre;

constexpr absl::Duration kDeadline = absl::Seconds(20);

class ReflectorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { certs_ = new TestCerts(); }
  static void TearDownTestSuite() {
    delete certs_;
    certs_ = nullptr;
  }

  void TearDown() override {
    if (reflector_) reflector_->Stop();
    server_.Stop();
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
    cfg.server = server_.url();
    cfg.ca_file = certs_->ca_crt;
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
    return Eventually([&] { return StoreContents() == server_.Snapshot(); });
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
  TestApiServer server_{*certs_};
  SyncGate gate_;
  Store<Service> store_{&gate_};
  std::unique_ptr<HttpClient> http_;
  std::unique_ptr<Reflector> reflector_;
  absl::Mutex changes_mu_;
  std::vector<std::string> changes_;
};

TestCerts* ReflectorTest::certs_ = nullptr;

TEST_F(ReflectorTest, InitialPaginatedListEqualsServerObjects) {
  server_.Start();
  for (int i = 0; i < 1234; ++i) server_.Upsert(absl::StrCat("svc-", i), 1000 + i);
  ReflectorOptions o = FastOptions();
  o.page_limit = 100;
  EXPECT_FALSE(gate_.AllSynced());
  StartReflector(o);
  ASSERT_TRUE(gate_.WaitAllSynced(kDeadline)) << "pending: " << gate_.Pending().size();
  EXPECT_TRUE(store_.HasSynced());
  EXPECT_EQ(StoreContents(), server_.Snapshot());
  const auto c = reflector_->counters();
  EXPECT_EQ(c.lists, 1u);
  EXPECT_EQ(c.list_pages, 13u);
  EXPECT_EQ(c.list_items, 1234u);
  EXPECT_EQ(store_.resource_version(), server_.resource_version());
  // The protocol as sent: first list RV "0" + limit, then continue tokens without RV, then a
  // watch from the list's RV with bookmarks.
  ASSERT_TRUE(server_.WaitOpenWatches(1, kDeadline));
  const auto reqs = server_.requests();
  ASSERT_GE(reqs.size(), 14u);
  EXPECT_EQ(reqs[0].param("limit"), "100");
  EXPECT_EQ(reqs[0].param("resourceVersion"), "0");
  EXPECT_EQ(reqs[0].param("continue"), "");
  EXPECT_NE(reqs[1].param("continue"), "");
  EXPECT_EQ(reqs[1].param("resourceVersion"), "");
  EXPECT_TRUE(reqs[13].watch());
  EXPECT_EQ(reqs[13].param("resourceVersion"), server_.resource_version());
  EXPECT_EQ(reqs[13].param("allowWatchBookmarks"), "true");
  int timeout_s = 0;
  ASSERT_TRUE(absl::SimpleAtoi(reqs[13].param("timeoutSeconds"), &timeout_s));
  EXPECT_GE(timeout_s, 60);
  EXPECT_LT(timeout_s, 120);
}

TEST_F(ReflectorTest, SelectorsAreSentUrlEncoded) {
  server_.Start();
  ReflectorOptions o = FastOptions();
  o.label_selector = kServiceProxyLabelSelector;
  o.field_selector = "spec.nodeName=n1";
  StartReflector(o);
  ASSERT_TRUE(store_.WaitSynced(kDeadline));
  const auto reqs = server_.requests();
  ASSERT_FALSE(reqs.empty());
  // httplib decodes the query, so this checks what the server understood.
  EXPECT_EQ(reqs[0].param("labelSelector"), kServiceProxyLabelSelector);
  EXPECT_EQ(reqs[0].param("fieldSelector"), "spec.nodeName=n1");
  EXPECT_EQ(QueryEscape("!a/b,c=d"), "%21a%2Fb%2Cc%3Dd");
}

TEST_F(ReflectorTest, WatchEventsAreAppliedInOrder) {
  server_.Start();
  server_.Upsert("a", 1);
  StartReflector();
  ASSERT_TRUE(store_.WaitSynced(kDeadline));
  ASSERT_TRUE(server_.WaitOpenWatches(1, kDeadline));
  ClearChanges();
  server_.Upsert("b", 2);
  server_.Upsert("a", 3);
  server_.Remove("b");
  server_.Upsert("c", 4);
  ASSERT_TRUE(Eventually([&] { return Changes().size() == 4; }));
  EXPECT_THAT(Changes(), ElementsAre("add b 2", "update a 3", "delete b 2", "add c 4"));
  EXPECT_EQ(StoreContents(), server_.Snapshot());
  EXPECT_EQ(reflector_->last_resource_version(), server_.resource_version());
  EXPECT_EQ(reflector_->counters().events, 4u);
}

TEST_F(ReflectorTest, BookmarkAdvancesResourceVersion) {
  server_.Start();
  server_.Upsert("a", 1);
  StartReflector();
  ASSERT_TRUE(server_.WaitOpenWatches(1, kDeadline));
  const std::string rv = server_.Bookmark();
  ASSERT_TRUE(Eventually([&] { return reflector_->last_resource_version() == rv; }));
  EXPECT_EQ(reflector_->counters().bookmarks, 1u);
  // A later re-watch starts from the bookmark's RV.
  server_.Disconnect();
  ASSERT_TRUE(Eventually([&] {
    auto reqs = server_.requests();
    return reqs.back().watch() && reqs.back().param("resourceVersion") == rv;
  }));
  EXPECT_EQ(reflector_->counters().lists, 1u);
}

TEST_F(ReflectorTest, StreamCutMidEventRewatchesFromLastAppliedEvent) {
  server_.Start();
  server_.Upsert("a", 1);
  StartReflector();
  ASSERT_TRUE(server_.WaitOpenWatches(1, kDeadline));
  server_.CutNextWatchAfter(0);  // applies to the next watch
  server_.Disconnect();
  ASSERT_TRUE(Eventually([&] { return server_.watch_requests() >= 2; }));
  ASSERT_TRUE(server_.WaitOpenWatches(1, kDeadline));
  ClearChanges();
  const std::string rv_b = server_.Upsert("b", 2);  // sent half, then the connection drops
  server_.Upsert("a", 3);
  ASSERT_TRUE(StoreMatchesServer());
  // Each change applied exactly once, the torn event never as garbage.
  EXPECT_THAT(Changes(), ElementsAre("add b 2", "update a 3"));
  const auto c = reflector_->counters();
  EXPECT_EQ(c.lists, 1u);
  EXPECT_GE(c.transport_errors, 1u);
  EXPECT_EQ(c.decode_errors, 0u);
}

TEST_F(ReflectorTest, HttpGoneRelistsAndDropsObjectsDeletedInTheGap) {
  server_.set_expired_as_http(true);
  server_.Start();
  for (const char* n : {"a", "b", "c"}) server_.Upsert(n, 1);
  StartReflector();
  ASSERT_TRUE(server_.WaitOpenWatches(1, kDeadline));
  server_.FreezeWatches();
  server_.Remove("b");
  server_.Upsert("a", 2);
  server_.Remove("c");
  server_.Upsert("c", 3);  // recreated: new UID
  server_.Upsert("d", 4);
  server_.CompactAndDisconnect();
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
  server_.Start();
  server_.Upsert("a", 1);
  server_.Upsert("b", 1);
  StartReflector();
  ASSERT_TRUE(server_.WaitOpenWatches(1, kDeadline));
  server_.FreezeWatches();
  server_.Remove("a");
  server_.CompactAndDisconnect();
  ASSERT_TRUE(Eventually([&] { return reflector_->counters().relists >= 1; }));
  ASSERT_TRUE(StoreMatchesServer());
  EXPECT_EQ(StoreContents(), (std::map<std::string, int>{{"b", 1}}));
  EXPECT_GE(reflector_->counters().expired, 1u);
  // And it watches again from the new list.
  ASSERT_TRUE(server_.WaitOpenWatches(1, kDeadline));
  server_.Upsert("e", 5);
  ASSERT_TRUE(StoreMatchesServer());
}

TEST_F(ReflectorTest, ExpiredContinueTokenRestartsTheList) {
  server_.Start();
  for (int i = 0; i < 30; ++i) server_.Upsert(absl::StrCat("s", i), i);
  server_.ExpireNextContinues(1);
  ReflectorOptions o = FastOptions();
  o.page_limit = 10;
  StartReflector(o);
  ASSERT_TRUE(store_.WaitSynced(kDeadline));
  EXPECT_EQ(StoreContents(), server_.Snapshot());
  EXPECT_EQ(reflector_->counters().expired, 1u);
  // The restart is a fresh list with RV "" (never stitched onto the expired snapshot).
  const auto reqs = server_.requests();
  ASSERT_GE(reqs.size(), 3u);
  EXPECT_EQ(reqs[2].param("continue"), "");
  EXPECT_EQ(reqs[2].param("resourceVersion"), "");
}

TEST_F(ReflectorTest, ServerAbsentAtStartThenAppears) {
  server_.Start();
  const int port = server_.port();
  const ClientConfig cfg = Config();
  server_.Stop();
  StartReflector(FastOptions(), cfg);
  ASSERT_TRUE(Eventually([&] { return reflector_->counters().transport_errors >= 2; }));
  EXPECT_FALSE(gate_.AllSynced());
  server_.Upsert("a", 1);
  server_.Start(port);
  ASSERT_TRUE(gate_.WaitAllSynced(kDeadline));
  EXPECT_EQ(StoreContents(), server_.Snapshot());
  EXPECT_GE(reflector_->counters().backoffs, 2u);
}

TEST_F(ReflectorTest, SlowListStillSyncs) {
  server_.Start();
  for (int i = 0; i < 40; ++i) server_.Upsert(absl::StrCat("s", i), i);
  server_.set_slow_list(512, absl::Milliseconds(5));
  StartReflector();
  ASSERT_TRUE(store_.WaitSynced(kDeadline));
  EXPECT_EQ(StoreContents(), server_.Snapshot());
}

TEST_F(ReflectorTest, ImmediateStreamEndsBackOffOnTheClockWithoutATightLoop) {
  server_.Start();
  server_.Upsert("a", 1);
  server_.set_close_watches_at_once(true);
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
    EXPECT_EQ(server_.watch_requests(), static_cast<int>(i + 1));
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

TEST_F(ReflectorTest, TokenIsReReadAfter401) {
  testing::TempDir dir;
  const std::string token_file = dir.File("token");
  testing::WriteFile(token_file, "first-token\n");
  server_.set_required_token("first-token");
  server_.Start();
  server_.Upsert("a", 1);
  ClientConfig cfg = Config();
  cfg.token_file = token_file;
  cfg.token_refresh = absl::Hours(1);  // only the 401 can make it re-read
  StartReflector(FastOptions(), cfg);
  ASSERT_TRUE(server_.WaitOpenWatches(1, kDeadline));
  const uint64_t reads = http_->tokens()->file_reads();
  // Rotation: the old token stops working, the file has the new one.
  testing::WriteFile(token_file, "second-token\n");
  server_.set_required_token("second-token");
  server_.Disconnect();
  server_.Upsert("b", 2);
  ASSERT_TRUE(StoreMatchesServer());
  EXPECT_GT(http_->tokens()->file_reads(), reads);
  const auto reqs = server_.requests();
  EXPECT_EQ(reqs.back().authorization, "Bearer second-token");
  EXPECT_EQ(reflector_->counters().lists, 1u);
}

TEST_F(ReflectorTest, StopIsPromptDuringAnIdleWatch) {
  server_.Start();
  StartReflector();
  ASSERT_TRUE(server_.WaitOpenWatches(1, kDeadline));
  const absl::Time start = absl::Now();
  reflector_->Stop();
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
}

TEST_F(ReflectorTest, SyncGateWaitsForEveryStore) {
  server_.Start();
  server_.Upsert("a", 1);
  Store<Service> never_listed(&gate_, "other");
  StartReflector();
  ASSERT_TRUE(store_.WaitSynced(kDeadline));
  EXPECT_FALSE(gate_.AllSynced());
  EXPECT_THAT(gate_.Pending(), ElementsAre("other"));
  never_listed.Replace({}, "1");
  EXPECT_TRUE(gate_.AllSynced());
}

TEST_F(ReflectorTest, ServerSignedByAnotherCaIsRejected) {
  server_.Start();
  ClientConfig cfg = Config();
  cfg.ca_file = certs_->other_ca_crt;
  StartReflector(FastOptions(), cfg);
  ASSERT_TRUE(Eventually([&] { return reflector_->counters().transport_errors >= 1; }));
  EXPECT_FALSE(store_.HasSynced());
}

TEST(ClientCertTest, ClientCertificateFromPemBlobs) {
  TestCerts certs;
  TestApiServer server(certs, /*require_client_cert=*/true);
  server.Start();
  server.Upsert("a", 7);
  ClientConfig cfg;
  cfg.server = server.url();
  cfg.ca_pem = testing::ReadAll(certs.ca_crt);
  HttpClient no_cert(cfg);
  HttpResult r = no_cert.Get({TestApiServer::kPath}, [](std::string_view) { return true; });
  EXPECT_FALSE(r.ok()) << r.Describe();

  cfg.client_cert_pem = testing::ReadAll(certs.client_crt);
  cfg.client_key_pem = testing::ReadAll(certs.client_key);
  HttpClient with_cert(cfg);
  std::string body;
  r = with_cert.Get({TestApiServer::kPath}, [&](std::string_view b) {
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
