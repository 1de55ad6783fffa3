#include "agent/lab/controllers/controllers.h"

#include <gtest/gtest.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "agent/base/fake_clock.h"
#include "agent/lab/lab_client.h"

namespace sluice::lab {
namespace {

using nlohmann::json;
using ::sluice::testing::Eventually;

json Service(const std::string& name, json spec) {
  return {{"metadata", {{"namespace", "default"}, {"name", name}}}, {"spec", spec}};
}

json Pod(const std::string& name, const std::string& ip, bool ready, json ports = json::array()) {
  json pod = {
      {"metadata", {{"namespace", "default"}, {"name", name}, {"labels", {{"app", "web"}}}}},
      {"spec",
       {{"nodeName", "node-1"}, {"containers", json::array({{{"name", "c"}, {"ports", ports}}})}}},
      {"status",
       {{"phase", "Running"},
        {"conditions", json::array({{{"type", "Ready"}, {"status", ready ? "True" : "False"}}})}}}};
  if (!ip.empty()) pod["status"]["podIP"] = ip;
  return pod;
}

class ControllersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ObjectStore::Options o;
    o.clock = &clock_;
    store_ = std::make_unique<ObjectStore>(o);
    admission_ = *ServiceAdmission::Create(options_);
    store_->SetAdmission(admission_.get());
    controllers_ = std::make_unique<Controllers>(store_.get(), options_);
    clock_.AddObserver([this] { controllers_->Wake(); });
    ASSERT_TRUE(Controllers::Bootstrap(store_.get(), options_, "127.0.0.1", 6443).ok());
    ASSERT_TRUE(controllers_->Start().ok());
  }
  void TearDown() override { controllers_->Stop(); }

  absl::StatusOr<json> CreateService(const std::string& name, json spec) {
    return store_->Create(Resource("services"), Service(name, spec));
  }
  std::vector<json> Slices(const std::string& svc) {
    ListOptions o;
    o.labels = *LabelSelector::Parse(absl::StrCat("kubernetes.io/service-name=", svc));
    std::vector<json> out;
    auto list = store_->List(Resource("endpointslices"), o);
    for (auto& p : list->items) out.push_back(*p);
    return out;
  }

  FakeClock clock_;
  ControllerOptions options_;
  std::unique_ptr<ObjectStore> store_;
  std::unique_ptr<ServiceAdmission> admission_;
  std::unique_ptr<Controllers> controllers_;
};

TEST_F(ControllersTest, BootstrapCreatesNamespacesAndTheKubernetesService) {
  EXPECT_TRUE(store_->Get(Resource("namespaces"), "", "kube-system").ok());
  auto svc = store_->Get(Resource("services"), "default", "kubernetes");
  ASSERT_TRUE(svc.ok());
  EXPECT_EQ((*svc)["spec"]["clusterIP"], "10.96.0.1");
  EXPECT_EQ(Slices("kubernetes").size(), 1u);
}

TEST_F(ControllersTest, ServiceDefaultsAndClusterIpAllocation) {
  auto a = CreateService("a", {{"ports", json::array({{{"port", 80}}})}});
  ASSERT_TRUE(a.ok()) << a.status();
  const json& spec = (*a)["spec"];
  EXPECT_EQ(spec["type"], "ClusterIP");
  EXPECT_EQ(spec["sessionAffinity"], "None");
  EXPECT_EQ(spec["ports"][0]["protocol"], "TCP");
  EXPECT_EQ(spec["ports"][0]["targetPort"], 80);
  std::string ip = spec["clusterIP"];
  EXPECT_EQ(ip.rfind("10.96.", 0), 0u);
  EXPECT_NE(ip, "10.96.0.1");
  EXPECT_EQ(spec["clusterIPs"], json::array({ip}));
  auto b = CreateService("b", {{"ports", json::array({{{"port", 80}}})}});
  EXPECT_NE((*b)["spec"]["clusterIP"], ip);

  auto headless = CreateService("h", {{"clusterIP", "None"}});
  EXPECT_EQ((*headless)["spec"]["clusterIP"], "None");
  auto ext = CreateService("e", {{"type", "ExternalName"}, {"externalName", "x.example"}});
  EXPECT_FALSE((*ext)["spec"].contains("clusterIP"));

  auto dup = CreateService("dup", {{"clusterIP", ip}});
  EXPECT_TRUE(absl::IsInvalidArgument(dup.status())) << dup.status();
  auto outside = CreateService("out", {{"clusterIP", "192.168.0.1"}});
  EXPECT_TRUE(absl::IsInvalidArgument(outside.status()));

  // Released on delete: the same IP can be requested again.
  ASSERT_TRUE(store_->Delete(Resource("services"), "default", "a", {}).ok());
  auto again = CreateService("again", {{"clusterIP", ip}});
  ASSERT_TRUE(again.ok()) << again.status();
  // Immutable on update.
  auto changed = store_->Update(Resource("services"), "default", "again", [](json& s) {
    s["spec"]["clusterIP"] = "10.96.5.5";
    return absl::OkStatus();
  });
  EXPECT_TRUE(absl::IsInvalidArgument(changed.status()));
}

