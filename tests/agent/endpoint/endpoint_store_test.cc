#include "agent/endpoint/endpoint_store.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "support/eventually.h"
#include "support/temp_dir.h"

namespace sluice::agent {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::sluice::testing::TempDir;
using ::testing::IsEmpty;

class EndpointStoreTest : public ::testing::Test {
 protected:

  std::unique_ptr<EndpointStore> Open() {
    absl::StatusOr<std::unique_ptr<EndpointStore>> store = EndpointStore::Open(dir_);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }
  std::string EndpointsDir() const { return dir_ + "/endpoints"; }
  std::set<std::string> Files() const {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(EndpointsDir())) names.insert(e.path().filename());
    return names;
  }

  static Endpoint Make(std::string id, std::string ifname = "eth0") {
    Endpoint ep;
    ep.container_id = std::move(id);
    ep.ifname = std::move(ifname);
    ep.netns = "/var/run/netns/" + ep.container_id;
    ep.network_name = "sluice";
    ep.pod_namespace = "default";
    ep.pod_name = "web-" + ep.container_id;
    ep.host_ifname = HostInterfaceName(ep.container_id, ep.ifname);
    ep.host_ifindex = 42;
    ep.ipv4 = "10.244.0.5";
    ep.mac = "02:00:0a:f4:00:05";
    ep.host_mac = "02:00:00:00:00:01";
    ep.mtu = 1450;
    ep.created = absl::FromUnixMillis(1700000000123);
    return ep;
  }

  TempDir tmp_{"sluice-endpoints-test"};
  const std::string dir_ = tmp_.path();
};

TEST(HostInterfaceNameTest, IsSlcPlusElevenHexDigitsOfSha256) {
  // printf 'cid123/eth0' | sha256sum -> bf5e306f5bb92bf4...
  EXPECT_EQ(HostInterfaceName("cid123", "eth0"), "slcbf5e306f5bb");
  // Two SHA-256 blocks: printf '<64 x>/eth0' | sha256sum -> bd7b91f19b12...
  EXPECT_EQ(HostInterfaceName(std::string(64, 'x'), "eth0"), "slcbd7b91f19b1");
  // What agents before the "slc" prefix named it: the same digits after "lxc".
  EXPECT_EQ(LegacyHostInterfaceName("cid123", "eth0"), "lxcbf5e306f5bb");
  EXPECT_EQ(LegacyHostInterfaceName(std::string(64, 'x'), "eth0"), "lxcbd7b91f19b1");
  EXPECT_LE(HostInterfaceName("a", "b").size(), 15u);
  EXPECT_NE(HostInterfaceName("cid123", "eth0"), HostInterfaceName("cid123", "eth1"));
}

TEST(LinkMarkTest, NamesTheAttachmentAndFitsTheKernelsAliasSize) {
  EXPECT_EQ(LinkMark("cid123", "eth0"), "sluice:cid123/eth0");
  EXPECT_NE(LinkMark("cid123", "eth0"), LinkMark("cid123", "eth1"));
  const std::string huge = LinkMark(std::string(300, 'x'), "eth0");
  EXPECT_LT(huge.size(), 256u);
  EXPECT_TRUE(absl::StartsWith(huge, "sluice:sha256:")) << huge;
  EXPECT_NE(huge, LinkMark(std::string(301, 'x'), "eth0"));
}

TEST(EndpointJsonTest, RoundTripsEveryField) {
  Endpoint ep;
  ep.container_id = "c1";
  ep.ifname = "eth0";
  ep.netns = "/proc/1/ns/net";
  ep.network_name = "n";
  ep.pod_namespace = "ns";
  ep.pod_name = "p";
  ep.host_ifname = "lxc1";
  ep.host_ifindex = 7;
  ep.ipv4 = "10.0.0.2";
  ep.mac = "aa:bb:cc:dd:ee:ff";
  ep.host_mac = "11:22:33:44:55:66";
  ep.endpoint_id = 4000000000u;
  ep.mtu = 9000;
  ep.created = absl::FromUnixNanos(1700000000123456789);
  ep.ingress = {.rate = 8000000, .burst_bytes = 32768};
  ep.egress = {.rate = 1000000000000000, .burst_bytes = UINT32_MAX};
  absl::StatusOr<Endpoint> back = EndpointFromJson(EndpointToJson(ep));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, ep);
}

