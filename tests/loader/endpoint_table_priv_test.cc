// loader::EndpointTable on real maps: sluice_ep4 and its index (sluice_ep4_slot, sluice_ep4_rec)
// kept in step through writes, slot collisions, record reuse after the quarantine, and a restart
// that finds the maps in any state.
#include <arpa/inet.h>

#include <cstring>
#include <memory>

#include "agent/base/fake_clock.h"
#include "gtest/gtest.h"
#include "loader/datapath.h"
#include "loader/endpoint_table.h"
#include "support/fixture.h"

namespace sluice::testing {
namespace {

sluice_endpoint Endpoint(uint32_t ifindex, uint32_t id) {
  sluice_endpoint e{};
  e.ifindex = ifindex;
  e.endpoint_id = id;
  e.mac[0] = 0x02;
  e.mac[5] = static_cast<uint8_t>(id);
  return e;
}

bool Same(const sluice_endpoint& a, const sluice_endpoint& b) {
  return std::memcmp(&a, &b, sizeof(a)) == 0;
}

class EndpointTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dp = loader::Datapath::Load(fs_.path());
    ASSERT_TRUE(dp.ok()) << dp.status();
    dp_ = std::move(*dp);
    table_ = NewTable();
  }
  std::unique_ptr<loader::EndpointTable> NewTable() {
    return std::make_unique<loader::EndpointTable>(dp_->endpoints(), dp_->ep4_slots(),
                                                   dp_->ep4_records(), &clock_);
  }
  // What the programs find for addr through the index: its record, or nothing.
  std::optional<sluice_endpoint> Indexed(uint32_t addr) {
    auto ref = dp_->ep4_slots().Lookup(loader::EndpointTable::SlotOf(addr));
    if (!ref.ok() || ref->addr != addr) return std::nullopt;
    auto rec = dp_->ep4_records().Lookup(ref->rec);
    if (!rec.ok()) return std::nullopt;
    return *rec;
  }
  uint32_t RecordOf(uint32_t addr) {
    return dp_->ep4_slots().Lookup(loader::EndpointTable::SlotOf(addr))->rec;
  }
  bool InHash(uint32_t addr) { return dp_->endpoints().Lookup(sluice_ep4_key{addr}).ok(); }

  ScratchBpffs fs_;
  std::unique_ptr<loader::Datapath> dp_;
  std::unique_ptr<loader::EndpointTable> table_;
  FakeClock clock_;
};

TEST_F(EndpointTableTest, AnEndpointIsIndexedWithItsValueAndLeavesBothMapsOnDelete) {
  const uint32_t a = Ip4("10.244.0.10");
  ASSERT_TRUE(table_->Upsert(a, Endpoint(7, 1)).ok());
  ASSERT_TRUE(InHash(a));
  auto got = Indexed(a);
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(Same(*got, Endpoint(7, 1)));

  ASSERT_TRUE(table_->Delete(a).ok());
  EXPECT_FALSE(InHash(a));
  EXPECT_FALSE(dp_->ep4_slots().Lookup(loader::EndpointTable::SlotOf(a)).ok()) << "slot freed";
  ASSERT_TRUE(table_->Delete(a).ok()) << "a second delete is not an error";
}

TEST_F(EndpointTableTest, AChangedEndpointGetsANewRecordAndTheOldOneIsLeftAsItWas) {
  const uint32_t a = Ip4("10.244.0.10");
  ASSERT_TRUE(table_->Upsert(a, Endpoint(7, 1)).ok());
  const uint32_t first = RecordOf(a);
  ASSERT_TRUE(table_->Upsert(a, Endpoint(7, 1)).ok());
  EXPECT_EQ(RecordOf(a), first) << "an unchanged value is not written again";
  ASSERT_TRUE(table_->Upsert(a, Endpoint(9, 1)).ok());
  EXPECT_NE(RecordOf(a), first);
  EXPECT_TRUE(Same(*Indexed(a), Endpoint(9, 1)));
  // A program that read the slot before the change still reads the value it named.
  EXPECT_TRUE(Same(*dp_->ep4_records().Lookup(first), Endpoint(7, 1)));
}

TEST_F(EndpointTableTest, ARetiredRecordIsWrittenAgainOnlyAfterTheQuarantine) {
  const uint32_t a = Ip4("10.244.0.10");
  // Every change takes a fresh record while the clock stands still (records 1 .. RECS - 1; 0 is
  // never named); the first one retired is the oldest in the queue.
  ASSERT_TRUE(table_->Upsert(a, Endpoint(1, 1)).ok());
  const uint32_t first = RecordOf(a);
  EXPECT_NE(first, 0u);
  for (uint32_t i = 2; i < SLUICE_EP4_RECS; ++i)
    ASSERT_TRUE(table_->Upsert(a, Endpoint(i, 1)).ok());
  EXPECT_TRUE(Same(*Indexed(a), Endpoint(SLUICE_EP4_RECS - 1, 1)));

  // No record left: the slot must not keep naming the old value; sluice_ep4 has the new one.
  ASSERT_TRUE(table_->Upsert(a, Endpoint(5000000, 1)).ok());
  EXPECT_FALSE(Indexed(a).has_value());
  EXPECT_EQ(dp_->endpoints().Lookup(sluice_ep4_key{a})->ifindex, 5000000u);
  EXPECT_EQ(table_->stats().unindexed, 1u);
  EXPECT_TRUE(Same(*dp_->ep4_records().Lookup(first), Endpoint(1, 1))) << "untouched so far";

  clock_.Advance(absl::Seconds(SLUICE_EP4_REC_QUARANTINE_S) - absl::Milliseconds(1));
  ASSERT_TRUE(table_->Upsert(a, Endpoint(5000001, 1)).ok());
  EXPECT_FALSE(Indexed(a).has_value()) << "reused before the quarantine ended";

  clock_.Advance(absl::Milliseconds(1));
  ASSERT_TRUE(table_->Upsert(a, Endpoint(5000002, 1)).ok());
  ASSERT_TRUE(Indexed(a).has_value());
  EXPECT_EQ(RecordOf(a), first);
  EXPECT_TRUE(Same(*Indexed(a), Endpoint(5000002, 1)));
  EXPECT_EQ(table_->stats().unindexed, 0u);
}

