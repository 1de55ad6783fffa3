// The reconciler against the real pinned maps of a loaded datapath: what it writes, what a
// restarted reconciler restores, what pruning and conntrack flushing remove.
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <netinet/in.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "agent/base/fake_clock.h"
#include "agent/service/reconciler.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "support/fixture.h"

namespace sluice::agent {
namespace {

using ::sluice::testing::CtKey;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

IpAddress Ip(const std::string& s) { return *IpAddress::Parse(s); }
uint32_t Be32(const std::string& s) { return htonl(Ip(s).v4_host_order()); }

LbFrontend Frontend(const std::string& addr, uint16_t port, std::vector<std::string> backends,
                    uint8_t proto = IPPROTO_TCP) {
  LbFrontend f;
  f.addr = Ip(addr);
  f.port = port;
  f.proto = proto;
  for (const auto& b : backends) f.backends.push_back(LbBackend{Ip(b), 8080, proto});
  std::sort(f.backends.begin(), f.backends.end());
  return f;
}

ServiceTranslation T(std::vector<LbFrontend> frontends) {
  ServiceTranslation t;
  t.frontends = std::move(frontends);
  return t;
}

sluice_lb4_key Key(const std::string& addr, uint16_t port, uint8_t proto, uint16_t slot) {
  sluice_lb4_key k{};
  k.addr = Be32(addr);
  k.dport = htons(port);
  k.proto = proto;
  k.backend_slot = slot;
  return k;
}

class ServiceReconcilerPrivTest : public testing::DatapathTest {
 protected:
  void SetUp() override {
    DatapathTest::SetUp();
    lb_ = MakeMaps();
  }
  // With slot records, as the agent runs it; their clock is the test's (clock_).
  std::unique_ptr<BpfLbMaps> MakeMaps() {
    return std::make_unique<BpfLbMaps>(
        dp_->lb4_services(), dp_->lb4_backends(), dp_->lb4_revnat(), dp_->lb4_source_ranges(),
        dp_->ct4_any(), &dp_->lb4_affinity(), nullptr, nullptr, &dp_->lb4_slot_records(), &clock_);
  }
  std::unique_ptr<ServiceReconciler> NewReconciler() {
    auto r = ServiceReconciler::Create(*lb_);
    EXPECT_TRUE(r.ok()) << r.status();
    return std::move(*r);
  }
  // Backend addresses of the service's slots 1..count, as the datapath would resolve them. A
  // master that names a slot record (sluice_lb4_rec) must find the same ids there as in its
  // slot entries: "<record differs>" where it does not.
  std::vector<std::string> Backends(const std::string& addr, uint16_t port, uint8_t proto) {
    std::vector<std::string> out;
    auto master = dp_->lb4_services().Lookup(Key(addr, port, proto, 0));
    if (!master.ok()) return {"<no master>"};
    std::optional<sluice_lb4_slot_record> rec;
    if (master->backend_id != 0) {
      auto r = dp_->lb4_slot_records().Lookup(master->backend_id);
      if (!r.ok() || master->count > SLUICE_LB4_RECORD_SLOTS) return {"<bad record>"};
      rec = *r;
    }
    for (uint16_t s = 1; s <= master->count; ++s) {
      auto slot = dp_->lb4_services().Lookup(Key(addr, port, proto, s));
      if (!slot.ok()) {
        out.push_back("<no slot>");
        continue;
      }
      if (rec && rec->backend_id[s - 1] != slot->backend_id) {
        out.push_back("<record differs>");
        continue;
      }
      auto be = dp_->lb4_backends().Lookup(slot->backend_id);
      if (!be.ok()) {
        out.push_back("<no backend>");
        continue;
      }
      char buf[INET_ADDRSTRLEN];
      in_addr a{be->addr};
      inet_ntop(AF_INET, &a, buf, sizeof(buf));
      out.push_back(absl::StrCat(buf, ":", ntohs(be->port)));
    }
    return out;
  }
  size_t Entries(auto& map) { return *map.Count(); }
  // Both conntrack maps: TCP (sluice_ct4) and the rest (sluice_ct4_any).
  size_t CtEntries() { return Entries(dp_->ct4()) + Entries(dp_->ct4_any()); }
  void AddFlow(uint16_t sport, uint8_t proto, uint32_t rev_nat_id, uint32_t backend_id) {
    for (uint8_t dir : {SLUICE_CT_DIR_FORWARD, SLUICE_CT_DIR_REPLY}) {
      const sluice_ct4_key k = CtKey("10.244.0.9", "10.96.0.10", sport, 53, proto, dir);
      sluice_ct4_entry e{};
      e.backend_id = backend_id;
      e.rev_nat_id = rev_nat_id;
      ASSERT_TRUE(dp_->ct4_of(proto).Update(k, e).ok());
    }
  }
  bool HasFlow(uint16_t sport, uint8_t proto, uint8_t dir = SLUICE_CT_DIR_FORWARD) {
    return dp_->ct4_of(proto).Lookup(CtKey("10.244.0.9", "10.96.0.10", sport, 53, proto, dir)).ok();
  }

