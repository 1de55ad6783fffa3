// sluicectl identities / policy get on real pinned maps and a state directory laid out as the
// agent writes it (identities.json, endpoint records): the output names the pod's identity, its
// enforced directions with their allows resolved to labels, and its policy drops.
#include <netinet/in.h>
#include <stdio.h>

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "agent/endpoint/endpoint_store.h"
#include "agent/policy/identity.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "support/fixture.h"
#include "support/temp_dir.h"

namespace sluice::agent {
namespace {

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

}  // namespace
}  // namespace sluice::agent
