// Flows as observers see them: raw datapath events decoded, named from the agent's stores (Pod
// and Service stores, the endpoint store, the reverse NAT map), filtered with `hubble observe`'s
// semantics, and their JSON form round-tripping.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <optional>

#include "agent/monitor/filter.h"
#include "agent/monitor/flow.h"
#include "agent/monitor/names.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "maps/drop.h"
#include "maps/policy.h"
#include "nlohmann/json.hpp"
#include "support/temp_dir.h"

namespace sluice::monitor {
namespace {

uint32_t Ip4(const char* s) {
  in_addr a{};
  inet_pton(AF_INET, s, &a);
  return a.s_addr;
}

sluice_event Event(uint8_t type, const char* src, const char* dst, uint16_t sport, uint16_t dport,
                   uint8_t proto = IPPROTO_TCP) {
  sluice_event e{};
  e.ts_ns = 1'000'000'000;
  e.type = type;
  e.verdict = SLUICE_VERDICT_FORWARDED;
  e.family = 4;
  e.proto = proto;
  e.saddr[0] = Ip4(src);
  e.daddr[0] = Ip4(dst);
  e.sport = htons(sport);
  e.dport = htons(dport);
  return e;
}

sluice_event Drop(const char* src, const char* dst, uint16_t dport, uint8_t reason) {
  sluice_event e = Event(SLUICE_EVENT_DROP, src, dst, 40000, dport);
  e.verdict = SLUICE_VERDICT_DROPPED;
  e.reason = reason;
  e.point = SLUICE_POINT_INGRESS;
  e.ifindex = 7;
  return e;
}

sluice_event Translation(const char* client, const char* frontend, uint16_t fport,
                         const char* backend, uint16_t bport, uint32_t rev_nat_id) {
  sluice_event e = Event(SLUICE_EVENT_TRANSLATE, client, frontend, 40000, fport);
  e.nat_addr[0] = Ip4(backend);
  e.nat_port = htons(bport);
  e.id = rev_nat_id;
  return e;
}

k8s::Pod MakePod(const std::string& ns, const std::string& name, const std::string& ip) {
  k8s::Pod p;
  p.meta.namespace_ = ns;
  p.meta.name = name;
  p.meta.uid = ns + "-" + name;
  p.pod_ips = {ip};
  return p;
}

k8s::Service MakeService(const std::string& ns, const std::string& name, const std::string& ip,
                         int32_t port, int32_t node_port = 0) {
  k8s::Service s;
  s.meta.namespace_ = ns;
  s.meta.name = name;
  s.meta.uid = ns + "-" + name;
  s.cluster_ips = {ip};
  k8s::ServicePort sp;
  sp.port = port;
  sp.node_port = node_port;
  s.ports = {sp};
  return s;
}

class FlowNamesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pods_.Upsert(MakePod("shop", "web-0", "10.244.0.10"));
    pods_.Upsert(MakePod("shop", "db-0", "10.244.1.20"));
    services_.Upsert(MakeService("shop", "db", "10.96.0.50", 5432, 30432));
    auto store = agent::EndpointStore::Open(dir_.path());
    ASSERT_TRUE(store.ok()) << store.status();
    endpoints_ = std::move(*store);
    agent::Endpoint ep;
    ep.container_id = "c1";
    ep.ifname = "eth0";
    ep.netns = "/proc/1/ns/net";
    ep.pod_namespace = "batch";
    ep.pod_name = "job-1";  // known only to the endpoint store (no apiserver)
    ep.host_ifname = "lxc1";
    ep.ipv4 = "10.244.0.30";
    ASSERT_TRUE(endpoints_->Put(ep).ok());
  }
  FlowNames Names() {
    NameSources s;
    s.pods = &pods_;
    s.services = &services_;
    s.endpoints = endpoints_.get();
    s.rev_nat = [](uint32_t id) -> std::optional<sluice_lb4_revnat> {
      if (id != 9) return std::nullopt;
      sluice_lb4_revnat v{};
      v.addr = Ip4("10.96.0.50");
      v.port = htons(5432);
      return v;
    };
    s.interface_name = [](uint32_t ifindex) { return ifindex == 7 ? "lxc1" : ""; };
    return FlowNames(std::move(s));
  }
  Flow Named(const sluice_event& e) {
    Flow f = DecodeEvent(e, absl::ZeroDuration(), "node-a");
    Names().Name(f);
    return f;
  }

