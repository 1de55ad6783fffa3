// Watch-stream and list-body framing independent of chunk boundaries.
#include "agent/k8s/framing.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::k8s {
namespace {

using ::testing::ElementsAre;

// Events with braces, brackets, escaped quotes, backslashes and newlines inside strings.
const std::vector<std::string> kEvents = {
    R"({"type":"ADDED","object":{"metadata":{"name":"a{b","annotations":{"x":"}\"]\\"}}}})",
    R"({"type":"MODIFIED","object":{"metadata":{"name":"c"},"spec":{"l":[1,[2,{"d":"\n"}]]}}})",
    R"({"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"9"}}})",
};

std::string Stream() {
  std::string s;
  for (const auto& e : kEvents) s += e + "\n";
  return s;
}

std::vector<std::string> FeedAll(EventFramer& f, const std::vector<std::string_view>& chunks) {
  std::vector<std::string> out;
  for (auto c : chunks) {
    absl::Status st = f.Feed(c, [&](std::string_view obj) {
      out.emplace_back(obj);
      return absl::OkStatus();
    });
    EXPECT_TRUE(st.ok()) << st;
  }
  return out;
}

TEST(EventFramerTest, SplitAtEveryBytePosition) {
  const std::string s = Stream();
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    EventFramer f;
    auto out = FeedAll(f, {std::string_view(s).substr(0, cut), std::string_view(s).substr(cut)});
    EXPECT_EQ(out, kEvents) << "cut at " << cut;
    EXPECT_FALSE(f.HasPartial());
  }
}

TEST(EventFramerTest, SplitAtEveryPairOfPositions) {
  const std::string s = Stream();
  for (size_t a = 0; a <= s.size(); a += 3) {
    for (size_t b = a; b <= s.size(); b += 5) {
      EventFramer f;
      std::string_view v(s);
      auto out = FeedAll(f, {v.substr(0, a), v.substr(a, b - a), v.substr(b)});
      ASSERT_EQ(out, kEvents) << a << "," << b;
    }
  }
}

TEST(EventFramerTest, OneByteAtATime) {
  const std::string s = Stream();
  EventFramer f;
  std::vector<std::string_view> chunks;
  for (size_t i = 0; i < s.size(); ++i) chunks.push_back(std::string_view(s).substr(i, 1));
  EXPECT_EQ(FeedAll(f, chunks), kEvents);
}

TEST(EventFramerTest, SeveralEventsPerChunkWithoutNewlines) {
  std::string s = kEvents[0] + kEvents[1] + "\r\n  " + kEvents[2];
  EventFramer f;
  EXPECT_EQ(FeedAll(f, {s}), kEvents);
}

TEST(EventFramerTest, StreamCutMidEventDeliversNothingBogus) {
  const std::string s = Stream();
  const size_t second_start = kEvents[0].size() + 1;
  for (size_t cut = second_start + 1; cut < second_start + kEvents[1].size(); ++cut) {
    EventFramer f;
    auto out = FeedAll(f, {std::string_view(s).substr(0, cut)});
    ASSERT_THAT(out, ElementsAre(kEvents[0])) << cut;
    EXPECT_TRUE(f.HasPartial());
  }
}

TEST(EventFramerTest, GarbageBetweenEventsIsAnError) {
  EventFramer f;
  absl::Status st = f.Feed(kEvents[0] + "\nxyz\n", [](std::string_view) { return absl::OkStatus(); });
  EXPECT_FALSE(st.ok());
}

TEST(EventFramerTest, OversizedEventIsAnError) {
  EventFramer f(16);
  EXPECT_FALSE(f.Feed(kEvents[0], [](std::string_view) { return absl::OkStatus(); }).ok());
}

TEST(ListFramerTest, ItemsAndMetadataAtEverySplit) {
  const std::string body =
      R"({"kind":"XList","apiVersion":"v1","metadata":{"resourceVersion":"5","continue":"c]"},)"
      R"("weird":{"items":[{"no":1}]},"items":[{"a":"}"},{"b":[{"c":1}]},{}]})";
  for (size_t cut = 0; cut <= body.size(); ++cut) {
    ListFramer f;
    std::vector<std::string> items;
    std::string meta;
    ListFramer::Callbacks cb;
    cb.on_metadata = [&](std::string_view m) {
      meta = std::string(m);
      return absl::OkStatus();
    };
    cb.on_item = [&](std::string_view i) {
      items.emplace_back(i);
      return absl::OkStatus();
    };
    ASSERT_TRUE(f.Feed(std::string_view(body).substr(0, cut), cb).ok());
    ASSERT_TRUE(f.Feed(std::string_view(body).substr(cut), cb).ok());
    ASSERT_TRUE(f.Finish().ok());
    EXPECT_EQ(meta, R"({"resourceVersion":"5","continue":"c]"})");
    EXPECT_THAT(items, ElementsAre(R"({"a":"}"})", R"({"b":[{"c":1}]})", "{}")) << cut;
  }
}

TEST(ListFramerTest, TruncatedBodyFailsFinish) {
  ListFramer f;
  ListFramer::Callbacks cb;
  int items = 0;
  cb.on_item = [&](std::string_view) {
    ++items;
    return absl::OkStatus();
  };
  ASSERT_TRUE(f.Feed(R"({"items":[{"a":1},{"b":)", cb).ok());
  EXPECT_EQ(items, 1);
  EXPECT_FALSE(f.Finish().ok());
}

}  // namespace
}  // namespace sluice::k8s