TEST(EndpointJsonTest, AnUnlimitedPodsRecordHasNoBandwidthAndABadOneIsRefused) {
  Endpoint ep{.container_id = "c", .ifname = "eth0"};
  EXPECT_FALSE(EndpointToJson(ep).contains("bandwidth")) << "as agents before limits wrote it";
  ep.egress = {.rate = 2000000, .burst_bytes = 16384};
  nlohmann::json j = EndpointToJson(ep);
  EXPECT_EQ(j["bandwidth"], (nlohmann::json{{"egressRate", 2000000}, {"egressBurstBytes", 16384}}));
  j["bandwidth"]["egressBurstBytes"] = -1;
  EXPECT_THAT(EndpointFromJson(j).status().message(), HasSubstr("bandwidth.egressRate"));
}

TEST(EndpointJsonTest, RejectsWrongTypesAndMissingKeysWithoutThrowing) {
  nlohmann::json j = EndpointToJson(Endpoint{.container_id = "c", .ifname = "eth0"});
  j["mtu"] = "big";
  EXPECT_THAT(EndpointFromJson(j).status().message(), HasSubstr("mtu"));
  j = EndpointToJson(Endpoint{.container_id = "c", .ifname = "eth0"});
  j.erase("containerID");
  EXPECT_THAT(EndpointFromJson(j).status().message(), HasSubstr("containerID"));
  j = EndpointToJson(Endpoint{.container_id = "c", .ifname = "eth0"});
  j["created"] = "yesterday";
  EXPECT_FALSE(EndpointFromJson(j).ok());
  EXPECT_FALSE(EndpointFromJson(nlohmann::json::array()).ok());
}

TEST_F(EndpointStoreTest, PutGetListRemove) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  absl::StatusOr<Endpoint> a = store->Put(Make("aaa"));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(store->Put(Make("bbb")).ok());
  EXPECT_EQ(store->Get("aaa", "eth0"), *a);
  EXPECT_EQ(store->Get("aaa", "eth1"), std::nullopt);
  ASSERT_EQ(store->List().size(), 2u);
  EXPECT_EQ(store->List()[0].container_id, "aaa");
  EXPECT_TRUE(store->Remove("aaa", "eth0").ok());
  EXPECT_TRUE(store->Remove("aaa", "eth0").ok());  // absent: OK
  EXPECT_EQ(store->Get("aaa", "eth0"), std::nullopt);
  EXPECT_EQ(store->size(), 1u);
}

TEST_F(EndpointStoreTest, WritesOneFilePerEndpointAtomicallyWithNoTempFilesLeft) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Put(Make("aaa")).ok());
  ASSERT_TRUE(store->Put(Make("aaa")).ok());  // replace
  ASSERT_TRUE(store->Put(Make("bbb", "net1")).ok());
  EXPECT_THAT(Files(), ElementsAre("aaa-eth0.json", "bbb-net1.json"));
  struct stat st;
  ASSERT_EQ(stat(EndpointsDir().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(stat((EndpointsDir() + "/aaa-eth0.json").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_TRUE(store->Remove("aaa", "eth0").ok());
  EXPECT_THAT(Files(), ElementsAre("bbb-net1.json"));
}

TEST_F(EndpointStoreTest, AssignsSmallestUnusedEndpointIdAndKeepsItOnReplace) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Put(Make("a"))->endpoint_id, 1u);
  EXPECT_EQ(store->Put(Make("b"))->endpoint_id, 2u);
  EXPECT_EQ(store->Put(Make("c"))->endpoint_id, 3u);
  Endpoint again = Make("b");
  again.mtu = 1500;
  EXPECT_EQ(store->Put(again)->endpoint_id, 2u);  // a replace keeps the id
  ASSERT_TRUE(store->Remove("a", "eth0").ok());
  EXPECT_EQ(store->Put(Make("d"))->endpoint_id, 1u);  // smallest unused
  EXPECT_EQ(store->Put(Make("e"))->endpoint_id, 4u);
}

TEST_F(EndpointStoreTest, RefusesAnExplicitIdOwnedByAnotherEndpoint) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  ASSERT_EQ(store->Put(Make("a"))->endpoint_id, 1u);
  Endpoint b = Make("b");
  b.endpoint_id = 1;
  EXPECT_EQ(store->Put(b).status().code(), absl::StatusCode::kAlreadyExists);
  b.endpoint_id = 9;
  EXPECT_EQ(store->Put(b)->endpoint_id, 9u);
  EXPECT_EQ(store->Put(Make("c"))->endpoint_id, 2u);
}