  testing::TempDir dir_;
  k8s::Store<k8s::Pod> pods_;
  k8s::Store<k8s::Service> services_;
  std::unique_ptr<agent::EndpointStore> endpoints_;
};

TEST_F(FlowNamesTest, DropIsDecodedWithReasonInterfaceAndPodNames) {
  Flow f = Named(Drop("10.244.0.10", "10.244.1.20", 5432, SLUICE_DROP_SPOOFED_SOURCE));
  EXPECT_EQ(f.type, "drop");
  EXPECT_EQ(f.verdict, "dropped");
  EXPECT_EQ(f.drop_reason, "spoofed_source");
  EXPECT_EQ(f.point, "ingress");
  EXPECT_EQ(f.interface, "lxc1");
  EXPECT_EQ(f.protocol, "tcp");
  EXPECT_EQ(f.node, "node-a");
  EXPECT_EQ(f.source.namespace_, "shop");
  EXPECT_EQ(f.source.pod, "web-0");
  EXPECT_EQ(f.destination.pod, "db-0");
  EXPECT_EQ(f.destination.port, 5432);
  EXPECT_EQ(f.time, absl::UnixEpoch() + absl::Seconds(1));
}

TEST_F(FlowNamesTest, PodKnownOnlyToTheEndpointStoreIsNamed) {
  Flow f = Named(Drop("10.244.0.30", "192.0.2.1", 80, SLUICE_DROP_NAT_NO_PORT));
  EXPECT_EQ(f.source.namespace_, "batch");
  EXPECT_EQ(f.source.pod, "job-1");
  EXPECT_TRUE(f.destination.pod.empty());
}

TEST_F(FlowNamesTest, TranslationNamesItsServiceFromTheRevNatIdAndItsBackendPod) {
  Flow f = Named(Translation("10.244.0.10", "10.96.0.50", 5432, "10.244.1.20", 5432, 9));
  EXPECT_EQ(f.type, "translate");
  EXPECT_EQ(f.service_namespace, "shop");
  EXPECT_EQ(f.service, "db");
  EXPECT_EQ(f.backend.pod, "db-0");
  EXPECT_EQ(f.backend.port, 5432);
}

TEST_F(FlowNamesTest, NodePortTranslationIsNamedThroughTheNodePort) {
  // A NodePort's reverse NAT entry names the node address and the node port.
  NameSources s;
  s.services = &services_;
  s.rev_nat = [](uint32_t) -> std::optional<sluice_lb4_revnat> {
    sluice_lb4_revnat v{};
    v.addr = Ip4("192.168.1.1");
    v.port = htons(30432);
    return v;
  };
  FlowNames names(std::move(s));
  Flow f = DecodeEvent(Translation("203.0.113.9", "192.168.1.1", 30432, "10.244.1.20", 5432, 3),
                       absl::ZeroDuration(), "node-a");
  names.Name(f);
  EXPECT_EQ(f.service, "db");
}

TEST_F(FlowNamesTest, DropOnTheWayToAFrontendNamesTheService) {
  Flow f = Named(Drop("10.244.0.10", "10.96.0.50", 5432, SLUICE_DROP_SERVICE_NO_BACKEND));
  EXPECT_EQ(f.service_namespace, "shop");
  EXPECT_EQ(f.service, "db");
}

