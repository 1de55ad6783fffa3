#include "agent/lab/store/object_store.h"

#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "agent/base/fake_clock.h"

namespace sluice::lab {
namespace {

using nlohmann::json;

json Pod(const std::string& ns, const std::string& name, json labels = json::object()) {
  return {{"metadata", {{"namespace", ns}, {"name", name}, {"labels", labels}}},
          {"spec", {{"nodeName", "node-1"}}}};
}

uint64_t Rv(const json& obj) {
  uint64_t rv = 0;
  EXPECT_TRUE(absl::SimpleAtoi(obj["metadata"]["resourceVersion"].get<std::string>(), &rv));
  return rv;
}

class ObjectStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ObjectStore::Options o;
    o.clock = &clock_;
    store_ = std::make_unique<ObjectStore>(o);
    ASSERT_TRUE(store_->Create(Resource("namespaces"), {{"metadata", {{"name", "ns1"}}}}).ok());
  }
  FakeClock clock_;
  std::unique_ptr<ObjectStore> store_;
  const ResourceType& pods_ = Resource("pods");
};

TEST_F(ObjectStoreTest, EveryWriteGetsAHigherResourceVersionAndSystemMetadata) {
  auto a = store_->Create(pods_, Pod("ns1", "a"));
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = store_->Create(pods_, Pod("ns1", "b"));
  ASSERT_TRUE(b.ok());
  EXPECT_LT(Rv(*a), Rv(*b));
  EXPECT_EQ((*a)["kind"], "Pod");
  EXPECT_EQ((*a)["apiVersion"], "v1");
  EXPECT_EQ((*a)["metadata"]["uid"].get<std::string>().size(), 36u);
  EXPECT_EQ((*a)["metadata"]["creationTimestamp"], "2023-11-14T22:13:20Z");
  EXPECT_EQ((*a)["metadata"]["generation"], 1);
  auto a2 = store_->Update(pods_, "ns1", "a", [](json& p) {
    p["spec"]["hostNetwork"] = true;
    return absl::OkStatus();
  });
  ASSERT_TRUE(a2.ok());
  EXPECT_GT(Rv(*a2), Rv(*b));
  EXPECT_EQ((*a2)["metadata"]["generation"], 2);
  EXPECT_EQ(store_->CurrentResourceVersion(), Rv(*a2));
}

TEST_F(ObjectStoreTest, NoOpUpdateIsNotCommitted) {
  auto a = store_->Create(pods_, Pod("ns1", "a"));
  uint64_t before = store_->CurrentResourceVersion();
  auto same = store_->Update(pods_, "ns1", "a", [](json&) { return absl::OkStatus(); });
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(store_->CurrentResourceVersion(), before);
  EXPECT_EQ(Rv(*same), Rv(*a));
}

TEST_F(ObjectStoreTest, CreateRejectsDuplicatesAndMissingNamespace) {
  ASSERT_TRUE(store_->Create(pods_, Pod("ns1", "a")).ok());
  EXPECT_TRUE(absl::IsAlreadyExists(store_->Create(pods_, Pod("ns1", "a")).status()));
  EXPECT_TRUE(absl::IsNotFound(store_->Create(pods_, Pod("nope", "a")).status()));
  json gen = {{"metadata", {{"namespace", "ns1"}, {"generateName", "web-"}}}};
  auto g = store_->Create(pods_, gen);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ((*g)["metadata"]["name"].get<std::string>().rfind("web-", 0), 0u);
  EXPECT_EQ((*g)["metadata"]["name"].get<std::string>().size(), 9u);
}

TEST_F(ObjectStoreTest, ReplaceWithStaleResourceVersionConflicts) {
  auto a = store_->Create(pods_, Pod("ns1", "a"));
  json stale = *a;
  json fresh = *a;
  fresh["metadata"]["labels"]["x"] = "1";
  ASSERT_TRUE(store_->Replace(pods_, fresh).ok());
  stale["metadata"]["labels"]["x"] = "2";
  EXPECT_TRUE(absl::IsAborted(store_->Replace(pods_, stale).status()));
}

