// The policy reconciler on the real pinned maps, judged by the real programs: what Apply writes
// is what sluice_from_pod looks up (key encoding, prefixes, identities), and a second reconciler
// reads the same state back.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>

#include "agent/policy/reconciler.h"
#include "gtest/gtest.h"
#include "support/fixture.h"

namespace sluice::agent {
namespace {

using sluice::testing::kTcOk;
using sluice::testing::kTcShot;
using sluice::testing::Packet;
using sluice::testing::ParseMac;

IpPrefix Pfx(const std::string& s) { return *IpPrefix::Parse(s); }

class PolicyReconcilerPrivTest : public sluice::testing::DatapathTest {
 protected:
  void SetUp() override {
    DatapathTest::SetUp();
    if (HasFatalFailure()) return;
    sluice_ep4_key key{sluice::testing::Ip4("10.244.0.10")};
    sluice_endpoint ep{};
    ep.ifindex = 1;  // lo: test_run receives on it
    ep.endpoint_id = 7;
    ASSERT_TRUE(dp_->endpoints().Update(key, ep).ok());
    maps_ = std::make_unique<BpfPolicyMaps>(dp_->ipcache4(), dp_->policy4(), dp_->policy_ep());
    rec_ = std::make_unique<PolicyReconciler>(*maps_);
  }
  int Send(const std::string& dst, uint16_t dport) {
    auto in = Packet::Eth(ParseMac("02:00:00:00:0a:01"), ParseMac("02:aa:00:00:0a:02"))
                  .IPv4("10.244.0.10", dst)
                  .TCP(40000, dport)
                  .Build();
    return Run(dp_->from_pod_fd(), in, 1).verdict;
  }
  std::unique_ptr<BpfPolicyMaps> maps_;
  std::unique_ptr<PolicyReconciler> rec_;
};

std::optional<std::string> Owner(uint32_t id) {
  if (id == 7) return std::string("x/a");
  return std::nullopt;
}

TEST_F(PolicyReconcilerPrivTest, AppliedEgressRuleIsWhatTheDatapathEnforces) {
  PolicyTranslation t;
  t.ipcache = {{Pfx("0.0.0.0/0"), SLUICE_IDENTITY_WORLD},
               {Pfx("10.244.1.0/24"), SLUICE_IDENTITY_UNMANAGED},
               {Pfx("10.244.1.5/32"), 300}};
  EndpointPolicy ep;
  ep.endpoint_id = 7;
  ep.pod = "x/a";
  ep.identity = 301;
  ep.enforce_egress = true;
  ep.allows = {{300, SLUICE_POLICY_EGRESS, IPPROTO_TCP, 80, 8 + 14}};  // 80..83
  t.endpoints = {ep};
  ASSERT_TRUE(rec_->Apply(t, Owner).ok());

  EXPECT_EQ(Send("10.244.1.5", 83), kTcOk);
  EXPECT_EQ(Send("10.244.1.5", 84), kTcShot);
  EXPECT_EQ(Send("10.244.1.6", 80), kTcShot);  // unmanaged, not 300
  EXPECT_EQ(Drops(SLUICE_DROP_POLICY_DENIED), 2u);

  // Read back by a second reconciler: nothing to write.
  PolicyReconciler again(*maps_);
  ASSERT_TRUE(again.Apply(t, Owner).ok());
  EXPECT_EQ(again.stats().allow_writes + again.stats().ipcache_writes +
                again.stats().endpoint_writes + again.stats().allow_deletes +
                again.stats().ipcache_deletes + again.stats().endpoint_deletes,
            0u);

  // The pod no longer selected: open again, its allows gone.
  t.endpoints[0].enforce_egress = false;
  t.endpoints[0].allows.clear();
  ASSERT_TRUE(rec_->Apply(t, Owner).ok());
  EXPECT_EQ(Send("10.244.1.6", 80), kTcOk);
  size_t allows = 0;
  ASSERT_TRUE(maps_->ForEachAllow([&](uint32_t, const PolicyAllow&) { ++allows; }).ok());
  EXPECT_EQ(allows, 0u);
}

}  // namespace
}  // namespace sluice::agent
