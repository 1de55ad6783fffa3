// The stage boundaries of sluice_from_pod and sluice_from_net (bpf/lib/stages.h,
// docs/architecture.md "Stages"): what one stage hands the next (read back from the per-CPU
// scratch entry after the next stage's slot was emptied), what a missing stage does (a counted
// missing_stage drop), and which stages a request and its reply pass. A second
// load of each object, against the test's pinned maps, has its own program array, which the tests
// change; its fields are read at the offsets the object's BTF gives.
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "maps/stages.h"
#include "support/fixture.h"

namespace sluice::testing {
namespace {

const Mac kClientMac = ParseMac("02:00:00:00:0a:0a");
const Mac kClientHostMac = ParseMac("02:aa:00:00:0a:0a");
const Mac kBackendMac = ParseMac("02:00:00:00:0a:15");
const Mac kBackendHostMac = ParseMac("02:aa:00:00:0a:15");
constexpr char kClient[] = "10.244.0.10";
constexpr char kBackend[] = "10.244.0.21";
constexpr char kClusterIp[] = "10.96.0.10";
constexpr char kNodeIp[] = "192.168.1.1";
constexpr uint32_t kClientId = 10;

// Byte offset of `path` ("pkt.daddr") in the struct `type` of `btf`, or -1.
int FieldOffset(const struct btf* btf, const char* type, const std::string& path) {
  int id = btf__find_by_name_kind(btf, type, BTF_KIND_STRUCT);
  if (id < 0) return -1;
  int offset = 0;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    std::string name =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const struct btf_type* t = btf__type_by_id(btf, id);
    const struct btf_member* m = btf_members(t);
    int found = -1;
    for (int i = 0; i < btf_vlen(t); ++i, ++m) {
      if (name == btf__name_by_offset(btf, m->name_off)) {
        offset += static_cast<int>(btf_member_bit_offset(t, i) / 8);
        found = static_cast<int>(m->type);
        break;
      }
    }
    if (found < 0) return -1;
    id = btf__resolve_type(btf, found);
    if (dot == std::string::npos) return offset;
    start = dot + 1;
  }
  return -1;
}

// What the last stage that ran handed on: the scratch entry of the CPU that ran it (all CPUs'
// entries were zeroed before the run; the one that is not zero now).
class Handed {
 public:
  Handed(const struct btf* btf, std::vector<uint8_t> entry) : btf_(btf), entry_(std::move(entry)) {}
  uint32_t U32(const std::string& field) const { return Read<uint32_t>(field); }
  uint16_t U16(const std::string& field) const { return Read<uint16_t>(field); }

 private:
  template <typename T>
  T Read(const std::string& field) const {
    int off = FieldOffset(btf_, "stage4_state", field);
    EXPECT_GE(off, 0) << "stage4_state has no " << field;
    T v{};
    if (off >= 0 && off + sizeof(T) <= entry_.size()) memcpy(&v, entry_.data() + off, sizeof(T));
    return v;
  }
  const struct btf* btf_;
  std::vector<uint8_t> entry_;
};

template <typename Skel>
class StagedObject {
 public:
  // Loads the object against the pins under `root`; `configure` as for Skeleton::OpenAndLoad.
  using StagesOf = struct bpf_map* (*)(Skel*);
  void Load(const std::string& root, typename loader::Skeleton<Skel>::Configure configure,
            StagesOf stages) {
    auto skel = loader::Skeleton<Skel>::OpenAndLoad(root, std::move(configure));
    ASSERT_TRUE(skel.ok()) << skel.status();
    skel_ = std::move(*skel);
    stages_fd_ = bpf_map__fd(stages(skel_->get()));
    scratch_fd_ = bpf_map__fd(skel_->get()->maps.sluice_stage4);
    scratch_size_ = bpf_map__value_size(skel_->get()->maps.sluice_stage4);
  }
  Skel* operator->() { return skel_->get(); }
  void EmptySlot(uint32_t slot) { ASSERT_EQ(bpf_map_delete_elem(stages_fd_, &slot), 0) << slot; }
  void ClearScratch() {
    uint32_t zero = 0;
    std::vector<uint8_t> all(Stride() * libbpf_num_possible_cpus(), 0);
    ASSERT_EQ(bpf_map_update_elem(scratch_fd_, &zero, all.data(), BPF_ANY), 0);
  }
  Handed Scratch() {
    uint32_t zero = 0;
    std::vector<uint8_t> all(Stride() * libbpf_num_possible_cpus(), 0);
    EXPECT_EQ(bpf_map_lookup_elem(scratch_fd_, &zero, all.data()), 0);
    std::vector<uint8_t> entry(scratch_size_, 0);
    for (size_t off = 0; off < all.size(); off += Stride()) {
      std::vector<uint8_t> cpu(all.begin() + off, all.begin() + off + scratch_size_);
      if (cpu != entry) return Handed(bpf_object__btf(skel_->get()->obj), cpu);
    }
    ADD_FAILURE() << "no stage handed anything on";
    return Handed(bpf_object__btf(skel_->get()->obj), entry);
  }

