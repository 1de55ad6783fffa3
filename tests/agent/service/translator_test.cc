#include "agent/service/translator.h"

#include <netinet/in.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/service/refusals.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "maps/lb.h"

namespace sluice::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using Slices = std::vector<std::shared_ptr<const k8s::EndpointSlice>>;

IpAddress Ip(const std::string& s) { return *IpAddress::Parse(s); }
IpPrefix Cidr(const std::string& s) { return *IpPrefix::Parse(s); }

constexpr char kNode[] = "node-a";

NodeContext Node() { return NodeContext{kNode, {Ip("192.168.0.10")}}; }

k8s::ServicePort Port(std::string name, int32_t port, k8s::Protocol proto = k8s::Protocol::kTCP,
                      int32_t node_port = 0) {
  k8s::ServicePort p;
  p.name = std::move(name);
  p.port = port;
  p.protocol = proto;
  p.node_port = node_port;
  p.target_port.number = port;
  return p;
}

k8s::Service Svc(std::vector<k8s::ServicePort> ports, std::string type = "ClusterIP") {
  k8s::Service s;
  s.meta.namespace_ = "default";
  s.meta.name = "web";
  s.type = std::move(type);
  s.cluster_ips = {"10.96.0.10"};
  s.ports = std::move(ports);
  return s;
}

k8s::Endpoint Ep(std::string addr, std::string node = "node-b", bool ready = true,
                 bool serving = true, bool terminating = false) {
  k8s::Endpoint e;
  e.address = std::move(addr);
  e.node_name = std::move(node);
  e.ready = ready;
  e.serving = serving;
  e.terminating = terminating;
  return e;
}

k8s::Endpoint Terminating(std::string addr, std::string node = "node-b") {
  return Ep(std::move(addr), std::move(node), /*ready=*/false, /*serving=*/true,
            /*terminating=*/true);
}

std::shared_ptr<const k8s::EndpointSlice> Slice(
    std::vector<k8s::Endpoint> eps, std::vector<k8s::EndpointPort> ports = {{"http", k8s::Protocol::kTCP, 8080}},
    std::string name = "web-abc") {
  auto s = std::make_shared<k8s::EndpointSlice>();
  s->meta.namespace_ = "default";
  s->meta.name = std::move(name);
  s->service_name = "web";
  s->address_type = "IPv4";
  s->endpoints = std::move(eps);
  s->ports = std::move(ports);
  return s;
}

LbBackend Be(const std::string& addr, uint16_t port, bool terminating = false, bool local = false,
             uint8_t proto = IPPROTO_TCP) {
  return LbBackend{Ip(addr), port, proto, terminating, local};
}

const LbFrontend* Find(const ServiceTranslation& t, const std::string& addr, uint16_t port) {
  for (const LbFrontend& f : t.frontends) {
    if (f.addr == Ip(addr) && f.port == port) return &f;
  }
  return nullptr;
}

TEST(ServiceTranslatorTest, ClusterIpFrontendWithReadyBackends) {
  ServiceTranslation t = TranslateService(
      Svc({Port("http", 80)}), {Slice({Ep("10.244.1.5"), Ep("10.244.1.4")})}, Node());
  ASSERT_EQ(t.frontends.size(), 1u);
  const LbFrontend& f = t.frontends[0];
  EXPECT_EQ(f.service, "default/web");
  EXPECT_EQ(f.port_name, "http");
  EXPECT_EQ(f.addr, Ip("10.96.0.10"));
  EXPECT_EQ(f.port, 80);
  EXPECT_EQ(f.proto, IPPROTO_TCP);
  EXPECT_EQ(f.scope, SLUICE_LB_SCOPE_EXTERNAL);
  EXPECT_EQ(f.flags, 0);
  EXPECT_THAT(f.backends, ElementsAre(Be("10.244.1.4", 8080), Be("10.244.1.5", 8080)));
  EXPECT_FALSE(t.health_check.has_value());
}

TEST(ServiceTranslatorTest, HeadlessAndExternalNameAreIgnored) {
  Slices slices = {Slice({Ep("10.244.1.5")})};
  k8s::Service headless = Svc({Port("http", 80)});
  headless.headless = true;
  headless.cluster_ips = {"None"};
  EXPECT_THAT(TranslateService(headless, slices, Node()).frontends, IsEmpty());

  k8s::Service none_ip = Svc({Port("http", 80)});
  none_ip.cluster_ips = {"None"};
  EXPECT_THAT(TranslateService(none_ip, slices, Node()).frontends, IsEmpty());

  k8s::Service ext = Svc({Port("http", 80)}, "ExternalName");
  ext.cluster_ips.clear();
  EXPECT_THAT(TranslateService(ext, slices, Node()).frontends, IsEmpty());
}

TEST(ServiceTranslatorTest, ServiceWithoutIpv4ClusterIpIsIgnored) {
  k8s::Service v6 = Svc({Port("http", 80)});
  v6.cluster_ips = {"fd00::10"};
  EXPECT_THAT(TranslateService(v6, {Slice({Ep("10.244.1.5")})}, Node()).frontends, IsEmpty());

  k8s::Service none = Svc({Port("http", 80)});
  none.cluster_ips.clear();
  EXPECT_THAT(TranslateService(none, {}, Node()).frontends, IsEmpty());
}

TEST(ServiceTranslatorTest, DualStackUsesTheIpv4ClusterIp) {
  k8s::Service s = Svc({Port("http", 80)});
  s.cluster_ips = {"fd00::10", "10.96.0.20"};
  ServiceTranslation t = TranslateService(s, {Slice({Ep("10.244.1.5")})}, Node());
  ASSERT_EQ(t.frontends.size(), 1u);
  EXPECT_EQ(t.frontends[0].addr, Ip("10.96.0.20"));
}

