// Readiness and liveness logic, and the HTTP routes the probes hit (a real server on loopback,
// a real HTTP client): 200 when healthy, 503 naming what is not.
#include "agent/metrics/health.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "agent/base/fake_clock.h"
#include "agent/metrics/agent_endpoints.h"
#include "agent/metrics/http_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

namespace sluice::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(ReadinessTest, ReadyOnlyWhenEveryConditionHoldsAndSaysWhichDoesNot) {
  Readiness r;
  Milestone datapath, cni;
  bool synced = false;
  r.Require("datapath", [&] { return datapath.reached() ? "" : "not loaded"; });
  r.Require("kubernetes", [&] { return synced ? "" : "not listed yet: Pod"; });
  r.Require("cni", [&] { return cni.reached() ? "" : "not installed"; });
  HealthVerdict v = r.Check();
  EXPECT_FALSE(v.ok);
  EXPECT_THAT(v.text, HasSubstr("fail datapath: not loaded\n"));
  EXPECT_THAT(v.text, HasSubstr("fail kubernetes: not listed yet: Pod\n"));
  datapath.Reach();
  synced = true;
  v = r.Check();
  EXPECT_FALSE(v.ok);
  EXPECT_THAT(v.text, HasSubstr("ok datapath\n"));
  EXPECT_THAT(v.text, HasSubstr("fail cni: not installed\n"));
  cni.Reach();
  v = r.Check();
  EXPECT_TRUE(v.ok) << v.text;
  EXPECT_EQ(v.text, "ok datapath\nok kubernetes\nok cni\n");
}

TEST(HeartbeatsTest, ALoopThatStopsBeatingPastItsLimitIsWedged) {
  FakeClock clock;
  Heartbeats beats(&clock);
  auto a = beats.Register("controller services", absl::Minutes(3));
  auto b = beats.Register("peer routes", absl::Minutes(3));
  EXPECT_TRUE(beats.Check().ok);
  clock.Advance(absl::Minutes(2));
  b->Beat();
  clock.Advance(absl::Minutes(2));  // a: 4 min without a beat, b: 2 min
  HealthVerdict v = beats.Check();
  EXPECT_FALSE(v.ok);
  EXPECT_THAT(v.text, HasSubstr("fail controller services: no progress for 4m"));
  EXPECT_THAT(v.text, HasSubstr("ok peer routes"));
  a->Beat();
  EXPECT_TRUE(beats.Check().ok);
  a.reset();  // a stopped loop is no longer asked
  clock.Advance(absl::Minutes(10));
  v = beats.Check();
  EXPECT_FALSE(v.ok);
  EXPECT_THAT(v.text, Not(HasSubstr("controller services")));
}

TEST(HttpServerTest, ParseHostPortNamesTheFlag) {
  auto ok = ParseHostPort("127.0.0.1:9879", "--health_address");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->first, "127.0.0.1");
  EXPECT_EQ(ok->second, 9879);
  auto v6 = ParseHostPort("[::1]:1", "--x");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->first, "::1");
  // The chart's spelling: every address.
  auto any = ParseHostPort(":9962", "--metrics_address");
  ASSERT_TRUE(any.ok()) << any.status();
  EXPECT_EQ(any->first, "0.0.0.0");
  EXPECT_EQ(any->second, 9962);
  auto bad = ParseHostPort("9879", "--health_address");
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("--health_address=9879"));
  EXPECT_FALSE(ParseHostPort("a:70000", "--x").ok());
}

TEST(AgentEndpointsTest, ProbesAnswer503WithTheReasonThen200) {
  Readiness readiness;
  Milestone loaded;
  readiness.Require("datapath", [&] { return loaded.reached() ? "" : "not loaded yet"; });
  FakeClock clock;
  Heartbeats beats(&clock);
  auto loop = beats.Register("controller policy", absl::Minutes(3));
  Registry registry;
  registry.GetCounter("sluice_x_total", "x").Inc(7);
  auto e = AgentEndpoints::Start({.health_address = "127.0.0.1:0",
                                  .metrics_address = "127.0.0.1:0",
                                  .config_json = [] { return std::string(R"({"a":1})"); }},
                                 readiness, beats, registry);
  ASSERT_TRUE(e.ok()) << e.status();
  httplib::Client health("127.0.0.1", (*e)->health_port());
  httplib::Client metrics("127.0.0.1", (*e)->metrics_port());
  ASSERT_NE((*e)->health_port(), (*e)->metrics_port());

  auto ready = health.Get("/readyz");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 503);
  EXPECT_THAT(ready->body, HasSubstr("fail datapath: not loaded yet"));
  loaded.Reach();
  ready = health.Get("/readyz");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200) << ready->body;

  auto live = health.Get("/healthz");
  ASSERT_TRUE(live);
  EXPECT_EQ(live->status, 200);
  clock.Advance(absl::Minutes(5));
  live = health.Get("/healthz");
  ASSERT_TRUE(live);
  EXPECT_EQ(live->status, 503);
  EXPECT_THAT(live->body, HasSubstr("fail controller policy: no progress for 5m"));

  auto config = health.Get("/config");
  ASSERT_TRUE(config);
  EXPECT_EQ(config->body, R"({"a":1})");
  EXPECT_EQ(config->get_header_value("Content-Type"), "application/json");

  auto m = metrics.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  EXPECT_THAT(m->get_header_value("Content-Type"), HasSubstr("version=0.0.4"));
  EXPECT_THAT(m->body, HasSubstr("sluice_x_total 7\n"));
  // Metrics are not on the health listener, nor probes on the metrics one.
  auto nope = health.Get("/metrics");
  ASSERT_TRUE(nope);
  EXPECT_EQ(nope->status, 404);
}

TEST(AgentEndpointsTest, OneAddressServesEveryRoute) {
  Readiness readiness;
  Registry registry;
  registry.GetGauge("sluice_g", "g").Set(1);
  // Bind a port first so both flags can name the same concrete address.
  auto probe = HttpServer::Start("127.0.0.1:0", {});
  ASSERT_TRUE(probe.ok());
  std::string addr = absl::StrCat("127.0.0.1:", (*probe)->port());
  probe->reset();
  auto e = AgentEndpoints::Start({.health_address = addr, .metrics_address = addr}, readiness,
                                 DefaultHeartbeats(), registry);
  ASSERT_TRUE(e.ok()) << e.status();
  httplib::Client c("127.0.0.1", (*e)->health_port());
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_THAT(m->body, HasSubstr("sluice_g 1"));
  auto r = c.Get("/readyz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST(AgentEndpointsTest, AnAddressInUseIsAnErrorNamingTheFlag) {
  auto first = HttpServer::Start("127.0.0.1:0", {});
  ASSERT_TRUE(first.ok());
  Readiness readiness;
  auto e = AgentEndpoints::Start({.health_address = absl::StrCat("127.0.0.1:", (*first)->port())},
                                 readiness);
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(std::string(e.status().message()), HasSubstr("--health_address"));
}

TEST(AgentEndpointsTest, RunningConfigNamesVersionAndFlags) {
  auto j = nlohmann::json::parse(RunningConfigJson());
  EXPECT_TRUE(j.contains("version"));
  EXPECT_TRUE(j["flags"].is_object());
}

}  // namespace
}  // namespace sluice::metrics