 private:
  size_t Stride() const { return (scratch_size_ + 7) / 8 * 8; }
  std::unique_ptr<loader::Skeleton<Skel>> skel_;
  int stages_fd_ = -1;
  int scratch_fd_ = -1;
  size_t scratch_size_ = 0;
};

struct bpf_map* PodStages(sluice_pod_egress* s) {
  return s->maps.sluice_pod_stages;
}

class StagesTest : public DatapathTest {
 protected:
  void SetUp() override {
    DatapathTest::SetUp();
    if (HasFatalFailure()) return;
    // Both pods on lo, where test_run receives, so that both pass the source check.
    ASSERT_TRUE(AddEndpoint(*dp_, Ip4(kClient), 1, kClientMac, kClientHostMac, kClientId).ok());
    ASSERT_TRUE(AddEndpoint(*dp_, Ip4(kBackend), 1, kBackendMac, kBackendHostMac, 21).ok());
    ASSERT_TRUE(ProgramService(*dp_, kClusterIp, 80, IPPROTO_TCP, 1,
                               {{.id = 1, .addr = kBackend, .port = 8080, .proto = IPPROTO_TCP}})
                    .ok());
    sluice_node_config cfg{};
    cfg.node_ip4 = Ip4(kNodeIp);
    cfg.pod_cidr4 = Ip4("10.244.0.0");
    cfg.pod_cidr4_len = 24;
    cfg.gateway_ip4 = Ip4("10.244.0.1");
    cfg.flags = SLUICE_NODE_F_MASQUERADE;
    cfg.nat_port_min = 61000;
    cfg.nat_port_max = 65535;
    cfg.service_cidr4 = Ip4("10.96.0.0");
    cfg.service_cidr4_len = 16;
    ASSERT_TRUE(dp_->node_config().Update(0, cfg).ok());
    pod_.Load(bpffs_->path(), nullptr, PodStages);
  }

  RunResult FromPod(const Packet& p) {
    return Run(bpf_program__fd(pod_->progs.sluice_from_pod), p.Build());
  }
  static Packet ClientToService(uint16_t sport, uint8_t flags = kTcpSyn) {
    return Packet::Eth(kClientMac, kClientHostMac).IPv4(kClient, kClusterIp).TCP(sport, 80, flags);
  }
  static Packet BackendToClient(uint16_t cport, uint8_t flags) {
    return Packet::Eth(kBackendMac, kBackendHostMac)
        .IPv4(kBackend, kClient)
        .TCP(8080, cport, flags);
  }
  uint64_t MissingStageDrops() { return Drops(SLUICE_DROP_MISSING_STAGE, SLUICE_DROP_DIR_EGRESS); }