TEST(ServiceTranslatorTest, NoEndpointsRejects) {
  ServiceTranslation t = TranslateService(Svc({Port("http", 80)}), {}, Node());
  ASSERT_EQ(t.frontends.size(), 1u);
  EXPECT_EQ(t.frontends[0].flags, SLUICE_SVC_F_REJECT);
  EXPECT_THAT(t.frontends[0].backends, IsEmpty());
}

TEST(ServiceTranslatorTest, OnlyTerminatingServingEndpointsStillServe) {
  ServiceTranslation t = TranslateService(
      Svc({Port("http", 80)}), {Slice({Terminating("10.244.1.5"), Terminating("10.244.1.6")})},
      Node());
  ASSERT_EQ(t.frontends.size(), 1u);
  EXPECT_EQ(t.frontends[0].flags & SLUICE_SVC_F_REJECT, 0);
  EXPECT_THAT(t.frontends[0].backends,
              ElementsAre(Be("10.244.1.5", 8080, true), Be("10.244.1.6", 8080, true)));
}

TEST(ServiceTranslatorTest, TerminatingEndpointsAreNotUsedWhileAnyIsReady) {
  ServiceTranslation t = TranslateService(
      Svc({Port("http", 80)}), {Slice({Terminating("10.244.1.5"), Ep("10.244.1.6")})}, Node());
  ASSERT_EQ(t.frontends.size(), 1u);
  EXPECT_THAT(t.frontends[0].backends, ElementsAre(Be("10.244.1.6", 8080)));
}

TEST(ServiceTranslatorTest, NotServingEndpointsAreNeverUsed) {
  ServiceTranslation t = TranslateService(
      Svc({Port("http", 80)}),
      {Slice({Ep("10.244.1.5", "node-b", /*ready=*/false, /*serving=*/false, /*terminating=*/true),
              Ep("10.244.1.6", "node-b", /*ready=*/false, /*serving=*/false,
                 /*terminating=*/false)})},
      Node());
  ASSERT_EQ(t.frontends.size(), 1u);
  EXPECT_THAT(t.frontends[0].backends, IsEmpty());
  EXPECT_EQ(t.frontends[0].flags, SLUICE_SVC_F_REJECT);
}

TEST(ServiceTranslatorTest, NotReadyServingButNotTerminatingIsNotAFallback) {
  // A starting pod (serving=false normally, but be strict): only serving AND terminating falls back.
  ServiceTranslation t = TranslateService(
      Svc({Port("http", 80)}),
      {Slice({Ep("10.244.1.5", "node-b", /*ready=*/false, /*serving=*/true,
                 /*terminating=*/false)})},
      Node());
  ASSERT_EQ(t.frontends.size(), 1u);
  EXPECT_THAT(t.frontends[0].backends, IsEmpty());
  EXPECT_EQ(t.frontends[0].flags, SLUICE_SVC_F_REJECT);
}

TEST(ServiceTranslatorTest, NamedTargetPortResolvesPerSlice) {
  k8s::ServicePort p = Port("http", 80);
  p.target_port = k8s::IntOrString{true, 0, "web"};
  ServiceTranslation t = TranslateService(
      Svc({p}),
      {Slice({Ep("10.244.1.5")}, {{"http", k8s::Protocol::kTCP, 8080}}, "web-1"),
       Slice({Ep("10.244.2.5")}, {{"http", k8s::Protocol::kTCP, 9090}}, "web-2")},
      Node());
  ASSERT_EQ(t.frontends.size(), 1u);
  EXPECT_THAT(t.frontends[0].backends,
              ElementsAre(Be("10.244.1.5", 8080), Be("10.244.2.5", 9090)));
}

TEST(ServiceTranslatorTest, BackendsJoinOnPortNameAndProtocol) {
  k8s::Service s = Svc({Port("dns", 53, k8s::Protocol::kUDP), Port("dns-tcp", 53)});
  ServiceTranslation t = TranslateService(
      s,
      {Slice({Ep("10.244.1.5")}, {{"dns", k8s::Protocol::kUDP, 5353},
                                  {"dns-tcp", k8s::Protocol::kTCP, 5354},
                                  {"metrics", k8s::Protocol::kTCP, 9153}})},
      Node());
  ASSERT_EQ(t.frontends.size(), 2u);
  // Same address and port: ordered by protocol (TCP 6 < UDP 17).
  EXPECT_EQ(t.frontends[0].proto, IPPROTO_TCP);
  EXPECT_EQ(t.frontends[0].port_name, "dns-tcp");
  EXPECT_THAT(t.frontends[0].backends, ElementsAre(Be("10.244.1.5", 5354)));
  EXPECT_EQ(t.frontends[1].proto, IPPROTO_UDP);
  EXPECT_THAT(t.frontends[1].backends,
              ElementsAre(Be("10.244.1.5", 5353, false, false, IPPROTO_UDP)));
}

TEST(ServiceTranslatorTest, ProtocolMismatchGivesNoBackends) {
  ServiceTranslation t = TranslateService(
      Svc({Port("http", 80)}), {Slice({Ep("10.244.1.5")}, {{"http", k8s::Protocol::kUDP, 8080}})},
      Node());
  ASSERT_EQ(t.frontends.size(), 1u);
  EXPECT_THAT(t.frontends[0].backends, IsEmpty());
  EXPECT_EQ(t.frontends[0].flags, SLUICE_SVC_F_REJECT);
}

TEST(ServiceTranslatorTest, SliceWithNilPortIsIgnored) {
  ServiceTranslation t = TranslateService(
      Svc({Port("http", 80)}),
      {Slice({Ep("10.244.1.5")}, {{"http", k8s::Protocol::kTCP, std::nullopt}})}, Node());
  ASSERT_EQ(t.frontends.size(), 1u);
  EXPECT_THAT(t.frontends[0].backends, IsEmpty());
}

