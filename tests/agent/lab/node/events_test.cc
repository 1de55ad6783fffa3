// core/v1 Events from the lab's EventRecorder (aggregation of repeats, the bound on how many are
// kept, the fields `kubectl describe` selects them by) and the pods/log subresource.
#include "agent/lab/node/events.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "agent/base/fake_clock.h"
#include "agent/lab/apiserver/apiserver.h"
#include "agent/lab/lab_client.h"

namespace sluice::lab {
namespace {

using nlohmann::json;

class EventRecorderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ObjectStore::Options o;
    o.clock = &clock_;
    store_ = std::make_unique<ObjectStore>(o);
    ASSERT_TRUE(store_->Create(Resource("namespaces"), {{"metadata", {{"name", "default"}}}}).ok());
    auto pod =
        store_->Create(Resource("pods"), {{"metadata", {{"name", "web"}, {"namespace", "default"}}},
                                          {"spec", {{"nodeName", "node2"}}}});
    ASSERT_TRUE(pod.ok()) << pod.status();
    pod_ = *pod;
  }
  std::vector<json> Events(const std::string& field_selector = "") {
    ListOptions lo;
    lo.namespace_name = "default";
    auto fs = FieldSelector::Parse(field_selector, "events");
    EXPECT_TRUE(fs.ok()) << fs.status();
    lo.fields = *fs;
    auto list = store_->List(Resource("events"), lo);
    EXPECT_TRUE(list.ok());
    std::vector<json> out;
    for (const auto& e : list->items) out.push_back(*e);
    return out;
  }
  FakeClock clock_;
  std::unique_ptr<ObjectStore> store_;
  json pod_;
};

TEST_F(EventRecorderTest, AnEventNamesItsObjectReasonMessageAndSource) {
  EventRecorder rec(store_.get());
  ASSERT_TRUE(rec.Record(pod_, "Warning", "FailedCreatePodSandBox",
                         "Failed to create pod sandbox: x",
                         {.component = "kubelet", .host = "node2"})
                  .ok());
  auto events = Events();
  ASSERT_EQ(events.size(), 1u);
  const json& e = events[0];
  EXPECT_EQ(e["kind"], "Event");
  EXPECT_EQ(e["apiVersion"], "v1");
  EXPECT_EQ(e["metadata"]["namespace"], "default");
  EXPECT_TRUE(e["metadata"]["name"].get<std::string>().starts_with("web.")) << e.dump();
  EXPECT_EQ(e["involvedObject"]["kind"], "Pod");
  EXPECT_EQ(e["involvedObject"]["name"], "web");
  EXPECT_EQ(e["involvedObject"]["namespace"], "default");
  EXPECT_EQ(e["involvedObject"]["uid"], pod_["metadata"]["uid"]);
  EXPECT_EQ(e["type"], "Warning");
  EXPECT_EQ(e["reason"], "FailedCreatePodSandBox");
  EXPECT_EQ(e["message"], "Failed to create pod sandbox: x");
  EXPECT_EQ(e["source"], json::parse(R"({"component":"kubelet","host":"node2"})"));
  EXPECT_EQ(e["count"], 1);
  EXPECT_EQ(e["firstTimestamp"], e["lastTimestamp"]);
  // kubectl describe's selector finds it; another object's does not.
  std::string uid = pod_["metadata"]["uid"];
  EXPECT_EQ(Events(absl::StrCat("involvedObject.name=web,involvedObject.namespace=default,"
                                "involvedObject.kind=Pod,involvedObject.uid=",
                                uid))
                .size(),
            1u);
  EXPECT_TRUE(Events("involvedObject.name=other").empty());
  EXPECT_EQ(Events("type=Warning,reason=FailedCreatePodSandBox").size(), 1u);
}

