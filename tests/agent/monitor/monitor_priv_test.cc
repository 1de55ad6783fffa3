// The agent's flow monitor on the real datapath: it switches the datapath's events on while
// someone observes and off again, drains the ring buffer the programs write, names and filters
// the flows, keeps the last N, and serves them over the observe socket as `sluicectl observe`
// reads them.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <thread>
#include <vector>

#include "agent/monitor/monitor.h"
#include "agent/monitor/observe_client.h"
#include "agent/monitor/observe_server.h"
#include "gmock/gmock.h"
#include "nlohmann/json.hpp"
#include "support/eventually.h"
#include "support/fixture.h"
#include "support/temp_dir.h"

namespace sluice::testing {
namespace {

using monitor::Flow;
using monitor::FlowFilter;
using monitor::FlowMonitor;
using monitor::MonitorOptions;

const Mac kPodMac = ParseMac("02:00:00:00:0a:01");
const Mac kHostMac = ParseMac("02:aa:00:00:0a:02");
constexpr int kIfindex = 1;
constexpr uint32_t kEpA = 7, kEpB = 8;
constexpr const char* kA = "10.244.0.10";
constexpr const char* kB = "10.244.0.11";
constexpr const char* kStranger = "10.244.0.99";

k8s::Pod MakePod(const std::string& ns, const std::string& name, const std::string& ip) {
  k8s::Pod p;
  p.meta.namespace_ = ns;
  p.meta.name = name;
  p.meta.uid = name;
  p.pod_ips = {ip};
  return p;
}

class MonitorTest : public DatapathTest {
 protected:
  void SetUp() override {
    DatapathTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_TRUE(AddEndpoint(*dp_, Ip4(kA), kIfindex, kPodMac, kHostMac, kEpA).ok());
    ASSERT_TRUE(AddEndpoint(*dp_, Ip4(kB), 4242, kHostMac, kHostMac, kEpB).ok());
    pods_.Upsert(MakePod("shop", "web-0", kA));
    pods_.Upsert(MakePod("shop", "db-0", kB));
    monitor::NameSources s;
    s.pods = &pods_;
    names_ = std::make_unique<monitor::FlowNames>(std::move(s));
  }
  void TearDown() override {
    monitor_.reset();
    DatapathTest::TearDown();
  }
  void StartMonitor(MonitorOptions opts = {}) {
    opts.node_name = "node-a";
    auto m = FlowMonitor::Start(dp_->events_fd(), dp_->monitor_config(), dp_->monitor_cpu(),
                                names_.get(), opts);
    ASSERT_TRUE(m.ok()) << m.status();
    monitor_ = std::move(*m);
  }
  uint32_t DatapathEvents() {
    auto cfg = dp_->monitor_config().Lookup(0);
    EXPECT_TRUE(cfg.ok());
    return cfg.ok() ? cfg->events : ~0u;
  }
  void SendSpoofed(uint16_t sport = 40000) {
    ASSERT_EQ(
        Run(dp_->from_pod_fd(),
            Packet::Eth(kPodMac, kHostMac).IPv4(kStranger, kB).TCP(sport, 8080).Build(), kIfindex)
            .verdict,
        kTcShot);
  }
  void SendDenied() {
    sluice_policy_ep_entry pep{};
    pep.identity = 301;
    pep.flags = SLUICE_POLICY_EP_F_INGRESS;
    ASSERT_TRUE(dp_->policy_ep().Update(kEpB, pep).ok());
    ASSERT_EQ(Run(dp_->from_pod_fd(),
                  Packet::Eth(kPodMac, kHostMac).IPv4(kA, kB).TCP(40000, 5432).Build(), kIfindex)
                  .verdict,
              kTcShot);
  }

