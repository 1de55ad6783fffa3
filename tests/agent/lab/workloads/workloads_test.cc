#include "agent/lab/workloads/workloads.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "support/eventually.h"

namespace sluice::lab {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::sluice::testing::Eventually;

TEST(SluiceImage, RecognisesTheChartsImageByItsLastPathPart) {
  EXPECT_TRUE(IsSluiceImage("sluice/sluice-agent:0.1.0"));
  EXPECT_TRUE(IsSluiceImage("sluice-agent"));
  EXPECT_TRUE(IsSluiceImage("registry.local:5000/sluice/sluice-agent"));
  EXPECT_TRUE(IsSluiceImage("ghcr.io/x/sluice-agent:1@sha256:0123abcd"));
  EXPECT_FALSE(IsSluiceImage("netexec"));
  EXPECT_FALSE(IsSluiceImage("sluice/sluice-agent-debug:1"));
  EXPECT_FALSE(IsSluiceImage("registry:5000/other:sluice-agent"));
  json pod = {{"spec",
               {{"initContainers", json::array({{{"image", "sluice/sluice-agent:1"}}})},
                {"containers", json::array({{{"image", "busybox"}}})}}}};
  EXPECT_TRUE(RunsSluiceImage(pod));
  pod["spec"].erase("initContainers");
  EXPECT_FALSE(RunsSluiceImage(pod));
}

LabNode Node(const std::string& dir, const std::string& name) {
  return {.name = name,
          .netns = "workloads-test-absent-" + name,
          .ip = "172.30.250.11",
          .dir = dir + "/" + name};
}

TEST(HostPaths, MapsTheChartsHostPathsToTheNodesDirectories) {
  LabNode n = Node("/run/sluice-lab/x", "node1");
  auto bin = MapHostPath(n, "/opt/cni/bin");
  ASSERT_TRUE(bin.ok()) << bin.status();
  EXPECT_EQ(bin->lab_path, n.cni_bin_dir());
  EXPECT_EQ(MapHostPath(n, "/etc/cni/net.d/")->lab_path, n.cni_conf_dir());
  EXPECT_EQ(MapHostPath(n, "/sys/fs/bpf")->lab_path, n.bpffs());
  EXPECT_EQ(MapHostPath(n, "/var/lib/sluice")->lab_path, n.state_dir());
  // The longest mapped prefix wins: the cgroup root is not a directory below <node>/run.
  EXPECT_NE(MapHostPath(n, "/run/sluice/cgroupv2")->lab_path, n.dir + "/run/cgroupv2");
  EXPECT_EQ(MapHostPath(n, "/run/sluice/extra")->lab_path, n.dir + "/run/extra");
  EXPECT_EQ(MapHostPath(n, "/proc")->kind, "proc");
}

TEST(HostPaths, AnUnknownHostPathIsAnErrorNotIgnored) {
  LabNode n = Node("/run/sluice-lab/x", "node1");
  for (const char* p : {"/etc", "/var/lib/kubelet", "/run", "/opt/cni", "/proc/sys"}) {
    auto e = MapHostPath(n, p);
    EXPECT_TRUE(absl::IsNotFound(e.status())) << p;
  }
  EXPECT_NE(MapHostPath(n, "/var/lib/kubelet").status().message().find("no stand-in"),
            std::string::npos);
}

TEST(ContainerSpecs, RoundTripThroughJsonAndRejectGarbage) {
  ContainerSpec s;
  s.scratch_dir = "/tmp/x";
  s.mounts = {{"/a", "/b", "bind", true}, {"", "/hostproc", "proc", false}};
  s.argv = {"sluice-operator", "--lease_name=l"};
  s.env = {"PATH=/bin"};
  s.restrict_caps = true;
  s.caps = {"BPF", "NET_ADMIN"};
  s.uid = 65532;
  s.gid = 65532;
  auto back = ContainerSpecFromJson(ContainerSpecToJson(s));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->mounts.size(), 2u);
  EXPECT_EQ(back->mounts[0].target, "/b");
  EXPECT_TRUE(back->mounts[0].read_only);
  EXPECT_EQ(back->argv, s.argv);
  EXPECT_EQ(back->caps, s.caps);
  EXPECT_EQ(back->uid, 65532);
  EXPECT_FALSE(ContainerSpecFromJson(json{{"mounts", 3}}).ok());
  EXPECT_FALSE(ContainerSpecFromJson(json::array()).ok());
}