// The datapath balances TCP and UDP only (it reads no SCTP ports and cannot rewrite SCTP's
// CRC32c): an SCTP port is refused, not programmed as a frontend no packet can reach (it showed
// as protocol '?' in sluicectl); the Service's other ports are programmed.
TEST(ServiceTranslatorTest, SctpPortIsRefusedAndTheOtherPortsKept) {
  ServiceTranslation t = TranslateService(
      Svc({Port("s", 3868, k8s::Protocol::kSCTP), Port("http", 80)}),
      {Slice({Ep("10.244.1.5")},
             {{"s", k8s::Protocol::kSCTP, 3868}, {"http", k8s::Protocol::kTCP, 8080}})},
      Node());
  ASSERT_EQ(t.frontends.size(), 1u);
  EXPECT_EQ(t.frontends[0].port_name, "http");
  EXPECT_EQ(t.frontends[0].proto, IPPROTO_TCP);
  EXPECT_THAT(t.refused, ElementsAre(Refusal{RefusalReason::kProtocolUnsupported,
                                             "port 's' 3868/SCTP"}));
}

TEST(ServiceTranslatorTest, ForeignAndNonIpv4SlicesAreIgnored) {
  auto other_ns = std::make_shared<k8s::EndpointSlice>(*Slice({Ep("10.244.9.1")}));
  other_ns->meta.namespace_ = "kube-system";
  auto other_svc = std::make_shared<k8s::EndpointSlice>(*Slice({Ep("10.244.9.2")}));
  other_svc->service_name = "api";
  auto fqdn = std::make_shared<k8s::EndpointSlice>(*Slice({Ep("example.com")}));
  fqdn->address_type = "FQDN";
  auto v6 = std::make_shared<k8s::EndpointSlice>(*Slice({Ep("fd00::5")}));
  v6->address_type = "IPv6";
  ServiceTranslation t = TranslateService(
      Svc({Port("http", 80)}), {other_ns, other_svc, fqdn, v6, nullptr, Slice({Ep("10.244.1.5")})},
      Node());
  ASSERT_EQ(t.frontends.size(), 1u);
  EXPECT_THAT(t.frontends[0].backends, ElementsAre(Be("10.244.1.5", 8080)));
}

TEST(ServiceTranslatorTest, DuplicateEndpointsAcrossSlicesAreMerged) {
  ServiceTranslation t = TranslateService(
      Svc({Port("http", 80)}),
      {Slice({Ep("10.244.1.5"), Ep("10.244.1.6")}, {{"http", k8s::Protocol::kTCP, 8080}}, "a"),
       Slice({Ep("10.244.1.5")}, {{"http", k8s::Protocol::kTCP, 8080}}, "b")},
      Node());
  ASSERT_EQ(t.frontends.size(), 1u);
  EXPECT_THAT(t.frontends[0].backends,
              ElementsAre(Be("10.244.1.5", 8080), Be("10.244.1.6", 8080)));
}

TEST(ServiceTranslatorTest, DuplicatePrefersTheLocalCopyRegardlessOfSliceOrder) {
  auto remote = Slice({Ep("10.244.1.5", "node-b")}, {{"http", k8s::Protocol::kTCP, 8080}}, "a");
  auto local = Slice({Ep("10.244.1.5", kNode)}, {{"http", k8s::Protocol::kTCP, 8080}}, "b");
  ServiceTranslation t1 = TranslateService(Svc({Port("http", 80)}), {remote, local}, Node());
  ServiceTranslation t2 = TranslateService(Svc({Port("http", 80)}), {local, remote}, Node());
  ASSERT_EQ(t1.frontends.size(), 1u);
  EXPECT_THAT(t1.frontends[0].backends, ElementsAre(Be("10.244.1.5", 8080, false, true)));
  EXPECT_EQ(t1, t2);
}

TEST(ServiceTranslatorTest, SameAddressOnDifferentPortsIsNotMerged) {
  ServiceTranslation t = TranslateService(
      Svc({Port("http", 80)}),
      {Slice({Ep("10.244.1.5")}, {{"http", k8s::Protocol::kTCP, 8080}}, "a"),
       Slice({Ep("10.244.1.5")}, {{"http", k8s::Protocol::kTCP, 8081}}, "b")},
      Node());
  ASSERT_EQ(t.frontends.size(), 1u);
  EXPECT_THAT(t.frontends[0].backends,
              ElementsAre(Be("10.244.1.5", 8080), Be("10.244.1.5", 8081)));
}

TEST(ServiceTranslatorTest, LocalEndpointsAreMarked) {
  ServiceTranslation t = TranslateService(
      Svc({Port("http", 80)}), {Slice({Ep("10.244.0.5", kNode), Ep("10.244.1.5", "node-b")})},
      Node());
  ASSERT_EQ(t.frontends.size(), 1u);
  EXPECT_THAT(t.frontends[0].backends,
              ElementsAre(Be("10.244.0.5", 8080, false, true), Be("10.244.1.5", 8080)));
}

TEST(ServiceTranslatorTest, NodePortFrontendOnEveryNodeAddress) {
  NodeContext node{kNode, {Ip("192.168.0.10"), Ip("172.16.0.10"), Ip("fd00::1")}};
  ServiceTranslation t = TranslateService(Svc({Port("http", 80, k8s::Protocol::kTCP, 30080)}, "NodePort"),
                                          {Slice({Ep("10.244.1.5")})}, node);
  ASSERT_EQ(t.frontends.size(), 3u);  // ClusterIP + two IPv4 node addresses
  // Sorted by address.
  EXPECT_EQ(t.frontends[0].addr, Ip("10.96.0.10"));
  EXPECT_EQ(t.frontends[0].flags, 0);
  EXPECT_EQ(t.frontends[1].addr, Ip("172.16.0.10"));
  EXPECT_EQ(t.frontends[2].addr, Ip("192.168.0.10"));
  for (int i : {1, 2}) {
    EXPECT_EQ(t.frontends[i].port, 30080);
    EXPECT_EQ(t.frontends[i].flags, SLUICE_SVC_F_NODEPORT);
    EXPECT_THAT(t.frontends[i].backends, ElementsAre(Be("10.244.1.5", 8080)));
  }
}

