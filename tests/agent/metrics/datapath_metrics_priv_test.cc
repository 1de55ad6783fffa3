// The scrape-time collector over real pinned maps: drops summed over CPUs, entries and capacity
// per map (arrays left out of pressure, a slot array's used slots counted), conntrack entries, and
// the agent's failed map writes counted per map through maps::update_failure_hook.
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/base/fake_clock.h"
#include "agent/metrics/datapath_metrics.h"
#include "agent/metrics/drop_window.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "support/eventually.h"
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

// Fills a pinned hash map, LPM trie or map of maps to max_entries with distinct keys (an LPM
// trie's at full prefix length) and zero values (a map of maps: one small inner table); returns
// the keys written. An LRU may evict a few of its own.
uint64_t FillMap(const std::string& bpffs_root, const char* name) {
  int fd = bpf_obj_get(maps::PinPath(bpffs_root, name).c_str());
  if (fd < 0) return 0;
  bpf_map_info info{};
  uint32_t len = sizeof(info);
  EXPECT_EQ(bpf_obj_get_info_by_fd(fd, &info, &len), 0);
  const bool lpm = info.type == BPF_MAP_TYPE_LPM_TRIE;
  // A map of maps (sluice_lb4_mag) holds inner maps: every entry gets the same small table (its
  // inner maps may differ in size, BPF_F_INNER_MAP).
  const bool of_maps = info.type == BPF_MAP_TYPE_HASH_OF_MAPS;
  int inner = -1;
  if (of_maps) {
    LIBBPF_OPTS(bpf_map_create_opts, opts, .map_flags = BPF_F_INNER_MAP);
    inner = bpf_map_create(BPF_MAP_TYPE_ARRAY, "fill_inner", 4, 4, 2, &opts);
    EXPECT_GE(inner, 0) << name << ": inner table: " << strerror(errno);
  }
  const bool percpu =
      info.type == BPF_MAP_TYPE_PERCPU_HASH || info.type == BPF_MAP_TYPE_LRU_PERCPU_HASH;
  const size_t value_size =
      percpu ? ((info.value_size + 7) / 8 * 8) * libbpf_num_possible_cpus() : info.value_size;
  constexpr uint32_t kBatch = 8192;
  std::vector<uint8_t> keys(static_cast<size_t>(kBatch) * info.key_size);
  std::vector<uint8_t> values(kBatch * value_size, 0);
  uint64_t written = 0;
  for (uint32_t i = 0; i < info.max_entries;) {
    const uint32_t n = std::min(kBatch, info.max_entries - i);
    std::fill(keys.begin(), keys.end(), 0);
    for (uint32_t j = 0; j < n; ++j) {
      uint8_t* k = &keys[static_cast<size_t>(j) * info.key_size];
      const uint32_t id = htonl(i + j);
      if (lpm) {
        const uint32_t prefixlen = (info.key_size - 4) * 8;
        memcpy(k, &prefixlen, 4);
      }
      memcpy(k + info.key_size - 4, &id, 4);
    }
    if (lpm) {  // no batch operations on a trie
      for (uint32_t j = 0; j < n; ++j) {
        EXPECT_EQ(bpf_map_update_elem(fd, &keys[static_cast<size_t>(j) * info.key_size],
                                      values.data(), BPF_ANY),
                  0)
            << name << ": " << strerror(errno);
      }
    } else {
      if (of_maps) {  // batched: one RCU grace period a batch, not one an update
        for (uint32_t j = 0; j < n; ++j) {
          const uint32_t inner_fd = static_cast<uint32_t>(inner);
          memcpy(&values[static_cast<size_t>(j) * value_size], &inner_fd, sizeof(inner_fd));
        }
      }
      uint32_t count = n;
      EXPECT_EQ(bpf_map_update_batch(fd, keys.data(), values.data(), &count, nullptr), 0)
          << name << ": " << strerror(errno);
    }
    i += n;
    written += n;
  }
  if (inner >= 0) ::close(inner);
  ::close(fd);
  return written;
}

