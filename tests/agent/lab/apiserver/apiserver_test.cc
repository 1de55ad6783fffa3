#include "agent/lab/apiserver/apiserver.h"

#include <gtest/gtest.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "agent/lab/lab_client.h"

namespace sluice::lab {
namespace {

using nlohmann::json;
using ::sluice::testing::Eventually;
using testing::LabClient;
using testing::WatchReader;

constexpr char kPods[] = "/api/v1/namespaces/default/pods";

json Pod(const std::string& name, json labels = json::object(), const std::string& node = "n1") {
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"labels", labels}}},
          {"spec", {{"nodeName", node}, {"terminationGracePeriodSeconds", 0}}}};
}

class ApiServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ApiServerOptions o;
    o.bookmark_interval = absl::Milliseconds(200);
    server_ = std::make_unique<ApiServer>(o);
    absl::Status s = server_->Start();
    ASSERT_TRUE(s.ok()) << s;
    api_ = std::make_unique<LabClient>(*server_);
  }
  std::string ListRv(const std::string& path) {
    auto r = api_->Get(path);
    EXPECT_EQ(r.status, 200) << r.raw;
    return r.body["metadata"]["resourceVersion"];
  }
  std::unique_ptr<ApiServer> server_;
  std::unique_ptr<LabClient> api_;
};

TEST_F(ApiServerTest, RequestsWithoutTheTokenGet401Status) {
  LabClient anonymous(*server_, /*with_token=*/false);
  auto r = anonymous.Get(kPods);
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(r.body["kind"], "Status");
  EXPECT_EQ(r.body["reason"], "Unauthorized");
  EXPECT_EQ(anonymous.Get("/healthz").status, 200);
  server_->SetToken("rotated");
  EXPECT_EQ(api_->Get(kPods).status, 401);
}

TEST_F(ApiServerTest, DiscoveryDescribesTheServedResources) {
  auto v1 = api_->Get("/api/v1");
  ASSERT_EQ(v1.status, 200);
  bool pods = false;
  for (const json& r : v1.body["resources"]) {
    if (r["name"] == "pods") {
      pods = true;
      EXPECT_EQ(r["shortNames"], json::array({"po"}));
      EXPECT_EQ(r["namespaced"], true);
    }
  }
  EXPECT_TRUE(pods);
  auto groups = api_->Get("/apis");
  ASSERT_EQ(groups.status, 200);
  // discovery, networking, coordination, and apps and rbac for what a chart installs
  EXPECT_EQ(groups.body["groups"].size(), 5u);
  std::set<std::string> apps;
  auto apps_v1 = api_->Get("/apis/apps/v1");
  for (const json& r : apps_v1.body["resources"]) {
    std::string name = r.value("name", "");
    if (name == "daemonsets" || name == "deployments") apps.insert(r.value("kind", ""));
  }
  EXPECT_EQ(apps, (std::set<std::string>{"DaemonSet", "Deployment"})) << apps_v1.raw;
  EXPECT_EQ(api_->Get("/apis/rbac.authorization.k8s.io/v1").body["resources"].size(), 4u);
  EXPECT_EQ(api_->Get("/apis/discovery.k8s.io/v1").body["resources"][0]["kind"], "EndpointSlice");
  json leases = api_->Get("/apis/coordination.k8s.io/v1").body["resources"][0];
  EXPECT_EQ(leases["kind"], "Lease");
  EXPECT_EQ(leases["namespaced"], true);
  EXPECT_EQ(api_->Get("/openapi/v2").status, 404);
}

