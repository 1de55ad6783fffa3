// Maglev through the whole agent side and the real datapath: two nodes, each its own loaded
// datapath (its own bpffs, maps and backend ids) and its own reconciler, programmed with the same
// NodePort Service. The same client flow entering either node lands on the same backend, also
// when it reaches the second node mid-connection (no conntrack entry there: a flow moved by
// the network); with random selection it does not. And a backend change under a stream of new
// flows never drops one: the new table is swapped in whole, between the backends written
// first and the ones deleted last.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "agent/service/reconciler.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "support/fixture.h"
#include "support/packet.h"

namespace sluice::agent {
namespace {

using ::sluice::testing::Decode;
using ::sluice::testing::Describe;
using ::sluice::testing::Ip4;
using ::sluice::testing::kTcpAck;
using ::sluice::testing::kTcpSyn;
using ::sluice::testing::kTcRedirect;
using ::sluice::testing::Mac;
using ::sluice::testing::Packet;
using ::sluice::testing::ParseMac;

IpAddress Ip(const std::string& s) { return *IpAddress::Parse(s); }

constexpr const char* kNodeA = "192.168.60.10";
constexpr const char* kNodeB = "192.168.60.11";
constexpr const char* kClient = "203.0.113.9";
constexpr uint16_t kNodePort = 30080;
const char* const kPods[] = {"10.244.0.21", "10.244.0.22", "10.244.0.23"};

Mac PodMac(int n) { return ParseMac(absl::StrFormat("02:00:00:00:%02x:01", n)); }
Mac HostMac(int n) { return ParseMac(absl::StrFormat("02:aa:00:00:%02x:02", n)); }

// One node: a datapath on a bpffs of its own, the agent's map writer and reconciler on it.
struct Node {
  std::unique_ptr<testing::ScratchBpffs> bpffs;
  std::unique_ptr<loader::Datapath> dp;
  std::unique_ptr<BpfLbMaps> lb;
  std::unique_ptr<ServiceReconciler> reconciler;
  std::string addr;
};

ServiceTranslation NodePortService(const std::string& node_addr,
                                   const std::vector<std::string>& pods, bool maglev) {
  LbFrontend f;
  f.service = "default/web";
  f.addr = Ip(node_addr);
  f.port = kNodePort;
  f.proto = IPPROTO_TCP;
  f.flags = SLUICE_SVC_F_NODEPORT | (maglev ? SLUICE_SVC_F_MAGLEV : 0);
  for (const std::string& p : pods) f.backends.push_back(LbBackend{Ip(p), 8080, IPPROTO_TCP});
  std::sort(f.backends.begin(), f.backends.end());
  ServiceTranslation t;
  t.frontends.push_back(std::move(f));
  return t;
}

class MaglevPrivTest : public testing::DatapathTest {
 protected:
  void SetUp() override {
    DatapathTest::SetUp();
    if (HasFatalFailure()) return;
    a_.dp = std::move(dp_);
    a_.bpffs = std::move(bpffs_);
    b_.bpffs = std::make_unique<testing::ScratchBpffs>();
    auto dp = loader::Datapath::Load(b_.bpffs->path());
    ASSERT_TRUE(dp.ok()) << dp.status();
    b_.dp = std::move(*dp);
    a_.addr = kNodeA;
    b_.addr = kNodeB;
    for (Node* n : {&a_, &b_}) {
      sluice_node_config cfg{};
      cfg.node_ip4 = Ip4(n->addr);
      cfg.pod_cidr4 = Ip4("10.244.0.0");
      cfg.pod_cidr4_len = 24;
      cfg.gateway_ip4 = Ip4("10.244.0.1");
      ASSERT_TRUE(n->dp->node_config().Update(0, cfg).ok());
      // The backends are pods on lo (test_run's device) in both nodes' eyes.
      for (int i = 21; i <= 23; ++i) {
        ASSERT_TRUE(testing::AddEndpoint(*n->dp, Ip4(absl::StrFormat("10.244.0.%d", i)), 1,
                                         PodMac(i), HostMac(i), i)
                        .ok());
      }
      n->lb = std::make_unique<BpfLbMaps>(
          n->dp->lb4_services(), n->dp->lb4_backends(), n->dp->lb4_revnat(),
          n->dp->lb4_source_ranges(), n->dp->ct4_any(), &n->dp->lb4_affinity(), nullptr,
          nullptr, &n->dp->lb4_slot_records());
      n->lb->WriteMaglevTablesTo(&n->dp->lb4_maglev());
      auto r = ServiceReconciler::Create(*n->lb);
      ASSERT_TRUE(r.ok()) << r.status();
      n->reconciler = std::move(*r);
    }
    // Node B's history differs: another Service took its first backend ids, so the same pods
    // have other ids there than on node A.
    LbFrontend other;
    other.service = "default/other";
    other.addr = Ip("10.96.0.50");
    other.port = 80;
    other.proto = IPPROTO_TCP;
    other.backends = {LbBackend{Ip("10.244.0.40"), 80, IPPROTO_TCP},
                      LbBackend{Ip("10.244.0.41"), 80, IPPROTO_TCP}};
    ServiceTranslation t;
    t.frontends.push_back(other);
    ASSERT_TRUE(b_.reconciler->Apply("default/other", t).ok());
  }
  void TearDown() override {
    for (Node* n : {&a_, &b_}) {
      n->reconciler.reset();
      n->lb.reset();
      n->dp.reset();
      n->bpffs.reset();
    }
  }