TEST(ServiceTranslatorTest, ClusterIpTypeGetsNoNodePortEvenIfSet) {
  ServiceTranslation t = TranslateService(Svc({Port("http", 80, k8s::Protocol::kTCP, 30080)}),
                                          {Slice({Ep("10.244.1.5")})}, Node());
  EXPECT_EQ(t.frontends.size(), 1u);
}

TEST(ServiceTranslatorTest, LoadBalancerWithoutNodePortGetsNoNodePortFrontend) {
  k8s::Service s = Svc({Port("http", 80)}, "LoadBalancer");
  s.load_balancer_ingress_ips = {"203.0.113.7"};
  ServiceTranslation t = TranslateService(s, {Slice({Ep("10.244.1.5")})}, Node());
  ASSERT_EQ(t.frontends.size(), 2u);
  EXPECT_EQ(t.frontends[1].addr, Ip("203.0.113.7"));
  EXPECT_EQ(t.frontends[1].flags, SLUICE_SVC_F_LOADBALANCER);
}

TEST(ServiceTranslatorTest, ExternalIpsGetAFrontendEach) {
  k8s::Service s = Svc({Port("http", 80)});
  s.external_ips = {"198.51.100.2", "198.51.100.1", "fd00::7", "garbage"};
  ServiceTranslation t = TranslateService(s, {Slice({Ep("10.244.1.5")})}, Node());
  ASSERT_EQ(t.frontends.size(), 3u);
  EXPECT_EQ(t.frontends[1].addr, Ip("198.51.100.1"));
  EXPECT_EQ(t.frontends[1].port, 80);
  EXPECT_EQ(t.frontends[1].flags, SLUICE_SVC_F_EXTERNAL_IP);
  EXPECT_EQ(t.frontends[2].addr, Ip("198.51.100.2"));
  EXPECT_THAT(t.frontends[2].backends, ElementsAre(Be("10.244.1.5", 8080)));
}

TEST(ServiceTranslatorTest, LoadBalancerSourceRangesAreParsedAndFlagged) {
  k8s::Service s = Svc({Port("http", 80, k8s::Protocol::kTCP, 30080)}, "LoadBalancer");
  s.load_balancer_ingress_ips = {"203.0.113.7"};
  s.load_balancer_source_ranges = {" 10.1.0.0/16 ", "192.0.2.5/24", "2001:db8::/32", "nonsense",
                                   "198.51.100.9"};
  ServiceTranslation t = TranslateService(s, {Slice({Ep("10.244.1.5")})}, Node());
  const LbFrontend* lb = Find(t, "203.0.113.7", 80);
  ASSERT_NE(lb, nullptr);
  EXPECT_EQ(lb->flags, SLUICE_SVC_F_LOADBALANCER | SLUICE_SVC_F_SOURCE_RANGES);
  EXPECT_THAT(lb->source_ranges, ElementsAre(Cidr("10.1.0.0/16"), Cidr("192.0.2.0/24"),
                                             Cidr("198.51.100.9/32")));
  // Source ranges restrict the LB VIP only.
  const LbFrontend* np = Find(t, "192.168.0.10", 30080);
  ASSERT_NE(np, nullptr);
  EXPECT_EQ(np->flags, SLUICE_SVC_F_NODEPORT);
  EXPECT_THAT(np->source_ranges, IsEmpty());
  EXPECT_THAT(Find(t, "10.96.0.10", 80)->source_ranges, IsEmpty());
}

TEST(ServiceTranslatorTest, NoSourceRangesMeansNoFlag) {
  k8s::Service s = Svc({Port("http", 80)}, "LoadBalancer");
  s.load_balancer_ingress_ips = {"203.0.113.7"};
  ServiceTranslation t = TranslateService(s, {Slice({Ep("10.244.1.5")})}, Node());
  const LbFrontend* lb = Find(t, "203.0.113.7", 80);
  ASSERT_NE(lb, nullptr);
  EXPECT_EQ(lb->flags & SLUICE_SVC_F_SOURCE_RANGES, 0);
  EXPECT_THAT(lb->source_ranges, IsEmpty());
}

k8s::Service EtpLocalLb() {
  k8s::Service s = Svc({Port("http", 80, k8s::Protocol::kTCP, 30080)}, "LoadBalancer");
  s.external_traffic_policy = "Local";
  s.health_check_node_port = 32000;
  s.load_balancer_ingress_ips = {"203.0.113.7"};
  s.external_ips = {"198.51.100.1"};
  return s;
}

TEST(ServiceTranslatorTest, EtpLocalExternalFrontendsUseOnlyLocalBackends) {
  ServiceTranslation t = TranslateService(
      EtpLocalLb(), {Slice({Ep("10.244.0.5", kNode), Ep("10.244.1.5", "node-b")})}, Node());
  ASSERT_EQ(t.frontends.size(), 4u);
  for (const LbFrontend& f : t.frontends) {
    if (f.addr == Ip("10.96.0.10")) {
      // ClusterIP is unaffected by externalTrafficPolicy.
      EXPECT_EQ(f.flags, 0);
      EXPECT_THAT(f.backends, ElementsAre(Be("10.244.0.5", 8080, false, true),
                                          Be("10.244.1.5", 8080)));
    } else {
      EXPECT_NE(f.flags & SLUICE_SVC_F_ETP_LOCAL, 0) << f.addr.ToString();
      EXPECT_EQ(f.flags & SLUICE_SVC_F_REJECT, 0);
      EXPECT_THAT(f.backends, ElementsAre(Be("10.244.0.5", 8080, false, true)));
    }
  }
  EXPECT_EQ(Find(t, "192.168.0.10", 30080)->flags,
            SLUICE_SVC_F_NODEPORT | SLUICE_SVC_F_ETP_LOCAL);
  EXPECT_EQ(Find(t, "198.51.100.1", 80)->flags,
            SLUICE_SVC_F_EXTERNAL_IP | SLUICE_SVC_F_ETP_LOCAL);
  EXPECT_EQ(Find(t, "203.0.113.7", 80)->flags,
            SLUICE_SVC_F_LOADBALANCER | SLUICE_SVC_F_ETP_LOCAL);
}