TEST_F(ApiServerTest, CreateGetUpdateConflictPatchDelete) {
  auto created = api_->Post(kPods, Pod("a"));
  ASSERT_EQ(created.status, 201) << created.raw;
  EXPECT_EQ(created.body["metadata"]["namespace"], "default");
  EXPECT_EQ(api_->Post(kPods, Pod("a")).body["reason"], "AlreadyExists");

  auto got = api_->Get(absl::StrCat(kPods, "/a"));
  ASSERT_EQ(got.status, 200);
  json update = got.body;
  update["metadata"]["labels"]["v"] = "1";
  auto put = api_->Put(absl::StrCat(kPods, "/a"), update);
  ASSERT_EQ(put.status, 200) << put.raw;
  auto stale = api_->Put(absl::StrCat(kPods, "/a"), update);  // old resourceVersion
  EXPECT_EQ(stale.status, 409);
  EXPECT_EQ(stale.body["reason"], "Conflict");

  auto merge = api_->Patch(absl::StrCat(kPods, "/a"), {{"metadata", {{"labels", {{"m", "x"}}}}}});
  ASSERT_EQ(merge.status, 200) << merge.raw;
  EXPECT_EQ(merge.body["metadata"]["labels"], json({{"v", "1"}, {"m", "x"}}));
  json smp = {{"spec",
               {{"$setElementOrder/containers", json::array({{{"name", "c"}}})},
                {"containers", json::array({{{"name", "c"}, {"image", "busybox"}}})}}}};
  auto strategic =
      api_->Patch(absl::StrCat(kPods, "/a"), smp, "application/strategic-merge-patch+json");
  ASSERT_EQ(strategic.status, 200) << strategic.raw;
  EXPECT_EQ(strategic.body["spec"]["containers"][0]["image"], "busybox");
  EXPECT_EQ(
      api_->Patch(absl::StrCat(kPods, "/a"), json::object(), "application/apply-patch+yaml").status,
      415);

  auto del = api_->Delete(absl::StrCat(kPods, "/a"), {{"propagationPolicy", "Background"}});
  ASSERT_EQ(del.status, 200) << del.raw;
  EXPECT_EQ(del.body["status"], "Success");
  auto gone = api_->Get(absl::StrCat(kPods, "/a"));
  EXPECT_EQ(gone.status, 404);
  EXPECT_EQ(gone.body["reason"], "NotFound");
  EXPECT_EQ(gone.body["message"], "pods \"a\" not found");
}

TEST_F(ApiServerTest, ListPaginationCoversEveryItemOnce) {
  for (int i = 0; i < 23; ++i) ASSERT_EQ(api_->Post(kPods, Pod(absl::StrCat("p", i))).status, 201);
  std::multiset<std::string> names;
  std::string cont;
  std::string rv;
  int pages = 0;
  do {
    std::string path = absl::StrCat("/api/v1/pods?limit=5", cont.empty() ? "" : "&continue=", cont);
    auto r = api_->Get(path);
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.body["kind"], "PodList");
    if (rv.empty()) rv = r.body["metadata"]["resourceVersion"];
    EXPECT_EQ(r.body["metadata"]["resourceVersion"], rv);
    for (const json& item : r.body["items"]) {
      EXPECT_EQ(item["kind"], "Pod");
      names.insert(item["metadata"]["name"]);
    }
    cont = r.body["metadata"].value("continue", "");
    ++pages;
    if (pages == 1) {
      ASSERT_EQ(api_->Post(kPods, Pod("late")).status, 201);
    }
  } while (!cont.empty());
  EXPECT_EQ(pages, 5);
  EXPECT_EQ(names.size(), 23u);
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), 23u);
}

TEST_F(ApiServerTest, LabelAndFieldSelectors) {
  ASSERT_EQ(api_->Post(kPods, Pod("a", {{"app", "web"}, {"tier", "fe"}}, "n1")).status, 201);
  ASSERT_EQ(api_->Post(kPods, Pod("b", {{"app", "web"}}, "n2")).status, 201);
  ASSERT_EQ(api_->Post(kPods, Pod("c", {{"app", "db"}}, "n1")).status, 201);
  auto names = [&](const std::string& query) {
    std::set<std::string> out;
    auto r = api_->Get(absl::StrCat("/api/v1/pods?", query));
    EXPECT_EQ(r.status, 200) << query << ": " << r.raw;
    for (const json& i : r.body["items"]) out.insert(i["metadata"]["name"]);
    return out;
  };
  using S = std::set<std::string>;
  EXPECT_EQ(names("labelSelector=app%3Dweb"), S({"a", "b"}));
  EXPECT_EQ(names("labelSelector=app%3D%3Dweb"), S({"a", "b"}));
  EXPECT_EQ(names("labelSelector=app%21%3Dweb"), S({"c"}));
  EXPECT_EQ(names("labelSelector=app%20in%20(web,db),tier"), S({"a"}));
  EXPECT_EQ(names("labelSelector=app%20notin%20(web)"), S({"c"}));
  EXPECT_EQ(names("labelSelector=%21tier"), S({"b", "c"}));
  EXPECT_EQ(names("fieldSelector=spec.nodeName%3Dn1"), S({"a", "c"}));
  EXPECT_EQ(names("fieldSelector=metadata.name%3Db"), S({"b"}));
  EXPECT_EQ(names("fieldSelector=metadata.namespace%3Ddefault,spec.nodeName%21%3Dn1"), S({"b"}));
  EXPECT_EQ(api_->Get("/api/v1/pods?fieldSelector=spec.bogus%3D1").status, 400);
}

