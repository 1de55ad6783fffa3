// The typed NetworkPolicy spec as agent/k8s/decode.cc produces it (next to spec_json).
#include "agent/k8s/decode.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::k8s {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

NetworkPolicy DecodePolicy(const std::string& spec) {
  Decoder d;
  NetworkPolicy np;
  absl::Status st =
      d.Decode(R"({"metadata":{"name":"p","namespace":"x"},"spec":)" + spec + "}", &np);
  EXPECT_TRUE(st.ok()) << st;
  return np;
}

TEST(PolicyDecodeTest, EveryFieldOfTheSpec) {
  NetworkPolicy np = DecodePolicy(R"({
    "podSelector": {"matchLabels": {"app": "web"},
                    "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]},
    "policyTypes": ["Ingress", "Egress"],
    "ingress": [{"from": [{"podSelector": {}, "namespaceSelector": {"matchLabels": {"team": "red"}}},
                          {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}],
                 "ports": [{"protocol": "UDP", "port": 53}, {"port": "serve-80-tcp"},
                           {"port": 8000, "endPort": 8080}]}],
    "egress": [{"to": null, "ports": null}, {}]})");
  const NetworkPolicySpec& s = np.spec;
  EXPECT_THAT(s.error, IsEmpty());
  EXPECT_EQ(s.pod_selector.match_labels.at("app"), "web");
  ASSERT_EQ(s.pod_selector.match_expressions.size(), 1u);
  EXPECT_EQ(s.pod_selector.match_expressions[0],
            (LabelSelectorRequirement{"tier", "In", {"a", "b"}}));
  EXPECT_THAT(s.policy_types, ElementsAre("Ingress", "Egress"));
  ASSERT_EQ(s.ingress.size(), 1u);
  const NetworkPolicyRule& r = s.ingress[0];
  ASSERT_EQ(r.peers.size(), 2u);
  ASSERT_TRUE(r.peers[0].pod_selector.has_value());
  EXPECT_EQ(*r.peers[0].pod_selector, LabelSelector{});
  EXPECT_EQ(r.peers[0].namespace_selector->match_labels.at("team"), "red");
  EXPECT_FALSE(r.peers[0].ip_block.has_value());
  EXPECT_EQ(*r.peers[1].ip_block, (IpBlock{"10.0.0.0/8", {"10.1.0.0/16"}}));
  ASSERT_EQ(r.ports.size(), 3u);
  EXPECT_EQ(r.ports[0].protocol, "UDP");
  EXPECT_EQ(r.ports[0].port->number, 53);
  EXPECT_TRUE(r.ports[1].port->is_name);
  EXPECT_EQ(r.ports[1].port->name, "serve-80-tcp");
  EXPECT_EQ(r.ports[1].protocol, "");  // TCP by default, decided by the translator
  EXPECT_EQ(r.ports[2].end_port, 8080);
  EXPECT_THAT(r.error, IsEmpty());
  ASSERT_EQ(s.egress.size(), 2u);  // null lists are empty: "every peer, every port"
  EXPECT_THAT(s.egress[0].peers, IsEmpty());
  EXPECT_THAT(s.egress[0].ports, IsEmpty());
  // spec_json is still there, unchanged.
  EXPECT_THAT(np.spec_json, HasSubstr(R"("policyTypes":["Ingress","Egress"])"));
}

// A field of the wrong type never fails the object (it would vanish from the store and open
// what it denies): it marks the smallest enclosing part bad.
TEST(PolicyDecodeTest, WrongTypesMarkThePartTheyBelongTo) {
  struct Case {
    const char* spec;
    const char* rule_error;      // of ingress[0], "" for none
    const char* selector_error;  // of spec.podSelector
    const char* spec_error;
  };
  const Case cases[] = {
      {R"({"podSelector":{},"ingress":[{"ports":[{"port":true}]}]})", "neither", "", ""},
      {R"({"podSelector":{},"ingress":[{"ports":[{"port":80,"endPort":"x"}]}]})", "endPort", "", ""},
      {R"({"podSelector":{},"ingress":[{"ports":[{"protocol":6}]}]})", "protocol", "", ""},
      {R"({"podSelector":{},"ingress":[{"from":[{"ipBlock":{"cidr":10}}]}]})", "ipBlock.cidr", "", ""},
      {R"({"podSelector":{},"ingress":[{"from":[{"ipBlock":"10.0.0.0/8"}]}]})", "ipBlock", "", ""},
      {R"({"podSelector":{},"ingress":[{"from":{}}]})", "from is not a list", "", ""},
      {R"({"podSelector":{},"ingress":[5]})", "not an object", "", ""},
      {R"({"podSelector":{"matchLabels":{"a":1}}})", "", "matchLabels[a]", ""},
      {R"({"podSelector":{"matchExpressions":{}}})", "", "not a list", ""},
      {R"({"podSelector":"all"})", "", "not an object", ""},
      {R"({"podSelector":{},"ingress":{}})", "", "", "ingress is not a list"},
      {R"({"podSelector":{},"policyTypes":"Ingress"})", "", "", "policyTypes"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    NetworkPolicy np = DecodePolicy(c.spec);
    if (*c.rule_error) {
      ASSERT_EQ(np.spec.ingress.size(), 1u);
      EXPECT_THAT(np.spec.ingress[0].error, HasSubstr(c.rule_error));
    }
    if (*c.selector_error) {
      EXPECT_THAT(np.spec.pod_selector.error, HasSubstr(c.selector_error));
    } else {
      EXPECT_THAT(np.spec.pod_selector.error, IsEmpty());
    }
    if (*c.spec_error) {
      EXPECT_THAT(np.spec.error, HasSubstr(c.spec_error));
    } else {
      EXPECT_THAT(np.spec.error, IsEmpty());
    }
  }
}

}  // namespace
}  // namespace sluice::k8s