// kube-proxy sends in-cluster traffic (pods, the node itself) to an ETP Local frontend to every
// endpoint; only traffic from outside the node is kept local. The datapath balances this node's
// pods and sockets over the internal-scope twin of each external frontend.
TEST(ServiceTranslatorTest, EtpLocalExternalFrontendsHaveAnInClusterTwinWithEveryEndpoint) {
  k8s::Service s = EtpLocalLb();
  s.load_balancer_source_ranges = {"10.0.0.0/8"};
  ServiceTranslation t = TranslateService(s, {Slice({Ep("10.244.1.5", "node-b")})}, Node());
  ASSERT_EQ(t.in_cluster_frontends.size(), 3u);
  for (const LbFrontend& f : t.in_cluster_frontends) {
    EXPECT_EQ(f.scope, SLUICE_LB_SCOPE_INTERNAL) << f.addr.ToString();
    EXPECT_EQ(f.flags & (SLUICE_SVC_F_ETP_LOCAL | SLUICE_SVC_F_REJECT), 0) << f.addr.ToString();
    EXPECT_THAT(f.backends, ElementsAre(Be("10.244.1.5", 8080))) << f.addr.ToString();
    // Same key as the external frontend, which keeps only the (here: no) local endpoints.
    const LbFrontend* external = Find(t, f.addr.ToString(), f.port);
    ASSERT_NE(external, nullptr) << f.addr.ToString();
    EXPECT_EQ(external->scope, SLUICE_LB_SCOPE_EXTERNAL);
    EXPECT_THAT(external->backends, IsEmpty());
    EXPECT_EQ(f.flags, external->flags & ~SLUICE_SVC_F_ETP_LOCAL);
    EXPECT_EQ(f.source_ranges, external->source_ranges);
  }
  EXPECT_EQ(t.in_cluster_frontends[0].flags, SLUICE_SVC_F_NODEPORT);
}

TEST(ServiceTranslatorTest, ClusterPolicyAndClusterIpNeedNoInClusterFrontends) {
  k8s::Service cluster_policy = EtpLocalLb();
  cluster_policy.external_traffic_policy = "Cluster";
  EXPECT_THAT(TranslateService(cluster_policy, {Slice({Ep("10.244.1.5")})}, Node())
                  .in_cluster_frontends,
              IsEmpty());
  k8s::Service itp_local = Svc({Port("http", 80)});
  itp_local.internal_traffic_policy = "Local";
  EXPECT_THAT(TranslateService(itp_local, {Slice({Ep("10.244.1.5")})}, Node()).in_cluster_frontends,
              IsEmpty());
}

TEST(ServiceTranslatorTest, EtpLocalNodeWithoutLocalEndpointsDropsNotRejects) {
  ServiceTranslation t =
      TranslateService(EtpLocalLb(), {Slice({Ep("10.244.1.5", "node-b")})}, Node());
  ASSERT_EQ(t.frontends.size(), 4u);
  for (const LbFrontend& f : t.frontends) {
    EXPECT_EQ(f.flags & SLUICE_SVC_F_REJECT, 0) << f.addr.ToString();
    if (f.addr == Ip("10.96.0.10")) {
      EXPECT_THAT(f.backends, ElementsAre(Be("10.244.1.5", 8080)));
    } else {
      EXPECT_NE(f.flags & SLUICE_SVC_F_ETP_LOCAL, 0);
      EXPECT_THAT(f.backends, IsEmpty());
    }
  }
  ASSERT_TRUE(t.health_check.has_value());
  EXPECT_EQ(t.health_check->local_endpoints, 0);
}

TEST(ServiceTranslatorTest, EtpLocalWithNoEndpointsAnywhereRejects) {
  ServiceTranslation t = TranslateService(EtpLocalLb(), {}, Node());
  ASSERT_EQ(t.frontends.size(), 4u);
  for (const LbFrontend& f : t.frontends) {
    EXPECT_NE(f.flags & SLUICE_SVC_F_REJECT, 0) << f.addr.ToString();
  }
}

TEST(ServiceTranslatorTest, EtpLocalFallsBackToLocalTerminatingEndpoints) {
  // Local set: local ready, else local serving+terminating — even when remote ready ones exist.
  ServiceTranslation t = TranslateService(
      EtpLocalLb(), {Slice({Terminating("10.244.0.5", kNode), Ep("10.244.1.5", "node-b")})},
      Node());
  const LbFrontend* np = Find(t, "192.168.0.10", 30080);
  ASSERT_NE(np, nullptr);
  EXPECT_THAT(np->backends, ElementsAre(Be("10.244.0.5", 8080, true, true)));
  EXPECT_THAT(Find(t, "10.96.0.10", 80)->backends, ElementsAre(Be("10.244.1.5", 8080)));
}

TEST(ServiceTranslatorTest, ItpLocalClusterIpUsesOnlyLocalBackends) {
  k8s::Service s = Svc({Port("http", 80, k8s::Protocol::kTCP, 30080)}, "NodePort");
  s.internal_traffic_policy = "Local";
  ServiceTranslation t = TranslateService(
      s, {Slice({Ep("10.244.0.5", kNode), Ep("10.244.1.5", "node-b")})}, Node());
  const LbFrontend* cip = Find(t, "10.96.0.10", 80);
  ASSERT_NE(cip, nullptr);
  EXPECT_EQ(cip->scope, SLUICE_LB_SCOPE_EXTERNAL);
  EXPECT_EQ(cip->flags, SLUICE_SVC_F_ITP_LOCAL);
  EXPECT_THAT(cip->backends, ElementsAre(Be("10.244.0.5", 8080, false, true)));
  // NodePort follows externalTrafficPolicy (Cluster), not ITP.
  const LbFrontend* np = Find(t, "192.168.0.10", 30080);
  ASSERT_NE(np, nullptr);
  EXPECT_EQ(np->flags, SLUICE_SVC_F_NODEPORT);
  EXPECT_EQ(np->backends.size(), 2u);
}

