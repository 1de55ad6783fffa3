// The policy translator against a small cluster: namespaces x, y, z; pods a, b, c; this node n1
// hosts x/a (endpoint 1), x/b (endpoint 2) and y/b (endpoint 3). Policies are written as the
// apiserver sends them and decoded by the production decoder. Every case states the exact allow
// entries of the endpoints it names, with identities resolved through the translated ipcache.
#include "agent/policy/translator.h"

#include <netinet/in.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/k8s/decode.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::agent {

std::ostream& operator<<(std::ostream& os, const PolicyAllow& a) {
  return os << "{id " << a.identity << (a.direction == SLUICE_POLICY_INGRESS ? " in" : " out")
            << " proto " << int(a.proto) << " port " << a.port << " bits "
            << int(a.proto_port_bits) << "}";
}
std::ostream& operator<<(std::ostream& os, const PolicyProblem& p) {
  return os << "{" << p.policy << " " << p.where << ": " << p.reason << "}";
}

namespace {

using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAreArray;

constexpr uint8_t I = SLUICE_POLICY_INGRESS;
constexpr uint8_t E = SLUICE_POLICY_EGRESS;
constexpr uint32_t kAny = SLUICE_IDENTITY_ANY;
constexpr uint32_t kHost = SLUICE_IDENTITY_HOST;

PolicyAllow All(uint32_t id, uint8_t dir) { return {id, dir, 0, 0, 0}; }
PolicyAllow Proto(uint32_t id, uint8_t dir, uint8_t proto) { return {id, dir, proto, 0, 8}; }
PolicyAllow Port(uint32_t id, uint8_t dir, uint8_t proto, uint16_t port) {
  return {id, dir, proto, port, 24};
}
PolicyAllow HostIn() { return All(kHost, I); }

std::shared_ptr<const k8s::Pod> MakePod(std::string ns, std::string name, std::string node,
                                        std::string ip, k8s::StringMap labels,
                                        int32_t tcp80 = 80) {
  auto p = std::make_shared<k8s::Pod>();
  p->meta.namespace_ = std::move(ns);
  p->meta.name = std::move(name);
  p->meta.labels = std::move(labels);
  p->node_name = std::move(node);
  p->pod_ips = {std::move(ip)};
  p->phase = "Running";
  p->container_ports = {{"serve-80-tcp", tcp80, k8s::Protocol::kTCP},
                        {"serve-81-udp", 81, k8s::Protocol::kUDP},
                        {"serve-80-sctp", 80, k8s::Protocol::kSCTP}};
  return p;
}

std::shared_ptr<const k8s::Namespace> MakeNs(std::string name, k8s::StringMap labels) {
  auto n = std::make_shared<k8s::Namespace>();
  n->meta.name = std::move(name);
  n->meta.labels = std::move(labels);
  return n;
}

std::shared_ptr<const k8s::Node> MakeNode(std::string name, std::string ip, std::string cidr) {
  auto n = std::make_shared<k8s::Node>();
  n->meta.name = std::move(name);
  n->internal_ips = {std::move(ip)};
  n->pod_cidrs = {std::move(cidr)};
  return n;
}

// A NetworkPolicy "x/<name>" (or ns/name) from its spec JSON, through the production decoder.
std::shared_ptr<const k8s::NetworkPolicy> Policy(const std::string& spec,
                                                 const std::string& name = "p",
                                                 const std::string& ns = "x") {
  k8s::Decoder d;
  auto np = std::make_shared<k8s::NetworkPolicy>();
  std::string json = absl::StrCat(R"({"metadata":{"name":")", name, R"(","namespace":")", ns,
                                  R"("},"spec":)", spec, "}");
  absl::Status st = d.Decode(json, np.get());
  EXPECT_TRUE(st.ok()) << st << " in " << json;
  return np;
}

