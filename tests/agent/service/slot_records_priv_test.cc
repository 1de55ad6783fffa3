// SlotRecords (agent/service/slot_records.h) over a real, small sluice_lb4_rec array: records are
// written before the master naming them is handed out, never changed while named, reused only
// after the quarantine, and taken over from the maps after a restart.

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <netinet/in.h>

#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "agent/base/fake_clock.h"
#include "agent/service/slot_records.h"
#include "gtest/gtest.h"

namespace sluice::agent {
namespace {

constexpr uint32_t kRecords = 4;  // records 1 to 3

sluice_lb4_key Key(uint32_t addr, uint16_t slot) {
  sluice_lb4_key k{};
  k.addr = htonl(addr);
  k.dport = htons(80);
  k.proto = IPPROTO_TCP;
  k.backend_slot = slot;
  return k;
}

sluice_lb4_service Master(uint16_t count) {
  sluice_lb4_service m{};
  m.count = count;
  m.rev_nat_id = 9;
  return m;
}

class SlotRecordsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int fd = bpf_map_create(BPF_MAP_TYPE_ARRAY, "sluice_lb4_rec", sizeof(uint32_t),
                            sizeof(sluice_lb4_slot_record), kRecords, nullptr);
    ASSERT_GE(fd, 0) << "bpf_map_create: " << strerror(errno);
    map_ = maps::Lb4SlotRecordMap(maps::MapFd(fd));
    records_ = std::make_unique<SlotRecords>(map_, &clock_);
  }

  // Writes a frontend's slots 1..ids.size() and its master, as BpfLbMaps hands them over, then
  // takes the masters to write and reports them all written. Returns the record each names.
  std::vector<uint32_t> Publish(
      const std::vector<std::pair<uint32_t, std::vector<uint32_t>>>& fes) {
    for (const auto& [addr, ids] : fes) {
      for (size_t s = 0; s < ids.size(); ++s) records_->SlotWritten(Key(addr, s + 1), ids[s]);
      records_->MasterWritten(Key(addr, 0), Master(ids.size()));
    }
    std::vector<uint32_t> named;
    for (const auto& [key, v] : records_->TakeMasters()) named.push_back(v.backend_id);
    records_->MastersWritten(named.size());
    return named;
  }

  std::vector<uint32_t> Ids(uint32_t record, size_t n) {
    auto r = map_.Lookup(record);
    if (!r.ok()) return {};
    return std::vector<uint32_t>(r->backend_id, r->backend_id + n);
  }

  FakeClock clock_;
  maps::Lb4SlotRecordMap map_;
  std::unique_ptr<SlotRecords> records_;
};

TEST_F(SlotRecordsTest, AMasterNamesARecordOfItsSlotsWrittenBeforeItIsHandedOut) {
  auto named = Publish({{0x0a60000a, {5, 6, 7}}});
  ASSERT_EQ(named.size(), 1u);
  ASSERT_NE(named[0], 0u);
  EXPECT_EQ(Ids(named[0], 3), (std::vector<uint32_t>{5, 6, 7}));
  // The same master and slots again keep the record.
  EXPECT_EQ(Publish({{0x0a60000a, {5, 6, 7}}}), named);
  EXPECT_EQ(records_->stats().named, 1u);
}

TEST_F(SlotRecordsTest, ChangedSlotsGetANewRecordAndTheOldOneStaysAsItWasUntilItsQuarantineEnds) {
  const uint32_t first = Publish({{0x0a60000a, {5, 6, 7}}})[0];
  // A slot rewritten without its master: the master is written again, with a new record.
  records_->SlotWritten(Key(0x0a60000a, 2), 8);
  auto masters = records_->TakeMasters();
  ASSERT_EQ(masters.size(), 1u);
  const uint32_t second = masters[0].second.backend_id;
  records_->MastersWritten(1);
  ASSERT_NE(second, 0u);
  ASSERT_NE(second, first);
  EXPECT_EQ(Ids(second, 3), (std::vector<uint32_t>{5, 8, 7}));
  EXPECT_EQ(Ids(first, 3), (std::vector<uint32_t>{5, 6, 7})) << "a retired record was changed";
  EXPECT_EQ(records_->stats().retired, 1u);

  // One record is left; then none until the first retired one's quarantine ends.
  EXPECT_NE(Publish({{0x0a60000b, {1}}})[0], 0u);
  clock_.Advance(absl::Seconds(SLUICE_LB4_REC_QUARANTINE_S) - absl::Milliseconds(1));
  EXPECT_EQ(Publish({{0x0a60000c, {2}}}), (std::vector<uint32_t>{0}))
      << "a record reused before its quarantine ended";
  EXPECT_EQ(Ids(first, 3), (std::vector<uint32_t>{5, 6, 7}));
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_EQ(Publish({{0x0a60000c, {2}}}), (std::vector<uint32_t>{first}));
  EXPECT_EQ(Ids(first, 1), (std::vector<uint32_t>{2}));
}