TEST_F(ControllersTest, NodePortAllocationRejectsDuplicatesAndReleases) {
  auto a = CreateService(
      "a", {{"type", "NodePort"},
            {"ports", json::array({{{"port", 80}}, {{"port", 81}, {"nodePort", 30080}}})}});
  ASSERT_TRUE(a.ok()) << a.status();
  int first = (*a)["spec"]["ports"][0]["nodePort"];
  EXPECT_GE(first, 30000);
  EXPECT_LE(first, 32767);
  EXPECT_EQ((*a)["spec"]["ports"][1]["nodePort"], 30080);
  EXPECT_EQ((*a)["spec"]["externalTrafficPolicy"], "Cluster");
  auto dup = CreateService(
      "dup", {{"type", "NodePort"}, {"ports", json::array({{{"port", 80}, {"nodePort", 30080}}})}});
  EXPECT_TRUE(absl::IsInvalidArgument(dup.status()));
  EXPECT_NE(dup.status().message().find("provided port is already allocated"), std::string::npos);
  auto range = CreateService(
      "r", {{"type", "NodePort"}, {"ports", json::array({{{"port", 80}, {"nodePort", 80}}})}});
  EXPECT_TRUE(absl::IsInvalidArgument(range.status()));

  // Updating without nodePort keeps the allocated one.
  auto kept = store_->Update(Resource("services"), "default", "a", [](json& s) {
    s["spec"]["ports"][0].erase("nodePort");
    return absl::OkStatus();
  });
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ((*kept)["spec"]["ports"][0]["nodePort"], first);

  auto lb = CreateService("lb", {{"type", "LoadBalancer"},
                                 {"externalTrafficPolicy", "Local"},
                                 {"ports", json::array({{{"port", 443}}})}});
  ASSERT_TRUE(lb.ok());
  EXPECT_GE((*lb)["spec"]["healthCheckNodePort"].get<int>(), 30000);

  size_t before = admission_->allocated_node_ports();
  ASSERT_TRUE(store_->Delete(Resource("services"), "default", "a", {}).ok());
  EXPECT_EQ(admission_->allocated_node_ports(), before - 2);
  EXPECT_TRUE(CreateService("dup2", {{"type", "NodePort"},
                                     {"ports", json::array({{{"port", 80}, {"nodePort", 30080}}})}})
                  .ok());
}

TEST_F(ControllersTest, EndpointSliceReflectsReadinessTerminationAndNamedPorts) {
  json http = json::array({{{"name", "http"}, {"containerPort", 8080}}});
  ASSERT_TRUE(
      CreateService(
          "web",
          {{"selector", {{"app", "web"}}},
           {"ports", json::array({{{"name", "http"}, {"port", 80}, {"targetPort", "http"}}})}})
          .ok());
  ASSERT_TRUE(store_->Create(Resource("pods"), Pod("ready", "10.244.0.2", true, http)).ok());
  ASSERT_TRUE(store_->Create(Resource("pods"), Pod("notready", "10.244.0.3", false, http)).ok());
  ASSERT_TRUE(store_->Create(Resource("pods"), Pod("noip", "", true, http)).ok());
  json terminating = Pod("term", "10.244.0.4", true, http);
  terminating["spec"]["terminationGracePeriodSeconds"] = 30;
  ASSERT_TRUE(store_->Create(Resource("pods"), terminating).ok());
  ASSERT_TRUE(store_->Delete(Resource("pods"), "default", "term", {}).ok());

  std::vector<json> slices;
  ASSERT_TRUE(Eventually([&] {
    slices = Slices("web");
    return slices.size() == 1 && slices[0]["endpoints"].size() == 3 &&
           slices[0]["endpoints"][2]["conditions"]["terminating"] == true;
  })) << json(slices).dump(2);
  const json& s = slices[0];
  EXPECT_EQ(s["addressType"], "IPv4");
  EXPECT_EQ(s["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"],
            "endpointslice-controller.k8s.io");
  EXPECT_EQ(s["metadata"]["ownerReferences"][0]["kind"], "Service");
  EXPECT_EQ(s["metadata"]["name"].get<std::string>().rfind("web-", 0), 0u);
  EXPECT_EQ(s["ports"], json::parse(R"([{"name":"http","port":8080,"protocol":"TCP"}])"));
  auto cond = [&](int i) { return s["endpoints"][i]["conditions"]; };
  // Sorted by pod name: notready, ready, term.
  EXPECT_EQ(s["endpoints"][0]["targetRef"]["name"], "notready");
  EXPECT_EQ(cond(0), json({{"ready", false}, {"serving", false}, {"terminating", false}}));
  EXPECT_EQ(cond(1), json({{"ready", true}, {"serving", true}, {"terminating", false}}));
  EXPECT_EQ(cond(2), json({{"ready", false}, {"serving", true}, {"terminating", true}}));
  EXPECT_EQ(s["endpoints"][1]["nodeName"], "node-1");

  // Graceful deletion ends when the (fake) clock passes the grace period.
  clock_.Advance(absl::Seconds(31));
  ASSERT_TRUE(Eventually([&] {
    return absl::IsNotFound(store_->Get(Resource("pods"), "default", "term").status()) &&
           Slices("web")[0]["endpoints"].size() == 2;
  }));

  // Deleting the Service deletes its slices.
  ASSERT_TRUE(store_->Delete(Resource("services"), "default", "web", {}).ok());
  EXPECT_TRUE(Eventually([&] { return Slices("web").empty(); }));
}

