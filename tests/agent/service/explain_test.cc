// The four faults that all look like `clusterip,reject` in the maps, told apart from the store:
// no selector, a selector matching nothing, an unresolved named targetPort, no ready pod.
#include "agent/service/explain.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace sluice::agent {
namespace {

using k8s::EndpointSlice;
using k8s::Pod;
using k8s::Service;
using ::testing::HasSubstr;

Service Svc(k8s::StringMap selector, k8s::IntOrString target) {
  Service s;
  s.meta.namespace_ = "default";
  s.meta.name = "web";
  s.cluster_ips = {"10.96.0.10"};
  s.selector = std::move(selector);
  k8s::ServicePort p;
  p.name = "http";
  p.port = 80;
  p.target_port = std::move(target);
  s.ports = {p};
  return s;
}

std::shared_ptr<const Pod> MakePod(std::string name, bool ready, k8s::StringMap labels,
                                   std::string port_name = "http") {
  auto p = std::make_shared<Pod>();
  p->meta.namespace_ = "default";
  p->meta.name = std::move(name);
  p->meta.labels = std::move(labels);
  p->ready = ready;
  p->container_ports = {{port_name, 8080, k8s::Protocol::kTCP}};
  return p;
}

std::shared_ptr<const EndpointSlice> Slice(bool ready) {
  auto s = std::make_shared<EndpointSlice>();
  s->meta.namespace_ = "default";
  s->meta.name = "web-abc";
  s->service_name = "web";
  s->address_type = "IPv4";
  s->ports = {{"http", k8s::Protocol::kTCP, 8080}};
  k8s::Endpoint e;
  e.address = "10.244.0.5";
  e.ready = ready;
  e.serving = ready;
  s->endpoints = {e};
  return s;
}

k8s::IntOrString Named(std::string n) { return {.is_name = true, .name = std::move(n)}; }

TEST(ExplainServiceTest, EmptySelectorWithoutHandMadeSlices) {
  auto d = DiagnoseService(Svc({}, Named("http")), {}, {});
  ASSERT_EQ(d.ports.size(), 1u);
  EXPECT_THAT(d.ports[0].why_empty, HasSubstr("no selector"));
}

TEST(ExplainServiceTest, SelectorMatchingNoPod) {
  auto d = DiagnoseService(Svc({{"app", "wbe"}}, Named("http")), {},
                           {MakePod("web-1", true, {{"app", "web"}})});
  EXPECT_EQ(d.ports[0].why_empty, "selector app=wbe matches no pod in namespace default");
}

TEST(ExplainServiceTest, NamedTargetPortNoMatchingPodDeclares) {
  auto d = DiagnoseService(Svc({{"app", "web"}}, Named("htpp")), {},
                           {MakePod("web-1", true, {{"app", "web"}})});
  EXPECT_EQ(d.ports[0].why_empty,
            "targetPort 'htpp' is no container port (TCP) of the 1 pod(s) the selector matches");
}

TEST(ExplainServiceTest, MatchingPodsNoneReady) {
  auto d = DiagnoseService(Svc({{"app", "web"}}, Named("http")), {Slice(false)},
                           {MakePod("web-1", false, {{"app", "web"}})});
  EXPECT_EQ(d.ports[0].not_ready, 1);
  EXPECT_EQ(d.ports[0].why_empty, "1 pod(s) match the selector, none is ready");
}

TEST(ExplainServiceTest, AServingServiceHasNoReason) {
  auto d = DiagnoseService(Svc({{"app", "web"}}, Named("http")), {Slice(true)},
                           {MakePod("web-1", true, {{"app", "web"}})});
  EXPECT_EQ(d.ports[0].ready, 1);
  EXPECT_EQ(d.ports[0].why_empty, "");
}

TEST(ExplainServiceTest, JsonListsServicesWithPortsAndReasons) {
  auto svc = std::make_shared<Service>(Svc({{"app", "x"}}, {.number = 8080}));
  auto j = nlohmann::json::parse(DiagnoseServicesJson({svc}, {}, {}));
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0]["name"], "web");
  EXPECT_EQ(j[0]["ports"][0]["targetPort"], "8080");
  EXPECT_THAT(j[0]["ports"][0]["whyEmpty"].get<std::string>(), HasSubstr("matches no pod"));
}

}  // namespace
}  // namespace sluice::agent