TEST_F(ApiServerTest, WatchFromListResourceVersionSeesLaterEventsInOrder) {
  ASSERT_EQ(api_->Post(kPods, Pod("before")).status, 201);
  std::string rv = ListRv(kPods);
  WatchReader w(*server_, absl::StrCat(kPods, "?watch=1&resourceVersion=", rv));
  ASSERT_EQ(api_->Post(kPods, Pod("a")).status, 201);
  ASSERT_EQ(
      api_->Patch(absl::StrCat(kPods, "/a"), {{"metadata", {{"labels", {{"x", "y"}}}}}}).status,
      200);
  ASSERT_EQ(api_->Delete(absl::StrCat(kPods, "/a")).status, 200);
  ASSERT_TRUE(w.WaitForEvents(3));
  auto events = w.events();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0]["type"], "ADDED");
  EXPECT_EQ(events[1]["type"], "MODIFIED");
  EXPECT_EQ(events[2]["type"], "DELETED");
  uint64_t last = std::stoull(rv);
  for (const json& e : events) {
    EXPECT_EQ(e["object"]["metadata"]["name"], "a");
    EXPECT_EQ(e["object"]["kind"], "Pod");
    uint64_t erv = std::stoull(e["object"]["metadata"]["resourceVersion"].get<std::string>());
    EXPECT_GT(erv, last);
    last = erv;
  }
}

TEST_F(ApiServerTest, BookmarksCarryOnlyTheResourceVersion) {
  std::string rv = ListRv(kPods);
  WatchReader w(*server_,
                absl::StrCat(kPods, "?watch=true&allowWatchBookmarks=true&resourceVersion=", rv));
  ASSERT_TRUE(w.WaitForEvents(2, absl::Seconds(5)));
  for (const json& e : w.events()) {
    EXPECT_EQ(e["type"], "BOOKMARK");
    EXPECT_EQ(e["object"]["kind"], "Pod");
    EXPECT_EQ(e["object"]["metadata"].size(), 1u);
    EXPECT_EQ(e["object"]["metadata"]["resourceVersion"], rv);
  }
}

TEST_F(ApiServerTest, TimeoutSecondsEndsTheStreamCleanly) {
  WatchReader w(*server_,
                absl::StrCat(kPods, "?watch=1&timeoutSeconds=1&resourceVersion=", ListRv(kPods)));
  ASSERT_TRUE(w.WaitDone(absl::Seconds(5)));
  EXPECT_EQ(w.error(), httplib::Error::Success);
  EXPECT_EQ(w.status(), 200);
}

TEST_F(ApiServerTest, WatchFromCompactedResourceVersionGets410) {
  std::string rv = ListRv(kPods);
  ASSERT_EQ(api_->Post(kPods, Pod("a")).status, 201);
  server_->Compact();
  auto r = api_->Get(absl::StrCat(kPods, "?watch=1&resourceVersion=", rv));
  EXPECT_EQ(r.status, 410);
  EXPECT_EQ(r.body["kind"], "Status");
  EXPECT_EQ(r.body["reason"], "Expired");
  EXPECT_EQ(r.body["code"], 410);
}

