// The scrape-time collector over real pinned maps: drops summed over CPUs, entries and capacity
// per map (arrays left out of pressure, a slot array's used slots counted), conntrack entries, and
// the agent's failed map writes counted per map through maps::update_failure_hook.
#include <arpa/inet.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/base/fake_clock.h"
#include "agent/metrics/datapath_metrics.h"
#include "agent/metrics/drop_window.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "support/fixture.h"

namespace sluice::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class DatapathMetricsTest : public sluice::testing::DatapathTest {};

TEST_F(DatapathMetricsTest, ScrapeSumsDropsOverCpusAndReportsMapFill) {
  std::vector<sluice_drop_count> per_cpu(dp_->drops().ncpus());
  per_cpu[0] = {3, 300};
  per_cpu.back().packets += 4;
  per_cpu.back().bytes += 400;
  ASSERT_TRUE(
      dp_->drops()
          .Update(SLUICE_DROP_KEY(SLUICE_DROP_SPOOFED_SOURCE, SLUICE_DROP_DIR_EGRESS), per_cpu)
          .ok());
  std::vector<sluice_drop_count> ingress(dp_->drops().ncpus());
  ingress[0] = {2, 20};
  ASSERT_TRUE(
      dp_->drops()
          .Update(SLUICE_DROP_KEY(SLUICE_DROP_SERVICE_REJECTED, SLUICE_DROP_DIR_INGRESS), ingress)
          .ok());
  std::vector<sluice_fwd_count> fwd(dp_->forwards().ncpus());
  fwd[0] = {5, 500};
  fwd.back().packets += 6;
  fwd.back().bytes += 600;
  ASSERT_TRUE(dp_->forwards().Update(SLUICE_FWD_NET_INGRESS, fwd).ok());
  ASSERT_TRUE(sluice::testing::AddEndpoint(*dp_, htonl(0x0af40005), 1, {}, {}, 9).ok());
  // sluice_lb4_be is an array of slots: its entries are the used ones, not its size.
  for (uint32_t id : {3u, 7u, 9u}) {
    ASSERT_TRUE(dp_->lb4_backends().Update(id, {htonl(0x0af40100 + id), htons(80), 6, 0}).ok());
  }
  ASSERT_TRUE(dp_->lb4_backends().Delete(9).ok());

  Registry r;
  AddDatapathCollector(r, bpffs_->path());
  std::string text = r.Expose();
  EXPECT_THAT(text, HasSubstr("sluice_drop_count_total{reason=\"spoofed_source\","
                              "direction=\"egress\"} 7\n"))
      << text;
  EXPECT_THAT(text, HasSubstr("sluice_drop_bytes_total{reason=\"spoofed_source\","
                              "direction=\"egress\"} 700\n"));
  EXPECT_THAT(text, HasSubstr("sluice_drop_count_total{reason=\"spoofed_source\","
                              "direction=\"ingress\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("sluice_drop_count_total{reason=\"service_rejected\","
                              "direction=\"ingress\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("sluice_drop_bytes_total{reason=\"service_rejected\","
                              "direction=\"ingress\"} 20\n"));
  EXPECT_THAT(text, HasSubstr("sluice_drop_count_total{reason=\"policy_denied\","
                              "direction=\"ingress\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("sluice_drop_count_total{reason=\"policy_denied\","
                              "direction=\"egress\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE sluice_forward_packets_total counter\n"));
  EXPECT_THAT(text, HasSubstr("sluice_forward_packets_total{direction=\"net_ingress\"} 11\n"));
  EXPECT_THAT(text, HasSubstr("sluice_forward_bytes_total{direction=\"net_ingress\"} 1100\n"));
  for (const char* dir : {"pod_egress", "pod_ingress", "net_egress", "net_xdp"}) {
    EXPECT_THAT(
        text, HasSubstr(absl::StrCat("sluice_forward_packets_total{direction=\"", dir, "\"} 0\n")));
  }
  EXPECT_THAT(text, HasSubstr("sluice_bpf_map_entries{map_name=\"sluice_ep4\"} 1\n"));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("sluice_bpf_map_capacity{map_name=\"sluice_ep4\"} ",
                                           SLUICE_EP4_MAX_ENTRIES, "\n")));
  // Reason x direction: 32 reasons, 2 directions.
  EXPECT_THAT(text, HasSubstr("sluice_bpf_map_entries{map_name=\"sluice_lb4_be\"} 2\n"));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("sluice_bpf_map_capacity{map_name=\"sluice_lb4_be\"} ",
                                           SLUICE_LB4_BACKENDS_MAX_ENTRIES, "\n")));
  EXPECT_THAT(text, HasSubstr("sluice_bpf_map_capacity{map_name=\"sluice_drops\"} 64\n"));
  EXPECT_THAT(text, HasSubstr("sluice_bpf_map_capacity{map_name=\"sluice_forward\"} 5\n"));
  EXPECT_THAT(text, Not(HasSubstr("sluice_bpf_map_entries{map_name=\"sluice_drops\"}")));
  EXPECT_THAT(text, HasSubstr("sluice_datapath_conntrack_entries 0\n"));
  EXPECT_THAT(text, HasSubstr("sluice_policy_drop_count_total{direction=\"ingress\"} 0\n"));
}