TEST(ServiceTranslatorTest, ItpLocalWithoutLocalEndpointsDropsButRejectsWhenNoneAtAll) {
  k8s::Service s = Svc({Port("http", 80)});
  s.internal_traffic_policy = "Local";
  ServiceTranslation remote_only =
      TranslateService(s, {Slice({Ep("10.244.1.5", "node-b")})}, Node());
  ASSERT_EQ(remote_only.frontends.size(), 1u);
  EXPECT_EQ(remote_only.frontends[0].flags, SLUICE_SVC_F_ITP_LOCAL);
  EXPECT_THAT(remote_only.frontends[0].backends, IsEmpty());

  ServiceTranslation none = TranslateService(s, {}, Node());
  ASSERT_EQ(none.frontends.size(), 1u);
  EXPECT_EQ(none.frontends[0].flags, SLUICE_SVC_F_ITP_LOCAL | SLUICE_SVC_F_REJECT);
}

TEST(ServiceTranslatorTest, AffinityDefaultTimeout) {
  k8s::Service s = Svc({Port("http", 80)});
  s.session_affinity_client_ip = true;
  ServiceTranslation t = TranslateService(s, {Slice({Ep("10.244.1.5")})}, Node());
  ASSERT_EQ(t.frontends.size(), 1u);
  EXPECT_EQ(t.frontends[0].flags, SLUICE_SVC_F_AFFINITY);
  EXPECT_EQ(t.frontends[0].affinity_timeout, 10800u);
}

TEST(ServiceTranslatorTest, AffinityExplicitTimeoutOnEveryFrontend) {
  k8s::Service s = Svc({Port("http", 80, k8s::Protocol::kTCP, 30080)}, "NodePort");
  s.session_affinity_client_ip = true;
  s.session_affinity_timeout_seconds = 60;
  ServiceTranslation t = TranslateService(s, {Slice({Ep("10.244.1.5")})}, Node());
  ASSERT_EQ(t.frontends.size(), 2u);
  for (const LbFrontend& f : t.frontends) {
    EXPECT_NE(f.flags & SLUICE_SVC_F_AFFINITY, 0);
    EXPECT_EQ(f.affinity_timeout, 60u);
  }
}

// A timeout the apiserver's validation refuses (outside 1..86400) refuses the whole Service, as
// the apiserver would: no frontend, rather than one with another timeout than the object says.
TEST(ServiceTranslatorTest, AffinityTimeoutOutsideTheApiRangeRefusesTheService) {
  for (int32_t timeout : {-5, 86401}) {
    k8s::Service s = Svc({Port("http", 80)});
    s.session_affinity_client_ip = true;
    s.session_affinity_timeout_seconds = timeout;
    ServiceTranslation t = TranslateService(s, {Slice({Ep("10.244.1.5")})}, Node());
    EXPECT_THAT(t.frontends, IsEmpty()) << timeout;
    EXPECT_THAT(t.in_cluster_frontends, IsEmpty());
    EXPECT_THAT(t.refused,
                ElementsAre(Refusal{RefusalReason::kAffinityTimeoutInvalid,
                                    absl::StrCat("Service with sessionAffinityConfig.clientIP."
                                                 "timeoutSeconds ",
                                                 timeout, " (the API allows 1..86400)")}));
  }
  k8s::Service edge = Svc({Port("http", 80)});
  edge.session_affinity_client_ip = true;
  edge.session_affinity_timeout_seconds = 86400;
  ServiceTranslation t = TranslateService(edge, {Slice({Ep("10.244.1.5")})}, Node());
  ASSERT_EQ(t.frontends.size(), 1u);
  EXPECT_EQ(t.frontends[0].affinity_timeout, 86400u);
  EXPECT_THAT(t.refused, IsEmpty());
}

TEST(ServiceTranslatorTest, NoAffinityMeansZeroTimeout) {
  k8s::Service s = Svc({Port("http", 80)});
  s.session_affinity_timeout_seconds = 60;  // ignored without ClientIP
  ServiceTranslation t = TranslateService(s, {Slice({Ep("10.244.1.5")})}, Node());
  EXPECT_EQ(t.frontends[0].flags, 0);
  EXPECT_EQ(t.frontends[0].affinity_timeout, 0u);
}

TEST(ServiceTranslatorTest, HealthCheckCountsLocalReadyEndpoints) {
  k8s::Service s = EtpLocalLb();
  s.ports.push_back(Port("https", 443, k8s::Protocol::kTCP, 30443));
  ServiceTranslation t = TranslateService(
      s,
      {Slice({Ep("10.244.0.5", kNode), Ep("10.244.0.6", kNode), Terminating("10.244.0.7", kNode),
              Ep("10.244.1.5", "node-b")},
             {{"http", k8s::Protocol::kTCP, 8080}, {"https", k8s::Protocol::kTCP, 8443}})},
      Node());
  ASSERT_TRUE(t.health_check.has_value());
  // Two local ready pods, counted once each although they serve two ports.
  EXPECT_EQ(*t.health_check, (HealthCheck{"default/web", 32000, 2}));
}