PolicyInput Cluster() {
  PolicyInput in;
  in.node_name = "n1";
  in.nodes = {MakeNode("n1", "192.168.1.1", "10.1.1.0/24"),
              MakeNode("n2", "192.168.1.2", "10.1.2.0/24")};
  in.namespaces = {MakeNs("x", {{"team", "blue"}, {"kubernetes.io/metadata.name", "x"}}),
                   MakeNs("y", {{"team", "red"}, {"kubernetes.io/metadata.name", "y"}}),
                   MakeNs("z", {})};  // metadata.name is implied
  in.pods = {MakePod("x", "a", "n1", "10.1.1.10", {{"pod", "a"}, {"app", "web"}}),
             MakePod("x", "b", "n1", "10.1.1.11", {{"pod", "b"}}),
             MakePod("x", "c", "n2", "10.1.2.12", {{"pod", "c"}, {"tier", "db"}}),
             MakePod("y", "a", "n2", "10.1.2.20", {{"pod", "a"}}),
             MakePod("y", "b", "n1", "10.1.1.21", {{"pod", "b"}}),
             MakePod("z", "a", "n2", "10.1.2.30", {{"pod", "a"}}, /*tcp80=*/8080)};
  auto host_pod = std::make_shared<k8s::Pod>(*MakePod("z", "h", "n2", "192.168.1.2", {}));
  host_pod->host_network = true;
  in.pods.push_back(host_pod);
  in.endpoints = {{1, "x", "a", *IpAddress::Parse("10.1.1.10")},
                  {2, "x", "b", *IpAddress::Parse("10.1.1.11")},
                  {3, "y", "b", *IpAddress::Parse("10.1.1.21")}};
  return in;
}

// Identities as the translation assigned them.
class Resolved {
 public:
  Resolved(const PolicyTranslation& t, const PolicyInput& in) {
    for (const IpcacheEntry& e : t.ipcache) by_prefix_[e.prefix.ToString()] = e.identity;
    for (const auto& p : in.pods) {
      if (!p->pod_ips.empty()) pod_ip_[p->meta.Key()] = p->pod_ips[0];
    }
  }
  uint32_t Pod(const std::string& key) const { return Cidr(pod_ip_.at(key) + "/32"); }
  uint32_t Cidr(const std::string& prefix) const {
    auto it = by_prefix_.find(prefix);
    EXPECT_NE(it, by_prefix_.end()) << "no ipcache entry " << prefix;
    return it == by_prefix_.end() ? 0 : it->second;
  }

 private:
  std::map<std::string, uint32_t> by_prefix_;
  std::map<std::string, std::string> pod_ip_;
};

struct Want {
  uint32_t endpoint_id;
  bool ingress;
  bool egress;
  std::vector<PolicyAllow> allows;
};