TEST_F(SlotRecordsTest, FrontendsWithoutUsableSlotsNameNoRecord) {
  std::vector<uint32_t> many(SLUICE_LB4_RECORD_SLOTS + 1, 3);
  EXPECT_EQ(Publish({{0x0a600001, {}}, {0x0a600002, many}}), (std::vector<uint32_t>{0, 0}));
  // A master counting a slot that was never written.
  records_->SlotWritten(Key(0x0a600003, 1), 4);
  records_->MasterWritten(Key(0x0a600003, 0), Master(2));
  auto masters = records_->TakeMasters();
  ASSERT_EQ(masters.size(), 1u);
  EXPECT_EQ(masters[0].second.backend_id, 0u);
  records_->MastersWritten(1);
  EXPECT_EQ(records_->stats().named, 0u);
}

TEST_F(SlotRecordsTest, AMasterThatWasNotWrittenKeepsItsOldRecordAndIsWrittenAgain) {
  const uint32_t first = Publish({{0x0a60000a, {5, 6}}})[0];
  records_->SlotWritten(Key(0x0a60000a, 1), 9);
  auto masters = records_->TakeMasters();
  ASSERT_EQ(masters.size(), 1u);
  const uint32_t fresh = masters[0].second.backend_id;
  records_->MastersWritten(0);  // the batch failed before the master
  EXPECT_EQ(records_->stats().retired, 0u) << "the map's master still names its record";
  masters = records_->TakeMasters();
  ASSERT_EQ(masters.size(), 1u) << "the master is held for the next flush";
  EXPECT_NE(masters[0].second.backend_id, first);
  EXPECT_EQ(Ids(masters[0].second.backend_id, 2), (std::vector<uint32_t>{9, 6}));
  records_->MastersWritten(1);
  EXPECT_EQ(records_->stats().named, 1u);
  (void)fresh;
}

TEST_F(SlotRecordsTest, ARestartKeepsRecordsThatHoldTheirSlotsAndRewritesTheOthers) {
  // What the maps hold after the last agent: master A names record 1 (matching), B names record
  // 2 (holding other ids), C names none (an agent without records), D names record 1 (A's).
  sluice_lb4_slot_record rec{};
  rec.backend_id[0] = 5;
  rec.backend_id[1] = 6;
  ASSERT_TRUE(map_.Update(1, rec).ok());
  rec.backend_id[0] = 99;
  ASSERT_TRUE(map_.Update(2, rec).ok());
  auto master = [](uint16_t count, uint32_t record) {
    sluice_lb4_service m = Master(count);
    m.backend_id = record;
    return m;
  };
  sluice_lb4_service slot{};
  records_->BeginRestore();
  for (uint32_t addr : {0x0a60000aU, 0x0a60000bU, 0x0a60000cU, 0x0a60000dU}) {
    slot.backend_id = 5;
    EXPECT_EQ(records_->Restored(Key(addr, 1), slot).backend_id, 5u);
    slot.backend_id = 6;
    records_->Restored(Key(addr, 2), slot);
  }
  // The reconciler sees masters without their records.
  EXPECT_EQ(records_->Restored(Key(0x0a60000a, 0), master(2, 1)).backend_id, 0u);
  EXPECT_EQ(records_->Restored(Key(0x0a60000b, 0), master(2, 2)).backend_id, 0u);
  EXPECT_EQ(records_->Restored(Key(0x0a60000c, 0), master(2, 0)).backend_id, 0u);
  records_->Restored(Key(0x0a60000d, 0), master(2, 1));
  records_->EndRestore();

  // One of A and D keeps record 1 (both hold 5, 6: whichever came first); the other, B and C
  // are written at the next flush. Record 3 was free; record 2 (B's) is retired once B stops
  // naming it.
  auto masters = records_->TakeMasters();
  ASSERT_EQ(masters.size(), 3u);
  std::map<uint32_t, uint32_t> got;
  for (const auto& [key, v] : masters) got[ntohl(key.addr)] = v.backend_id;
  EXPECT_TRUE(got.contains(0x0a60000b));
  EXPECT_TRUE(got.contains(0x0a60000c));
  EXPECT_NE(got.contains(0x0a60000a), got.contains(0x0a60000d));
  EXPECT_EQ(records_->stats().retired, 0u);
  records_->MastersWritten(masters.size());
  EXPECT_EQ(records_->stats().retired, 1u) << "record 2, once B stopped naming it";
  int with_record = 0;
  for (const auto& [addr, record] : got) {
    if (record == 0) continue;  // three masters, one free record
    ++with_record;
    EXPECT_EQ(record, 3u) << std::hex << addr;
    EXPECT_EQ(Ids(record, 2), (std::vector<uint32_t>{5, 6}));
  }
  EXPECT_EQ(with_record, 1);
  EXPECT_EQ(Ids(1, 2), (std::vector<uint32_t>{5, 6})) << "A's record was changed";
}

}  // namespace
}  // namespace sluice::agent