TEST(ServiceTranslatorTest, HealthCheckOnlyForEtpLocalLoadBalancers) {
  k8s::Service cluster_policy = EtpLocalLb();
  cluster_policy.external_traffic_policy = "Cluster";
  EXPECT_FALSE(TranslateService(cluster_policy, {}, Node()).health_check.has_value());

  k8s::Service nodeport = EtpLocalLb();
  nodeport.type = "NodePort";
  EXPECT_FALSE(TranslateService(nodeport, {}, Node()).health_check.has_value());

  k8s::Service no_port = EtpLocalLb();
  no_port.health_check_node_port = 0;
  EXPECT_FALSE(TranslateService(no_port, {}, Node()).health_check.has_value());
}

TEST(ServiceTranslatorTest, OutputIsDeterministicAcrossInputOrder) {
  k8s::Service a = Svc({Port("http", 80, k8s::Protocol::kTCP, 30080),
                        Port("dns", 53, k8s::Protocol::kUDP, 30053)},
                       "LoadBalancer");
  a.external_ips = {"198.51.100.2", "198.51.100.1"};
  a.load_balancer_ingress_ips = {"203.0.113.9", "203.0.113.7"};
  a.load_balancer_source_ranges = {"10.2.0.0/16", "10.1.0.0/16"};
  k8s::Service b = a;
  std::swap(b.ports[0], b.ports[1]);
  std::swap(b.external_ips[0], b.external_ips[1]);
  std::swap(b.load_balancer_ingress_ips[0], b.load_balancer_ingress_ips[1]);
  std::swap(b.load_balancer_source_ranges[0], b.load_balancer_source_ranges[1]);
  std::vector<k8s::EndpointPort> ports = {{"http", k8s::Protocol::kTCP, 8080},
                                          {"dns", k8s::Protocol::kUDP, 5353}};
  auto s1 = Slice({Ep("10.244.1.9"), Ep("10.244.1.2")}, ports, "s1");
  auto s2 = Slice({Ep("10.244.2.1", kNode), Ep("10.244.0.3")}, ports, "s2");
  NodeContext n1{kNode, {Ip("192.168.0.10"), Ip("172.16.0.10")}};
  NodeContext n2{kNode, {Ip("172.16.0.10"), Ip("192.168.0.10")}};
  ServiceTranslation t1 = TranslateService(a, {s1, s2}, n1);
  ServiceTranslation t2 = TranslateService(b, {s2, s1}, n2);
  EXPECT_EQ(t1, t2);
  EXPECT_TRUE(std::is_sorted(t1.frontends.begin(), t1.frontends.end(), FrontendKeyLess));
  for (const LbFrontend& f : t1.frontends) {
    EXPECT_TRUE(std::is_sorted(f.backends.begin(), f.backends.end()));
  }
  EXPECT_EQ(t1.frontends.size(), 2u * (1 + 2 + 2 + 2));
}

TEST(ServiceTranslatorTest, AddressListedTwiceYieldsOneFrontendPerKey) {
  k8s::Service s = Svc({Port("http", 80)}, "LoadBalancer");
  s.external_ips = {"203.0.113.7", "203.0.113.7"};
  s.load_balancer_ingress_ips = {"203.0.113.7"};
  ServiceTranslation t = TranslateService(s, {Slice({Ep("10.244.1.5")})}, Node());
  ASSERT_EQ(t.frontends.size(), 2u);
  EXPECT_EQ(t.frontends[1].addr, Ip("203.0.113.7"));
  EXPECT_EQ(t.frontends[1].flags, SLUICE_SVC_F_EXTERNAL_IP);
}

TEST(ServiceTranslatorTest, UnknownProtocolPortIsSkipped) {
  ServiceTranslation t = TranslateService(
      Svc({Port("x", 80, k8s::Protocol::kUnknown), Port("http", 80)}), {Slice({Ep("10.244.1.5")})},
      Node());
  ASSERT_EQ(t.frontends.size(), 1u);
  EXPECT_EQ(t.frontends[0].port_name, "http");
}

std::vector<RefusalReason> Reasons(const ServiceTranslation& t) {
  std::vector<RefusalReason> out;
  for (const Refusal& r : t.refused) out.push_back(r.reason);
  return out;
}

TEST(ServiceTranslatorTest, LoopbackUnspecifiedLinkLocalMulticastBroadcastBackendsAreRefused) {
  ServiceTranslation t = TranslateService(
      Svc({Port("http", 80)}),
      {Slice({Ep("127.0.0.1"), Ep("0.0.0.0"), Ep("169.254.169.254"), Ep("224.0.0.251"),
              Ep("255.255.255.255"), Ep("fd00::5"), Ep("10.244.1.5"), Ep("127.1.2.3")})},
      Node());
  ASSERT_EQ(t.frontends.size(), 1u);
  EXPECT_THAT(t.frontends[0].backends, ElementsAre(Be("10.244.1.5", 8080)));
  EXPECT_THAT(Reasons(t), ::testing::UnorderedElementsAre(
                              RefusalReason::kBackendLoopback, RefusalReason::kBackendLoopback,
                              RefusalReason::kBackendUnspecified, RefusalReason::kBackendLinkLocal,
                              RefusalReason::kBackendMulticast, RefusalReason::kBackendBroadcast,
                              RefusalReason::kBackendInvalid));
  EXPECT_THAT(t.refused,
              ::testing::Contains(Refusal{RefusalReason::kBackendLoopback,
                                          "EndpointSlice default/web-abc endpoint 127.0.0.1"}));
}

TEST(ServiceTranslatorTest, OnlyRefusedBackendsMeanTheServiceRejects) {
  ServiceTranslation t =
      TranslateService(Svc({Port("http", 80)}), {Slice({Ep("127.0.0.1")})}, Node());
  ASSERT_EQ(t.frontends.size(), 1u);
  EXPECT_THAT(t.frontends[0].backends, IsEmpty());
  EXPECT_NE(t.frontends[0].flags & SLUICE_SVC_F_REJECT, 0);
}