TEST(ContainerRoot, SymlinksResolveInsideTheRootNeverOnTheMachine) {
  char tmpl[] = "/tmp/workloads-root-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string root = tmpl;
  fs::create_directories(root + "/run");
  fs::create_directories(root + "/var");
  fs::create_directories(root + "/etc/alt");
  fs::create_symlink("/run", root + "/var/run");         // absolute, as on Debian
  fs::create_symlink("alt", root + "/etc/link");         // relative
  fs::create_symlink("../../..", root + "/etc/alt/up");  // climbing above the root stops there
  EXPECT_EQ(*ResolveInRoot(root, "/var/run/secrets/kubernetes.io"),
            root + "/run/secrets/kubernetes.io");
  EXPECT_EQ(*ResolveInRoot(root, "/etc/link/x"), root + "/etc/alt/x");
  EXPECT_EQ(*ResolveInRoot(root, "/etc/alt/up/run"), root + "/run");
  EXPECT_EQ(*ResolveInRoot(root, "/usr/local/bin/sluice-agent"),
            root + "/usr/local/bin/sluice-agent");
  fs::create_symlink("/loop", root + "/loop");
  EXPECT_FALSE(ResolveInRoot(root, "/loop/x").ok());
  fs::remove_all(root);
}

class WorkloadsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/workloads-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    topology_.lab = "wt";
    topology_.dir = dir_;
    for (const char* n : {"node1", "node2"}) {
      topology_.nodes.push_back(Node(dir_, n));
      fs::create_directories(topology_.nodes.back().cni_conf_dir());
    }
    ObjectStore::Options o;
    o.require_namespace = false;
    store_ = std::make_unique<ObjectStore>(o);
    for (const auto& n : topology_.nodes) {
      ASSERT_TRUE(
          store_
              ->Create(
                  Resource("nodes"),
                  {{"metadata", {{"name", n.name}, {"labels", {{"kubernetes.io/os", "linux"}}}}},
                   {"status",
                    {{"conditions", json::array({{{"type", "Ready"}, {"status", "False"}}})}}}})
              .ok());
    }
  }
  void TearDown() override {
    if (workloads_) workloads_->Stop();
    fs::remove_all(dir_);
  }
  void StartWorkloads() {
    // The containers cannot start (the nodes' namespaces do not exist): these tests are about
    // the controllers, whose pods then stay Pending with the reason.
    workloads_ = std::make_unique<Workloads>(
        store_.get(), topology_,
        WorkloadOptions{.self_exe = "/bin/false", .token = "t", .ca_pem = "ca"});
    ASSERT_TRUE(workloads_->Start().ok());
  }
  std::vector<json> Pods() {
    std::vector<json> out;
    auto list = store_->List(Resource("pods"), {});
    for (const auto& p : list->items) out.push_back(*p);
    return out;
  }
  std::string ReadyOf(const std::string& node) {
    auto n = store_->Get(Resource("nodes"), "", node);
    for (const auto& c : (*n)["status"]["conditions"]) {
      if (c["type"] == "Ready") return c["status"];
    }
    return "";
  }
  static json DaemonSet(const std::string& image) {
    return {{"apiVersion", "apps/v1"},
            {"kind", "DaemonSet"},
            {"metadata", {{"namespace", "kube-system"}, {"name", "sluice"}}},
            {"spec",
             {{"selector", {{"matchLabels", {{"app", "sluice"}}}}},
              {"template",
               {{"metadata", {{"labels", {{"app", "sluice"}}}}},
                {"spec",
                 {{"hostNetwork", true},
                  {"nodeSelector", {{"kubernetes.io/os", "linux"}}},
                  {"containers", json::array({{{"name", "agent"}, {"image", image}}})}}}}}}}};
  }

  std::string dir_;
  Topology topology_;
  std::unique_ptr<ObjectStore> store_;
  std::unique_ptr<Workloads> workloads_;
};