TEST_F(FlowNamesTest, PolicyVerdictCarriesDirectionEnforcementAndEndpoint) {
  sluice_event e = Event(SLUICE_EVENT_POLICY, "10.244.0.10", "10.244.1.20", 40000, 5432);
  e.verdict = SLUICE_VERDICT_DROPPED;
  e.reason = SLUICE_DROP_POLICY_DENIED;
  e.policy_dir = SLUICE_POLICY_INGRESS;
  e.flags = SLUICE_EVENT_F_ENFORCED;
  e.id = 12;
  Flow f = Named(e);
  EXPECT_EQ(f.type, "policy");
  EXPECT_EQ(f.verdict, "dropped");
  EXPECT_EQ(f.drop_reason, "policy_denied");
  EXPECT_EQ(f.policy_direction, "ingress");
  EXPECT_TRUE(f.policy_enforced);
  EXPECT_EQ(f.endpoint_id, 12u);
}

TEST_F(FlowNamesTest, JsonRoundTripKeepsEveryField) {
  Flow f = Named(Translation("10.244.0.10", "10.96.0.50", 5432, "10.244.1.20", 5432, 9));
  f.tcp_flags = "SYN";
  auto back = FlowFromJson(FlowToJson(f));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(FlowToJson(*back), FlowToJson(f));
  EXPECT_EQ(back->time, f.time);
  EXPECT_EQ(back->backend.pod, "db-0");
  EXPECT_EQ(back->service, "db");
}

absl::StatusOr<FlowFilter> Filter(const char* json) {
  return FilterFromJson(nlohmann::json::parse(json));
}

TEST_F(FlowNamesTest, FiltersAreAndedAcrossOptionsAndOredWithinOne) {
  Flow drop = Named(Drop("10.244.0.10", "10.244.1.20", 5432, SLUICE_DROP_SPOOFED_SOURCE));
  Flow xlate = Named(Translation("10.244.0.30", "10.96.0.50", 5432, "10.244.1.20", 5432, 9));
  struct Case {
    const char* filter;
    bool drop, xlate;
  } cases[] = {
      {"{}", true, true},
      {R"({"verdict":"dropped"})", true, false},
      {R"({"verdict":"forwarded"})", false, true},
      {R"({"pods":["shop/web-0"]})", true, false},
      {R"({"pods":["shop/db-0"]})", true, true},  // the translation's backend
      {R"({"pods":["web-0"]})", false, false},    // a bare name is in namespace default
      {R"({"pods":["shop/web-0","batch/job-1"]})", true, true},
      {R"({"namespaces":["batch"]})", false, true},
      {R"({"ips":["10.244.0.10"]})", true, false},
      {R"({"ips":["10.244.0.0/24"]})", true, true},
      {R"({"ips":["10.244.0.0/24"],"verdict":"dropped"})", true, false},
      {R"({"ports":[5432]})", true, true},
      {R"({"ports":[40001]})", false, false},
      {R"({"protocols":["udp"]})", false, false},
      {R"({"protocols":["TCP"]})", true, true},
      {R"({"drop_reasons":["spoofed_source"]})", true, false},
      {R"({"services":["shop/db"]})", false, true},
      {R"({"types":["translate","close"]})", false, true},
  };
  for (const Case& c : cases) {
    auto f = Filter(c.filter);
    ASSERT_TRUE(f.ok()) << c.filter << ": " << f.status();
    EXPECT_EQ(Matches(*f, drop), c.drop) << c.filter;
    EXPECT_EQ(Matches(*f, xlate), c.xlate) << c.filter;
    auto again = FilterFromJson(FilterToJson(*f));
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(FilterToJson(*again), FilterToJson(*f)) << c.filter;
  }
}

TEST(FlowFilterTest, TyposAreErrorsNotFiltersThatMatchNothing) {
  for (const char* bad : {R"({"verdict":"denied"})", R"({"protocols":["tcpp"]})",
                          R"({"drop_reasons":["policy-denied"]})", R"({"ips":["10.0.0.300"]})",
                          R"({"ports":[0]})", R"({"ports":["80"]})", R"({"types":["drops"]})",
                          R"({"pod":["a/b"]})", R"({"pods":"a/b"})", R"([])"}) {
    EXPECT_FALSE(Filter(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace sluice::monitor