TEST_F(ObjectStoreTest, MainUpdateKeepsStatusAndStatusUpdateKeepsSpec) {
  ASSERT_TRUE(store_->Create(pods_, Pod("ns1", "a")).ok());
  auto s = store_->Update(
      pods_, "ns1", "a",
      [](json& p) {
        p["status"]["podIP"] = "10.0.0.1";
        p["spec"]["nodeName"] = "other";
        return absl::OkStatus();
      },
      ObjectStore::Subresource::kStatus);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)["status"]["podIP"], "10.0.0.1");
  EXPECT_EQ((*s)["spec"]["nodeName"], "node-1");
  auto m = store_->Update(pods_, "ns1", "a", [](json& p) {
    p["status"]["podIP"] = "10.0.0.2";
    return absl::OkStatus();
  });
  ASSERT_TRUE(m.ok());
  EXPECT_EQ((*m)["status"]["podIP"], "10.0.0.1");
}

TEST_F(ObjectStoreTest, WatchDeliversEventsInOrderWithSelectorTransitions) {
  ASSERT_TRUE(store_->Create(pods_, Pod("ns1", "a", {{"app", "x"}})).ok());
  WatchOptions opts;
  opts.since = store_->CurrentResourceVersion();
  opts.labels = *LabelSelector::Parse("app=x");
  auto w = store_->Watch(pods_, opts);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(store_->Create(pods_, Pod("ns1", "b", {{"app", "y"}})).ok());  // filtered
  ASSERT_TRUE(store_
                  ->Update(pods_, "ns1", "b",
                           [](json& p) {
                             p["metadata"]["labels"]["app"] = "x";  // starts matching
                             return absl::OkStatus();
                           })
                  .ok());
  ASSERT_TRUE(store_
                  ->Update(pods_, "ns1", "a",
                           [](json& p) {
                             p["metadata"]["labels"]["app"] = "z";  // stops matching
                             return absl::OkStatus();
                           })
                  .ok());
  ASSERT_TRUE(store_->Delete(pods_, "ns1", "b", {.grace_period_seconds = 0}).ok());
  std::vector<std::pair<std::string, std::string>> got;
  uint64_t last = 0;
  Event e;
  while ((*w)->Next(absl::Now() + absl::Milliseconds(50), &e) == WatchStream::Result::kEvent) {
    got.push_back({EventTypeName(e.type), (*e.object)["metadata"]["name"]});
    EXPECT_GT(e.resource_version, last);
    EXPECT_EQ(Rv(*e.object), e.resource_version);
    last = e.resource_version;
  }
  std::vector<std::pair<std::string, std::string>> want = {
      {"ADDED", "b"}, {"DELETED", "a"}, {"DELETED", "b"}};
  EXPECT_EQ(got, want);
}

TEST_F(ObjectStoreTest, WatchWithoutResourceVersionStartsWithSyntheticAdds) {
  ASSERT_TRUE(store_->Create(pods_, Pod("ns1", "a")).ok());
  ASSERT_TRUE(store_->Create(pods_, Pod("ns1", "b")).ok());
  auto w = store_->Watch(pods_, {});
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->queued(), 2u);
}

TEST_F(ObjectStoreTest, WatchBlocksUntilAnEventArrives) {
  auto w = store_->Watch(pods_, {.since = store_->CurrentResourceVersion()});
  ASSERT_TRUE(w.ok());
  std::thread writer([&] { ASSERT_TRUE(store_->Create(pods_, Pod("ns1", "late")).ok()); });
  Event e;
  EXPECT_EQ((*w)->Next(absl::Now() + absl::Seconds(10), &e), WatchStream::Result::kEvent);
  EXPECT_EQ((*e.object)["metadata"]["name"], "late");
  writer.join();
  EXPECT_EQ((*w)->Next(absl::Now() + absl::Milliseconds(20), &e), WatchStream::Result::kTimeout);
}

TEST_F(ObjectStoreTest, HistoryWindowExpiresOldResourceVersions) {
  store_->SetHistoryLimit(3);
  uint64_t start = store_->CurrentResourceVersion();
  for (int i = 0; i < 5; ++i)
    ASSERT_TRUE(store_->Create(pods_, Pod("ns1", absl::StrCat("p", i))).ok());
  auto old = store_->Watch(pods_, {.since = start});
  EXPECT_TRUE(absl::IsOutOfRange(old.status())) << old.status();
  EXPECT_NE(old.status().message().find("too old resource version"), std::string::npos);
  uint64_t oldest = store_->OldestWatchableResourceVersion();
  auto ok = store_->Watch(pods_, {.since = oldest});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)->queued(), 3u);
}