  k8s::Store<k8s::Pod> pods_;
  std::unique_ptr<monitor::FlowNames> names_;
  std::unique_ptr<FlowMonitor> monitor_;
};

TEST_F(MonitorTest, DatapathEmitsOnlyWhileSomeoneObserves) {
  StartMonitor();
  EXPECT_EQ(DatapathEvents(), 0u);
  {
    std::vector<Flow> none;
    auto observer = monitor_->Observe({}, 0, /*follow=*/true, &none);
    ASSERT_NE(observer, nullptr);
    EXPECT_EQ(DatapathEvents(), SLUICE_MON_EVENTS_ALL);
    auto second = monitor_->Observe({}, 0, true, &none);
    second.reset();
    EXPECT_EQ(DatapathEvents(), SLUICE_MON_EVENTS_ALL) << "one observer is still there";
  }
  EXPECT_EQ(DatapathEvents(), 0u);
  SendSpoofed();
  monitor_.reset();
  EXPECT_EQ(DatapathEvents(), 0u);
  auto counters = monitor::ReadMonitorCounters(dp_->monitor_cpu());
  ASSERT_TRUE(counters.ok());
  EXPECT_EQ(counters->emitted, 0u) << "nothing emitted while nobody observed";
}

TEST_F(MonitorTest, PolicyDropReachesAFollowingObserverNamedAndFiltered) {
  StartMonitor();
  FlowFilter filter;
  filter.pods = {"shop/db-0"};
  filter.verdict = "dropped";
  std::vector<Flow> history;
  auto observer = monitor_->Observe(filter, 0, true, &history);
  ASSERT_NE(observer, nullptr);
  SendSpoofed();  // from an address no pod owns, to db-0: matches
  SendDenied();
  std::vector<Flow> got;
  ASSERT_TRUE(Eventually([&] {
    while (auto f = observer->Next(absl::ZeroDuration())) got.push_back(*f);
    return got.size() >= 2;
  }));
  EXPECT_EQ(got[0].type, "drop");
  EXPECT_EQ(got[0].drop_reason, "spoofed_source");
  EXPECT_EQ(got[1].type, "policy");
  EXPECT_EQ(got[1].drop_reason, "policy_denied");
  EXPECT_EQ(got[1].source.pod, "web-0");
  EXPECT_EQ(got[1].destination.namespace_, "shop");
  EXPECT_EQ(got[1].destination.pod, "db-0");
  EXPECT_EQ(got[1].node, "node-a");
  EXPECT_EQ(got[1].policy_direction, "ingress");
}

TEST_F(MonitorTest, IdleDropsAreKeptForLastN) {
  MonitorOptions opts;
  opts.idle_events = 1u << SLUICE_EVENT_DROP;
  opts.history = 2;
  StartMonitor(opts);
  EXPECT_EQ(DatapathEvents(), opts.idle_events);
  for (uint16_t port : {40001, 40002, 40003}) SendSpoofed(port);
  ASSERT_TRUE(Eventually([&] { return monitor_->flows_read() == 3; }));
  std::vector<Flow> last;
  EXPECT_EQ(monitor_->Observe({}, 10, /*follow=*/false, &last), nullptr);
  ASSERT_EQ(last.size(), 2u) << "the history keeps 2";
  EXPECT_EQ(last[0].source.port, 40002);
  EXPECT_EQ(last[1].source.port, 40003);
}

TEST_F(MonitorTest, RateLimitedEventsCountAsLost) {
  MonitorOptions opts;
  opts.idle_events = 1u << SLUICE_EVENT_DROP;
  opts.rate = 1;
  opts.burst = 2;
  StartMonitor(opts);
  for (int i = 0; i < 5; ++i) SendSpoofed(40000 + i);
  EXPECT_EQ(monitor_->EventsLost(), 3u);
  ASSERT_TRUE(Eventually([&] { return monitor_->flows_read() == 2; }));
}

TEST_F(MonitorTest, ObserveSocketServesLastNThenFollowsAndRefusesBadFilters) {
  MonitorOptions opts;
  opts.idle_events = 1u << SLUICE_EVENT_DROP;
  StartMonitor(opts);
  SendSpoofed(40001);
  ASSERT_TRUE(Eventually([&] { return monitor_->flows_read() == 1; }));
  TempDir dir;
  monitor::ObserveServerOptions sopts;
  sopts.socket_path = dir / "observe.sock";
  monitor::ObserveServer server(*monitor_, sopts);
  ASSERT_TRUE(server.Start().ok());

  std::vector<nlohmann::json> lines;
  absl::Mutex mu;
  std::thread client([&] {
    auto st = monitor::Observe(sopts.socket_path, {{"last", 5}, {"follow", true}},
                               [&](const nlohmann::json& j) {
                                 absl::MutexLock lock(&mu);
                                 lines.push_back(j);
                                 int flows = 0;
                                 for (const auto& l : lines) flows += l.contains("flow");
                                 return flows < 2;  // the old drop and one new one
                               });
    EXPECT_TRUE(st.ok()) << st;
  });
  ASSERT_TRUE(Eventually([&] { return monitor_->observers() == 1; }));
  SendSpoofed(40002);
  client.join();
  ASSERT_GE(lines.size(), 4u);
  EXPECT_TRUE(lines[0].contains("status"));
  EXPECT_EQ(lines[1]["flow"]["source"]["port"], 40001);
  EXPECT_TRUE(lines[2].contains("live")) << "the history ends before the live flows: " << lines[2];
  EXPECT_EQ(lines[3]["flow"]["source"]["port"], 40002);
  EXPECT_EQ(lines[3]["flow"]["drop_reason"], "spoofed_source");
  EXPECT_TRUE(Eventually([&] { return monitor_->observers() == 0; }))
      << "the agent lets go of an observer that closed its end";

  auto bad = monitor::Observe(sopts.socket_path, {{"filter", {{"verdict", "denied"}}}},
                              [](const nlohmann::json&) { return true; });
  EXPECT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.message()), ::testing::HasSubstr("verdict denied"));
  server.Stop();
}

}  // namespace
}  // namespace sluice::testing
