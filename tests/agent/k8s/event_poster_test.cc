// The agent's Events, posted to the real lab control plane (sluice::lab::ApiServer over HTTPS on
// loopback) and read back as kubectl lists them; the JSON of one Event as the apiserver gets it.
#include "agent/k8s/event_poster.h"

#include <memory>
#include <set>
#include <string>

#include "absl/time/time.h"
#include "agent/k8s/config.h"
#include "agent/k8s/http_client.h"
#include "agent/lab/apiserver/apiserver.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "support/eventually.h"

namespace sluice::k8s {
namespace {

using nlohmann::json;
using ::sluice::testing::Eventually;

TEST(EventJsonTest, NamesTheObjectTheSourceAndTheReason) {
  EventObject pod{"Pod", "v1", "default", "server", "uid-1"};
  json ev = json::parse(EventJson(pod, "Warning", "PolicyNotApplied", "does not fit", "node1",
                                  absl::FromUnixSeconds(1700000000)));
  EXPECT_EQ(ev["kind"], "Event");
  EXPECT_EQ(ev["metadata"]["namespace"], "default");
  EXPECT_EQ(ev["involvedObject"]["kind"], "Pod");
  EXPECT_EQ(ev["involvedObject"]["name"], "server");
  EXPECT_EQ(ev["involvedObject"]["uid"], "uid-1");
  EXPECT_EQ(ev["type"], "Warning");
  EXPECT_EQ(ev["reason"], "PolicyNotApplied");
  EXPECT_EQ(ev["source"]["component"], "sluice-agent");
  EXPECT_EQ(ev["source"]["host"], "node1");
  EXPECT_EQ(ev["firstTimestamp"], "2023-11-14T22:13:20Z");
  EXPECT_EQ(ev["count"], 1);
}

class EventPosterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<lab::ApiServer>(lab::ApiServerOptions{});
    absl::Status s = server_->Start();
    ASSERT_TRUE(s.ok()) << s;
    ClientConfig cfg;
    cfg.server = server_->url();
    cfg.ca_pem = server_->ca_cert_pem();
    cfg.token = server_->token();
    cfg.source = "lab";
    http_ = std::make_unique<HttpClient>(cfg);
  }
  void TearDown() override {
    http_.reset();
    if (server_) server_->Stop();
  }
  // The Events of `ns` as the apiserver lists them.
  json Events(const std::string& ns) {
    std::string body;
    HttpRequest req;
    req.path = "/api/v1/namespaces/" + ns + "/events";
    req.timeout = absl::Seconds(5);
    HttpResult r = http_->Get(req, [&](std::string_view s) {
      body.append(s);
      return true;
    });
    if (!r.ok()) return json::array();
    json list = json::parse(body, nullptr, false);
    return list.is_object() ? list.value("items", json::array()) : json::array();
  }

  std::unique_ptr<lab::ApiServer> server_;
  std::unique_ptr<HttpClient> http_;
};

TEST_F(EventPosterTest, PostedEventsAreListedByTheApiserver) {
  EventPoster poster(*http_, "node1");
  poster.Post({"Pod", "v1", "default", "server", ""}, "Warning", "PolicyNotApplied",
              "the policy does not fit");
  poster.Post({"NetworkPolicy", "networking.k8s.io/v1", "default", "bad", ""}, "Warning",
              "PolicyInvalid", "ingress[0]: invalid CIDR");
  ASSERT_TRUE(Eventually([&] { return Events("default").size() == 2; }))
      << Events("default").dump();
  json items = Events("default");
  std::set<std::string> reasons;
  for (const json& e : items) {
    reasons.insert(e["reason"].get<std::string>());
    EXPECT_EQ(e["source"]["component"], "sluice-agent");
  }
  EXPECT_EQ(reasons, (std::set<std::string>{"PolicyNotApplied", "PolicyInvalid"}));
  EXPECT_EQ(poster.stats().posted, 2u);
  EXPECT_EQ(poster.stats().failed, 0u);
}

// An apiserver that is gone costs the caller nothing: Post returns at once, the failure is
// counted by the poster's own thread.
TEST_F(EventPosterTest, RefusedPostIsCountedNotRetried) {
  server_->Stop();
  server_.reset();
  EventPoster poster(*http_, "node1");
  poster.Post({"Pod", "v1", "default", "server", ""}, "Warning", "PolicyNotApplied", "x");
  ASSERT_TRUE(Eventually([&] { return poster.stats().failed == 1; }));
  EXPECT_EQ(poster.stats().posted, 0u);
}

}  // namespace
}  // namespace sluice::k8s