TEST_F(ObjectStoreTest, CompactionExpiresRunningWatchesAndOldResourceVersions) {
  uint64_t start = store_->CurrentResourceVersion();
  auto w = store_->Watch(pods_, {.since = start});
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(store_->Create(pods_, Pod("ns1", "a")).ok());
  store_->Compact();
  Event e;
  EXPECT_EQ((*w)->Next(absl::Now() + absl::Seconds(1), &e), WatchStream::Result::kExpired);
  EXPECT_TRUE(absl::IsOutOfRange(store_->Watch(pods_, {.since = start}).status()));
  EXPECT_TRUE(store_->Watch(pods_, {.since = store_->CurrentResourceVersion()}).ok());
}

TEST_F(ObjectStoreTest, PaginatedListIsASnapshotCoveringEveryItemOnce) {
  for (int i = 0; i < 25; ++i) {
    ASSERT_TRUE(store_->Create(pods_, Pod("ns1", absl::StrCat("p", i))).ok());
  }
  ListOptions opts;
  opts.limit = 10;
  auto first = store_->List(pods_, opts);
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->items.size(), 10u);
  ASSERT_FALSE(first->continue_token.empty());
  // Changes after the first page are not seen by later pages of the same list.
  ASSERT_TRUE(store_->Create(pods_, Pod("ns1", "zz-new")).ok());
  ASSERT_TRUE(store_->Delete(pods_, "ns1", "p9", {.grace_period_seconds = 0}).ok());
  std::multiset<std::string> names;
  for (auto& i : first->items) names.insert((*i)["metadata"]["name"]);
  std::string token = first->continue_token;
  while (!token.empty()) {
    opts.continue_token = token;
    auto page = store_->List(pods_, opts);
    ASSERT_TRUE(page.ok());
    EXPECT_EQ(page->resource_version, first->resource_version);
    for (auto& i : page->items) names.insert((*i)["metadata"]["name"]);
    token = page->continue_token;
  }
  EXPECT_EQ(names.size(), 25u);
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), 25u);
  EXPECT_TRUE(names.contains("p9"));
  EXPECT_FALSE(names.contains("zz-new"));
}

TEST_F(ObjectStoreTest, ContinueTokenExpiresWithCompaction) {
  for (int i = 0; i < 5; ++i)
    ASSERT_TRUE(store_->Create(pods_, Pod("ns1", absl::StrCat("p", i))).ok());
  auto first = store_->List(pods_, {.limit = 2});
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(store_->Create(pods_, Pod("ns1", "later")).ok());
  store_->Compact();
  auto next = store_->List(pods_, {.limit = 2, .continue_token = first->continue_token});
  EXPECT_TRUE(absl::IsOutOfRange(next.status()));
}

TEST_F(ObjectStoreTest, GracefulPodDeletionWaitsForTheGracePeriod) {
  json pod = Pod("ns1", "a");
  pod["spec"]["terminationGracePeriodSeconds"] = 5;
  ASSERT_TRUE(store_->Create(pods_, pod).ok());
  auto del = store_->Delete(pods_, "ns1", "a", {});
  ASSERT_TRUE(del.ok());
  EXPECT_FALSE(del->deleted);
  EXPECT_EQ(del->object["metadata"]["deletionGracePeriodSeconds"], 5);
  EXPECT_EQ(del->object["metadata"]["deletionTimestamp"], "2023-11-14T22:13:25Z");
  EXPECT_EQ(store_->RemoveExpiredTerminatingPods(), 0);
  clock_.Advance(absl::Seconds(4));
  EXPECT_EQ(store_->RemoveExpiredTerminatingPods(), 0);
  EXPECT_TRUE(store_->Get(pods_, "ns1", "a").ok());
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(store_->RemoveExpiredTerminatingPods(), 1);
  EXPECT_TRUE(absl::IsNotFound(store_->Get(pods_, "ns1", "a").status()));
}

TEST_F(ObjectStoreTest, DeletingANamespaceDeletesItsObjects) {
  ASSERT_TRUE(store_->Create(pods_, Pod("ns1", "a")).ok());
  ASSERT_TRUE(store_->Delete(Resource("namespaces"), "", "ns1", {}).ok());
  EXPECT_TRUE(absl::IsNotFound(store_->Get(pods_, "ns1", "a").status()));
}

}  // namespace
}  // namespace sluice::lab