TEST_F(ApiServerTest, CompactionUnderARunningWatchSendsErrorEvent) {
  WatchReader w(*server_, absl::StrCat(kPods, "?watch=1&resourceVersion=", ListRv(kPods)));
  ASSERT_TRUE(Eventually([&] { return server_->open_watches() == 1; }));
  server_->Compact();
  ASSERT_TRUE(w.WaitForEvents(1));
  json e = w.events()[0];
  EXPECT_EQ(e["type"], "ERROR");
  EXPECT_EQ(e["object"]["kind"], "Status");
  EXPECT_EQ(e["object"]["code"], 410);
  EXPECT_EQ(e["object"]["reason"], "Expired");
  ASSERT_TRUE(w.WaitDone());
  EXPECT_EQ(w.error(), httplib::Error::Success);
}

TEST_F(ApiServerTest, FaultCutWatchesEndsStreamsWithoutTerminatingChunk) {
  WatchReader w(*server_, absl::StrCat(kPods, "?watch=1&resourceVersion=", ListRv(kPods)));
  ASSERT_TRUE(Eventually([&] { return server_->open_watches() == 1; }));
  server_->CutWatches();
  ASSERT_TRUE(w.WaitDone());
  EXPECT_NE(w.error(), httplib::Error::Success);
  EXPECT_TRUE(w.events().empty());
  EXPECT_TRUE(Eventually([&] { return server_->open_watches() == 0; }));
}

TEST_F(ApiServerTest, FaultCutMidEventTearsTheNextEvent) {
  std::string rv = ListRv(kPods);
  WatchReader w(*server_, absl::StrCat(kPods, "?watch=1&resourceVersion=", rv));
  ASSERT_TRUE(Eventually([&] { return server_->open_watches() == 1; }));
  server_->CutWatches({.mid_event = true, .at_next_event = true});
  ASSERT_EQ(api_->Post(kPods, Pod("torn")).status, 201);
  ASSERT_TRUE(w.WaitDone());
  EXPECT_NE(w.error(), httplib::Error::Success);
  EXPECT_TRUE(w.events().empty());
  EXPECT_FALSE(w.tail().empty());
  EXPECT_EQ(w.tail().find('\n'), std::string::npos);
  EXPECT_EQ(w.tail().rfind("{\"object\"", 0), 0u) << w.tail();
  // Re-watching from the last complete RV delivers the torn event whole.
  WatchReader again(*server_, absl::StrCat(kPods, "?watch=1&resourceVersion=", rv));
  ASSERT_TRUE(again.WaitForEvents(1));
  EXPECT_EQ(again.events()[0]["object"]["metadata"]["name"], "torn");
}

TEST_F(ApiServerTest, FaultCutMidEventNowTearsABookmark) {
  WatchReader w(*server_, absl::StrCat(kPods, "?watch=1&resourceVersion=", ListRv(kPods)));
  ASSERT_TRUE(Eventually([&] { return server_->open_watches() == 1; }));
  server_->CutWatches({.mid_event = true});
  ASSERT_TRUE(w.WaitDone());
  EXPECT_NE(w.error(), httplib::Error::Success);
  EXPECT_FALSE(w.tail().empty());
}

TEST_F(ApiServerTest, FaultFailNextWatchesAnswers410ThenRecovers) {
  std::string rv = ListRv(kPods);
  server_->FailNextWatches(2);
  std::string path = absl::StrCat(kPods, "?watch=1&timeoutSeconds=1&resourceVersion=", rv);
  EXPECT_EQ(api_->Get(path).status, 410);
  EXPECT_EQ(api_->Get(path).body["reason"], "Expired");
  EXPECT_EQ(api_->Get(path).status, 200);
}

TEST_F(ApiServerTest, FaultStallHoldsRequests) {
  server_->Stall(absl::Milliseconds(700));
  absl::Time start = absl::Now();
  EXPECT_EQ(api_->Get(kPods).status, 200);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(600));
}

TEST_F(ApiServerTest, FaultGoAwayRefusesConnectionsUntilComeBack) {
  WatchReader w(*server_, absl::StrCat(kPods, "?watch=1&resourceVersion=", ListRv(kPods)));
  ASSERT_TRUE(Eventually([&] { return server_->open_watches() == 1; }));
  server_->GoAway();
  ASSERT_TRUE(w.WaitDone());
  EXPECT_NE(w.error(), httplib::Error::Success);
  LabClient fresh(*server_);
  auto refused = fresh.Get(kPods);
  EXPECT_EQ(refused.status, 0);
  EXPECT_EQ(refused.error, httplib::Error::Connection);
  ASSERT_TRUE(server_->ComeBack().ok());
  LabClient later(*server_);
  EXPECT_EQ(later.Get(kPods).status, 200);
}

