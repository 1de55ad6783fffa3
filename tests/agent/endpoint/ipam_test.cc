#include "agent/endpoint/ipam.h"

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

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "support/eventually.h"
#include "support/temp_dir.h"

namespace sluice::agent {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::sluice::testing::TempDir;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

class IpamTest : public ::testing::Test {
 protected:

  static IpPrefix Cidr(absl::string_view s) { return *IpPrefix::Parse(s); }
  static IpAddress Ip(absl::string_view s) { return *IpAddress::Parse(s); }
  static Ipam::Owner Pod(std::string id, std::string ifname = "eth0") {
    return Ipam::Owner{"sluice", std::move(id), std::move(ifname)};
  }
  std::unique_ptr<Ipam> Open(absl::string_view cidr) {
    absl::StatusOr<std::unique_ptr<Ipam>> ipam = Ipam::Open(dir_, Cidr(cidr));
    EXPECT_TRUE(ipam.ok()) << ipam.status();
    return ipam.ok() ? *std::move(ipam) : nullptr;
  }
  std::string CidrDir(absl::string_view name) const { return dir_ + "/ipam/" + std::string(name); }

  TempDir tmp_{"sluice-ipam-test"};
  const std::string dir_ = tmp_.path();
};

TEST(IpAddressTest, ParsesAndFormatsBothFamilies) {
  EXPECT_EQ(IpAddress::Parse("10.244.0.5")->ToString(), "10.244.0.5");
  EXPECT_EQ(IpAddress::Parse("10.244.0.5")->v4_host_order(), 0x0af40005u);
  EXPECT_EQ(IpAddress::V4(0x0af40005u), *IpAddress::Parse("10.244.0.5"));
  EXPECT_EQ(IpAddress::Parse("fd00::1")->family(), IpFamily::kV6);
  EXPECT_EQ(IpAddress::Parse("fd00:0::1")->ToString(), "fd00::1");
  EXPECT_FALSE(IpAddress::Parse("10.244.0.256").ok());
  EXPECT_FALSE(IpAddress::Parse("").ok());
}

TEST(IpPrefixTest, ParsesCanonicalPrefixesAndRejectsHostBits) {
  EXPECT_EQ(IpPrefix::Parse("10.244.1.0/24")->ToString(), "10.244.1.0/24");
  EXPECT_TRUE(IpPrefix::Parse("fd00:10::/64").ok());
  EXPECT_THAT(IpPrefix::Parse("10.244.1.5/24").status().message(), HasSubstr("host bits"));
  EXPECT_FALSE(IpPrefix::Parse("10.244.1.0").ok());
  EXPECT_FALSE(IpPrefix::Parse("10.244.1.0/33").ok());
  EXPECT_FALSE(IpPrefix::Parse("10.244.1.0/x").ok());
  IpPrefix p = *IpPrefix::Parse("10.244.1.0/24");
  EXPECT_TRUE(p.Contains(*IpAddress::Parse("10.244.1.255")));
  EXPECT_FALSE(p.Contains(*IpAddress::Parse("10.244.2.0")));
  EXPECT_FALSE(p.Contains(*IpAddress::Parse("fd00::1")));
}

TEST_F(IpamTest, ReservesNetworkGatewayAndBroadcast) {
  auto ipam = Open("10.244.0.0/29");
  ASSERT_NE(ipam, nullptr);
  EXPECT_EQ(ipam->gateway(), Ip("10.244.0.1"));
  EXPECT_EQ(ipam->capacity(), 5u);
  std::set<IpAddress> got;
  for (int i = 0; i < 5; ++i) got.insert(*ipam->Allocate(Pod("c" + std::to_string(i))));
  EXPECT_THAT(got, ElementsAre(Ip("10.244.0.2"), Ip("10.244.0.3"), Ip("10.244.0.4"),
                               Ip("10.244.0.5"), Ip("10.244.0.6")));
}

TEST_F(IpamTest, AllocatesSequentiallyFromAfterTheGateway) {
  auto ipam = Open("10.244.0.0/24");
  ASSERT_NE(ipam, nullptr);
  EXPECT_EQ(*ipam->Allocate(Pod("a")), Ip("10.244.0.2"));
  EXPECT_EQ(*ipam->Allocate(Pod("b")), Ip("10.244.0.3"));
  EXPECT_EQ(*ipam->Allocate(Pod("a", "net1")), Ip("10.244.0.4"));
  EXPECT_EQ(ipam->Lookup(Pod("b")), Ip("10.244.0.3"));
  EXPECT_EQ(ipam->Lookup(Pod("zzz")), std::nullopt);
  EXPECT_THAT(ipam->Allocated(),
              ElementsAre(Ipam::Allocation{Ip("10.244.0.2"), Pod("a")},
                          Ipam::Allocation{Ip("10.244.0.3"), Pod("b")},
                          Ipam::Allocation{Ip("10.244.0.4"), Pod("a", "net1")}));
}

TEST_F(IpamTest, SameOwnerAskingAgainGetsItsExistingAddress) {
  auto ipam = Open("10.244.0.0/24");
  ASSERT_NE(ipam, nullptr);
  IpAddress first = *ipam->Allocate(Pod("a"));
  EXPECT_EQ(*ipam->Allocate(Pod("a")), first);
  EXPECT_EQ(ipam->Allocated().size(), 1u);
}

TEST_F(IpamTest, RejectsOwnerWithoutContainerIdOrInterface) {
  auto ipam = Open("10.244.0.0/24");
  ASSERT_NE(ipam, nullptr);
  EXPECT_EQ(ipam->Allocate(Pod("")).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ipam->Allocate(Pod("a", "")).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(IpamTest, ExhaustionNamesTheCidrAndTheCountInUse) {
  auto ipam = Open("10.244.0.0/29");
  ASSERT_NE(ipam, nullptr);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(ipam->Allocate(Pod("c" + std::to_string(i))).ok());
  absl::StatusOr<IpAddress> more = ipam->Allocate(Pod("one-too-many"));
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(more.status().message(), HasSubstr("10.244.0.0/29"));
  EXPECT_THAT(more.status().message(), HasSubstr("5 of 5"));
  // An existing owner still gets its address when the pool is full.
  EXPECT_EQ(*ipam->Allocate(Pod("c0")), Ip("10.244.0.2"));
}

TEST_F(IpamTest, ReleasedAddressIsNotReusedUntilTheCursorWrapsAround) {
  auto ipam = Open("10.244.0.0/29");
  ASSERT_NE(ipam, nullptr);
  ASSERT_EQ(*ipam->Allocate(Pod("a")), Ip("10.244.0.2"));
  ASSERT_EQ(*ipam->Allocate(Pod("b")), Ip("10.244.0.3"));
  ASSERT_TRUE(ipam->Release(Pod("a")).ok());
  EXPECT_EQ(ipam->Lookup(Pod("a")), std::nullopt);
  EXPECT_EQ(*ipam->Allocate(Pod("c")), Ip("10.244.0.4"));
  EXPECT_EQ(*ipam->Allocate(Pod("d")), Ip("10.244.0.5"));
  EXPECT_EQ(*ipam->Allocate(Pod("e")), Ip("10.244.0.6"));
  EXPECT_EQ(*ipam->Allocate(Pod("f")), Ip("10.244.0.2"));  // wrapped: .2 is free again
}

TEST_F(IpamTest, ReleasingAnUnknownOwnerSucceeds) {
  auto ipam = Open("10.244.0.0/24");
  ASSERT_NE(ipam, nullptr);
  EXPECT_TRUE(ipam->Release(Pod("never-added")).ok());
  ASSERT_TRUE(ipam->Allocate(Pod("a")).ok());
  EXPECT_TRUE(ipam->Release(Pod("a")).ok());
  EXPECT_TRUE(ipam->Release(Pod("a")).ok());
}

TEST_F(IpamTest, PersistsOneFilePerAddressWithTheOwnerAndNoTempFiles) {
  auto ipam = Open("10.244.0.0/24");
  ASSERT_NE(ipam, nullptr);
  ASSERT_TRUE(ipam->Allocate(Pod("abc")).ok());
  const std::string d = CidrDir("10.244.0.0_24");
  std::ifstream f(d + "/10.244.0.2");
  std::string content((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_THAT(content, HasSubstr("\"containerID\":\"abc\""));
  EXPECT_THAT(content, HasSubstr("\"ifName\":\"eth0\""));
  struct stat st;
  ASSERT_EQ(stat((d + "/10.244.0.2").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(d)) names.insert(e.path().filename());
  EXPECT_THAT(names, ElementsAre("10.244.0.2", "last_reserved", "lock"));
  ASSERT_TRUE(ipam->Release(Pod("abc")).ok());
  EXPECT_FALSE(fs::exists(d + "/10.244.0.2"));
}

TEST_F(IpamTest, RestartKeepsAllocationsAndContinuesAfterTheCursor) {
  {
    auto ipam = Open("10.244.0.0/24");
    ASSERT_NE(ipam, nullptr);
    ASSERT_EQ(*ipam->Allocate(Pod("a")), Ip("10.244.0.2"));
    ASSERT_EQ(*ipam->Allocate(Pod("b")), Ip("10.244.0.3"));
    ASSERT_EQ(*ipam->Allocate(Pod("c")), Ip("10.244.0.4"));
    ASSERT_TRUE(ipam->Release(Pod("c")).ok());
  }
  auto ipam = Open("10.244.0.0/24");
  ASSERT_NE(ipam, nullptr);
  EXPECT_EQ(ipam->Lookup(Pod("a")), Ip("10.244.0.2"));
  EXPECT_EQ(*ipam->Allocate(Pod("b")), Ip("10.244.0.3"));
  EXPECT_EQ(ipam->Allocated().size(), 2u);
  EXPECT_EQ(*ipam->Allocate(Pod("d")), Ip("10.244.0.5"));  // not the just-released .4
}

TEST_F(IpamTest, SecondAllocatorOverTheSameDirectoryIsRefused) {
  auto ipam = Open("10.244.0.0/24");
  ASSERT_NE(ipam, nullptr);
  absl::StatusOr<std::unique_ptr<Ipam>> second = Ipam::Open(dir_, Cidr("10.244.0.0/24"));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(IpamTest, ReleaseAllExceptFreesExactlyTheLeakedAddresses) {
  auto ipam = Open("10.244.0.0/24");
  ASSERT_NE(ipam, nullptr);
  for (const char* id : {"live1", "leak1", "live2", "leak2"}) ASSERT_TRUE(ipam->Allocate(Pod(id)).ok());
  absl::StatusOr<std::vector<Ipam::Allocation>> freed =
      ipam->ReleaseAllExcept({Pod("live1"), Pod("live2"), Pod("not-allocated")});
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_THAT(*freed, UnorderedElementsAre(Ipam::Allocation{Ip("10.244.0.3"), Pod("leak1")},
                                           Ipam::Allocation{Ip("10.244.0.5"), Pod("leak2")}));
  EXPECT_THAT(ipam->Allocated(),
              ElementsAre(Ipam::Allocation{Ip("10.244.0.2"), Pod("live1")},
                          Ipam::Allocation{Ip("10.244.0.4"), Pod("live2")}));
  EXPECT_THAT(*ipam->ReleaseAllExcept({Pod("live1"), Pod("live2")}), IsEmpty());
  ipam.reset();
  auto reopened = Open("10.244.0.0/24");  // the frees reached the disk
  ASSERT_NE(reopened, nullptr);
  EXPECT_EQ(reopened->Allocated().size(), 2u);
}

TEST_F(IpamTest, CorruptRecordHoldsItsAddressAndIsReported) {
  {
    auto ipam = Open("10.244.0.0/29");
    ASSERT_NE(ipam, nullptr);
    ASSERT_TRUE(ipam->Allocate(Pod("a")).ok());
  }
  const std::string d = CidrDir("10.244.0.0_29");
  std::ofstream(d + "/10.244.0.3") << "{not json";
  std::ofstream(d + "/not-an-ip") << "x";
  std::ofstream(d + "/10.244.0.7") << R"({"containerID":"x","ifName":"eth0"})";  // broadcast
  auto ipam = Open("10.244.0.0/29");
  ASSERT_NE(ipam, nullptr);
  EXPECT_THAT(ipam->Unreadable(), ElementsAre(Ip("10.244.0.3")));
  EXPECT_EQ(*ipam->Allocate(Pod("b")), Ip("10.244.0.4"));  // skips the held .3
  EXPECT_THAT(*ipam->ReleaseAllExcept({}), UnorderedElementsAre(
                                               Ipam::Allocation{Ip("10.244.0.2"), Pod("a")},
                                               Ipam::Allocation{Ip("10.244.0.4"), Pod("b")}));
  EXPECT_THAT(ipam->Unreadable(), ElementsAre(Ip("10.244.0.3")));
}

TEST_F(IpamTest, AddressFileWrittenBehindItsBackIsNeverHandedOut) {
  auto ipam = Open("10.244.0.0/29");
  ASSERT_NE(ipam, nullptr);
  std::ofstream(CidrDir("10.244.0.0_29") + "/10.244.0.2") << "{}";
  EXPECT_EQ(*ipam->Allocate(Pod("a")), Ip("10.244.0.3"));
  EXPECT_THAT(ipam->Unreadable(), ElementsAre(Ip("10.244.0.2")));
}

TEST_F(IpamTest, ChangedPodCidrAdoptsAddressesInsideAndReportsOthersAsForeign) {
  {
    auto ipam = Open("10.244.0.0/24");
    ASSERT_NE(ipam, nullptr);
    ASSERT_EQ(*ipam->Allocate(Pod("inside")), Ip("10.244.0.2"));
    ASSERT_TRUE(ipam->Allocate(Pod("skip")).ok());
    ASSERT_TRUE(ipam->Release(Pod("skip")).ok());
  }
  {
    auto ipam = Open("10.244.1.0/24");
    ASSERT_NE(ipam, nullptr);
    ASSERT_EQ(*ipam->Allocate(Pod("outside")), Ip("10.244.1.2"));
  }
  // Now the node's CIDR becomes 10.244.0.0/23: 10.244.0.2 and 10.244.1.2 are both inside.
  // The earlier /24 records are adopted; a record from 10.245.0.0/24 is foreign.
  {
    auto other = Open("10.245.0.0/24");
    ASSERT_NE(other, nullptr);
    ASSERT_EQ(*other->Allocate(Pod("far")), Ip("10.245.0.2"));
  }
  auto ipam = Open("10.244.0.0/23");
  ASSERT_NE(ipam, nullptr);
  EXPECT_EQ(ipam->Lookup(Pod("inside")), Ip("10.244.0.2"));
  EXPECT_EQ(ipam->Lookup(Pod("outside")), Ip("10.244.1.2"));
  EXPECT_THAT(ipam->Foreign(), ElementsAre(Ipam::Allocation{Ip("10.245.0.2"), Pod("far")}));
  EXPECT_FALSE(fs::exists(CidrDir("10.244.0.0_24") + "/10.244.0.2"));
  EXPECT_TRUE(fs::exists(CidrDir("10.244.0.0_23") + "/10.244.0.2"));
  // A foreign allocation whose pod is gone is freed by GC.
  absl::StatusOr<std::vector<Ipam::Allocation>> freed =
      ipam->ReleaseAllExcept({Pod("inside"), Pod("outside")});
  ASSERT_TRUE(freed.ok());
  EXPECT_THAT(*freed, ElementsAre(Ipam::Allocation{Ip("10.245.0.2"), Pod("far")}));
  EXPECT_THAT(ipam->Foreign(), IsEmpty());
  EXPECT_FALSE(fs::exists(CidrDir("10.245.0.0_24") + "/10.245.0.2"));
}

TEST_F(IpamTest, RejectsCidrsTooSmallForPodsAndIpv6ForNow) {
  EXPECT_EQ(Ipam::Open(dir_, Cidr("10.244.0.0/31")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Ipam::Open(dir_, Cidr("fd00::/64")).status().code(),
            absl::StatusCode::kUnimplemented);
}

TEST_F(IpamTest, ConcurrentAllocationsNeverShareAnAddress) {
  auto ipam = Open("10.244.0.0/24");
  ASSERT_NE(ipam, nullptr);
  std::vector<std::thread> threads;
  std::vector<std::vector<IpAddress>> got(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        absl::StatusOr<IpAddress> a = ipam->Allocate(Pod(absl::StrCat("t", t, "-", i)));
        if (a.ok()) got[t].push_back(*a);
      }
    });
  }
  for (auto& th : threads) th.join();
  std::set<IpAddress> all;
  size_t total = 0;
  for (const auto& v : got) {
    total += v.size();
    all.insert(v.begin(), v.end());
  }
  EXPECT_EQ(total, 100u);
  EXPECT_EQ(all.size(), 100u);
}

}  // namespace
}  // namespace sluice::agent

namespace sluice::agent {
namespace {

class IpamReconcileTest : public ::testing::Test {
 protected:
  static IpAddress Ip(absl::string_view s) { return *IpAddress::Parse(s); }
  static Ipam::Owner Pod(std::string id) { return Ipam::Owner{"sluice", std::move(id), "eth0"}; }
  std::unique_ptr<Ipam> Open() {
    absl::StatusOr<std::unique_ptr<Ipam>> ipam = Ipam::Open(dir_, *IpPrefix::Parse("10.9.0.0/28"));
    EXPECT_TRUE(ipam.ok()) << ipam.status();
    return ipam.ok() ? *std::move(ipam) : nullptr;
  }
  std::string File(absl::string_view addr) const {
    return absl::StrCat(dir_, "/ipam/10.9.0.0_28/", addr);
  }

  sluice::testing::TempDir tmp_{"sluice-ipam-reconcile-test"};
  const std::string dir_ = tmp_.path();
};

TEST_F(IpamReconcileTest, VerifyPersistedNoticesALostOrForeignReservationFile) {
  auto ipam = Open();
  ASSERT_NE(ipam, nullptr);
  auto a = ipam->Allocate(Pod("a"));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(ipam->VerifyPersisted(Pod("a"), *a).ok());
  EXPECT_EQ(ipam->VerifyPersisted(Pod("b"), *a).code(), absl::StatusCode::kDataLoss);
  ASSERT_EQ(unlink(File(a->ToString()).c_str()), 0);
  EXPECT_EQ(ipam->VerifyPersisted(Pod("a"), *a).code(), absl::StatusCode::kNotFound);
  // In memory it is still held; the owner asking again writes the file back.
  EXPECT_EQ(ipam->Lookup(Pod("a")), *a);
  EXPECT_EQ(*ipam->Allocate(Pod("a")), *a);
  EXPECT_TRUE(ipam->VerifyPersisted(Pod("a"), *a).ok());
}

TEST_F(IpamReconcileTest, ReserveHoldsALiveEndpointsAddressWhoseFileWasLostAcrossARestart) {
  IpAddress held;
  {
    auto ipam = Open();
    ASSERT_NE(ipam, nullptr);
    held = *ipam->Allocate(Pod("live"));
    ASSERT_EQ(unlink(File(held.ToString()).c_str()), 0);
  }
  auto ipam = Open();
  ASSERT_NE(ipam, nullptr);
  EXPECT_FALSE(ipam->Lookup(Pod("live")).has_value());  // the file was all there was
  ASSERT_TRUE(ipam->Reserve(Pod("live"), held).ok());
  EXPECT_EQ(ipam->Lookup(Pod("live")), held);
  EXPECT_TRUE(ipam->VerifyPersisted(Pod("live"), held).ok());
  for (int i = 0; i < 10; ++i) {
    auto other = ipam->Allocate(Pod(absl::StrCat("new", i)));
    ASSERT_TRUE(other.ok()) << other.status();
    EXPECT_NE(*other, held);
  }
  // Another owner's address is not taken over; nothing changes.
  auto taken = ipam->Lookup(Pod("new0"));
  EXPECT_EQ(ipam->Reserve(Pod("live"), *taken).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ipam->Lookup(Pod("live")), held);
  EXPECT_EQ(ipam->Reserve(Pod("live"), Ip("10.9.1.5")).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(IpamReconcileTest, AStalledWriteHoldsUpOnlyTheAllocationMakingIt) {
  auto ipam = Open();
  ASSERT_NE(ipam, nullptr);
  ASSERT_TRUE(ipam->Allocate(Pod("other")).ok());
  // A FIFO where the cursor is written: opening it for writing waits for a reader.
  const std::string fifo = File("last_reserved.tmp");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::atomic<bool> allocated = false;
  std::thread stalled([&] {
    EXPECT_TRUE(ipam->Allocate(Pod("stalled")).ok());
    allocated = true;
  });
  // The stalled allocation has its address once its file exists.
  ASSERT_TRUE(sluice::testing::Eventually([&] { return ipam->Lookup(Pod("stalled")).has_value(); }));
  EXPECT_FALSE(allocated);
  const absl::Time start = absl::Now();
  EXPECT_EQ(ipam->Allocated().size(), 2u);                 // STATUS
  EXPECT_TRUE(ipam->Lookup(Pod("other")).has_value());     // CHECK
  EXPECT_TRUE(ipam->Release(Pod("other")).ok());           // DEL
  auto third = ipam->Allocate(Pod("third"));               // another ADD
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_NE(*third, *ipam->Lookup(Pod("stalled")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_FALSE(allocated);
  // A reader lets the stalled write finish.
  int reader = open(fifo.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(reader, 0);
  stalled.join();
  close(reader);
  EXPECT_TRUE(allocated);
}

}  // namespace
}  // namespace sluice::agent