struct Case {
  std::string name;
  std::vector<std::shared_ptr<const k8s::NetworkPolicy>> policies;
  std::function<std::vector<Want>(const Resolved&)> want;
  std::vector<std::string> problems = {};  // the `where` of each expected problem
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class PolicyTranslatorTest : public ::testing::TestWithParam<Case> {};

TEST_P(PolicyTranslatorTest, ExactEntries) {
  const Case& c = GetParam();
  PolicyInput in = Cluster();
  in.policies = c.policies;
  IdentityAllocator ids;
  PolicyTranslation t = TranslatePolicy(in, &ids);
  Resolved r(t, in);
  std::map<uint32_t, const EndpointPolicy*> by_id;
  for (const EndpointPolicy& ep : t.endpoints) by_id[ep.endpoint_id] = &ep;
  ASSERT_EQ(by_id.size(), 3u);
  for (const Want& w : c.want(r)) {
    SCOPED_TRACE(absl::StrCat("endpoint ", w.endpoint_id));
    ASSERT_TRUE(by_id.contains(w.endpoint_id));
    const EndpointPolicy& got = *by_id[w.endpoint_id];
    EXPECT_EQ(got.enforce_ingress, w.ingress);
    EXPECT_EQ(got.enforce_egress, w.egress);
    EXPECT_THAT(got.allows, UnorderedElementsAreArray(w.allows));
    EXPECT_TRUE(std::is_sorted(got.allows.begin(), got.allows.end()));
  }
  std::vector<std::string> where;
  for (const PolicyProblem& p : t.problems) where.push_back(p.where);
  EXPECT_EQ(where, c.problems) << ::testing::PrintToString(t.problems);
}

const Case kCases[] = {
    {"NoPolicyLeavesEveryEndpointOpen",
     {},
     [](const Resolved&) {
       return std::vector<Want>{{1, false, false, {}}, {2, false, false, {}}, {3, false, false, {}}};
     }},
    {"EmptyPodSelectorSelectsEveryPodOfItsNamespaceOnly",
     {Policy(R"({"podSelector":{},"policyTypes":["Ingress"]})")},
     [](const Resolved&) {
       return std::vector<Want>{
           {1, true, false, {HostIn()}}, {2, true, false, {HostIn()}}, {3, false, false, {}}};
     }},
    {"PolicyTypesDefaultToIngress",
     {Policy(R"({"podSelector":{"matchLabels":{"pod":"a"}},"ingress":[{}]})")},
     [](const Resolved&) {
       return std::vector<Want>{{1, true, false, {All(kAny, I), HostIn()}},
                                {2, false, false, {}}};
     }},
    {"PolicyTypesDefaultAddEgressWhenEgressRulesExist",
     {Policy(R"({"podSelector":{},"egress":[{"to":[{"podSelector":{"matchLabels":{"pod":"b"}}}]}]})")},
     [](const Resolved& r) {
       return std::vector<Want>{{1, true, true, {HostIn(), All(r.Pod("x/b"), E)}}};
     }},
    {"EmptyEgressListKeepsTheDefaultIngressOnly",
     {Policy(R"({"podSelector":{},"egress":[]})")},
     [](const Resolved&) { return std::vector<Want>{{1, true, false, {HostIn()}}}; }},
    {"ExplicitEgressTypeWithoutRulesDeniesAllEgress",
     {Policy(R"({"podSelector":{},"policyTypes":["Egress"]})")},
     [](const Resolved&) { return std::vector<Want>{{1, false, true, {}}}; }},
    {"PodSelectorPeerMatchesPodsOfThePolicysNamespace",
     {Policy(R"({"podSelector":{},"ingress":[{"from":[{"podSelector":{"matchLabels":{"pod":"b"}}}]}]})")},
     [](const Resolved& r) {
       return std::vector<Want>{{1, true, false, {HostIn(), All(r.Pod("x/b"), I)}}};
     }},
    {"NamespaceSelectorPeerMatchesEveryPodOfTheNamespaces",
     {Policy(R"({"podSelector":{},"ingress":[{"from":[{"namespaceSelector":{"matchLabels":{"team":"red"}}}]}]})")},
     [](const Resolved& r) {
       return std::vector<Want>{
           {1, true, false, {HostIn(), All(r.Pod("y/a"), I), All(r.Pod("y/b"), I)}}};
     }},
    {"NamespaceAndPodSelectorInOnePeerAreAnded",
     {Policy(R"({"podSelector":{},"ingress":[{"from":[{"namespaceSelector":{"matchLabels":{"team":"red"}},
                  "podSelector":{"matchLabels":{"pod":"b"}}}]}]})")},
     [](const Resolved& r) {
       return std::vector<Want>{{1, true, false, {HostIn(), All(r.Pod("y/b"), I)}}};
     }},
    {"SeveralPeersAreOred",
     {Policy(R"({"podSelector":{},"ingress":[{"from":[{"namespaceSelector":{"matchLabels":{"team":"red"}}},
                  {"podSelector":{"matchLabels":{"pod":"b"}}}]}]})")},
     [](const Resolved& r) {
       return std::vector<Want>{{1, true, false,
                                 {HostIn(), All(r.Pod("y/a"), I), All(r.Pod("y/b"), I),
                                  All(r.Pod("x/b"), I)}}};
     }},
    {"SeveralRulesAreOredEachWithItsPorts",
     {Policy(R"({"podSelector":{},"ingress":[
          {"from":[{"podSelector":{"matchLabels":{"pod":"b"}}}],"ports":[{"port":80}]},
          {"from":[{"namespaceSelector":{"matchLabels":{"team":"red"}}}],"ports":[{"protocol":"UDP","port":81}]}]})")},
     [](const Resolved& r) {
       return std::vector<Want>{{1, true, false,
                                 {HostIn(), Port(r.Pod("x/b"), I, IPPROTO_TCP, 80),
                                  Port(r.Pod("y/a"), I, IPPROTO_UDP, 81),
                                  Port(r.Pod("y/b"), I, IPPROTO_UDP, 81)}}};
     }},
    {"PoliciesSelectingOnePodAreUnioned",
     {Policy(R"({"podSelector":{"matchLabels":{"pod":"a"}},"ingress":[{"from":[{"podSelector":{"matchLabels":{"pod":"b"}}}]}]})", "p1"),
      Policy(R"({"podSelector":{"matchLabels":{"app":"web"}},"ingress":[{"from":[{"podSelector":{"matchLabels":{"pod":"c"}}}]}]})", "p2")},
     [](const Resolved& r) {
       return std::vector<Want>{
           {1, true, false, {HostIn(), All(r.Pod("x/b"), I), All(r.Pod("x/c"), I)}},
           {2, false, false, {}}};
     }},
    {"MatchExpressionIn",
     {Policy(R"({"podSelector":{},"ingress":[{"from":[{"podSelector":{"matchExpressions":[{"key":"pod","operator":"In","values":["b","c"]}]}}]}]})")},
     [](const Resolved& r) {
       return std::vector<Want>{
           {1, true, false, {HostIn(), All(r.Pod("x/b"), I), All(r.Pod("x/c"), I)}}};
     }},
    {"MatchExpressionNotIn",
     {Policy(R"({"podSelector":{},"ingress":[{"from":[{"podSelector":{"matchExpressions":[{"key":"pod","operator":"NotIn","values":["a"]}]}}]}]})")},
     [](const Resolved& r) {
       return std::vector<Want>{
           {1, true, false, {HostIn(), All(r.Pod("x/b"), I), All(r.Pod("x/c"), I)}}};
     }},
    {"MatchExpressionExists",
     {Policy(R"({"podSelector":{},"ingress":[{"from":[{"podSelector":{"matchExpressions":[{"key":"tier","operator":"Exists"}]}}]}]})")},
     [](const Resolved& r) {
       return std::vector<Want>{{1, true, false, {HostIn(), All(r.Pod("x/c"), I)}}};
     }},
    {"MatchExpressionDoesNotExist",
     {Policy(R"({"podSelector":{"matchExpressions":[{"key":"app","operator":"DoesNotExist"}]},
                  "ingress":[{"from":[{"podSelector":{"matchExpressions":[{"key":"app","operator":"DoesNotExist"}]}}]}]})")},
     [](const Resolved& r) {
       return std::vector<Want>{
           {1, false, false, {}},
           {2, true, false, {HostIn(), All(r.Pod("x/b"), I), All(r.Pod("x/c"), I)}}};
     }},
    {"NamespaceMatchExpressionsAndMetadataName",
     {Policy(R"({"podSelector":{},"ingress":[{"from":[
          {"namespaceSelector":{"matchExpressions":[{"key":"team","operator":"In","values":["red"]}]}},
          {"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"z"}}}]}]})")},
     [](const Resolved& r) {
       return std::vector<Want>{{1, true, false,
                                 {HostIn(), All(r.Pod("y/a"), I), All(r.Pod("y/b"), I),
                                  All(r.Pod("z/a"), I)}}};
     }},
    {"EmptyNamespaceSelectorMatchesEveryPodOfTheCluster",
     {Policy(R"({"podSelector":{"matchLabels":{"pod":"a"}},"ingress":[{"from":[{"namespaceSelector":{}}]}]})")},
     [](const Resolved& r) {
       std::vector<PolicyAllow> allows = {HostIn()};
       for (const char* p : {"x/a", "x/b", "x/c", "y/a", "y/b", "z/a"}) {
         allows.push_back(All(r.Pod(p), I));
       }
       return std::vector<Want>{{1, true, false, allows}};
     }},
    {"IpBlockMatchesPodsAndUnknownAddressesInsideButNotTheExcept",
     // Host bits of cidr are masked: 10.1.2.99/24 is 10.1.2.0/24 (n2's pod CIDR).
     {Policy(R"({"podSelector":{},"ingress":[{"from":[{"ipBlock":{"cidr":"10.1.2.99/24","except":["10.1.2.30/32"]}}]}]})")},
     [](const Resolved& r) {
       return std::vector<Want>{{1, true, false,
                                 {HostIn(), All(r.Pod("x/c"), I), All(r.Pod("y/a"), I),
                                  All(r.Cidr("10.1.2.0/24"), I)}}};
     }},
    {"IpBlockOutsideTheClusterIsACidrIdentity",
     {Policy(R"({"podSelector":{},"policyTypes":["Egress"],"egress":[{"to":[{"ipBlock":{"cidr":"8.8.8.0/24"}}],"ports":[{"protocol":"UDP","port":53}]}]})")},
     [](const Resolved& r) {
       return std::vector<Want>{
           {1, false, true, {Port(r.Cidr("8.8.8.0/24"), E, IPPROTO_UDP, 53)}}};
     }},
    {"IpBlockMatchesOtherNodesAddresses",
     {Policy(R"({"podSelector":{},"ingress":[{"from":[{"ipBlock":{"cidr":"192.168.1.2/32"}}]}]})")},
     [](const Resolved& r) {
       EXPECT_NE(r.Cidr("192.168.1.2/32"), SLUICE_IDENTITY_REMOTE_NODE);  // remote-node + cidr
       return std::vector<Want>{{1, true, false, {HostIn(), All(r.Cidr("192.168.1.2/32"), I)}}};
     }},
    {"NumericTcpAndUdpPorts",
     {Policy(R"({"podSelector":{},"ingress":[{"ports":[{"port":80},{"protocol":"UDP","port":81}]}]})")},
     [](const Resolved&) {
       return std::vector<Want>{{1, true, false,
                                 {HostIn(), Port(kAny, I, IPPROTO_TCP, 80),
                                  Port(kAny, I, IPPROTO_UDP, 81)}}};
     }},
    {"SctpNeverOpensTcpOrUdp",
     {Policy(R"({"podSelector":{},"ingress":[{"ports":[{"protocol":"SCTP","port":80}]}]})")},
     [](const Resolved&) {
       return std::vector<Want>{{1, true, false, {HostIn(), Port(kAny, I, IPPROTO_SCTP, 80)}}};
     }},
    {"EndPortBecomesPortPrefixes",
     {Policy(R"({"podSelector":{},"ingress":[{"ports":[{"port":80,"endPort":83},{"protocol":"UDP","port":1000,"endPort":1030}]}]})")},
     [](const Resolved&) {
       // 80..83 is one 14-bit prefix; 1000..1030 = 1000/13 (1000-1007), 1008/12 (1008-1023),
       // 1024/14 (1024-1027), 1028/15 (1028-1029), 1030/16.
       return std::vector<Want>{{1, true, false,
                                 {HostIn(), {kAny, I, IPPROTO_TCP, 80, 8 + 14},
                                  {kAny, I, IPPROTO_UDP, 1000, 8 + 13},
                                  {kAny, I, IPPROTO_UDP, 1008, 8 + 12},
                                  {kAny, I, IPPROTO_UDP, 1024, 8 + 14},
                                  {kAny, I, IPPROTO_UDP, 1028, 8 + 15},
                                  {kAny, I, IPPROTO_UDP, 1030, 8 + 16}}}};
     }},
    {"ProtocolWithoutPortIsEveryPortOfThatProtocol",
     {Policy(R"({"podSelector":{},"ingress":[{"ports":[{"protocol":"UDP"}]}]})")},
     [](const Resolved&) {
       return std::vector<Want>{{1, true, false, {HostIn(), Proto(kAny, I, IPPROTO_UDP)}}};
     }},
    {"EmptyPortsAllowEverythingAndSubsumeNarrowerEntries",
     {Policy(R"({"podSelector":{},"ingress":[
          {"from":[{"podSelector":{"matchLabels":{"pod":"b"}}}]},
          {"from":[{"podSelector":{"matchLabels":{"pod":"b"}}}],"ports":[{"port":80},{"protocol":"UDP"}]}]})")},
     [](const Resolved& r) {
       return std::vector<Want>{{1, true, false, {HostIn(), All(r.Pod("x/b"), I)}}};
     }},
    {"NamedPortOnIngressResolvesOnTheDestinationEndpoint",
     {Policy(R"({"podSelector":{},"ingress":[{"ports":[{"port":"serve-80-tcp"},{"protocol":"UDP","port":"serve-81-udp"},
          {"protocol":"UDP","port":"serve-80-tcp"}]}]})")},
     [](const Resolved&) {
       // serve-80-tcp is TCP: asked for as UDP it resolves to nothing.
       return std::vector<Want>{{1, true, false,
                                 {HostIn(), Port(kAny, I, IPPROTO_TCP, 80),
                                  Port(kAny, I, IPPROTO_UDP, 81)}}};
     }},
    {"NamedPortOnEgressResolvesPerDestinationPod",
     {Policy(R"({"podSelector":{"matchLabels":{"pod":"a"}},"policyTypes":["Egress"],
          "egress":[{"to":[{"namespaceSelector":{}}],"ports":[{"port":"serve-80-tcp"}]}]})")},
     [](const Resolved& r) {
       std::vector<PolicyAllow> allows;
       for (const char* p : {"x/a", "x/b", "x/c", "y/a", "y/b"}) {
         allows.push_back(Port(r.Pod(p), E, IPPROTO_TCP, 80));
       }
       allows.push_back(Port(r.Pod("z/a"), E, IPPROTO_TCP, 8080));  // z/a serves it on 8080
       return std::vector<Want>{{1, false, true, allows}};
     }},
    {"BadRuleIsRejectedAndTheRestStillApplies",
     {Policy(R"({"podSelector":{},"ingress":[{"from":[{"ipBlock":{"cidr":"10.1.2.0/33"}}]},
          {"from":[{"podSelector":{"matchLabels":{"pod":"b"}}}]}]})")},
     [](const Resolved& r) {
       return std::vector<Want>{{1, true, false, {HostIn(), All(r.Pod("x/b"), I)}}};
     },
     {"ingress[0]"}},
    {"BadPodSelectorSelectsTheWholeNamespaceAndAllowsNothing",
     {Policy(R"({"podSelector":{"matchExpressions":[{"key":"pod","operator":"Near","values":["a"]}]},"ingress":[{}]})")},
     [](const Resolved&) {
       return std::vector<Want>{
           {1, true, false, {HostIn()}}, {2, true, false, {HostIn()}}, {3, false, false, {}}};
     },
     {"podSelector"}},
    {"UndecodableSpecFailsClosedInBothDirections",
     {Policy(R"({"podSelector":{"matchLabels":{"pod":"zzz"}},"ingress":"everything"})")},
     [](const Resolved&) {
       return std::vector<Want>{{1, true, true, {HostIn()}}, {2, true, true, {HostIn()}}};
     },
     {"spec"}},
    {"UnknownPolicyTypeEnforcesBothDirections",
     {Policy(R"({"podSelector":{},"policyTypes":["Sideways"],"ingress":[{}]})")},
     [](const Resolved&) {
       return std::vector<Want>{{1, true, true, {All(kAny, I), HostIn()}}};
     },
     {"policyTypes"}},
};