TEST_F(EndpointStoreTest, RestartRestoresEndpointsAndTheirIds) {
  Endpoint b;
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Put(Make("a")).ok());
    b = *store->Put(Make("b"));
    ASSERT_TRUE(store->Put(Make("c")).ok());
    ASSERT_TRUE(store->Remove("a", "eth0").ok());
  }
  auto store = Open();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->corrupt_files(), 0);
  EXPECT_EQ(store->Get("b", "eth0"), b);
  EXPECT_EQ(store->Get("c", "eth0")->endpoint_id, 3u);
  EXPECT_EQ(store->Put(Make("d"))->endpoint_id, 1u);  // the id freed before the restart
  EXPECT_EQ(store->Put(Make("e"))->endpoint_id, 4u);  // never 2 or 3 again
}

TEST_F(EndpointStoreTest, CorruptFilesAreSkippedCountedAndLeftForInspection) {
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Put(Make("good")).ok());
  }
  std::ofstream(EndpointsDir() + "/broken-eth0.json") << "{\"containerID\": ";
  std::ofstream(EndpointsDir() + "/typed-eth0.json") << R"({"containerID": 5})";
  // Valid content, wrong file name: Remove would never find it.
  nlohmann::json moved = EndpointToJson(Make("moved"));
  std::ofstream(EndpointsDir() + "/elsewhere-eth0.json") << moved.dump();
  std::ofstream(EndpointsDir() + "/half-eth0.json.tmp") << "{";
  auto store = Open();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->corrupt_files(), 3);
  ASSERT_EQ(store->List().size(), 1u);
  EXPECT_EQ(store->List()[0].container_id, "good");
  EXPECT_TRUE(fs::exists(EndpointsDir() + "/broken-eth0.json"));
  EXPECT_FALSE(fs::exists(EndpointsDir() + "/half-eth0.json.tmp"));
}

TEST_F(EndpointStoreTest, DuplicateIdOnDiskIsReassignedNotDropped) {
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    ASSERT_EQ(store->Put(Make("a"))->endpoint_id, 1u);
  }
  Endpoint dup = Make("b");
  dup.endpoint_id = 1;
  std::ofstream(EndpointsDir() + "/b-eth0.json") << EndpointToJson(dup).dump();
  auto store = Open();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Get("a", "eth0")->endpoint_id, 1u);
  EXPECT_EQ(store->Get("b", "eth0")->endpoint_id, 2u);
  store.reset();
  EXPECT_EQ(Open()->Get("b", "eth0")->endpoint_id, 2u);  // the fix was persisted
}

TEST_F(EndpointStoreTest, RejectsKeysUnsafeForFileNames) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Put(Make("../etc")).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Put(Make("")).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Put(Make("ok", "a/b")).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Put(Make("ok", "sixteen-chars-xx")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Files(), IsEmpty());
}

TEST_F(EndpointStoreTest, RefusesTwoKeysThatShareAFileName) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Put(Make("a-b", "c")).ok());
  EXPECT_EQ(store->Put(Make("a", "b-c")).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store->Get("a-b", "c")->container_id, "a-b");
}

TEST_F(EndpointStoreTest, ConcurrentPutsGetDistinctIds) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) ASSERT_TRUE(store->Put(Make(absl::StrCat("t", t, "i", i))).ok());
    });
  }
  for (auto& th : threads) th.join();
  std::set<uint32_t> ids;
  for (const Endpoint& ep : store->List()) ids.insert(ep.endpoint_id);
  EXPECT_EQ(ids.size(), 40u);
  EXPECT_EQ(*ids.begin(), 1u);
  EXPECT_EQ(*ids.rbegin(), 40u);
}

}  // namespace
}  // namespace sluice::agent