  StagedObject<sluice_pod_egress> pod_;
};

TEST_F(StagesTest, EntryHandsAServicePacketToTheServiceStageAsParsed) {
  pod_.EmptySlot(SLUICE_POD_STAGE_LB4);
  pod_.ClearScratch();
  const uint64_t before = MissingStageDrops();
  auto r = FromPod(ClientToService(40001));
  EXPECT_EQ(r.verdict, kTcShot);
  EXPECT_EQ(MissingStageDrops(), before + 1);
  Handed h = pod_.Scratch();
  EXPECT_EQ(h.U32("pkt.saddr"), Ip4(kClient));
  EXPECT_EQ(h.U32("pkt.daddr"), Ip4(kClusterIp));
  EXPECT_EQ(ntohs(h.U16("pkt.dport")), 80);
  EXPECT_EQ(h.U32("src_id"), kClientId);
  EXPECT_EQ(h.U32("lb"), 0u);  // LB4_NONE: no Service stage yet
  EXPECT_EQ(h.U32("local_dst"), 0u);
  EXPECT_EQ(h.U32("sent.daddr"), Ip4(kClusterIp));
}

TEST_F(StagesTest, PodToPodTrafficSkipsTheServiceStage) {
  pod_.EmptySlot(SLUICE_POD_STAGE_LB4);
  // A segment that opens nothing from a port vouched free of backends (sluice_lb4_nbport, as the
  // agent writes it after a full sync): neither a reply to reverse-translate nor a crossed flow
  // to clear (lb4_plain_to_endpoint).
  const uint16_t port = 40003;
  ASSERT_TRUE(dp_->lb4_non_backend_ports().Update(port >> 5, 1u << (port & 31)).ok());
  auto r = FromPod(
      Packet::Eth(kClientMac, kClientHostMac).IPv4(kClient, kBackend).TCP(port, 9000, kTcpAck));
  EXPECT_EQ(r.verdict, kTcRedirect);
}

TEST_F(StagesTest, AReplyPassesTheServiceStageForItsFrontend) {
  ASSERT_EQ(FromPod(ClientToService(40004)).verdict, kTcRedirect);
  // With every stage: the Service stage gives the reply its frontend, then judges and forwards.
  auto full = FromPod(BackendToClient(40004, kTcpSyn | kTcpAck));
  ASSERT_EQ(full.verdict, kTcRedirect);
  auto d = Decode(full.out);
  ASSERT_TRUE(d);
  EXPECT_EQ(FormatIp4(d->ip_src), kClusterIp);
  EXPECT_EQ(d->sport, 80);
  // Without the Service stage: the entry hands the reply on as the backend sent it, to a pod
  // here, and the reply goes no further.
  pod_.EmptySlot(SLUICE_POD_STAGE_LB4);
  pod_.ClearScratch();
  const uint64_t before = MissingStageDrops();
  EXPECT_EQ(FromPod(BackendToClient(40004, kTcpAck)).verdict, kTcShot);
  EXPECT_EQ(MissingStageDrops(), before + 1);
  Handed h = pod_.Scratch();
  EXPECT_EQ(h.U32("lb"), 0u);
  EXPECT_EQ(h.U32("pkt.saddr"), Ip4(kBackend));
  EXPECT_EQ(ntohs(h.U16("pkt.sport")), 8080);
  EXPECT_EQ(h.U32("sent.saddr"), Ip4(kBackend));  // policy judges the reply as sent
  EXPECT_EQ(h.U32("local_dst"), 1u);
}

TEST_F(StagesTest, AMissingStageIsADropUnderItsOwnReason) {
  EXPECT_STREQ(sluice_drop_reason_name(SLUICE_DROP_MISSING_STAGE), "missing_stage");
  pod_.EmptySlot(SLUICE_POD_STAGE_LB4);
  auto r = FromPod(ClientToService(40005));
  EXPECT_EQ(r.verdict, kTcShot);
  auto totals = dp_->DropTotals();
  ASSERT_TRUE(totals.ok()) << totals.status();
  bool seen = false;
  for (const auto& t : *totals) {
    if (t.reason != SLUICE_DROP_MISSING_STAGE) continue;
    seen = true;
    EXPECT_STREQ(t.name, "missing_stage");
    EXPECT_EQ(t.dir_packets[SLUICE_DROP_DIR_EGRESS], 1u);
  }
  EXPECT_TRUE(seen) << "missing_stage is not among the drop totals";
}

TEST_F(StagesTest, Ipv6GoesToItsEmptySlotOnlyWhenEnabled) {
  const Packet v6 =
      Packet::Eth(kClientMac, kClientHostMac).Ether(0x86dd).Payload(std::string(40, '\0'));
  const uint64_t unsupported = Drops(SLUICE_DROP_UNSUPPORTED_L3, SLUICE_DROP_DIR_EGRESS);
  EXPECT_EQ(FromPod(v6).verdict, kTcShot);
  EXPECT_EQ(Drops(SLUICE_DROP_UNSUPPORTED_L3, SLUICE_DROP_DIR_EGRESS), unsupported + 1);

  StagedObject<sluice_pod_egress> with_ipv6;
  with_ipv6.Load(
      bpffs_->path(),
      [](sluice_pod_egress* s) {
        s->rodata->enable_ipv6 = 1;
        return absl::OkStatus();
      },
      PodStages);
  const uint64_t missing = MissingStageDrops();
  EXPECT_EQ(Run(bpf_program__fd(with_ipv6->progs.sluice_from_pod), v6.Build()).verdict, kTcShot);
  EXPECT_EQ(MissingStageDrops(), missing + 1);
}

TEST_F(StagesTest, NodePortPacketsMoveToTheServiceStageOfTheNativeDevice) {
  ASSERT_TRUE(ProgramService(*dp_, kNodeIp, 30080, IPPROTO_TCP, 2,
                             {{.id = 2, .addr = kBackend, .port = 8080, .proto = IPPROTO_TCP}},
                             SLUICE_SVC_F_NODEPORT)
                  .ok());
  StagedObject<sluice_netdev> net;
  net.Load(bpffs_->path(), nullptr, [](sluice_netdev* s) { return s->maps.sluice_net_stages; });
  const Packet in =
      Packet::Eth(kClientHostMac, kClientMac).IPv4("198.51.100.7", kNodeIp).TCP(40006, 30080);
  const int from_net = bpf_program__fd(net->progs.sluice_from_net);
  auto full = Run(from_net, in.Build());
  EXPECT_EQ(full.verdict, kTcRedirect);  // to the backend pod
  net.EmptySlot(SLUICE_NET_STAGE_LB4);
  net.ClearScratch();
  const uint64_t before = Drops(SLUICE_DROP_MISSING_STAGE, SLUICE_DROP_DIR_INGRESS);
  EXPECT_EQ(Run(from_net, in.Build()).verdict, kTcShot);
  EXPECT_EQ(Drops(SLUICE_DROP_MISSING_STAGE, SLUICE_DROP_DIR_INGRESS), before + 1);
  EXPECT_EQ(net.Scratch().U32("pkt.daddr"), Ip4(kNodeIp));
}

TEST_F(StagesTest, ThePortsOfTheNodeThatAreNoFrontendsMoveOnToTheMasqueradeStage) {
  StagedObject<sluice_netdev> net;
  net.Load(bpffs_->path(), nullptr, [](sluice_netdev* s) { return s->maps.sluice_net_stages; });
  const int from_net = bpf_program__fd(net->progs.sluice_from_net);
  // TCP to the node on a port no Service has: the Service stage finds no frontend and hands
  // the packet on; with the masquerade stage it is no reply of a masqueraded flow and passes.
  const Packet in = Packet::Eth(kClientHostMac, kClientMac)
                        .IPv4("198.51.100.7", kNodeIp)
                        .TCP(40007, 62000, kTcpAck);
  EXPECT_EQ(Run(from_net, in.Build()).verdict, kTcOk);
  net.EmptySlot(SLUICE_NET_STAGE_NAT4);
  net.ClearScratch();
  const uint64_t before = Drops(SLUICE_DROP_MISSING_STAGE, SLUICE_DROP_DIR_INGRESS);
  EXPECT_EQ(Run(from_net, in.Build()).verdict, kTcShot);
  EXPECT_EQ(Drops(SLUICE_DROP_MISSING_STAGE, SLUICE_DROP_DIR_INGRESS), before + 1);
  Handed h = net.Scratch();
  EXPECT_EQ(h.U32("pkt.daddr"), Ip4(kNodeIp));
  EXPECT_EQ(ntohs(h.U16("pkt.dport")), 62000);
  // Not TCP or UDP: no Service stage, straight to the masquerade stage.
  net.EmptySlot(SLUICE_NET_STAGE_LB4);
  const Packet ping =
      Packet::Eth(kClientHostMac, kClientMac).IPv4("198.51.100.7", kNodeIp).IcmpEcho(7, 1);
  EXPECT_EQ(Run(from_net, ping.Build()).verdict, kTcShot);
  EXPECT_EQ(Drops(SLUICE_DROP_MISSING_STAGE, SLUICE_DROP_DIR_INGRESS), before + 2);
}

}  // namespace
}  // namespace sluice::testing