INSTANTIATE_TEST_SUITE_P(Cases, PolicyTranslatorTest, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return info.param.name; });

// Every kind of bad input in the only rule of a default-deny policy: the rule is rejected (with
// a reason), the endpoint stays enforced, nothing opens.
TEST(PolicyTranslatorBadInputTest, EachBadRuleIsRejectedWithAReasonAndOpensNothing) {
  const std::pair<const char*, const char*> rules[] = {
      {R"({"from":[{"ipBlock":{"cidr":"10.1.2.0"}}]})", "invalid CIDR"},
      {R"({"from":[{"ipBlock":{"cidr":"nonsense/8"}}]})", "invalid CIDR"},
      {R"({"from":[{"ipBlock":{"cidr":"10.0.0.0/8","except":["11.0.0.0/16"]}}]})", "not inside"},
      {R"({"from":[{"ipBlock":{"cidr":"10.0.0.0/8"},"podSelector":{}}]})", "ipBlock and a selector"},
      {R"({"from":[{}]})", "empty peer"},
      {R"({"from":[{"podSelector":{"matchExpressions":[{"key":"a","operator":"In"}]}}]})", "no values"},
      {R"({"from":[{"podSelector":{"matchExpressions":[{"key":"a","operator":"Exists","values":["x"]}]}}]})", "values given"},
      {R"({"ports":[{"protocol":"ICMP","port":80}]})", "unknown protocol"},
      {R"({"ports":[{"port":70000}]})", "out of range"},
      {R"({"ports":[{"port":0}]})", "out of range"},
      {R"({"ports":[{"port":90,"endPort":80}]})", "endPort 80 out of range"},
      {R"({"ports":[{"port":90,"endPort":65536}]})", "endPort 65536 out of range"},
      {R"({"ports":[{"endPort":80}]})", "endPort without port"},
      {R"({"ports":[{"port":"serve-80-tcp","endPort":90}]})", "named port"},
      {R"({"ports":[{"port":true}]})", "neither an integer nor a name"},
      {R"({"ports":[{"port":99999999999}]})", "neither an integer nor a name"},
      {R"({"from":"everyone"})", "not a list"},
  };
  for (const auto& [rule, reason] : rules) {
    SCOPED_TRACE(rule);
    PolicyInput in = Cluster();
    in.policies = {Policy(absl::StrCat(R"({"podSelector":{},"ingress":[)", rule, "]}"))};
    IdentityAllocator ids;
    PolicyTranslation t = TranslatePolicy(in, &ids);
    ASSERT_EQ(t.endpoints.size(), 3u);
    EXPECT_TRUE(t.endpoints[0].enforce_ingress);
    EXPECT_THAT(t.endpoints[0].allows, ElementsAre(HostIn()));
    ASSERT_EQ(t.problems.size(), 1u);
    EXPECT_EQ(t.problems[0].policy, "x/p");
    EXPECT_EQ(t.problems[0].where, "ingress[0]");
    EXPECT_THAT(t.problems[0].reason, ::testing::HasSubstr(reason));
  }
}