TEST(ServiceTranslatorTest, BadPortsAndProtocolsAreRefusedAndTheValidPortKept) {
  ServiceTranslation t =
      TranslateService(Svc({Port("zero", 0), Port("big", 65536), Port("neg", -1),
                            Port("foo", 81, k8s::Protocol::kUnknown), Port("http", 80)}),
                       {Slice({Ep("10.244.1.5")})}, Node());
  ASSERT_EQ(t.frontends.size(), 1u);
  EXPECT_EQ(t.frontends[0].port_name, "http");
  EXPECT_THAT(t.frontends[0].backends, ElementsAre(Be("10.244.1.5", 8080)));
  EXPECT_THAT(t.refused, ElementsAre(Refusal{RefusalReason::kPortInvalid, "port 'big' 65536"},
                                     Refusal{RefusalReason::kPortInvalid, "port 'neg' -1"},
                                     Refusal{RefusalReason::kPortInvalid, "port 'zero' 0"},
                                     Refusal{RefusalReason::kProtocolUnknown,
                                             "port 'foo' 81: unknown protocol"}));
}

TEST(ServiceTranslatorTest, BadNodePortIsRefusedButTheClusterIpPortServes) {
  ServiceTranslation t =
      TranslateService(Svc({Port("http", 80, k8s::Protocol::kTCP, 70000)}, "NodePort"),
                       {Slice({Ep("10.244.1.5")})}, Node());
  ASSERT_EQ(t.frontends.size(), 1u);
  EXPECT_EQ(t.frontends[0].addr, Ip("10.96.0.10"));
  EXPECT_THAT(Reasons(t), ElementsAre(RefusalReason::kPortInvalid));
}

TEST(ServiceTranslatorTest, BadEndpointSlicePortIsRefused) {
  ServiceTranslation t =
      TranslateService(Svc({Port("http", 80)}),
                       {Slice({Ep("10.244.1.5")}, {{"http", k8s::Protocol::kTCP, 0}})}, Node());
  ASSERT_EQ(t.frontends.size(), 1u);
  EXPECT_THAT(t.frontends[0].backends, IsEmpty());
  EXPECT_THAT(t.refused, ElementsAre(Refusal{RefusalReason::kPortInvalid,
                                             "EndpointSlice default/web-abc port 'http' 0"}));
}

TEST(ServiceTranslatorTest, InvalidExternalAndLoadBalancerIpsAreRefused) {
  k8s::Service s = Svc({Port("http", 80)}, "LoadBalancer");
  s.external_ips = {"garbage", "127.0.0.1", "198.51.100.1", "fd00::7"};
  s.load_balancer_ingress_ips = {"0.0.0.0", "203.0.113.7", "224.1.1.1"};
  ServiceTranslation t = TranslateService(s, {Slice({Ep("10.244.1.5")})}, Node());
  std::vector<IpAddress> addrs;
  for (const LbFrontend& f : t.frontends) addrs.push_back(f.addr);
  EXPECT_THAT(addrs, ElementsAre(Ip("10.96.0.10"), Ip("198.51.100.1"), Ip("203.0.113.7")));
  EXPECT_THAT(
      t.refused,
      ElementsAre(
          Refusal{RefusalReason::kExternalIpInvalid, "externalIP 'garbage': not an IP address"},
          Refusal{RefusalReason::kExternalIpInvalid, "externalIP 127.0.0.1: loopback"},
          Refusal{RefusalReason::kLoadBalancerIpInvalid,
                  "loadBalancer ingress IP 0.0.0.0: unspecified"},
          Refusal{RefusalReason::kLoadBalancerIpInvalid,
                  "loadBalancer ingress IP 224.1.1.1: multicast"}));
}

TEST(ServiceTranslatorTest, ValidServiceHasNoRefusals) {
  ServiceTranslation t =
      TranslateService(Svc({Port("http", 80, k8s::Protocol::kTCP, 30080)}, "NodePort"),
                       {Slice({Ep("10.244.1.5"), Ep("10.244.2.9")})}, Node());
  EXPECT_THAT(t.refused, IsEmpty());
}

TEST(ServiceRefusalsTest, EachRefusalIsCountedOncePerObjectNotPerResync) {
  ServiceRefusals log;
  const std::vector<Refusal> two = {{RefusalReason::kBackendLoopback, "a"},
                                    {RefusalReason::kPortInvalid, "b"}};
  EXPECT_EQ(log.Record("default/web", two), 2u);
  EXPECT_EQ(log.Record("default/web", two), 0u);  // resync: nothing new
  EXPECT_EQ(log.Record("default/web", two), 0u);
  EXPECT_EQ(log.counts().of(RefusalReason::kBackendLoopback), 1u);
  EXPECT_EQ(log.counts().of(RefusalReason::kPortInvalid), 1u);
  EXPECT_EQ(log.counts().total(), 2u);
  // Another object with the same refusal is another count.
  EXPECT_EQ(log.Record("default/other", {{RefusalReason::kBackendLoopback, "a"}}), 1u);
  EXPECT_EQ(log.counts().of(RefusalReason::kBackendLoopback), 2u);
  EXPECT_EQ(log.services_with_refusals(), 2u);
  // Fixed, then broken again: news again.
  EXPECT_EQ(log.Record("default/web", {}), 0u);
  EXPECT_EQ(log.services_with_refusals(), 1u);
  EXPECT_EQ(log.Record("default/web", {{RefusalReason::kPortInvalid, "b"}}), 1u);
  EXPECT_EQ(log.counts().of(RefusalReason::kPortInvalid), 2u);
  // Deleted and recreated the same: news again.
  log.Forget("default/other");
  EXPECT_EQ(log.Record("default/other", {{RefusalReason::kBackendLoopback, "a"}}), 1u);
  EXPECT_EQ(log.counts().ToString(), "backend_loopback=3 port_invalid=2");
  EXPECT_EQ(RefusalCounts{}.ToString(), "none");
}

}  // namespace
}  // namespace sluice::agent