TEST_F(ApiServerTest, AdminEndpointTriggersFaults) {
  LabClient anonymous(*server_, false);
  EXPECT_EQ(anonymous.Post("/lab/faults", {{"action", "compact"}}).status, 401);
  EXPECT_EQ(api_->Post("/lab/faults", {{"action", "expire-watches"}, {"count", 1}}).status, 200);
  EXPECT_EQ(api_->Get(absl::StrCat(kPods, "?watch=1")).status, 410);
  EXPECT_EQ(api_->Post("/lab/faults", {{"action", "nope"}}).status, 400);
  ASSERT_EQ(api_->Post("/lab/faults", {{"action", "go-away"}, {"seconds", 0.5}}).status, 200);
  // Down, then back by itself on the same port.
  EXPECT_TRUE(Eventually([&] { return !server_->serving(); }));
  EXPECT_TRUE(Eventually([&] { return LabClient(*server_).Get("/healthz").status == 200; }));
}

// ---- the fault knobs the k8s client tests use -----------------------------------------------

// A server of its own for the tests that need options the fixture's server lacks.
std::unique_ptr<ApiServer> StartServer(ApiServerOptions o) {
  auto server = std::make_unique<ApiServer>(o);
  absl::Status s = server->Start();
  EXPECT_TRUE(s.ok()) << s;
  return server;
}

TEST_F(ApiServerTest, RequestLogKeepsTheLastRequestsWithTheirDecodedQuery) {
  ApiServerOptions o;
  o.request_log_limit = 2;
  auto server = StartServer(o);
  LabClient api(*server);
  EXPECT_EQ(server->requests().size(), 0u);
  ASSERT_EQ(api.Get("/healthz").status, 200);
  ASSERT_EQ(api.Get(absl::StrCat(kPods, "?limit=5&labelSelector=app%3Dweb%2C%21gone")).status, 200);
  server->EndWatchesAtOnce(true);
  ASSERT_EQ(api.Get(absl::StrCat(kPods, "?watch=1&resourceVersion=7")).status, 200);
  const auto reqs = server->requests();
  ASSERT_EQ(reqs.size(), 2u);  // the oldest (/healthz) was dropped
  EXPECT_EQ(reqs[0].method, "GET");
  EXPECT_EQ(reqs[0].path, kPods);
  EXPECT_EQ(reqs[0].param("labelSelector"), "app=web,!gone");
  EXPECT_EQ(reqs[0].param("limit"), "5");
  EXPECT_EQ(reqs[0].param("continue"), "");
  EXPECT_EQ(reqs[0].authorization, "Bearer " + server->token());
  EXPECT_FALSE(reqs[0].watch());
  EXPECT_TRUE(reqs[1].watch());
  EXPECT_EQ(reqs[1].param("resourceVersion"), "7");
  EXPECT_EQ(server->watch_requests(), 1);
  EXPECT_TRUE(server_->requests().empty());  // off by default
}

TEST_F(ApiServerTest, FaultEndWatchesAtOnceAnswersAnEmptyCleanStream) {
  std::string rv = ListRv(kPods);
  ASSERT_EQ(api_->Post(kPods, Pod("a")).status, 201);
  server_->EndWatchesAtOnce(true);
  auto r = api_->Get(absl::StrCat(kPods, "?watch=1&resourceVersion=", rv));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.error, httplib::Error::Success);
  EXPECT_EQ(r.raw, "");  // not even the pending ADDED
  server_->EndWatchesAtOnce(false);
  WatchReader w(*server_, absl::StrCat(kPods, "?watch=1&resourceVersion=", rv));
  ASSERT_TRUE(w.WaitForEvents(1));
  EXPECT_EQ(w.events()[0]["object"]["metadata"]["name"], "a");
}

