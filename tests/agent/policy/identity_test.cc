#include "agent/policy/identity.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "support/temp_dir.h"

namespace sluice::agent {
namespace {

using ::testing::ElementsAre;

const LabelSet kA = {"k8s:app=a", "k8s:io.kubernetes.pod.namespace=x"};
const LabelSet kB = {"k8s:app=b", "k8s:io.kubernetes.pod.namespace=x"};
const LabelSet kC = {"k8s:app=c", "k8s:io.kubernetes.pod.namespace=x"};

TEST(IdentityTest, ReservedIdentitiesAreFixedAndNeverNumberedDynamically) {
  IdentityAllocator ids;
  ASSERT_TRUE(ids.Assign({ReservedLabels(SLUICE_IDENTITY_WORLD), kA}).ok());
  EXPECT_EQ(ids.Find({"reserved:host"}), SLUICE_IDENTITY_HOST);
  EXPECT_EQ(ids.Find({"reserved:world"}), SLUICE_IDENTITY_WORLD);
  EXPECT_EQ(ids.Find({"reserved:unmanaged"}), SLUICE_IDENTITY_UNMANAGED);
  EXPECT_EQ(ids.Find({"reserved:remote-node"}), SLUICE_IDENTITY_REMOTE_NODE);
  EXPECT_EQ(ids.size(), 1u);
  EXPECT_EQ(ids.Find(kA), SLUICE_IDENTITY_MIN_DYNAMIC);
  ASSERT_NE(ids.Labels(SLUICE_IDENTITY_HOST), nullptr);
  EXPECT_THAT(*ids.Labels(SLUICE_IDENTITY_HOST), ElementsAre("reserved:host"));
  EXPECT_EQ(ids.Labels(9999), nullptr);
}

TEST(IdentityTest, NumbersStayWhileTheLabelSetIsWantedAndAreNotReusedAtOnce) {
  IdentityAllocator ids;
  ASSERT_TRUE(ids.Assign({kA, kB}).ok());
  const uint32_t a = *ids.Find(kA), b = *ids.Find(kB);
  EXPECT_EQ(a, 256u);  // sorted order: kA < kB
  EXPECT_EQ(b, 257u);
  ASSERT_TRUE(ids.Assign({kB, kC}).ok());  // kA released, kC new
  EXPECT_EQ(ids.Find(kA), std::nullopt);
  EXPECT_EQ(ids.Find(kB), b);
  EXPECT_EQ(ids.Find(kC), 258u);  // not a's old number
  ASSERT_TRUE(ids.Assign({kA, kB, kC}).ok());
  EXPECT_EQ(ids.Find(kA), 259u);
  EXPECT_EQ(ids.Find(kB), b);
}

TEST(IdentityTest, FullRangeIsResourceExhaustedAndWrapsAroundToFreedNumbers) {
  IdentityAllocator ids(300, 301);
  ASSERT_TRUE(ids.Assign({kA, kB}).ok());
  absl::Status st = ids.Assign({kA, kB, kC});
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_EQ(ids.Find(kC), std::nullopt);
  EXPECT_EQ(ids.Find(kA), 300u);
  ASSERT_TRUE(ids.Assign({kB, kC}).ok());  // kA's number is free again
  EXPECT_EQ(ids.Find(kC), 300u);
  EXPECT_EQ(ids.Find(kB), 301u);
}

TEST(IdentityTest, RestoreKeepsNumbersAndContinuesAfterTheHighest) {
  IdentityAllocator ids;
  ASSERT_TRUE(ids.Restore({{700, kB}, {300, kA}}).ok());
  ASSERT_TRUE(ids.Assign({kA, kB, kC}).ok());
  EXPECT_EQ(ids.Find(kA), 300u);
  EXPECT_EQ(ids.Find(kB), 700u);
  EXPECT_EQ(ids.Find(kC), 701u);
  EXPECT_THAT(ids.Records(), ElementsAre(IdentityRecord{300, kA}, IdentityRecord{700, kB},
                                         IdentityRecord{701, kC}));
}

TEST(IdentityTest, RestoreRejectsBadRecords) {
  struct Case {
    const char* name;
    std::vector<IdentityRecord> records;
  };
  const Case cases[] = {
      {"reserved number", {{2, kA}}},
      {"above the range", {{SLUICE_IDENTITY_MAX_DYNAMIC + 1, kA}}},
      {"number twice", {{300, kA}, {300, kB}}},
      {"labels twice", {{300, kA}, {301, kA}}},
      {"unsorted labels", {{300, {"k8s:z=1", "k8s:a=1"}}}},
      {"reserved labels", {{300, {"reserved:world"}}}},
  };
  for (const Case& c : cases) {
    IdentityAllocator ids;
    EXPECT_FALSE(ids.Restore(c.records).ok()) << c.name;
    EXPECT_EQ(ids.size(), 0u) << c.name;
  }
}

TEST(IdentityTest, StateFileRoundTripsAndAbsentFileIsEmpty) {
  testing::TempDir dir("sluice-identity");
  auto empty = LoadIdentities(dir.path());
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->empty());