TEST_F(DatapathMetricsTest, MapFillListsEveryPinnedMap) {
  auto fill = ReadMapFill(bpffs_->path());
  ASSERT_TRUE(fill.ok()) << fill.status();
  // Every pinned map but the ring buffer (sluice_events), which has bytes, not entries.
  EXPECT_EQ(fill->size(), maps::kMapCount - 1);
  for (const auto& f : *fill) EXPECT_NE(f.name, std::string(maps::name::sluice_events));
  auto none = ReadMapFill(bpffs_->path() + "/nothing-here");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST_F(DatapathMetricsTest, FailedUpdatesAreCountedPerMapAndErrno) {
  CountMapUpdateFailures();
  sluice_node_config cfg{};
  // sluice_node is an array of one: index 1 does not exist.
  EXPECT_FALSE(dp_->node_config().Update(1, cfg).ok());
  std::string text = Default().Expose();
  EXPECT_THAT(text, HasSubstr("sluice_bpf_map_update_errors_total{map_name=\"sluice_node\","
                              "errno=\"E2BIG\"} 1\n"))
      << text;
  maps::update_failure_hook.store(nullptr);
}

TEST_F(DatapathMetricsTest, DropWindowCountsOnlyWhatWasDroppedWithinTheLastMinute) {
  FakeClock clock;
  auto set_drops = [&](uint64_t packets) {
    std::vector<sluice_drop_count> per_cpu(dp_->drops().ncpus());
    per_cpu[0].packets = packets;
    ASSERT_TRUE(dp_->drops().Update(SLUICE_DROP_POLICY_DENIED, per_cpu).ok());
  };
  set_drops(100);  // before the agent started: never "recent"
  DropWindow w({.bpffs_root = bpffs_->path(), .clock = &clock, .sample_in_background = false});
  for (int i = 1; i <= 9; ++i) {  // 90 s, 10 more drops every 10 s
    clock.Advance(absl::Seconds(10));
    set_drops(100 + 10 * i);
    w.SampleNow();
  }
  DropWindow::Recent r = w.Get();
  EXPECT_EQ(r.span, absl::Seconds(60));
  EXPECT_EQ(r.packets["policy_denied"], 60u);
  EXPECT_FALSE(r.packets.contains("spoofed_source"));
  EXPECT_THAT(w.Json(), HasSubstr("\"windowSeconds\": 60"));
}

TEST(MapNameOfTest, RestoresNamesTheKernelCutTo15Characters) {
  EXPECT_EQ(MapNameOf("sluice_sock4_rn"), "sluice_sock4_rnat");
  EXPECT_EQ(MapNameOf("sluice_ct4"), "sluice_ct4");
  EXPECT_EQ(MapNameOf("other"), "other");
}

}  // namespace
}  // namespace sluice::metrics