TEST_F(ApiServerTest, FaultCutNextWatchAfterTearsTheEventAfterN) {
  std::string rv = ListRv(kPods);
  server_->CutNextWatchAfter(1);
  WatchReader w(*server_, absl::StrCat(kPods, "?watch=1&resourceVersion=", rv));
  ASSERT_TRUE(Eventually([&] { return server_->open_watches() == 1; }));
  ASSERT_EQ(api_->Post(kPods, Pod("one")).status, 201);
  ASSERT_EQ(api_->Post(kPods, Pod("two")).status, 201);
  ASSERT_TRUE(w.WaitDone());
  EXPECT_NE(w.error(), httplib::Error::Success);
  ASSERT_EQ(w.events().size(), 1u);
  EXPECT_EQ(w.events()[0]["object"]["metadata"]["name"], "one");
  EXPECT_FALSE(w.tail().empty());
  EXPECT_EQ(w.tail().find('\n'), std::string::npos);
  // Only the next watch: this one gets both events whole.
  WatchReader again(*server_, absl::StrCat(kPods, "?watch=1&resourceVersion=", rv));
  ASSERT_TRUE(again.WaitForEvents(2));
  EXPECT_EQ(again.events()[1]["object"]["metadata"]["name"], "two");
}

TEST_F(ApiServerTest, FaultFreezeWatchesHoldsEventsAndTheCutDropsThem) {
  std::string rv = ListRv(kPods);
  WatchReader frozen(*server_, absl::StrCat(kPods, "?watch=1&resourceVersion=", rv));
  ASSERT_TRUE(Eventually([&] { return server_->open_watches() == 1; }));
  server_->FreezeWatches();
  ASSERT_EQ(api_->Post(kPods, Pod("held")).status, 201);
  // A watch opened after the freeze is not frozen: once it has the event, the frozen one had
  // every chance to send it too.
  WatchReader later(*server_, absl::StrCat(kPods, "?watch=1&resourceVersion=", rv));
  ASSERT_TRUE(later.WaitForEvents(1));
  EXPECT_EQ(later.events()[0]["object"]["metadata"]["name"], "held");
  server_->CutWatches();
  ASSERT_TRUE(frozen.WaitDone());
  EXPECT_NE(frozen.error(), httplib::Error::Success);
  EXPECT_TRUE(frozen.events().empty());
  EXPECT_TRUE(Eventually([&] { return server_->open_watches() == 0; }));
}

TEST_F(ApiServerTest, FaultExpiredWatchReplyAsAnErrorEvent) {
  std::string rv = ListRv(kPods);
  ASSERT_EQ(api_->Post(kPods, Pod("a")).status, 201);
  server_->Compact();
  server_->SetExpiredWatchReply(ExpiredWatchReply::kErrorEvent);
  auto check = [&](const std::string& what) {
    auto r = api_->Get(absl::StrCat(kPods, "?watch=1&resourceVersion=", rv));
    EXPECT_EQ(r.status, 200) << what;
    ASSERT_FALSE(r.raw.empty()) << what;
    EXPECT_EQ(r.raw.find('\n'), r.raw.size() - 1) << what << ": one event line";
    json e = json::parse(r.raw, nullptr, false);
    EXPECT_EQ(e["type"], "ERROR") << what;
    EXPECT_EQ(e["object"]["code"], 410) << what;
    EXPECT_EQ(e["object"]["reason"], "Expired") << what;
  };
  check("compacted");
  server_->FailNextWatches(1);
  rv = ListRv(kPods);
  check("FailNextWatches");
  server_->SetExpiredWatchReply(ExpiredWatchReply::kHttpStatus);
  server_->FailNextWatches(1);
  EXPECT_EQ(api_->Get(absl::StrCat(kPods, "?watch=1&resourceVersion=", rv)).status, 410);
}

TEST_F(ApiServerTest, FaultExpireNextContinuesAnswers410ThenServesThePage) {
  for (const char* n : {"a", "b", "c"}) ASSERT_EQ(api_->Post(kPods, Pod(n)).status, 201);
  auto first = api_->Get(absl::StrCat(kPods, "?limit=1"));
  ASSERT_EQ(first.status, 200);
  std::string cont = first.body["metadata"]["continue"];
  ASSERT_FALSE(cont.empty());
  server_->ExpireNextContinues(1);
  auto expired = api_->Get(absl::StrCat(kPods, "?limit=1&continue=", cont));
  EXPECT_EQ(expired.status, 410);
  EXPECT_EQ(expired.body["reason"], "Expired");
  EXPECT_EQ(api_->Get(absl::StrCat(kPods, "?limit=1")).status, 200);  // no token: not counted
  auto second = api_->Get(absl::StrCat(kPods, "?limit=1&continue=", cont));
  ASSERT_EQ(second.status, 200);
  EXPECT_EQ(second.body["items"][0]["metadata"]["name"], "b");
}

