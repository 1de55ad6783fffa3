// The lab's network for real: node namespaces on the underlay bridge reach the control plane's
// address and each other, bpffs is mounted per node (mode 0700), a second lab gets its own /24, and
// DestroyTopology leaves no namespace, mount or directory behind.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "agent/lab/network/topology.h"
#include "agent/lab/tools/process.h"
#include "gtest/gtest.h"

namespace sluice::lab {
namespace {

bool Mounted(const std::string& path) {
  std::ifstream in("/proc/self/mounts");
  std::string line;
  while (std::getline(in, line)) {
    if (line.find(absl::StrCat(" ", path, " ")) != std::string::npos) return true;
  }
  return false;
}

bool Ping(const std::string& netns, const std::string& ip) {
  auto r = RunProcess(
      {.argv = {"ping", "-c1", "-W2", ip}, .netns_path = std::string(kNetnsDir) + "/" + netns});
  return r.ok() && r->exit_code == 0;
}

std::string UniqueName(const char* what) { return absl::StrCat("tt", what, getpid()); }

TEST(TopologyTest, NodesReachTheControlPlaneAndEachOtherAndTeardownLeavesNothing) {
  auto t = CreateTopology(UniqueName("a"), 2);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->nodes.size(), 2u);
  for (const auto& n : t->nodes) {
    EXPECT_TRUE(std::filesystem::exists(n.netns_path())) << n.netns;
    EXPECT_TRUE(Mounted(n.bpffs())) << n.bpffs();
    // Root-only, like a real node's /sys/fs/bpf (the bpffs default is 1777).
    struct stat st {};
    ASSERT_EQ(stat(n.bpffs().c_str(), &st), 0) << n.bpffs();
    EXPECT_EQ(st.st_mode & 07777, 0700u) << std::oct << (st.st_mode & 07777);
    EXPECT_TRUE(Ping(n.netns, t->gateway_ip)) << n.name << " -> " << t->gateway_ip;
  }
  EXPECT_TRUE(Ping(t->nodes[0].netns, t->nodes[1].ip));
  EXPECT_TRUE(Ping(t->external_netns, t->nodes[0].ip));
  auto loaded = LoadTopology(t->lab);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->index, t->index);
  ASSERT_EQ(loaded->nodes.size(), 2u);
  EXPECT_EQ(loaded->nodes[1].ip, t->nodes[1].ip);

  std::string pod_ns = t->PodNetns("default", "p");
  ASSERT_TRUE(CreatePodNetns(*t, pod_ns).ok());
  // A process left running in a namespace is killed by the teardown.
  auto sleeper = StartProcess({.argv = {"sleep", "600"}, .netns_path = t->netns_path(pod_ns)});
  ASSERT_TRUE(sleeper.ok());
  // StartProcess returns after fork: wait until the child has entered the namespace, as the
  // teardown finds processes by their namespace.
  struct stat ns_st {};
  ASSERT_EQ(stat(t->netns_path(pod_ns).c_str(), &ns_st), 0);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  auto in_netns = [&] {
    struct stat st {};
    return stat(absl::StrCat("/proc/", *sleeper, "/ns/net").c_str(), &st) == 0 &&
           st.st_ino == ns_st.st_ino;
  };
  while (!in_netns() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(in_netns()) << "sleep did not enter " << pod_ns;

  ASSERT_TRUE(DestroyTopology(*t).ok());
  EXPECT_TRUE(ReapIfExited(*sleeper).has_value() || StopProcess(*sleeper) == 128 + 9);
  for (const auto& ns :
       {t->underlay_netns, t->external_netns, t->nodes[0].netns, t->nodes[1].netns, pod_ns}) {
    EXPECT_FALSE(std::filesystem::exists(t->netns_path(ns))) << ns;
  }
  EXPECT_FALSE(Mounted(t->nodes[0].bpffs()));
  EXPECT_FALSE(std::filesystem::exists(t->dir));
}

TEST(TopologyTest, TwoLabsGetDifferentUnderlaysAndTheSameNameIsRefused) {
  auto a = CreateTopology(UniqueName("b"), 1);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = CreateTopology(UniqueName("c"), 1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(a->index, b->index);
  EXPECT_NE(a->gateway_ip, b->gateway_ip);
  EXPECT_TRUE(absl::IsAlreadyExists(CreateTopology(a->lab, 1).status()));
  EXPECT_TRUE(DestroyTopology(*a).ok());
  EXPECT_TRUE(DestroyTopology(*b).ok());
}

TEST(TopologyTest, RejectsNamesThatCannotBeNamespaceNames) {
  EXPECT_FALSE(ValidateLabName("").ok());
  EXPECT_FALSE(ValidateLabName("Lab").ok());
  EXPECT_FALSE(ValidateLabName("a/b").ok());
  EXPECT_FALSE(ValidateLabName("x-pod-y").ok());
  EXPECT_FALSE(ValidateLabName(std::string(30, 'a')).ok());
  EXPECT_TRUE(ValidateLabName("lab-2").ok());
}

}  // namespace
}  // namespace sluice::lab