TEST_F(EndpointTableTest, AnAddressWhoseSlotIsTakenGetsItWhenItsOwnerLeaves) {
  const uint32_t b = Ip4("10.244.0.11"), c = Ip4("10.244.16.11");  // the same slot
  ASSERT_EQ(loader::EndpointTable::SlotOf(b), loader::EndpointTable::SlotOf(c));
  ASSERT_TRUE(table_->Upsert(b, Endpoint(7, 2)).ok());
  ASSERT_TRUE(table_->Upsert(c, Endpoint(8, 3)).ok());
  EXPECT_TRUE(InHash(c));
  EXPECT_FALSE(Indexed(c).has_value());
  EXPECT_TRUE(Same(*Indexed(b), Endpoint(7, 2)));
  EXPECT_EQ(table_->stats().indexed, 1u);
  EXPECT_EQ(table_->stats().unindexed, 1u);

  ASSERT_TRUE(table_->Delete(b).ok());
  EXPECT_FALSE(InHash(b));
  ASSERT_TRUE(Indexed(c).has_value());
  EXPECT_TRUE(Same(*Indexed(c), Endpoint(8, 3)));
  EXPECT_EQ(table_->stats().unindexed, 0u);
}

// A restart (or the first start after programs without the index) finds the maps as the last
// run left them, possibly half-written: what names the current value is kept, the rest freed, and
// what sluice_ep4 holds alone is indexed.
TEST_F(EndpointTableTest, RebuildKeepsRightSlotsFreesWrongOnesAndIndexesTheRest) {
  const uint32_t kept = Ip4("10.244.0.10"), changed = Ip4("10.244.0.11"), gone = Ip4("10.244.0.12"),
                 fresh = Ip4("10.244.0.13");
  ASSERT_TRUE(table_->Upsert(kept, Endpoint(7, 1)).ok());
  ASSERT_TRUE(table_->Upsert(changed, Endpoint(8, 2)).ok());
  ASSERT_TRUE(table_->Upsert(gone, Endpoint(9, 3)).ok());
  const uint32_t kept_rec = RecordOf(kept);
  const uint32_t gone_slot = loader::EndpointTable::SlotOf(gone);
  // Behind the table's back, as a crash between two writes could leave it: sluice_ep4 changed
  // or lost an entry the index still names, and holds one the index never saw.
  ASSERT_TRUE(dp_->endpoints().Update(sluice_ep4_key{changed}, Endpoint(80, 2)).ok());
  ASSERT_TRUE(dp_->endpoints().Delete(sluice_ep4_key{gone}).ok());
  ASSERT_TRUE(dp_->endpoints().Update(sluice_ep4_key{fresh}, Endpoint(10, 4)).ok());
  // And a slot naming record 0, which programs never follow.
  const uint32_t zero = Ip4("10.244.0.14");
  ASSERT_TRUE(table_->Upsert(zero, Endpoint(11, 5)).ok());
  ASSERT_TRUE(dp_->ep4_slots().Update(loader::EndpointTable::SlotOf(zero), {zero, 0}).ok());

  auto restarted = NewTable();
  ASSERT_TRUE(restarted->Rebuild().ok());
  EXPECT_EQ(RecordOf(kept), kept_rec) << "a right slot is left as it is";
  EXPECT_TRUE(Same(*Indexed(kept), Endpoint(7, 1)));
  EXPECT_TRUE(Same(*Indexed(changed), Endpoint(80, 2)));
  EXPECT_FALSE(dp_->ep4_slots().Lookup(gone_slot).ok());
  EXPECT_TRUE(Same(*Indexed(fresh), Endpoint(10, 4)));
  EXPECT_NE(RecordOf(zero), 0u);
  EXPECT_TRUE(Same(*Indexed(zero), Endpoint(11, 5)));
  EXPECT_EQ(restarted->stats().indexed, 4u);

  // The rebuilt table goes on from there.
  ASSERT_TRUE(restarted->Delete(kept).ok());
  EXPECT_FALSE(Indexed(kept).has_value());
  EXPECT_FALSE(InHash(kept));
}

// Loading the datapath over the pins of an earlier run rebuilds the index from sluice_ep4.
TEST_F(EndpointTableTest, ALoadIndexesWhatSluiceEp4Holds) {
  const uint32_t a = Ip4("10.244.0.10");
  ASSERT_TRUE(dp_->endpoints().Update(sluice_ep4_key{a}, Endpoint(7, 1)).ok());
  EXPECT_FALSE(Indexed(a).has_value());
  table_.reset();
  dp_.reset();
  auto dp = loader::Datapath::Load(fs_.path());
  ASSERT_TRUE(dp.ok()) << dp.status();
  dp_ = std::move(*dp);
  ASSERT_TRUE(Indexed(a).has_value());
  EXPECT_TRUE(Same(*Indexed(a), Endpoint(7, 1)));
}

}  // namespace
}  // namespace sluice::testing