  IdentityAllocator ids;
  ASSERT_TRUE(ids.Assign({kA, kB}).ok());
  ASSERT_TRUE(SaveIdentities(dir.path(), ids.Records()).ok());
  auto loaded = LoadIdentities(dir.path());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded, ids.Records());

  IdentityAllocator restarted;
  ASSERT_TRUE(restarted.Restore(*loaded).ok());
  EXPECT_EQ(restarted.Find(kA), ids.Find(kA));
  EXPECT_EQ(restarted.Find(kB), ids.Find(kB));
}

TEST(IdentityTest, StateFileKeepsQuotesBackslashesControlAndNonAsciiBytes) {
  // Label text the state file must carry through unchanged (the file is written by hand).
  const LabelSet odd = {"k8s:a=\"quoted\"", "k8s:b=back\\slash", "k8s:c=line\nbreak\t\x01",
                        "k8s:d=\xc3\xa9t\xc3\xa9 \xe2\x80\xa8", "k8s:e="};
  std::vector<IdentityRecord> records = {{300, odd}, {301, {}}, {302, kA}};
  auto back = IdentitiesFromJson(IdentitiesToJson(records));
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << IdentitiesToJson(records);
  EXPECT_EQ(*back, records);
  auto none = IdentitiesFromJson(IdentitiesToJson({}));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
}

TEST(IdentityTest, GenerationMovesExactlyWhenNumbersChange) {
  IdentityAllocator ids;
  const uint64_t g0 = ids.generation();
  ASSERT_TRUE(ids.Assign({kA, kB}).ok());
  const uint64_t g1 = ids.generation();
  EXPECT_NE(g1, g0);
  ASSERT_TRUE(ids.Assign({kA, kB}).ok());  // the same sets: nothing to write
  EXPECT_EQ(ids.generation(), g1);
  ASSERT_TRUE(ids.Assign({kA}).ok());  // a release
  const uint64_t g2 = ids.generation();
  EXPECT_NE(g2, g1);
  ASSERT_TRUE(ids.Assign({kA, kC}).ok());  // a new number
  EXPECT_NE(ids.generation(), g2);
  // The pointer form walks both sorted lists: the same numbers as the set form.
  IdentityAllocator by_set, by_ptr;
  ASSERT_TRUE(by_set.Assign({kA, kB, kC}).ok());
  std::vector<const LabelSet*> sorted = {&kA, &kB, &kC};
  std::sort(sorted.begin(), sorted.end(), [](auto* x, auto* y) { return *x < *y; });
  ASSERT_TRUE(by_ptr.Assign(sorted).ok());
  EXPECT_EQ(by_ptr.Records(), by_set.Records());
  sorted = {&kC};
  ASSERT_TRUE(by_ptr.Assign(sorted).ok());
  ASSERT_TRUE(by_set.Assign({kC}).ok());
  EXPECT_EQ(by_ptr.Records(), by_set.Records());
}

TEST(IdentityTest, CorruptStateFileIsAnError) {
  for (const char* text : {"", "[]", R"({"identities":[{"id":"x","labels":[]}]})",
                           R"({"identities":[{"id":300,"labels":[1]}]})"}) {
    EXPECT_FALSE(IdentitiesFromJson(text).ok()) << text;
  }
}

}  // namespace
}  // namespace sluice::agent