TEST(PolicyTranslatorIpcacheTest, EveryAddressWithItsIdentity) {
  PolicyInput in = Cluster();
  in.policies = {Policy(R"({"podSelector":{},"egress":[{"to":[{"ipBlock":{"cidr":"8.0.0.0/8","except":["8.8.0.0/16"]}}]}]})")};
  IdentityAllocator ids;
  PolicyTranslation t = TranslatePolicy(in, &ids);
  auto id = [&](const LabelSet& l) { return ids.Find(l).value_or(0); };
  const LabelSet xa = {"k8s:app=web",
                       "k8s:io.kubernetes.pod.namespace.labels.kubernetes.io/metadata.name=x",
                       "k8s:io.kubernetes.pod.namespace.labels.team=blue",
                       "k8s:io.kubernetes.pod.namespace=x", "k8s:pod=a"};
  const LabelSet za = {"k8s:io.kubernetes.pod.namespace.labels.kubernetes.io/metadata.name=z",
                       "k8s:io.kubernetes.pod.namespace=z", "k8s:pod=a"};
  ASSERT_NE(id(xa), 0u);
  ASSERT_NE(id(za), 0u);
  auto entry = [](const char* prefix, uint32_t identity) {
    return IpcacheEntry{*IpPrefix::Parse(prefix), identity};
  };
  auto labels_of = [&](const char* prefix) -> LabelSet {
    for (const IpcacheEntry& e : t.ipcache) {
      if (e.prefix.ToString() == prefix) return *ids.Labels(e.identity);
    }
    return {};
  };
  EXPECT_THAT(labels_of("8.0.0.0/8"), ElementsAre("cidr:8.0.0.0/8", "reserved:world"));
  EXPECT_THAT(labels_of("8.8.0.0/16"),
              ElementsAre("cidr:8.0.0.0/8", "cidr:8.8.0.0/16", "reserved:world"));
  EXPECT_THAT(labels_of("10.1.1.0/24"), ElementsAre("reserved:unmanaged"));
  EXPECT_THAT(labels_of("10.1.2.30/32"), ::testing::ElementsAreArray(za));
  std::vector<IpcacheEntry> want = {
      entry("0.0.0.0/0", SLUICE_IDENTITY_WORLD),
      entry("8.0.0.0/8", id({"cidr:8.0.0.0/8", "reserved:world"})),
      entry("8.8.0.0/16", id({"cidr:8.0.0.0/8", "cidr:8.8.0.0/16", "reserved:world"})),
      entry("10.1.1.0/24", SLUICE_IDENTITY_UNMANAGED),
      entry("10.1.1.10/32", id(xa)),
      entry("10.1.1.11/32", id(labels_of("10.1.1.11/32"))),
      entry("10.1.1.21/32", id(labels_of("10.1.1.21/32"))),
      entry("10.1.2.0/24", SLUICE_IDENTITY_UNMANAGED),
      entry("10.1.2.12/32", id(labels_of("10.1.2.12/32"))),
      entry("10.1.2.20/32", id(labels_of("10.1.2.20/32"))),
      entry("10.1.2.30/32", id(za)),
      entry("192.168.1.1/32", SLUICE_IDENTITY_HOST),
      entry("192.168.1.2/32", SLUICE_IDENTITY_REMOTE_NODE),  // not the hostNetwork pod's
  };
  EXPECT_EQ(t.ipcache, want);
  // Distinct label sets, distinct numbers: x/a, x/b, x/c, y/a, y/b, z/a, two CIDRs.
  EXPECT_EQ(ids.size(), 8u);
  // Endpoints carry their own identity.
  EXPECT_EQ(t.endpoints[0].identity, id(xa));
}