// A scrape with every hash map and trie full (4 M entries, sluice_policy4's million among them)
// answers well within Prometheus's timeout: the entries are counted off the scrape path, and
// once counted they are right.
TEST_F(DatapathMetricsTest, ScrapeStaysFastWithEveryMapFull) {
  uint64_t filled = 0;
  for (const char* name : maps::kAllMapNames) {
    bpf_map_info info{};
    uint32_t len = sizeof(info);
    int fd = bpf_obj_get(maps::PinPath(bpffs_->path(), name).c_str());
    ASSERT_GE(fd, 0) << name;
    ASSERT_EQ(bpf_obj_get_info_by_fd(fd, &info, &len), 0);
    ::close(fd);
    if (info.type == BPF_MAP_TYPE_ARRAY || info.type == BPF_MAP_TYPE_PERCPU_ARRAY ||
        info.type == BPF_MAP_TYPE_RINGBUF) {
      continue;
    }
    filled += FillMap(bpffs_->path(), name);
  }
  ASSERT_GE(filled, 4'000'000u);
  Registry r;
  AddDatapathCollector(r, bpffs_->path());
  absl::Duration slowest;
  int scrapes = 0;
  std::string text;
  const std::string policy4 = absl::StrCat("sluice_bpf_map_entries{map_name=\"sluice_policy4\"} ",
                                           SLUICE_POLICY4_MAX_ENTRIES, "\n");
  ASSERT_TRUE(sluice::testing::Eventually(
      [&] {
        const absl::Time start = absl::Now();
        text = r.Expose();
        slowest = std::max(slowest, absl::Now() - start);
        ++scrapes;
        return text.find(policy4) != std::string::npos;
      },
      absl::Minutes(3), absl::Milliseconds(500)))
      << text;
  // The bound is Prometheus's scrape budget with a margin: 1 s (a scrape waits 0.25 s at most for
  // a count under way).
  EXPECT_LT(slowest, absl::Seconds(1)) << scrapes << " scrapes";
  auto exact = ReadMapFill(bpffs_->path());
  ASSERT_TRUE(exact.ok()) << exact.status();
  uint64_t ct = 0;
  for (const MapFill& f : *exact) {
    if (f.is_array) continue;
    EXPECT_THAT(text, HasSubstr(absl::StrCat("sluice_bpf_map_entries{map_name=\"", f.name, "\"} ",
                                             f.entries, "\n")));
    if (f.type == BPF_MAP_TYPE_HASH || f.type == BPF_MAP_TYPE_LPM_TRIE) {
      EXPECT_EQ(f.entries, f.capacity) << f.name;
      EXPECT_THAT(
          text, HasSubstr(absl::StrCat("sluice_bpf_map_pressure{map_name=\"", f.name, "\"} 1\n")));
    }
    if (f.name == maps::name::sluice_ct4 || f.name == maps::name::sluice_ct4_any) ct += f.entries;
  }
  EXPECT_THAT(text, HasSubstr(absl::StrCat("sluice_datapath_conntrack_entries ", ct, "\n")));
  EXPECT_THAT(text, HasSubstr("# TYPE sluice_bpf_map_count_timestamp_seconds gauge\n"));
  std::cerr << "full maps: " << filled << " entries, " << scrapes << " scrapes, slowest "
            << absl::FormatDuration(slowest) << "\n";
}

TEST(MapNameOfTest, RestoresNamesTheKernelCutTo15Characters) {
  EXPECT_EQ(MapNameOf("sluice_sock4_rn"), "sluice_sock4_rnat");
  EXPECT_EQ(MapNameOf("sluice_ct4"), "sluice_ct4");
  EXPECT_EQ(MapNameOf("other"), "other");
}

}  // namespace
}  // namespace sluice::metrics