  void Program(bool maglev, const std::vector<std::string>& pods = {kPods[0], kPods[1], kPods[2]}) {
    for (Node* n : {&a_, &b_}) {
      ASSERT_TRUE(
          n->reconciler->Apply("default/web", NodePortService(n->addr, pods, maglev)).ok());
    }
  }

  // The backend address a client packet to the node's NodePort went to ("" when it was not
  // redirected to a backend).
  std::string Through(Node& n, uint16_t sport, uint8_t flags) {
    auto in = Packet::Eth(ParseMac("02:ee:00:00:00:01"), ParseMac("02:ee:00:00:00:02"))
                  .IPv4(kClient, n.addr)
                  .TCP(sport, kNodePort, flags)
                  .Payload("hi")
                  .Build();
    auto r = Run(n.dp->from_net_fd(), in, 1);
    if (r.verdict != kTcRedirect) return "";
    auto d = Decode(r.out);
    if (!d || d->dport != 8080 || !d->l4_csum_ok) return "";
    char buf[INET_ADDRSTRLEN];
    in_addr a{d->ip_dst};
    inet_ntop(AF_INET, &a, buf, sizeof(buf));
    return buf;
  }

  Node a_, b_;
};

TEST_F(MaglevPrivTest, AFlowMovedToAnotherNodeKeepsItsBackendWithMaglevAndNotWithRandom) {
  for (bool maglev : {true, false}) {
    SCOPED_TRACE(maglev ? "maglev" : "random");
    Program(maglev);
    ASSERT_NE(a_.reconciler->BackendId(Ip(kPods[0]), 8080, IPPROTO_TCP),
              b_.reconciler->BackendId(Ip(kPods[0]), 8080, IPPROTO_TCP))
        << "the nodes number the backends alike; the test would prove less";
    std::map<std::string, int> hits;
    int same = 0;
    const uint16_t base = maglev ? 40000 : 41000;
    for (uint16_t i = 0; i < 300; ++i) {
      // The connection opens through node A; its next packet (an ACK, no SYN) reaches node B,
      // which has no conntrack entry for it.
      std::string at_a = Through(a_, base + i, kTcpSyn);
      std::string at_b = Through(b_, base + i, kTcpAck);
      ASSERT_FALSE(at_a.empty());
      ASSERT_FALSE(at_b.empty());
      ++hits[at_a];
      same += at_a == at_b;
    }
    EXPECT_EQ(hits.size(), 3u) << "every backend takes flows";
    if (maglev) {
      EXPECT_EQ(same, 300);
    } else {
      EXPECT_LT(same, 200) << "random choices agree on about a third of the flows";
    }
  }
}

TEST_F(MaglevPrivTest, BackendChangesUnderNewFlowsDropNoneAndNameOnlyLiveBackends) {
  Program(true);
  std::atomic<bool> stop{false};
  std::atomic<int> sent{0}, lost{0};
  std::thread sender([&] {
    uint16_t port = 1024;
    while (!stop.load()) {
      if (Through(a_, port, kTcpSyn).empty()) lost.fetch_add(1);
      sent.fetch_add(1);
      port = port == 65535 ? 1024 : port + 1;
    }
  });
  const std::vector<std::string> all = {kPods[0], kPods[1], kPods[2]};
  const std::vector<std::string> two = {kPods[0], kPods[2]};
  for (int i = 0; i < 40; ++i) {
    const auto& pods = i % 2 == 0 ? two : all;
    Program(true, pods);
    // The table in the map names exactly the live backends.
    sluice_lb4_key key{};
    key.addr = Ip4(kNodeA);
    key.dport = htons(kNodePort);
    key.proto = IPPROTO_TCP;
    auto table = a_.dp->lb4_maglev().Read(key);
    ASSERT_TRUE(table.ok()) << table.status();
    ASSERT_EQ(table->size(), kDefaultMaglevTableSize);
    std::set<uint32_t> ids(table->begin(), table->end());
    std::set<uint32_t> want;
    for (const auto& p : pods) want.insert(a_.reconciler->BackendId(Ip(p), 8080, IPPROTO_TCP));
    EXPECT_EQ(ids, want);
  }
  stop = true;
  sender.join();
  EXPECT_GT(sent.load(), 40);
  EXPECT_EQ(lost.load(), 0) << "of " << sent.load() << " new flows";
}

}  // namespace
}  // namespace sluice::agent