TEST_F(EventRecorderTest, ARepeatBumpsCountAndLastTimestampOfTheSameEvent) {
  EventRecorder rec(store_.get());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(
        rec.Record(pod_, "Warning", "FailedCreatePodSandBox", "same", {"kubelet", "node2"}).ok());
    clock_.Advance(absl::Seconds(2));
  }
  ASSERT_TRUE(
      rec.Record(pod_, "Warning", "FailedCreatePodSandBox", "different", {"kubelet", "node2"})
          .ok());
  auto events = Events("involvedObject.name=web");
  ASSERT_EQ(events.size(), 2u);
  const json& same = events[0]["message"] == "same" ? events[0] : events[1];
  EXPECT_EQ(same["count"], 3);
  EXPECT_EQ(same["firstTimestamp"],
            ObjectStore::FormatTimestamp(absl::FromUnixSeconds(1'700'000'000)));
  EXPECT_EQ(same["lastTimestamp"],
            ObjectStore::FormatTimestamp(absl::FromUnixSeconds(1'700'000'004)));
  EXPECT_EQ(rec.size(), 2u);
}

TEST_F(EventRecorderTest, KeepsAtMostTheLimitEvictingTheOldest) {
  EventRecorder rec(store_.get(), /*limit=*/3);
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(
        rec.Record(pod_, "Normal", "Seen", absl::StrCat("number ", i), {"kubelet", ""}).ok());
  }
  auto events = Events();
  ASSERT_EQ(events.size(), 3u);
  std::set<std::string> messages;
  for (const auto& e : events) messages.insert(e["message"]);
  EXPECT_EQ(messages, (std::set<std::string>{"number 2", "number 3", "number 4"}));
  EXPECT_EQ(rec.size(), 3u);
  // An Event deleted by someone else is recorded afresh, not lost.
  for (const auto& e : events) {
    ASSERT_TRUE(
        store_->Delete(Resource("events"), "default", e["metadata"]["name"].get<std::string>(), {})
            .ok());
  }
  ASSERT_TRUE(rec.Record(pod_, "Normal", "Seen", "number 4", {"kubelet", ""}).ok());
  ASSERT_EQ(Events().size(), 1u);
  EXPECT_EQ(Events()[0]["count"], 1);
}

TEST(PodLog, ServesTheKubeletsLogFileWithTailAndLimitAnd404ForAnUnknownPod) {
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("sluice-podlog-", getpid());
  std::filesystem::create_directories(dir);
  ApiServerOptions o;
  o.pod_log_dir = dir.string();
  ApiServer server(o);
  ASSERT_TRUE(server.Start().ok());
  testing::LabClient api(server);
  ASSERT_EQ(api.Post("/api/v1/namespaces/default/pods",
                     {{"metadata", {{"name", "web"}}},
                      {"spec", {{"nodeName", "n1"}, {"containers", {{{"name", "c"}}}}}}})
                .status,
            201);
  const std::string log = "/api/v1/namespaces/default/pods/web/log";
  // Not started yet: what kube-apiserver says of a container that is still being created.
  auto waiting = api.Get(log);
  EXPECT_EQ(waiting.status, 400);
  EXPECT_NE(waiting.body.value("message", "").find("is waiting to start: ContainerCreating"),
            std::string::npos)
      << waiting.raw;
  std::ofstream(dir / "default_web.log") << "start\nrequest 1\nrequest 2\n";
  ASSERT_EQ(
      api.Patch("/api/v1/namespaces/default/pods/web/status", {{"status", {{"phase", "Running"}}}})
          .status,
      200);
  auto all = api.Get(log);
  EXPECT_EQ(all.status, 200);
  EXPECT_EQ(all.raw, "start\nrequest 1\nrequest 2\n");
  EXPECT_EQ(api.Get(log + "?tailLines=2").raw, "request 1\nrequest 2\n");
  EXPECT_EQ(api.Get(log + "?tailLines=0").raw, "");
  EXPECT_EQ(api.Get(log + "?tailLines=9").raw, "start\nrequest 1\nrequest 2\n");
  EXPECT_EQ(api.Get(log + "?limitBytes=5").raw, "start");
  EXPECT_EQ(api.Get(log + "?container=c").status, 200);
  EXPECT_EQ(api.Get(log + "?container=nope").status, 400);
  auto unknown = api.Get("/api/v1/namespaces/default/pods/nobody/log");
  EXPECT_EQ(unknown.status, 404);
  EXPECT_EQ(unknown.body["reason"], "NotFound");
  EXPECT_EQ(unknown.body["message"], "pods \"nobody\" not found");
  server.Stop();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sluice::lab