  // The master's slot record (0: none).
  uint32_t RecordOf(const std::string& addr, uint16_t port, uint8_t proto = IPPROTO_TCP) {
    auto master = dp_->lb4_services().Lookup(Key(addr, port, proto, 0));
    return master.ok() ? master->backend_id : UINT32_MAX;
  }

  FakeClock clock_;
  std::unique_ptr<BpfLbMaps> lb_;
};

TEST_F(ServiceReconcilerPrivTest, MapsHoldWhatWasAppliedThroughUpdatesAndDeletion) {
  auto r = NewReconciler();
  ASSERT_TRUE(
      r->Apply("default/web", T({Frontend("10.96.0.10", 80, {"10.244.1.4", "10.244.2.5"})})).ok());
  EXPECT_THAT(Backends("10.96.0.10", 80, IPPROTO_TCP),
              ElementsAre("10.244.1.4:8080", "10.244.2.5:8080"));
  auto master = dp_->lb4_services().Lookup(Key("10.96.0.10", 80, IPPROTO_TCP, 0));
  ASSERT_TRUE(master.ok());
  auto rnat = dp_->lb4_revnat().Lookup(master->rev_nat_id);
  ASSERT_TRUE(rnat.ok());
  EXPECT_EQ(rnat->addr, Be32("10.96.0.10"));
  EXPECT_EQ(rnat->port, htons(80));
  auto wild = dp_->lb4_services().Lookup(Key("10.96.0.10", 0, 0, 0));
  ASSERT_TRUE(wild.ok());
  EXPECT_EQ(wild->count, 0);
  EXPECT_EQ(wild->flags, SLUICE_SVC_F_REJECT);
  EXPECT_EQ(Entries(dp_->lb4_services()), 4u);  // master, 2 slots, wildcard

  ASSERT_TRUE(r->Apply("default/web",
                       T({Frontend("10.96.0.10", 80, {"10.244.1.4", "10.244.2.5", "10.244.2.6"})}))
                  .ok());
  EXPECT_THAT(Backends("10.96.0.10", 80, IPPROTO_TCP),
              ElementsAre("10.244.1.4:8080", "10.244.2.5:8080", "10.244.2.6:8080"));
  ASSERT_TRUE(r->Apply("default/web", T({Frontend("10.96.0.10", 80, {"10.244.2.6"})})).ok());
  EXPECT_THAT(Backends("10.96.0.10", 80, IPPROTO_TCP), ElementsAre("10.244.2.6:8080"));
  EXPECT_EQ(Entries(dp_->lb4_services()), 3u);
  EXPECT_EQ(Entries(dp_->lb4_backends()), 1u);

  ASSERT_TRUE(r->Apply("default/web", std::nullopt).ok());
  EXPECT_EQ(Entries(dp_->lb4_services()), 0u);
  EXPECT_EQ(Entries(dp_->lb4_backends()), 0u);
  EXPECT_EQ(Entries(dp_->lb4_revnat()), 0u);
}

TEST_F(ServiceReconcilerPrivTest, RestartedReconcilerKeepsIdsAndWritesNothing) {
  auto web = T({Frontend("10.96.0.10", 80, {"10.244.1.4", "10.244.2.5"})});
  auto dns = T({Frontend("10.96.0.20", 53, {"10.244.1.4", "10.244.2.5"}, IPPROTO_UDP)});
  uint32_t web_r, be4;
  {
    auto r = NewReconciler();
    ASSERT_TRUE(r->Apply("default/web", web).ok());
    ASSERT_TRUE(r->Apply("kube-system/dns", dns).ok());
    web_r = r->RevNatId(Ip("10.96.0.10"), 80, IPPROTO_TCP, 0);
    be4 = r->BackendId(Ip("10.244.1.4"), 8080, IPPROTO_TCP);
  }
  // A new reconciler (as after a restart) over the same pinned maps.
  lb_ = MakeMaps();
  auto r = NewReconciler();
  EXPECT_EQ(r->RevNatId(Ip("10.96.0.10"), 80, IPPROTO_TCP, 0), web_r);
  EXPECT_EQ(r->BackendId(Ip("10.244.1.4"), 8080, IPPROTO_TCP), be4);
  ASSERT_TRUE(r->Apply("default/web", web).ok());
  ASSERT_TRUE(r->Apply("kube-system/dns", dns).ok());
  ASSERT_TRUE(r->PruneStale().ok());
  EXPECT_EQ(r->stats().map_updates, 0u);
  EXPECT_EQ(r->stats().map_deletes, 0u);
  EXPECT_THAT(Backends("10.96.0.20", 53, IPPROTO_UDP),
              ElementsAre("10.244.1.4:8080", "10.244.2.5:8080"));
}

// Masters name a slot record of their slots (sluice_lb4_rec): a new one when the slots change,
// the old one left as it was; a restart keeps them and writes nothing; a master without one (an
// agent without records wrote it) gets one at the next flush. Backends() checks every record
// against the slot entries.
TEST_F(ServiceReconcilerPrivTest, MastersNameARecordOfTheirSlotsThroughChangesAndRestarts) {
  auto web = T({Frontend("10.96.0.10", 80, {"10.244.1.4", "10.244.2.5", "10.244.3.6"})});
  uint32_t first = 0;
  {
    auto r = NewReconciler();
    ASSERT_TRUE(r->Apply("default/web", web).ok());
    first = RecordOf("10.96.0.10", 80);
    ASSERT_NE(first, 0u);
    EXPECT_THAT(Backends("10.96.0.10", 80, IPPROTO_TCP),
                ElementsAre("10.244.1.4:8080", "10.244.2.5:8080", "10.244.3.6:8080"));
    auto old = dp_->lb4_slot_records().Lookup(first);
    ASSERT_TRUE(old.ok());

    web = T({Frontend("10.96.0.10", 80, {"10.244.1.4", "10.244.2.7", "10.244.3.6"})});
    ASSERT_TRUE(r->Apply("default/web", web).ok());
    EXPECT_NE(RecordOf("10.96.0.10", 80), first);
    EXPECT_NE(RecordOf("10.96.0.10", 80), 0u);
    EXPECT_THAT(Backends("10.96.0.10", 80, IPPROTO_TCP),
                ElementsAre("10.244.1.4:8080", "10.244.2.7:8080", "10.244.3.6:8080"));
    auto kept = dp_->lb4_slot_records().Lookup(first);
    ASSERT_TRUE(kept.ok());
    EXPECT_EQ(std::memcmp(&*kept, &*old, sizeof(*old)), 0) << "a retired record was changed";
    EXPECT_EQ(lb_->slot_record_stats().retired, 1u);
  }
  const uint32_t second = RecordOf("10.96.0.10", 80);

  // A restart: the record stays, nothing is written.
  lb_ = MakeMaps();
  {
    auto r = NewReconciler();
    ASSERT_TRUE(r->Apply("default/web", web).ok());
    ASSERT_TRUE(r->PruneStale().ok());
    EXPECT_EQ(r->stats().map_updates, 0u);
    EXPECT_EQ(RecordOf("10.96.0.10", 80), second);
  }

  // The master as an agent without records wrote it: the next flush gives it a record.
  auto master = dp_->lb4_services().Lookup(Key("10.96.0.10", 80, IPPROTO_TCP, 0));
  ASSERT_TRUE(master.ok());
  master->backend_id = 0;
  ASSERT_TRUE(dp_->lb4_services().Update(Key("10.96.0.10", 80, IPPROTO_TCP, 0), *master).ok());
  lb_ = MakeMaps();
  auto r = NewReconciler();
  ASSERT_TRUE(r->Apply("default/web", web).ok());
  EXPECT_EQ(r->stats().map_updates, 0u) << "the reconciler sees its own entries";
  EXPECT_NE(RecordOf("10.96.0.10", 80), 0u);
  EXPECT_THAT(Backends("10.96.0.10", 80, IPPROTO_TCP),
              ElementsAre("10.244.1.4:8080", "10.244.2.7:8080", "10.244.3.6:8080"));

  // Deleted: its record waits out the quarantine.
  const size_t retired = lb_->slot_record_stats().retired;
  ASSERT_TRUE(r->Apply("default/web", std::nullopt).ok());
  EXPECT_EQ(RecordOf("10.96.0.10", 80), UINT32_MAX) << "the master is gone";
  EXPECT_EQ(lb_->slot_record_stats().retired, retired + 1);
  EXPECT_EQ(lb_->slot_record_stats().named, 0u);
}

TEST_F(ServiceReconcilerPrivTest, PruneStaleRemovesOnlyWhatNoServiceClaimed) {
  {
    auto r = NewReconciler();
    ASSERT_TRUE(r->Apply("default/web", T({Frontend("10.96.0.10", 80, {"10.244.1.4"})})).ok());
    ASSERT_TRUE(
        r->Apply("default/gone", T({Frontend("10.96.0.99", 80, {"10.244.9.9", "10.244.1.4"})}))
            .ok());
  }
  auto r = NewReconciler();
  ASSERT_TRUE(r->Apply("default/web", T({Frontend("10.96.0.10", 80, {"10.244.1.4"})})).ok());
  EXPECT_THAT(Backends("10.96.0.99", 80, IPPROTO_TCP),
              ElementsAre("10.244.1.4:8080", "10.244.9.9:8080"));
  ASSERT_TRUE(r->PruneStale().ok());
  EXPECT_THAT(Backends("10.96.0.99", 80, IPPROTO_TCP), ElementsAre("<no master>"));
  EXPECT_FALSE(dp_->lb4_services().Lookup(Key("10.96.0.99", 0, 0, 0)).ok());
  EXPECT_THAT(Backends("10.96.0.10", 80, IPPROTO_TCP), ElementsAre("10.244.1.4:8080"));
  EXPECT_TRUE(dp_->lb4_services().Lookup(Key("10.96.0.10", 0, 0, 0)).ok());
  EXPECT_EQ(Entries(dp_->lb4_services()), 3u);
  EXPECT_EQ(Entries(dp_->lb4_backends()), 1u);
  EXPECT_EQ(Entries(dp_->lb4_revnat()), 1u);
}

// sluice_lb4_nbport: the pruning pass vouches for every port but the backends' and the backend
// ports of translated flows still in conntrack; a backend on a vouched port is claimed (its bit
// cleared) before it is written.
TEST_F(ServiceReconcilerPrivTest,
       PortsNoBackendIsOnAreVouchedAfterPruningAndClaimedForANewBackend) {
  lb_ = std::make_unique<BpfLbMaps>(dp_->lb4_services(), dp_->lb4_backends(), dp_->lb4_revnat(),
                                    dp_->lb4_source_ranges(), dp_->ct4_any(), &dp_->lb4_affinity(),
                                    &dp_->ct4(), &dp_->lb4_non_backend_ports());
  auto vouched = [&](uint16_t port) {
    auto bits = dp_->lb4_non_backend_ports().Lookup(port >> 5);
    EXPECT_TRUE(bits.ok());
    return bits.ok() && ((*bits >> (port & 31)) & 1);
  };
  auto r = NewReconciler();
  ASSERT_TRUE(r->Apply("default/web", T({Frontend("10.96.0.10", 80, {"10.244.1.4"})})).ok());
  // Nothing is vouched before the pass that knows every Service.
  EXPECT_FALSE(vouched(7070));
  // A translated TCP flow whose backend, on 9090, is gone from every Service (its reply entry's
  // source port), and a flow only policy tracks (no reverse NAT) on 7070.
  AddFlow(9090, IPPROTO_TCP, /*rev_nat_id=*/1, /*backend_id=*/1);
  AddFlow(7070, IPPROTO_UDP, /*rev_nat_id=*/0, /*backend_id=*/0);
  ASSERT_TRUE(r->PruneStale().ok());
  EXPECT_FALSE(vouched(8080));
  EXPECT_FALSE(vouched(9090));
  EXPECT_TRUE(vouched(7070));
  EXPECT_TRUE(vouched(80));
  EXPECT_TRUE(vouched(1));
  EXPECT_TRUE(vouched(65535));

  LbFrontend f;
  f.addr = Ip("10.96.0.11");
  f.port = 53;
  f.proto = IPPROTO_UDP;
  f.backends.push_back(LbBackend{Ip("10.244.1.5"), 7070, IPPROTO_UDP});
  ASSERT_TRUE(r->Apply("default/dns", T({f})).ok());
  EXPECT_FALSE(vouched(7070));
  EXPECT_THAT(Backends("10.96.0.11", 53, IPPROTO_UDP), ElementsAre("10.244.1.5:7070"));
}

// A removed backend's UDP flows are balanced again from their next datagram (forward entry
// deleted), while a reply it still sends as it terminates is translated (reply entry kept).
TEST_F(ServiceReconcilerPrivTest, RemovedBackendLosesItsUdpForwardEntriesButKeepsRepliesAndTcp) {
  auto r = NewReconciler();
  auto both = [](std::vector<std::string> bes) {
    return T({Frontend("10.96.0.10", 53, bes, IPPROTO_UDP), Frontend("10.96.0.10", 53, bes)});
  };
  ASSERT_TRUE(r->Apply("kube-system/dns", both({"10.244.1.4", "10.244.2.5"})).ok());
  uint32_t udp_r = r->RevNatId(Ip("10.96.0.10"), 53, IPPROTO_UDP, 0);
  uint32_t tcp_r = r->RevNatId(Ip("10.96.0.10"), 53, IPPROTO_TCP, 0);
  AddFlow(1001, IPPROTO_UDP, udp_r, r->BackendId(Ip("10.244.2.5"), 8080, IPPROTO_UDP));
  AddFlow(1002, IPPROTO_UDP, udp_r, r->BackendId(Ip("10.244.1.4"), 8080, IPPROTO_UDP));
  AddFlow(1003, IPPROTO_TCP, tcp_r, r->BackendId(Ip("10.244.2.5"), 8080, IPPROTO_TCP));
  ASSERT_EQ(CtEntries(), 6u);

  ASSERT_TRUE(r->Apply("kube-system/dns", both({"10.244.1.4"})).ok());
  EXPECT_FALSE(HasFlow(1001, IPPROTO_UDP));
  EXPECT_TRUE(HasFlow(1001, IPPROTO_UDP, SLUICE_CT_DIR_REPLY));
  EXPECT_TRUE(HasFlow(1002, IPPROTO_UDP));
  EXPECT_TRUE(HasFlow(1002, IPPROTO_UDP, SLUICE_CT_DIR_REPLY));
  EXPECT_TRUE(HasFlow(1003, IPPROTO_TCP));
  EXPECT_EQ(CtEntries(), 5u);
  EXPECT_EQ(r->stats().ct_flushed, 1u);
}

// The same for a flow with one flow entry (both directions): its forward half goes, its reply
// half stays, written as a reply entry that names the frontend.
TEST_F(ServiceReconcilerPrivTest, RemovedBackendsUdpFlowEntryKeepsItsReplyHalf) {
  auto r = NewReconciler();
  auto udp = [](std::vector<std::string> bes) {
    return T({Frontend("10.96.0.10", 53, bes, IPPROTO_UDP)});
  };
  ASSERT_TRUE(r->Apply("kube-system/dns", udp({"10.244.1.4", "10.244.2.5"})).ok());
  const uint32_t udp_r = r->RevNatId(Ip("10.96.0.10"), 53, IPPROTO_UDP, 0);
  auto add_flow_entry = [&](uint16_t sport, const std::string& backend) {
    sluice_ct4_entry e{};
    e.backend_id = r->BackendId(Ip(backend), 8080, IPPROTO_UDP);
    e.rev_nat_id = udp_r;
    e.frontend_addr = Be32("10.96.0.10");
    e.frontend_port = htons(53);
    e.last_seen_ns = 77;
    e.backend_addr = Be32(backend);
    e.backend_port = htons(8080);
    ASSERT_TRUE(
        dp_->ct4_any()
            .Update(CtKey("10.244.0.9", "0.0.0.0", sport, 0, IPPROTO_UDP, SLUICE_CT_DIR_FLOW), e)
            .ok());
  };
  add_flow_entry(1004, "10.244.2.5");
  add_flow_entry(1005, "10.244.1.4");
  int pairs_written = 0;
  lb_->OnPairsWritten([&] {
    ++pairs_written;
    return absl::OkStatus();
  });
  ASSERT_TRUE(r->Apply("kube-system/dns", udp({"10.244.1.4"})).ok());
  EXPECT_EQ(pairs_written, 1) << "the GC is told: the datapath must look reply entries up";
  auto flow_entry = [&](uint16_t sport) {
    return dp_->ct4_any().Lookup(
        CtKey("10.244.0.9", "0.0.0.0", sport, 0, IPPROTO_UDP, SLUICE_CT_DIR_FLOW));
  };
  EXPECT_FALSE(flow_entry(1004).ok()) << "the next datagram is balanced again";
  EXPECT_TRUE(flow_entry(1005).ok()) << "a kept backend's flow stays";
  auto reply = dp_->ct4_any().Lookup(
      CtKey("10.244.2.5", "10.244.0.9", 8080, 1004, IPPROTO_UDP, SLUICE_CT_DIR_REPLY));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(reply->flags & SLUICE_CT_F_FRONTEND);
  EXPECT_EQ(reply->backend_addr, Be32("10.96.0.10"));
  EXPECT_EQ(reply->backend_port, htons(53));
  EXPECT_EQ(reply->rev_nat_id, udp_r);
  EXPECT_EQ(reply->last_seen_ns, 77u) << "as idle as the flow was";
  EXPECT_EQ(CtEntries(), 2u);
  EXPECT_EQ(r->stats().ct_flushed, 1u);
}

TEST_F(ServiceReconcilerPrivTest, RemovedBackendLosesItsSessionAffinity) {
  auto r = NewReconciler();
  auto sticky = [](std::vector<std::string> bes) {
    LbFrontend f = Frontend("10.96.0.10", 80, bes);
    f.flags = SLUICE_SVC_F_AFFINITY;
    f.affinity_timeout = 10800;
    return T({f});
  };
  ASSERT_TRUE(r->Apply("default/sticky", sticky({"10.244.1.4", "10.244.2.5"})).ok());
  uint32_t rn = r->RevNatId(Ip("10.96.0.10"), 80, IPPROTO_TCP, 0);
  auto stick = [&](const std::string& client, const std::string& backend) {
    sluice_lb4_affinity_key k{Be32(client), rn};
    sluice_lb4_affinity v{};
    v.backend_id = r->BackendId(Ip(backend), 8080, IPPROTO_TCP);
    ASSERT_TRUE(dp_->lb4_affinity().Update(k, v).ok());
  };
  stick("10.244.0.8", "10.244.1.4");
  stick("10.244.0.9", "10.244.2.5");
  ASSERT_TRUE(r->Apply("default/sticky", sticky({"10.244.1.4"})).ok());
  EXPECT_TRUE(dp_->lb4_affinity().Lookup({Be32("10.244.0.8"), rn}).ok());
  EXPECT_FALSE(dp_->lb4_affinity().Lookup({Be32("10.244.0.9"), rn}).ok());
  ASSERT_TRUE(r->Apply("default/sticky", std::nullopt).ok());
  EXPECT_EQ(Entries(dp_->lb4_affinity()), 0u);
}

// Not a pass/fail figure: how long programming a large cluster takes through real maps.
TEST_F(ServiceReconcilerPrivTest, ProgramsTenThousandServicesOfTenEndpoints) {
  constexpr int kServices = 10000, kEndpoints = 10;
  std::vector<std::pair<std::string, std::optional<ServiceTranslation>>> all;
  for (int s = 0; s < kServices; ++s) {
    std::string vip = absl::StrCat("10.96.", s / 250, ".", s % 250 + 1);
    std::vector<std::string> bes;
    for (int e = 0; e < kEndpoints; ++e) {
      int n = s * kEndpoints + e;
      bes.push_back(absl::StrCat("10.", 128 + n / 65536, ".", (n / 256) % 256, ".", n % 256));
    }
    all.emplace_back(absl::StrCat("default/svc-", s), T({Frontend(vip, 80, bes)}));
  }
  auto r = NewReconciler();
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(r->ApplyAll(all).ok());
  auto t1 = std::chrono::steady_clock::now();
  EXPECT_EQ(Entries(dp_->lb4_services()), size_t{kServices} * (kEndpoints + 2));
  EXPECT_EQ(Entries(dp_->lb4_backends()), size_t{kServices} * kEndpoints);
  lb_ = MakeMaps();
  auto t2 = std::chrono::steady_clock::now();
  auto again = NewReconciler();
  auto t3 = std::chrono::steady_clock::now();
  ASSERT_TRUE(again->ApplyAll(all).ok());
  ASSERT_TRUE(again->PruneStale().ok());
  auto t4 = std::chrono::steady_clock::now();
  EXPECT_EQ(again->stats().map_updates + again->stats().map_deletes, 0u);
  auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
  std::printf(
      "%d services x %d endpoints: program %.0f ms (%llu map writes), restore %.0f ms, "
      "no-op re-apply + prune %.0f ms\n",
      kServices, kEndpoints, ms(t1 - t0), static_cast<unsigned long long>(r->stats().map_updates),
      ms(t3 - t2), ms(t4 - t3));
}

// BpfLbMaps writes in batches; when a batch fails (here: a reverse NAT map with room for 1), no
// master may name what is missing, and what the reconciler believed written is written again
// on the next apply.
TEST_F(ServiceReconcilerPrivTest, FailedBatchedWriteLeavesNoMasterAndIsWrittenAgain) {
  LIBBPF_OPTS(bpf_map_create_opts, opts, .map_flags = BPF_F_NO_PREALLOC);
  int fd = bpf_map_create(BPF_MAP_TYPE_HASH, "test_lb4_rnat", sizeof(uint32_t),
                          sizeof(sluice_lb4_revnat), 1, &opts);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  maps::Lb4RevNatMap small{maps::MapFd(fd)};
  // Claims no limit, so the reconciler writes more than fits (as if its count were wrong).
  struct UnboundedLbMaps : BpfLbMaps {
    using BpfLbMaps::BpfLbMaps;
    LbCapacity Capacity() const override { return {}; }
  };
  UnboundedLbMaps lb(dp_->lb4_services(), dp_->lb4_backends(), small, dp_->lb4_source_ranges(),
                     dp_->ct4_any(), &dp_->lb4_affinity());
  auto r = ServiceReconciler::Create(lb);
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<std::pair<std::string, std::optional<ServiceTranslation>>> both = {
      {"default/a", T({Frontend("10.96.0.10", 80, {"10.244.1.1", "10.244.1.2", "10.244.1.3"})})},
      {"default/b", T({Frontend("10.96.0.11", 80, {"10.244.2.1", "10.244.2.2", "10.244.2.3"})})},
  };
  EXPECT_FALSE((*r)->ApplyAll(both).ok());
  EXPECT_FALSE(dp_->lb4_services().Lookup(Key("10.96.0.10", 80, IPPROTO_TCP, 0)).ok());
  EXPECT_FALSE(dp_->lb4_services().Lookup(Key("10.96.0.11", 80, IPPROTO_TCP, 0)).ok());

  // b goes (its reverse NAT with it), a is applied unchanged: all of it is written now.
  std::vector<std::pair<std::string, std::optional<ServiceTranslation>>> only_a = {
      {"default/a", both[0].second}, {"default/b", std::nullopt}};
  ASSERT_TRUE((*r)->ApplyAll(only_a).ok());
  auto master = dp_->lb4_services().Lookup(Key("10.96.0.10", 80, IPPROTO_TCP, 0));
  ASSERT_TRUE(master.ok());
  EXPECT_EQ(master->count, 3);
  EXPECT_EQ(*small.Count(), 1u);
  EXPECT_TRUE(small.Lookup(master->rev_nat_id).ok());
  for (uint16_t s = 1; s <= 3; ++s) {
    auto slot = dp_->lb4_services().Lookup(Key("10.96.0.10", 80, IPPROTO_TCP, s));
    ASSERT_TRUE(slot.ok()) << "slot " << s;
    EXPECT_TRUE(dp_->lb4_backends().Lookup(slot->backend_id).ok()) << "slot " << s;
  }
}

// With the real maps sized small (as --bpf_lb_service_max=1024 does): the same Services are
// programmed whatever the order of the changes, each whole, the rest refused without an error;
// deleting programmed Services lets the next ones in the order in.
class ServiceMapsFullPrivTest : public ServiceReconcilerPrivTest {
 protected:
  void SetUp() override {
    ServiceReconcilerPrivTest::SetUp();
    lb_.reset();
    dp_.reset();
    auto dp = loader::Datapath::Load(bpffs_->path(), {{maps::name::sluice_lb4_svc, 1024}});
    ASSERT_TRUE(dp.ok()) << dp.status();
    dp_ = std::move(*dp);
    lb_ = MakeMaps();
  }
  static std::pair<std::string, std::optional<ServiceTranslation>> Svc(int s) {
    std::vector<std::string> bes;
    for (int e = 0; e < 10; ++e) bes.push_back(absl::StrCat("10.244.", s, ".", e + 1));
    return {absl::StrFormat("default/svc-%03d", s),
            T({Frontend(absl::StrCat("10.96.1.", s + 1), 80, bes)})};
  }
  // Every master's slots and backends are there (no frontend half programmed).
  void ExpectWhole(int s) {
    std::vector<std::string> got = Backends(absl::StrCat("10.96.1.", s + 1), 80, IPPROTO_TCP);
    ASSERT_EQ(got.size(), 10u) << "svc-" << s << ": " << got[0];
    for (const std::string& b : got) EXPECT_EQ(b.rfind("10.244.", 0), 0u) << b;
  }
};

TEST_F(ServiceMapsFullPrivTest, SameServicesProgrammedWhateverTheOrderAndNewcomersAfterDeletion) {
  ASSERT_EQ(lb_->Capacity().services, 1024u);
  // Each Service takes 12 entries of sluice_lb4_svc (master, 10 slots, the ClusterIP's
  // wildcard): 85 of 100 fit (1020 entries).
  constexpr int kServices = 100, kFit = 85;
  std::vector<std::string> first_programmed;
  for (int round = 0; round < 3; ++round) {
    std::vector<int> order(kServices);
    for (int i = 0; i < kServices; ++i) order[i] = i;
    if (round == 1) std::reverse(order.begin(), order.end());
    if (round == 2) std::shuffle(order.begin(), order.end(), std::mt19937(42));
    std::vector<std::pair<std::string, std::optional<ServiceTranslation>>> all;
    for (int i : order) all.push_back(Svc(i));
    auto r = NewReconciler();
    ASSERT_TRUE(r->ApplyAll(all).ok());
    ASSERT_TRUE(r->PruneStale().ok());
    std::vector<std::string> programmed = r->Services();
    ASSERT_EQ(programmed.size(), size_t{kFit}) << "round " << round;
    EXPECT_EQ(programmed.front(), "default/svc-000");
    EXPECT_EQ(programmed.back(), absl::StrFormat("default/svc-%03d", kFit - 1));
    if (round == 0) first_programmed = programmed;
    EXPECT_EQ(programmed, first_programmed) << "round " << round;
    EXPECT_EQ(Entries(dp_->lb4_services()), size_t{kFit} * 12);
    EXPECT_EQ(Entries(dp_->lb4_backends()), size_t{kFit} * 10);
    EXPECT_EQ(Entries(dp_->lb4_revnat()), size_t{kFit});
    for (int s = 0; s < kFit; ++s) ExpectWhole(s);
    for (int s = kFit; s < kServices; ++s) {
      EXPECT_FALSE(dp_->lb4_services()
                       .Lookup(Key(absl::StrCat("10.96.1.", s + 1), 80, IPPROTO_TCP, 0))
                       .ok());
    }
    EXPECT_EQ(r->stats().unprogrammed, size_t{kServices - kFit});
    EXPECT_EQ(r->stats().errors, 0u);
    if (round < 2) {
      // Empty the maps for the next round.
      std::vector<std::pair<std::string, std::optional<ServiceTranslation>>> none;
      for (int i = 0; i < kServices; ++i) none.emplace_back(Svc(i).first, std::nullopt);
      ASSERT_TRUE(r->ApplyAll(none).ok());
      ASSERT_EQ(Entries(dp_->lb4_services()), 0u);
      continue;
    }
    // Three programmed Services go (one batch): the next three in the order come in.
    std::vector<std::pair<std::string, std::optional<ServiceTranslation>>> gone;
    for (int s : {3, 40, 7}) gone.emplace_back(Svc(s).first, std::nullopt);
    ASSERT_TRUE(r->ApplyAll(gone).ok());
    std::vector<std::string> now = r->Services();
    EXPECT_EQ(now.size(), size_t{kFit});
    for (int s = kFit; s < kFit + 3; ++s) {
      EXPECT_TRUE(std::count(now.begin(), now.end(), Svc(s).first)) << s;
      ExpectWhole(s);
    }
    EXPECT_FALSE(std::count(now.begin(), now.end(), Svc(kFit + 3).first));
    EXPECT_EQ(Entries(dp_->lb4_services()), size_t{kFit} * 12);
    EXPECT_EQ(r->stats().unprogrammed, size_t{kServices - kFit - 3});
    EXPECT_EQ(r->stats().errors, 0u);
  }
}

}  // namespace
}  // namespace sluice::agent