TEST_F(WorkloadsTest, NodeReadyFollowsTheConflist) {
  const LabNode& n1 = topology_.nodes[0];
  SyncNodeReady(store_.get(), topology_);
  EXPECT_EQ(ReadyOf("node1"), "False");
  std::ofstream(n1.cni_conf_dir() + "/05-sluice.conflist") << "{}";
  SyncNodeReady(store_.get(), topology_);
  EXPECT_EQ(ReadyOf("node1"), "True");
  EXPECT_EQ(ReadyOf("node2"), "False");
  auto node = store_->Get(Resource("nodes"), "", "node1");
  EXPECT_EQ((*node)["status"]["conditions"].size(), 1u);
  EXPECT_EQ((*node)["status"]["conditions"][0]["reason"], "KubeletReady");
  fs::remove(n1.cni_conf_dir() + "/05-sluice.conflist");
  SyncNodeReady(store_.get(), topology_);
  EXPECT_EQ(ReadyOf("node1"), "False");
  node = store_->Get(Resource("nodes"), "", "node1");
  EXPECT_EQ((*node)["status"]["conditions"][0]["reason"], "KubeletNotReady");
}

TEST_F(WorkloadsTest, DaemonSetGetsOneOwnedPodPerSelectedNodeAndItsPodsGoWithIt) {
  StartWorkloads();
  // Not Sluice's image: left alone.
  json other = DaemonSet("busybox");
  other["metadata"]["name"] = "other";
  ASSERT_TRUE(store_->Create(Resource("daemonsets"), other).ok());
  auto ds = store_->Create(Resource("daemonsets"), DaemonSet("sluice/sluice-agent:0.1.0"));
  ASSERT_TRUE(ds.ok()) << ds.status();
  std::string uid = (*ds)["metadata"]["uid"];
  ASSERT_TRUE(Eventually([&] { return Pods().size() == 2; })) << Pods().size();
  std::set<std::string> nodes;
  for (const json& p : Pods()) {
    nodes.insert(p["spec"]["nodeName"].get<std::string>());
    EXPECT_EQ(p["metadata"]["ownerReferences"][0]["uid"], uid);
    EXPECT_EQ(p["metadata"]["ownerReferences"][0]["kind"], "DaemonSet");
    EXPECT_EQ(p["metadata"]["labels"]["app"], "sluice");
    EXPECT_FALSE(p["metadata"]["labels"]["controller-revision-hash"].get<std::string>().empty());
    EXPECT_EQ(p["metadata"]["name"].get<std::string>().rfind("sluice-", 0), 0u);
  }
  EXPECT_EQ(nodes, (std::set<std::string>{"node1", "node2"}));
  // The containers could not start: the pods say why instead of looking healthy.
  ASSERT_TRUE(Eventually([&] {
    for (const json& p : Pods()) {
      if (p["status"].value("phase", "") != "Pending" || p["status"].value("message", "").empty()) {
        return false;
      }
    }
    return true;
  }));
  ASSERT_TRUE(store_->Delete(Resource("daemonsets"), "kube-system", "sluice", {}).ok());
  EXPECT_TRUE(Eventually([&] { return Pods().empty(); })) << Pods().size();
}

TEST_F(WorkloadsTest, DeploymentWithAntiAffinitySpreadsItsReplicasOverNodes) {
  StartWorkloads();
  json d = {
      {"apiVersion", "apps/v1"},
      {"kind", "Deployment"},
      {"metadata", {{"namespace", "kube-system"}, {"name", "sluice-operator"}}},
      {"spec",
       {{"replicas", 3},
        {"template",
         {{"metadata", {{"labels", {{"app", "op"}}}}},
          {"spec",
           {{"hostNetwork", true},
            {"affinity",
             {{"podAntiAffinity",
               {{"requiredDuringSchedulingIgnoredDuringExecution",
                 json::array({{{"topologyKey", "kubernetes.io/hostname"}}})}}}}},
            {"containers", json::array({{{"name", "op"},
                                         {"image", "sluice/sluice-agent:0.1.0"},
                                         {"command", json::array({"sluice-operator"})}}})}}}}}}}};
  ASSERT_TRUE(store_->Create(Resource("deployments"), d).ok());
  // Three replicas, two nodes: two pods, one per node; the third stays unscheduled (not made).
  // The round that made them found no node for the third and said so in the status.
  ASSERT_TRUE(Eventually([&] {
    auto o = store_->Get(Resource("deployments"), "kube-system", "sluice-operator");
    return o.ok() && (*o)["status"].is_object() && (*o)["status"].value("replicas", 0) == 2;
  }));
  std::set<std::string> nodes;
  for (const json& p : Pods()) nodes.insert(p["spec"]["nodeName"].get<std::string>());
  EXPECT_EQ(nodes.size(), 2u);
  EXPECT_EQ(Pods().size(), 2u);
}

}  // namespace
}  // namespace sluice::lab