TEST(PolicyTranslatorIpcacheTest, IdentitiesAreStableAcrossRetranslationAndRelabelChangesOne) {
  PolicyInput in = Cluster();
  IdentityAllocator ids;
  PolicyTranslation first = TranslatePolicy(in, &ids);
  PolicyTranslation again = TranslatePolicy(in, &ids);
  EXPECT_EQ(first.ipcache, again.ipcache);

  auto relabelled = std::make_shared<k8s::Pod>(*in.pods[1]);  // x/b
  relabelled->meta.labels["pod"] = "bb";
  in.pods[1] = relabelled;
  PolicyTranslation after = TranslatePolicy(in, &ids);
  ASSERT_EQ(after.ipcache.size(), first.ipcache.size());
  for (size_t i = 0; i < after.ipcache.size(); ++i) {
    if (after.ipcache[i].prefix.ToString() == "10.1.1.11/32") {
      EXPECT_NE(after.ipcache[i].identity, first.ipcache[i].identity);
    } else {
      EXPECT_EQ(after.ipcache[i], first.ipcache[i]);
    }
  }
}

TEST(PolicyTranslatorEndpointTest, EndpointWithoutItsPodIsUnmanagedAndFailsClosed) {
  PolicyInput in = Cluster();
  in.endpoints.push_back({9, "x", "ghost", *IpAddress::Parse("10.1.1.99")});
  in.policies = {Policy(R"({"podSelector":{"matchLabels":{"pod":"a"}},"ingress":[{}]})")};
  IdentityAllocator ids;
  PolicyTranslation t = TranslatePolicy(in, &ids);
  ASSERT_EQ(t.endpoints.size(), 4u);
  const EndpointPolicy& ghost = t.endpoints[3];
  EXPECT_EQ(ghost.endpoint_id, 9u);
  EXPECT_EQ(ghost.identity, SLUICE_IDENTITY_UNMANAGED);
  EXPECT_TRUE(ghost.enforce_ingress);
  EXPECT_FALSE(ghost.enforce_egress);
  EXPECT_THAT(ghost.allows, ElementsAre(HostIn()));
}

