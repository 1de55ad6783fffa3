// sluicectl identities / policy get on real pinned maps and a state directory laid out as the
// agent writes it (identities.json, endpoint records): the output names the pod's identity, its
// enforced directions with their allows resolved to labels, and its policy drops; sluicectl drops
// lists the policy_denied drops the real programs counted, per endpoint and direction, with the
// pod each endpoint belongs to (table, -o json, --pod).
#include <netinet/in.h>
#include <stdio.h>

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "agent/endpoint/endpoint_store.h"
#include "agent/policy/identity.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "support/fixture.h"
#include "support/temp_dir.h"

namespace sluice::agent {
namespace {

using sluice::testing::Ip4;
using sluice::testing::Packet;
using sluice::testing::ParseMac;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

std::string Shell(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return "popen failed";
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  pclose(p);
  return out;
}

class SluicectlPolicyTest : public sluice::testing::DatapathTest {
 protected:
  void SetUp() override {
    DatapathTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_TRUE(
        SaveIdentities(state_.path(), {{300, {"k8s:io.kubernetes.pod.namespace=x", "k8s:pod=b"}}})
            .ok());
    Endpoint ep;
    ep.container_id = "ctr1";
    ep.ifname = "eth0";
    ep.netns = "/var/run/netns/p";
    ep.network_name = "net";
    ep.pod_namespace = "x";
    ep.pod_name = "a";
    ep.host_ifname = "lxc1";
    ep.host_ifindex = 5;
    ep.ipv4 = "10.244.0.10";
    ep.mac = "02:00:00:00:00:01";
    ep.host_mac = "02:00:00:00:00:02";
    ep.endpoint_id = 7;
    std::filesystem::create_directories(state_ / "endpoints");
    std::ofstream(state_ / "endpoints/ctr1.json") << EndpointToJson(ep).dump();

    sluice_policy_ep_entry e{};
    e.identity = 301;
    e.flags = SLUICE_POLICY_EP_F_INGRESS;
    ASSERT_TRUE(dp_->policy_ep().Update(7, e).ok());
    sluice_policy4_entry allow{};
    allow.verdict = SLUICE_POLICY_ALLOW;
    ASSERT_TRUE(
        dp_->policy4()
            .Update(maps::MakePolicy4Key(7, 300, SLUICE_POLICY_INGRESS, IPPROTO_TCP, 80, 8 + 15),
                    allow)
            .ok());
    sluice_ipcache4_entry id{};
    id.identity = 300;
    ASSERT_TRUE(dp_->ipcache4().Update({32, htonl(0x0af40014)}, id).ok());  // 10.244.0.20
  }
  std::string Ctl(const std::string& args) {
    return Shell(absl::StrCat(SLUICE_BUILD_DIR, "/agent/sluicectl --bpffs_root=", bpffs_->path(),
                              " --state_dir=", state_.path(), " ", args));
  }
  // Policy drops counted by the real programs: x/a (endpoint 7, on lo) denies ingress TCP 8080
  // from 10.244.0.20 (its allow is for tcp/80-81); endpoint 9 (10.244.0.30), which has no
  // endpoint record (its pod is gone), enforces egress without allows.
  void DropPackets(int ingress_to_a, int egress_from_9) {
    const auto pod_mac = ParseMac("02:00:00:00:00:01"), host_mac = ParseMac("02:00:00:00:00:02");
    ASSERT_TRUE(
        sluice::testing::AddEndpoint(*dp_, Ip4("10.244.0.10"), 1, pod_mac, host_mac, 7).ok());
    ASSERT_TRUE(
        sluice::testing::AddEndpoint(*dp_, Ip4("10.244.0.30"), 1, pod_mac, host_mac, 9).ok());
    sluice_policy_ep_entry e{};
    e.identity = 302;
    e.flags = SLUICE_POLICY_EP_F_EGRESS;
    ASSERT_TRUE(dp_->policy_ep().Update(9, e).ok());
    for (int i = 0; i < ingress_to_a; ++i) {
      auto in = Packet::Eth(host_mac, pod_mac)
                    .IPv4("10.244.0.20", "10.244.0.10")
                    .TCP(static_cast<uint16_t>(40000 + i), 8080)
                    .Build();
      ASSERT_EQ(Run(dp_->to_pod_fd(), in).verdict, sluice::testing::kTcShot);
    }
    for (int i = 0; i < egress_from_9; ++i) {
      auto in = Packet::Eth(pod_mac, host_mac)
                    .IPv4("10.244.0.30", "10.244.0.20")
                    .TCP(static_cast<uint16_t>(40000 + i), 80)
                    .Build();
      ASSERT_EQ(Run(dp_->from_pod_fd(), in).verdict, sluice::testing::kTcShot);
    }
  }
  sluice::testing::TempDir state_{"sluicectl-policy"};
};

TEST_F(SluicectlPolicyTest, PolicyGetShowsEnforcedDirectionsAndAllowsWithPeerLabels) {
  std::string out = Ctl("policy get x/a");
  EXPECT_THAT(out, HasSubstr("endpoint 7  address 10.244.0.10")) << out;
  EXPECT_THAT(out, HasSubstr("ingress: enforced, 0 packets denied")) << out;
  EXPECT_THAT(out, HasSubstr("egress: open")) << out;
  EXPECT_THAT(out, HasSubstr("tcp/80-81")) << out;
  EXPECT_THAT(out, HasSubstr("k8s:io.kubernetes.pod.namespace=x,k8s:pod=b")) << out;
}

TEST_F(SluicectlPolicyTest, PolicyGetOfAnUnknownPodFails) {
  EXPECT_THAT(Ctl("policy get x/nope"), HasSubstr("no endpoint of pod x/nope"));
}

TEST_F(SluicectlPolicyTest, IdentitiesListsReservedAndNumberedOnesWithTheirPrefixes) {
  std::string out = Ctl("identities");
  EXPECT_THAT(out, HasSubstr("reserved:host")) << out;
  EXPECT_THAT(out, HasSubstr("300       1        k8s:io.kubernetes.pod.namespace=x,k8s:pod=b"))
      << out;
  EXPECT_THAT(out, Not(HasSubstr("(any peer)"))) << out;
}

// One test for the table (a datapath per test costs seconds): before any drop, after drops of
// two endpoints, and narrowed by --pod.
TEST_F(SluicectlPolicyTest, DropsListPolicyDeniedPerEndpointAndDirectionWithItsPod) {
  std::string out = Ctl("drops");
  EXPECT_THAT(out, ContainsRegex("policy_denied +0 +0")) << out;
  EXPECT_THAT(out, HasSubstr("policy_denied by endpoint:\n  (none)")) << out;

  DropPackets(3, 2);
  if (HasFatalFailure()) return;
  out = Ctl("drops");
  EXPECT_THAT(out, ContainsRegex("policy_denied +5 ")) << out;
  // INGRESS / EGRESS columns: sluice_to_pod denied 3 (ingress), sluice_from_pod 2 (egress).
  EXPECT_THAT(out, ContainsRegex("REASON +PACKETS +BYTES +INGRESS +EGRESS\n")) << out;
  EXPECT_THAT(out, ContainsRegex("policy_denied +5 +[1-9][0-9]* +3 +2\n")) << out;
  EXPECT_THAT(out, ContainsRegex("\n  7 +x/a +ingress +3 +[1-9][0-9]*\n")) << out;
  EXPECT_THAT(out, ContainsRegex("\n  9 +\\(gone\\) +egress +2 +[1-9][0-9]*\n")) << out;
  EXPECT_THAT(out, Not(ContainsRegex("x/a +egress"))) << out;

  out = Ctl("drops --pod=x/a");
  EXPECT_THAT(out, ContainsRegex("7 +x/a +ingress +3 ")) << out;
  EXPECT_THAT(out, Not(HasSubstr("(gone)"))) << out;
  // A pod with no endpoint here is an error, not an empty list that reads as "no drops".
  out = Ctl("drops --pod=x/nope");
  EXPECT_THAT(out, HasSubstr("--pod=x/nope: no endpoint of that pod on this node")) << out;
  EXPECT_THAT(out, Not(HasSubstr("policy_denied by endpoint"))) << out;
}

TEST_F(SluicectlPolicyTest, DropsJsonHasReasonsAndPolicyDeniedByEndpoint) {
  DropPackets(3, 2);
  if (HasFatalFailure()) return;
  std::string out = Ctl("drops -o json");
  auto j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << out;
  bool found = false;
  for (const auto& r : j["reasons"]) {
    if (r["reason"] == "policy_denied") {
      found = true;
      EXPECT_EQ(r["packets"], 5) << out;
      EXPECT_EQ(r["direction"]["ingress"]["packets"], 3) << out;
      EXPECT_EQ(r["direction"]["egress"]["packets"], 2) << out;
      EXPECT_GT(r["direction"]["egress"]["bytes"], 0) << out;
    }
  }
  EXPECT_TRUE(found) << out;
  ASSERT_EQ(j["policy_denied_by_endpoint"].size(), 2u) << out;
  const auto& a = j["policy_denied_by_endpoint"][0];
  EXPECT_EQ(a["endpoint"], 7) << out;
  EXPECT_EQ(a["pod"], "x/a") << out;
  EXPECT_EQ(a["direction"], "ingress") << out;
  EXPECT_EQ(a["packets"], 3) << out;
  EXPECT_GE(a["bytes"].get<uint64_t>(), 3u * 40) << out;
  const auto& gone = j["policy_denied_by_endpoint"][1];
  EXPECT_EQ(gone["endpoint"], 9) << out;
  EXPECT_EQ(gone["pod"], "(gone)") << out;
  EXPECT_EQ(gone["direction"], "egress") << out;
  EXPECT_EQ(gone["packets"], 2) << out;
}

}  // namespace
}  // namespace sluice::agent