TEST_F(ApiServerTest, FaultSlowListsTrickleTheSameBody) {
  for (int i = 0; i < 5; ++i) ASSERT_EQ(api_->Post(kPods, Pod(absl::StrCat("p", i))).status, 201);
  auto fast = api_->Get(kPods);
  ASSERT_EQ(fast.status, 200);
  server_->SlowLists(256, absl::Milliseconds(20));
  const absl::Time start = absl::Now();
  auto slow = api_->Get(kPods);
  const absl::Duration took = absl::Now() - start;
  ASSERT_EQ(slow.status, 200);
  EXPECT_EQ(slow.raw, fast.raw);
  const size_t pieces = (fast.raw.size() + 255) / 256;
  ASSERT_GE(pieces, 4u);
  EXPECT_GE(took, absl::Milliseconds(20) * static_cast<int64_t>(pieces));
  server_->SlowLists(0, absl::ZeroDuration());
  EXPECT_EQ(api_->Get(kPods).raw, fast.raw);
}

TEST_F(ApiServerTest, FaultSendBookmarksBookmarksEveryOpenWatchNow) {
  ApiServerOptions o;
  o.bookmark_interval = absl::Hours(1);  // only SendBookmarks can make one
  auto server = StartServer(o);
  LabClient api(*server);
  auto list = api.Get(kPods);
  ASSERT_EQ(list.status, 200);
  std::string rv = list.body["metadata"]["resourceVersion"];
  WatchReader w(*server,
                absl::StrCat(kPods, "?watch=1&allowWatchBookmarks=true&resourceVersion=", rv));
  ASSERT_TRUE(Eventually([&] { return server->open_watches() == 1; }));
  // Another resource's write moves the resourceVersion without a pod event.
  ASSERT_EQ(api.Post("/api/v1/namespaces", {{"metadata", {{"name", "elsewhere"}}}}).status, 201);
  const std::string now = absl::StrCat(server->store().CurrentResourceVersion());
  ASSERT_NE(now, rv);
  server->SendBookmarks();
  ASSERT_TRUE(w.WaitForEvents(1));
  EXPECT_EQ(w.events()[0]["type"], "BOOKMARK");
  EXPECT_EQ(w.events()[0]["object"]["metadata"]["resourceVersion"], now);
}

TEST_F(ApiServerTest, AdminEndpointTriggersTheClientTestFaults) {
  for (const char* n : {"a", "b"}) ASSERT_EQ(api_->Post(kPods, Pod(n)).status, 201);
  std::string cont = api_->Get(absl::StrCat(kPods, "?limit=1")).body["metadata"]["continue"];
  ASSERT_EQ(api_->Post("/lab/faults", {{"action", "expire-continues"}, {"count", 1}}).status, 200);
  EXPECT_EQ(api_->Get(absl::StrCat(kPods, "?limit=1&continue=", cont)).status, 410);
  EXPECT_EQ(api_->Post("/lab/faults", {{"action", "cut-next-watch"}, {"count", 0}}).status, 200);
  WatchReader w(*server_, absl::StrCat(kPods, "?watch=1&resourceVersion=", ListRv(kPods)));
  ASSERT_TRUE(Eventually([&] { return server_->open_watches() == 1; }));
  ASSERT_EQ(api_->Post(kPods, Pod("torn")).status, 201);
  ASSERT_TRUE(w.WaitDone());
  EXPECT_TRUE(w.events().empty());
  EXPECT_FALSE(w.tail().empty());
  EXPECT_EQ(api_->Post("/lab/faults", {{"action", "freeze-watches"}}).status, 200);
  EXPECT_EQ(api_->Post("/lab/faults", {{"action", "bookmark"}}).status, 200);
}

}  // namespace
}  // namespace sluice::lab