TEST_F(ControllersTest, PodsResolvingANamedPortDifferentlyGetSeparateSlices) {
  json svc = Service(
      "web", {{"selector", {{"app", "web"}}},
              {"ports", json::array({{{"name", "http"}, {"port", 80}, {"targetPort", "http"}}})}});
  svc["metadata"]["uid"] = "u1";
  std::vector<json> pods = {
      Pod("a", "10.0.0.1", true, json::array({{{"name", "http"}, {"containerPort", 8080}}})),
      Pod("b", "10.0.0.2", true, json::array({{{"name", "http"}, {"containerPort", 9090}}})),
      Pod("c", "10.0.0.3", true, json::array({{{"name", "other"}, {"containerPort", 1}}})),
  };
  auto slices = DesiredEndpointSlices(svc, pods);
  ASSERT_EQ(slices.size(), 3u);
  std::set<std::string> ports;
  for (const json& s : slices) ports.insert(s["ports"].dump());
  EXPECT_TRUE(ports.contains("[]"));  // c does not declare the port
  EXPECT_TRUE(ports.contains(R"([{"name":"http","port":8080,"protocol":"TCP"}])"));
  EXPECT_TRUE(ports.contains(R"([{"name":"http","port":9090,"protocol":"TCP"}])"));
}

TEST_F(ControllersTest, SliceFollowsPodChanges) {
  ASSERT_TRUE(CreateService("web", {{"selector", {{"app", "web"}}},
                                    {"ports", json::array({{{"port", 80}, {"targetPort", 8080}}})}})
                  .ok());
  EXPECT_TRUE(Eventually([&] {
    auto s = Slices("web");
    return s.size() == 1 && s[0]["endpoints"].empty();  // placeholder
  }));
  ASSERT_TRUE(store_->Create(Resource("pods"), Pod("a", "10.244.0.2", false)).ok());
  ASSERT_TRUE(Eventually([&] {
    auto s = Slices("web");
    return s.size() == 1 && s[0]["endpoints"].size() == 1 &&
           s[0]["endpoints"][0]["conditions"]["ready"] == false;
  }));
  ASSERT_TRUE(store_
                  ->Update(
                      Resource("pods"), "default", "a",
                      [](json& p) {
                        p["status"]["conditions"][0]["status"] = "True";
                        return absl::OkStatus();
                      },
                      ObjectStore::Subresource::kStatus)
                  .ok());
  EXPECT_TRUE(Eventually([&] {
    auto s = Slices("web");
    return s.size() == 1 && s[0]["endpoints"][0]["conditions"]["ready"] == true;
  }));
  ASSERT_TRUE(store_
                  ->Update(Resource("pods"), "default", "a",
                           [](json& p) {
                             p["metadata"]["labels"]["app"] = "other";
                             return absl::OkStatus();
                           })
                  .ok());
  EXPECT_TRUE(Eventually([&] { return Slices("web")[0]["endpoints"].empty(); }));
}

TEST_F(ControllersTest, NodesGetDistinctPodCidrs) {
  // The preset node first: the allocator runs meanwhile, and a node created before it could
  // already hold its CIDR.
  ASSERT_TRUE(store_
                  ->Create(Resource("nodes"), {{"metadata", {{"name", "preset"}}},
                                               {"spec", {{"podCIDR", "10.244.0.0/24"}}}})
                  .ok());
  for (const char* n : {"n1", "n2"}) {
    ASSERT_TRUE(store_->Create(Resource("nodes"), {{"metadata", {{"name", n}}}}).ok());
  }
  std::set<std::string> cidrs;
  ASSERT_TRUE(Eventually([&] {
    cidrs.clear();
    for (const char* n : {"n1", "n2"}) {
      auto node = store_->Get(Resource("nodes"), "", n);
      if (!(*node)["spec"].contains("podCIDR")) return false;
      cidrs.insert((*node)["spec"]["podCIDR"].get<std::string>());
      EXPECT_EQ((*node)["spec"]["podCIDRs"][0], (*node)["spec"]["podCIDR"]);
    }
    return true;
  }));
  EXPECT_EQ(cidrs.size(), 2u);
  EXPECT_FALSE(cidrs.contains("10.244.0.0/24"));
  for (const std::string& c : cidrs) EXPECT_EQ(c.rfind("10.244.", 0), 0u) << c;
}

}  // namespace
}  // namespace sluice::lab