namespace sluice::agent {
namespace {

class EndpointStorePersistTest : public ::testing::Test {
 protected:
  static Endpoint Make(std::string id) {
    Endpoint ep;
    ep.container_id = std::move(id);
    ep.ifname = "eth0";
    ep.network_name = "sluice";
    ep.host_ifname = HostInterfaceName(ep.container_id, ep.ifname);
    ep.host_ifindex = 42;
    ep.ipv4 = "10.244.0.5";
    ep.mac = "02:00:0a:f4:00:05";
    ep.host_mac = "02:00:00:00:00:01";
    return ep;
  }
  std::string File(const std::string& id) const {
    return dir_ + "/endpoints/" + EndpointStore::FileName(id, "eth0");
  }
  sluice::testing::TempDir tmp_{"sluice-endpoints-persist-test"};
  const std::string dir_ = tmp_.path();
};

TEST_F(EndpointStorePersistTest, VerifyPersistedNoticesALostOrChangedRecord) {
  auto store = EndpointStore::Open(dir_);
  ASSERT_TRUE(store.ok()) << store.status();
  auto ep = (*store)->Put(Make("a"));
  ASSERT_TRUE(ep.ok()) << ep.status();
  EXPECT_TRUE((*store)->VerifyPersisted(*ep).ok());
  Endpoint moved = *ep;
  moved.ipv4 = "10.244.0.6";
  EXPECT_EQ((*store)->VerifyPersisted(moved).code(), absl::StatusCode::kDataLoss);
  ASSERT_EQ(unlink(File("a").c_str()), 0);
  EXPECT_EQ((*store)->VerifyPersisted(*ep).code(), absl::StatusCode::kNotFound);
}

TEST_F(EndpointStorePersistTest, AStalledWriteHoldsUpOnlyThePutMakingIt) {
  auto opened = EndpointStore::Open(dir_);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EndpointStore& store = **opened;
  ASSERT_TRUE(store.Put(Make("other")).ok());
  // A FIFO where the record's temporary file goes: opening it for writing waits for a reader.
  const std::string fifo = File("stalled") + ".tmp";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::atomic<bool> written = false;
  std::atomic<pid_t> tid = 0;
  absl::Status stalled_result;
  std::thread stalled([&] {
    tid = gettid();
    // Once a reader comes it fails (fsync(2) of a FIFO is EINVAL): what matters is who waited.
    stalled_result = store.Put(Make("stalled")).status();
    written = true;
  });
  // The Put is stuck once its thread sits in openat(2) (x86-64 syscall 257) on the FIFO.
  ASSERT_TRUE(sluice::testing::Eventually([&] {
    if (tid == 0) return false;
    std::ifstream syscall(absl::StrCat("/proc/self/task/", tid.load(), "/syscall"));
    std::string number;
    syscall >> number;
    return number == "257";
  }));
  // A second Put of the same record says it is being written.
  EXPECT_TRUE(absl::IsUnavailable(store.Put(Make("stalled")).status()));
  const absl::Time start = absl::Now();
  EXPECT_TRUE(store.Get("other", "eth0").has_value());  // CHECK and DEL of other pods
  EXPECT_EQ(store.List().size(), 1u);
  auto third = store.Put(Make("third"));                // another ADD
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_TRUE(store.Remove("other", "eth0").ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_FALSE(written);
  int reader = open(fifo.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(reader, 0);
  stalled.join();
  close(reader);
  EXPECT_TRUE(written);
  EXPECT_FALSE(stalled_result.ok());
  // The failed write left nothing: no record, and its endpoint id is free again.
  EXPECT_FALSE(store.Get("stalled", "eth0").has_value());
  unlink(fifo.c_str());
  auto retried = store.Put(Make("stalled"));
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_NE(retried->endpoint_id, third->endpoint_id);
}

}  // namespace
}  // namespace sluice::agent