TEST(PolicyTranslatorEndpointTest, LocalEndpointAddressIsKnownBeforeThePodStatusHasIt) {
  PolicyInput in = Cluster();
  auto fresh = std::make_shared<k8s::Pod>(*in.pods[0]);  // x/a, status not yet written
  fresh->pod_ips.clear();
  in.pods[0] = fresh;
  IdentityAllocator ids;
  PolicyTranslation t = TranslatePolicy(in, &ids);
  const LabelSet* labels = ids.Labels(t.endpoints[0].identity);
  ASSERT_NE(labels, nullptr);
  EXPECT_THAT(*labels, ::testing::Contains("k8s:pod=a"));
}

TEST(PortRangePrefixesTest, CoversExactlyTheRange) {
  EXPECT_THAT(PortRangePrefixes(80, 80), ElementsAre(std::pair<uint16_t, int>{80, 16}));
  EXPECT_THAT(PortRangePrefixes(0, 65535), ElementsAre(std::pair<uint16_t, int>{0, 0}));
  EXPECT_THAT(PortRangePrefixes(65535, 65535),
              ElementsAre(std::pair<uint16_t, int>{65535, 16}));
  for (auto [first, last] : {std::pair{1, 65535}, {1000, 1030}, {32768, 60999}, {7, 9}}) {
    std::vector<bool> covered(65536, false);
    for (auto [port, n] : PortRangePrefixes(first, last)) {
      uint32_t size = 1u << (16 - n);
      EXPECT_EQ(port % size, 0u) << "unaligned prefix " << port << "/" << n;
      for (uint32_t p = port; p < port + size; ++p) {
        EXPECT_FALSE(covered[p]) << p << " twice";
        covered[p] = true;
      }
    }
    for (int p = 0; p < 65536; ++p) {
      ASSERT_EQ(covered[p], p >= first && p <= last) << first << ".." << last << " port " << p;
    }
  }
}

}  // namespace
}  // namespace sluice::agent
