// The agent's Kubernetes wiring (KubernetesState) against the lab apiserver, through a
// kubeconfig as an operator would configure it: which kinds are watched, kube-proxy's Service
// filter, the sync gate and the node's pod CIDR.
#include "agent/k8s/watches.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/lab/apiserver/apiserver.h"
#include "nlohmann/json.hpp"
#include "support/eventually.h"
#include "support/temp_dir.h"

namespace sluice::agent {
namespace {

using nlohmann::json;
using ::sluice::testing::Eventually;
using ::sluice::testing::TempDir;
using ::testing::HasSubstr;

json NodeJson(const std::string& name) {
  return json{{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", name}}}};
}

json ServiceJson(const std::string& name, json labels = json::object()) {
  return json{{"apiVersion", "v1"},
              {"kind", "Service"},
              {"metadata", {{"name", name}, {"namespace", "default"}, {"labels", labels}}},
              {"spec", {{"ports", json::array({{{"port", 80}, {"protocol", "TCP"}}})}}}};
}

class WatchesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<lab::ApiServer>(lab::ApiServerOptions{});
    ASSERT_TRUE(server_->Start().ok());
    ASSERT_TRUE(server_->WriteKubeconfig(tmp_ / "kubeconfig").ok());
  }
  void TearDown() override {
    k8s_.reset();
    server_->Stop();
  }

  void Start(const std::string& node) {
    KubernetesOptions o;
    o.config.kubeconfig = tmp_ / "kubeconfig";
    o.node_name = node;
    auto k = KubernetesState::Start(o);
    ASSERT_TRUE(k.ok()) << k.status();
    k8s_ = *std::move(k);
  }

  void Create(const char* plural, const json& obj) {
    auto r = server_->store().Create(lab::Resource(plural), obj);
    ASSERT_TRUE(r.ok()) << r.status();
  }

  std::string PodCidrOf(const std::string& node) {
    auto obj = server_->store().Get(lab::Resource("nodes"), "", node);
    if (!obj.ok()) return "";
    return obj->value("spec", json::object()).value("podCIDR", "");
  }

  TempDir tmp_{"sluice-watches-test"};
  std::unique_ptr<lab::ApiServer> server_;
  std::unique_ptr<KubernetesState> k8s_;
};

TEST_F(WatchesTest, PodCidrIsTheOneOfThisNodesObject) {
  Create("nodes", NodeJson("n1"));
  Create("nodes", NodeJson("n2"));
  ASSERT_TRUE(Eventually([&] { return !PodCidrOf("n1").empty() && !PodCidrOf("n2").empty(); }));
  ASSERT_NE(PodCidrOf("n1"), PodCidrOf("n2"));
  Start("n2");
  auto cidr = k8s_->WaitForPodCidr(absl::Seconds(20));
  ASSERT_TRUE(cidr.ok()) << cidr.status();
  EXPECT_EQ(cidr->ToString(), PodCidrOf("n2"));
}

TEST_F(WatchesTest, UnknownNodeHasNoPodCidrAndSaysSo) {
  Start("absent");
  auto cidr = k8s_->WaitForPodCidr(absl::Milliseconds(500));
  ASSERT_FALSE(cidr.ok());
  EXPECT_EQ(cidr.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(cidr.status().message(), HasSubstr("absent"));
}

TEST_F(WatchesTest, GateOpensOnceEveryKindHasListed) {
  Start("n1");
  ASSERT_TRUE(k8s_->WaitForSync(absl::Seconds(20)));
  EXPECT_TRUE(k8s_->synced());
  EXPECT_TRUE(k8s_->services().HasSynced());
  EXPECT_TRUE(k8s_->endpoint_slices().HasSynced());
  EXPECT_TRUE(k8s_->pods().HasSynced());
  EXPECT_TRUE(k8s_->nodes().HasSynced());
  EXPECT_NE(k8s_->services().Get("default/kubernetes"), nullptr);
}

TEST_F(WatchesTest, ServicesFollowKubeProxysFilter) {
  Start("n1");
  ASSERT_TRUE(k8s_->WaitForSync(absl::Seconds(20)));
  Create("services", ServiceJson("headless", {{"service.kubernetes.io/headless", ""}}));
  Create("services", ServiceJson("other-proxy", {{"service.kubernetes.io/service-proxy-name", "x"}}));
  Create("services", ServiceJson("web"));
  ASSERT_TRUE(Eventually([&] { return k8s_->services().Get("default/web") != nullptr; }));
  // Created before "web", so delivered before it on the same watch had they passed the filter.
  EXPECT_EQ(k8s_->services().Get("default/headless"), nullptr);
  EXPECT_EQ(k8s_->services().Get("default/other-proxy"), nullptr);
}

TEST_F(WatchesTest, ABrokenKubeconfigIsAnError) {
  KubernetesOptions o;
  o.config.kubeconfig = tmp_ / "missing";
  o.node_name = "n1";
  auto k = KubernetesState::Start(o);
  EXPECT_FALSE(k.ok());
}

}  // namespace
}  // namespace sluice::agent
