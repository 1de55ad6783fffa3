// The loader against the real kernel: bpffs mounting, pinning and reuse of maps across loads
// (an agent restart), and TC attachment that is idempotent and replaces programs in place.
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <linux/if_link.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "gtest/gtest.h"
#include "loader/bpffs.h"
#include "loader/datapath.h"
#include "loader/stage_pins.h"
#include "loader/tc.h"
#include "loader/uninstall.h"
#include "loader/xdp.h"
#include "maps/stages.h"
#include "support/fixture.h"

namespace sluice::testing {
namespace {

// Each test binary moves into a private network namespace so the interfaces it makes vanish
// with it and the host's are never touched.
class PrivateNetns : public ::testing::Environment {
 public:
  void SetUp() override {
    ASSERT_EQ(unshare(CLONE_NEWNET), 0) << strerror(errno);
    ASSERT_EQ(std::system("ip link add sluice-t0 type veth peer name sluice-t1 && ip link set sluice-t0 up && ip link set sluice-t1 up"), 0);
  }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new PrivateNetns);

int Ifindex() { return static_cast<int>(if_nametoindex("sluice-t0")); }

TEST(Bpffs, MountsOnceAndIsIdempotent) {
  ScratchBpffs fs;
  EXPECT_TRUE(loader::IsOnBpffs(fs.path()));
  ASSERT_TRUE(loader::EnsureBpffs(fs.path()).ok());
  // A second call finds the mount instead of stacking another one.
  std::string mounts_before, mounts_after;
  auto count_mounts = [&] {
    FILE* f = fopen("/proc/self/mounts", "r");
    int n = 0;
    char line[1024];
    while (fgets(line, sizeof(line), f))
      if (strstr(line, fs.path().c_str())) ++n;
    fclose(f);
    return n;
  };
  int before = count_mounts();
  ASSERT_TRUE(loader::EnsureBpffs(fs.path()).ok());
  EXPECT_EQ(count_mounts(), before);
  EXPECT_EQ(before, 1);
}

TEST(Datapath, MapsArePinnedUnderTheRootWithSluiceNames) {
  ScratchBpffs fs;
  auto dp = loader::Datapath::Load(fs.path());
  ASSERT_TRUE(dp.ok()) << dp.status();
  for (const char* name : {maps::name::sluice_ep4, maps::name::sluice_node,
                           maps::name::sluice_nomasq4, maps::name::sluice_snat4,
                           maps::name::sluice_rnat4, maps::name::sluice_drops}) {
    EXPECT_TRUE(std::filesystem::exists(maps::PinPath(fs.path(), name))) << name;
  }
  // Every listed map, not only the node's: the service and socket-LB maps too.
  for (const char* name : maps::kAllMapNames) {
    EXPECT_TRUE(std::filesystem::exists(maps::PinPath(fs.path(), name))) << name;
  }
  // The typed API opens a pin and checks its layout.
  auto ep = maps::EndpointMap::Open(maps::PinPath(fs.path(), maps::name::sluice_ep4));
  EXPECT_TRUE(ep.ok()) << ep.status();
  auto wrong = maps::NatMap::Open(maps::PinPath(fs.path(), maps::name::sluice_ep4));
  EXPECT_FALSE(wrong.ok());
}

// The TC programs' xlated length (instructions after the verifier), per program.
std::vector<uint32_t> TcProgramLengths(const loader::Datapath& dp) {
  std::vector<uint32_t> lens;
  for (int fd : {dp.from_pod_fd(), dp.to_pod_fd(), dp.from_net_fd(), dp.to_net_fd(),
                 dp.from_overlay_fd()}) {
    bpf_prog_info info{};
    uint32_t len = sizeof(info);
    EXPECT_EQ(bpf_obj_get_info_by_fd(fd, &info, &len), 0) << std::strerror(errno);
    lens.push_back(info.xlated_prog_len);
  }
  return lens;
}

// This kernel (6.2+ with BTF, as CI's) takes the TC programs' main build, which reads the skb's
// checksum state through bpf_cast_to_kern_ctx; the loader falls back to their build without it,
// a different program, when told to (as on a kernel that lacks the kfunc).
TEST(Datapath, TcProgramsLoadTheKernCtxBuildHereAndTheCompatBuildWhenTold) {
  ASSERT_TRUE(loader::UseKernCtx()) << "the kernel's BTF names no bpf_cast_to_kern_ctx";
  ScratchBpffs main_fs, compat_fs;
  auto main_dp = loader::Datapath::Load(main_fs.path());
  ASSERT_TRUE(main_dp.ok()) << main_dp.status();
  loader::ForceNoKernCtxForTesting(true);
  EXPECT_FALSE(loader::UseKernCtx());
  auto compat_dp = loader::Datapath::Load(compat_fs.path());
  loader::ForceNoKernCtxForTesting(false);
  ASSERT_TRUE(compat_dp.ok()) << compat_dp.status();
  EXPECT_TRUE(loader::UseKernCtx());
  std::vector<uint32_t> main_lens = TcProgramLengths(**main_dp);
  std::vector<uint32_t> compat_lens = TcProgramLengths(**compat_dp);
  ASSERT_EQ(main_lens.size(), compat_lens.size());
  for (size_t i = 0; i < main_lens.size(); ++i) {
    EXPECT_GT(main_lens[i], 0u) << "program " << i;
    EXPECT_NE(main_lens[i], compat_lens[i]) << "program " << i << ": the same code loaded twice";
  }
}

TEST(Datapath, ReloadReusesPinnedMapsWithTheirContents) {
  ScratchBpffs fs;
  sluice_ep4_key key{0x0a0af40a};
  sluice_endpoint ep{};
  ep.ifindex = 7;
  ep.endpoint_id = 99;
  {
    auto first = loader::Datapath::Load(fs.path());
    ASSERT_TRUE(first.ok()) << first.status();
    ASSERT_TRUE((*first)->endpoints().Update(key, ep).ok());
  }
  auto second = loader::Datapath::Load(fs.path());
  ASSERT_TRUE(second.ok()) << second.status();
  auto got = (*second)->endpoints().Lookup(key);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->endpoint_id, 99u);
  EXPECT_EQ(got->ifindex, 7u);
}

// An upgrade that changed a map's layout: the old pin is replaced (its contents lost) instead of
// failing the load; maps whose layout is unchanged keep their contents.
TEST(Datapath, PinWithAnOlderLayoutIsReplacedAndTheOthersKept) {
  ScratchBpffs fs;
  sluice_ep4_key key{0x0a0af40a};
  sluice_endpoint ep{};
  ep.endpoint_id = 42;
  {
    auto first = loader::Datapath::Load(fs.path());
    ASSERT_TRUE(first.ok()) << first.status();
    ASSERT_TRUE((*first)->endpoints().Update(key, ep).ok());
  }
  // sluice_node as an older agent made it: a 20-byte value.
  const std::string node_pin = maps::PinPath(fs.path(), maps::name::sluice_node);
  ASSERT_EQ(unlink(node_pin.c_str()), 0);
  int old = bpf_map_create(BPF_MAP_TYPE_ARRAY, "sluice_node", 4, 20, 1, nullptr);
  ASSERT_GE(old, 0) << strerror(errno);
  ASSERT_EQ(bpf_obj_pin(old, node_pin.c_str()), 0) << strerror(errno);
  close(old);

  auto second = loader::Datapath::Load(fs.path());
  ASSERT_TRUE(second.ok()) << second.status();
  sluice_node_config cfg{};
  cfg.service_cidr4_len = 16;
  EXPECT_TRUE((*second)->node_config().Update(0, cfg).ok()) << "the new layout is in place";
  auto reopened = maps::NodeConfigMap::Open(node_pin);
  EXPECT_TRUE(reopened.ok()) << reopened.status();
  auto got = (*second)->endpoints().Lookup(key);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->endpoint_id, 42u);
}

// An upgrade from the agent whose sluice_lb4_be was a hash map: the new slot array takes over
// every backend whose id fits (ids are array indices now), so Services keep their backends
// through the upgrade; one beyond the array is dropped (the agent writes it again under a new
// id).
TEST(Datapath, BackendsOfTheOldHashLayoutAreCarriedIntoTheSlotArray) {
  ScratchBpffs fs;
  const std::string pin = maps::PinPath(fs.path(), maps::name::sluice_lb4_be);
  {
    LIBBPF_OPTS(bpf_map_create_opts, opts, .map_flags = BPF_F_NO_PREALLOC);
    int old = bpf_map_create(BPF_MAP_TYPE_HASH, "sluice_lb4_be", 4, sizeof(sluice_lb4_backend),
                             1 << 20, &opts);
    ASSERT_GE(old, 0) << strerror(errno);
    for (uint32_t id : {1u, 5u, 63u, 64u}) {
      sluice_lb4_backend be{htonl(0x0af40000 + id), htons(8080), IPPROTO_TCP, 0};
      ASSERT_EQ(bpf_map_update_elem(old, &id, &be, BPF_ANY), 0) << strerror(errno);
    }
    ASSERT_EQ(bpf_obj_pin(old, pin.c_str()), 0) << strerror(errno);
    close(old);
  }
  auto dp = loader::Datapath::Load(fs.path(), {{maps::name::sluice_lb4_be, 64}});
  ASSERT_TRUE(dp.ok()) << dp.status();
  auto& be = (*dp)->lb4_backends();
  EXPECT_EQ(be.size(), 64u);
  EXPECT_EQ(*be.Count(), 3u);
  for (uint32_t id : {1u, 5u, 63u}) {
    auto got = be.Lookup(id);
    ASSERT_TRUE(got.ok()) << "id " << id << ": " << got.status();
    EXPECT_EQ(got->addr, htonl(0x0af40000 + id));
    EXPECT_EQ(got->port, htons(8080));
  }
  EXPECT_FALSE(be.Lookup(64).ok()) << "beyond the array";
  auto reopened = maps::Lb4BackendMap::Open(pin);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_EQ(*reopened->Count(), 3u) << "the pin is the new array";
}

// The same for sluice_policy_ep, a hash map before it became a slot array: every endpoint keeps
// its enforced directions through the upgrade (the new programs would otherwise see pods under
// policy as open until the agent wrote them again).
TEST(Datapath, PolicyEndpointsOfTheOldHashLayoutAreCarriedIntoTheSlotArray) {
  ScratchBpffs fs;
  const std::string pin = maps::PinPath(fs.path(), maps::name::sluice_policy_ep);
  {
    LIBBPF_OPTS(bpf_map_create_opts, opts, .map_flags = BPF_F_NO_PREALLOC);
    int old = bpf_map_create(BPF_MAP_TYPE_HASH, "sluice_policy_ep", 4,
                             sizeof(sluice_policy_ep_entry), SLUICE_POLICY_EP_MAX_ENTRIES, &opts);
    ASSERT_GE(old, 0) << strerror(errno);
    for (uint32_t id : {1u, 2u, 900u}) {
      sluice_policy_ep_entry e{};
      e.identity = 256 + id;
      e.flags = id == 2 ? SLUICE_POLICY_EP_F_EGRESS : SLUICE_POLICY_EP_F_INGRESS;
      ASSERT_EQ(bpf_map_update_elem(old, &id, &e, BPF_ANY), 0) << strerror(errno);
    }
    ASSERT_EQ(bpf_obj_pin(old, pin.c_str()), 0) << strerror(errno);
    close(old);
  }
  auto dp = loader::Datapath::Load(fs.path());
  ASSERT_TRUE(dp.ok()) << dp.status();
  auto& eps = (*dp)->policy_ep();
  EXPECT_EQ(*eps.Count(), 3u);
  for (uint32_t id : {1u, 2u, 900u}) {
    auto got = eps.Lookup(id);
    ASSERT_TRUE(got.ok()) << "endpoint " << id << ": " << got.status();
    EXPECT_EQ(got->identity, 256 + id);
    EXPECT_EQ(got->flags, id == 2 ? SLUICE_POLICY_EP_F_EGRESS : SLUICE_POLICY_EP_F_INGRESS);
  }
  EXPECT_EQ(eps.Lookup(3).status().code(), absl::StatusCode::kNotFound);
}

// The map flags of a pin. -1 when it cannot be read.
int64_t PinnedMapFlags(const std::string& pin, uint32_t* id = nullptr) {
  int fd = bpf_obj_get(pin.c_str());
  if (fd < 0) return -1;
  bpf_map_info info{};
  uint32_t len = sizeof(info);
  int rc = bpf_obj_get_info_by_fd(fd, &info, &len);
  close(fd);
  if (rc != 0) return -1;
  if (id != nullptr) *id = info.id;
  return info.map_flags;
}

// sluice_ct4 takes its entries' memory as flows come (BPF_F_NO_PREALLOC). An older agent's
// preallocated map differs only in that flag: the upgrade keeps it, and every live flow in it,
// and the new programs use it; only a node without the pin gets the new flags.
TEST(Datapath, AnOlderAgentsPreallocatedConntrackIsKeptWithItsFlows) {
  {
    ScratchBpffs fresh;
    auto dp = loader::Datapath::Load(fresh.path());
    ASSERT_TRUE(dp.ok()) << dp.status();
    EXPECT_EQ(PinnedMapFlags(maps::PinPath(fresh.path(), maps::name::sluice_ct4)),
              BPF_F_NO_PREALLOC);
  }
  ScratchBpffs fs;
  const std::string pin = maps::PinPath(fs.path(), maps::name::sluice_ct4);
  const sluice_ct4_key key =
      CtKey("10.244.0.2", "172.30.0.1", 40000, 80, IPPROTO_TCP, SLUICE_CT_DIR_FORWARD);
  sluice_ct4_entry flow{};
  flow.backend_id = 7;
  flow.backend_addr = htonl(0x0af40009);
  flow.backend_port = htons(8080);
  flow.flags = SLUICE_CT_F_ESTABLISHED;
  uint32_t old_id = 0;
  {
    int old = bpf_map_create(BPF_MAP_TYPE_HASH, "sluice_ct4", sizeof(key), sizeof(flow),
                             SLUICE_CT4_MAX_ENTRIES, nullptr);
    ASSERT_GE(old, 0) << strerror(errno);
    ASSERT_EQ(bpf_map_update_elem(old, &key, &flow, BPF_ANY), 0) << strerror(errno);
    ASSERT_EQ(bpf_obj_pin(old, pin.c_str()), 0) << strerror(errno);
    close(old);
  }
  ASSERT_EQ(PinnedMapFlags(pin, &old_id), 0);

  auto dp = loader::Datapath::Load(fs.path());
  ASSERT_TRUE(dp.ok()) << dp.status();
  uint32_t id = 0;
  EXPECT_EQ(PinnedMapFlags(pin, &id), 0) << "the pin was replaced";
  EXPECT_EQ(id, old_id);
  sluice_ct4_entry seen{};
  ASSERT_EQ(bpf_map_lookup_elem((*dp)->ct4().fd(), &key, &seen), 0) << "the live flow was lost";
  EXPECT_EQ(seen.backend_addr, flow.backend_addr);
  // The loaded programs use the kept map: sluice_from_pod's Service stage, the program in the
  // slot of the program array the entry uses (bpf/lib/stages.h).
  auto map_ids_of = [](int prog_fd) {
    bpf_prog_info prog{};
    uint32_t len = sizeof(prog);
    std::vector<uint32_t> ids(64);
    prog.nr_map_ids = ids.size();
    prog.map_ids = reinterpret_cast<uintptr_t>(ids.data());
    EXPECT_EQ(bpf_obj_get_info_by_fd(prog_fd, &prog, &len), 0) << strerror(errno);
    ids.resize(std::min<size_t>(prog.nr_map_ids, ids.size()));
    return ids;
  };
  uint32_t lb_stage_id = 0;
  for (uint32_t map_id : map_ids_of((*dp)->from_pod_fd())) {
    int fd = bpf_map_get_fd_by_id(map_id);
    ASSERT_GE(fd, 0) << strerror(errno);
    bpf_map_info info{};
    uint32_t len = sizeof(info);
    ASSERT_EQ(bpf_obj_get_info_by_fd(fd, &info, &len), 0) << strerror(errno);
    uint32_t slot = SLUICE_POD_STAGE_LB4;
    if (info.type == BPF_MAP_TYPE_PROG_ARRAY) {
      EXPECT_EQ(bpf_map_lookup_elem(fd, &slot, &lb_stage_id), 0) << strerror(errno);
    }
    close(fd);
  }
  ASSERT_NE(lb_stage_id, 0u) << "sluice_from_pod has no Service stage";
  int lb_stage = bpf_prog_get_fd_by_id(lb_stage_id);
  ASSERT_GE(lb_stage, 0) << strerror(errno);
  auto map_ids = map_ids_of(lb_stage);
  close(lb_stage);
  EXPECT_NE(std::find(map_ids.begin(), map_ids.end(), old_id), map_ids.end())
      << "sluice_from_pod's Service stage does not use the kept sluice_ct4";
}

// sluice_lb4_be through its memory mapping, as the agent writes it, and through the syscalls, as
// bpftool and the datapath see it: the same slots, a free one reading as zeroes.
TEST(SlotArray, WritesThroughTheMappingAreTheMapsAndAFreeSlotIsAbsent) {
  ScratchBpffs fs;
  auto dp = loader::Datapath::Load(fs.path(), {{maps::name::sluice_lb4_be, 16}});
  ASSERT_TRUE(dp.ok()) << dp.status();
  auto& be = (*dp)->lb4_backends();
  const sluice_lb4_backend v{htonl(0x0af40007), htons(53), IPPROTO_UDP, SLUICE_BE_F_LOCAL};
  ASSERT_TRUE(be.Update(7, v).ok());
  uint32_t id = 7;
  sluice_lb4_backend seen{};
  ASSERT_EQ(bpf_map_lookup_elem(be.fd(), &id, &seen), 0) << strerror(errno);
  EXPECT_EQ(std::memcmp(&seen, &v, sizeof(v)), 0);
  // Written with a syscall, read through the mapping.
  id = 3;
  ASSERT_EQ(bpf_map_update_elem(be.fd(), &id, &v, BPF_ANY), 0) << strerror(errno);
  EXPECT_TRUE(be.Lookup(3).ok());
  std::vector<uint32_t> used;
  ASSERT_TRUE(be.ForEach([&](uint32_t k, const sluice_lb4_backend&) { used.push_back(k); }).ok());
  EXPECT_EQ(used, (std::vector<uint32_t>{3, 7}));
  EXPECT_EQ(*maps::CountUsedSlots(be.fd()), 2u);

  ASSERT_TRUE(be.Delete(7).ok());
  EXPECT_EQ(be.Lookup(7).status().code(), absl::StatusCode::kNotFound);
  id = 7;
  ASSERT_EQ(bpf_map_lookup_elem(be.fd(), &id, &seen), 0);
  EXPECT_EQ(seen.addr, 0u) << "a free slot reads as zeroes";
  EXPECT_TRUE(be.Delete(7).ok()) << "freeing a free slot is no error";
  EXPECT_TRUE(be.Delete(99).ok()) << "nor one beyond the array";
  EXPECT_FALSE(be.Update(16, v).ok()) << "beyond the array: refused like a full map";
  EXPECT_EQ(*be.Count(), 1u);
  // Only an mmapable array of 8-byte values is a slot array.
  EXPECT_FALSE(maps::Lb4BackendMap::FromFd((*dp)->node_config().fd()).ok());
}

// Map sizes from configuration: the maps are created with them, a pin of another size (the
// configuration changed) is replaced by an empty map of the new size, and an unsizable map or a
// zero size is refused before anything is loaded.
TEST(Datapath, MapSizesComeFromConfigurationAndAChangedSizeReplacesThePin) {
  ScratchBpffs fs;
  auto max_entries = [](int fd) {
    bpf_map_info info{};
    uint32_t len = sizeof(info);
    EXPECT_EQ(bpf_obj_get_info_by_fd(fd, &info, &len), 0);
    return info.max_entries;
  };
  sluice_ct4_key key{};
  key.proto = IPPROTO_TCP;
  {
    auto dp = loader::Datapath::Load(fs.path(), {{maps::name::sluice_ct4, 1024},
                                                 {maps::name::sluice_lb4_be, 64}});
    ASSERT_TRUE(dp.ok()) << dp.status();
    EXPECT_EQ(max_entries((*dp)->ct4().fd()), 1024u);
    EXPECT_EQ(max_entries((*dp)->lb4_backends().fd()), 64u);
    EXPECT_EQ(max_entries((*dp)->ct4_any().fd()), SLUICE_CT4_ANY_MAX_ENTRIES);
    ASSERT_TRUE((*dp)->ct4().Update(key, sluice_ct4_entry{}).ok());
  }
  {
    auto same = loader::Datapath::Load(fs.path(), {{maps::name::sluice_ct4, 1024},
                                                   {maps::name::sluice_lb4_be, 64}});
    ASSERT_TRUE(same.ok()) << same.status();
    EXPECT_TRUE((*same)->ct4().Lookup(key).ok()) << "same size: the pin and its entries stay";
  }
  auto resized = loader::Datapath::Load(fs.path(), {{maps::name::sluice_ct4, 2048}});
  ASSERT_TRUE(resized.ok()) << resized.status();
  EXPECT_EQ(max_entries((*resized)->ct4().fd()), 2048u);
  EXPECT_EQ(max_entries((*resized)->lb4_backends().fd()), SLUICE_LB4_BACKENDS_MAX_ENTRIES);
  EXPECT_FALSE((*resized)->ct4().Lookup(key).ok()) << "a new size starts empty";
  auto pinned = maps::Ct4Map::Open(maps::PinPath(fs.path(), maps::name::sluice_ct4));
  ASSERT_TRUE(pinned.ok());
  EXPECT_EQ(max_entries(pinned->fd()), 2048u) << "every object shares the resized pin";

  // Every map an agent flag sizes (--bpf_*_max) is sizable.
  ScratchBpffs other;
  auto flagged = loader::Datapath::Load(other.path(), {{maps::name::sluice_ct4, 1024},
                                                       {maps::name::sluice_ct4_any, 1024},
                                                       {maps::name::sluice_snat4, 512},
                                                       {maps::name::sluice_rnat4, 512},
                                                       {maps::name::sluice_lb4_svc, 4096},
                                                       {maps::name::sluice_lb4_be, 4096},
                                                       {maps::name::sluice_lb4_rnat, 1024},
                                                       {maps::name::sluice_frag4, 256},
                                                       {maps::name::sluice_ep4, 128}});
  ASSERT_TRUE(flagged.ok()) << flagged.status();
  EXPECT_EQ(max_entries((*flagged)->frag4().fd()), 256u);
  EXPECT_EQ(max_entries((*flagged)->endpoints().fd()), 128u);

  EXPECT_FALSE(loader::Datapath::Load(fs.path(), {{maps::name::sluice_node, 2}}).ok());
  EXPECT_FALSE(loader::Datapath::Load(fs.path(), {{maps::name::sluice_ct4, 0}}).ok());
}

TEST(Tc, AttachingTwiceLeavesOneFilterRunningTheProgram) {
  ScratchBpffs fs;
  auto dp = loader::Datapath::Load(fs.path());
  ASSERT_TRUE(dp.ok()) << dp.status();
  ASSERT_TRUE((*dp)->AttachPod(Ifindex()).ok());
  ASSERT_TRUE((*dp)->AttachPod(Ifindex()).ok());
  auto id = loader::AttachedTcProgram(Ifindex(), loader::TcDirection::kIngress);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, *loader::ProgramId((*dp)->from_pod_fd()));
  // Exactly one filter on the hook.
  FILE* p = popen("tc filter show dev sluice-t0 ingress | grep -c 'handle'", "r");
  char buf[16] = {};
  fgets(buf, sizeof(buf), p);
  pclose(p);
  EXPECT_EQ(atoi(buf), 1);
  ASSERT_TRUE(loader::DetachTc(Ifindex(), loader::TcDirection::kIngress).ok());
}

TEST(Tc, ReattachFromANewLoadReplacesTheProgramInPlace) {
  ScratchBpffs fs;
  auto old_dp = loader::Datapath::Load(fs.path());
  ASSERT_TRUE(old_dp.ok());
  ASSERT_TRUE((*old_dp)->AttachNative(Ifindex()).ok());
  auto old_id = *loader::ProgramId((*old_dp)->to_net_fd());

  auto new_dp = loader::Datapath::Load(fs.path());  // an upgraded agent
  ASSERT_TRUE(new_dp.ok());
  ASSERT_TRUE((*new_dp)->AttachNative(Ifindex()).ok());
  auto new_id = *loader::ProgramId((*new_dp)->to_net_fd());
  ASSERT_NE(old_id, new_id);
  EXPECT_EQ(*loader::AttachedTcProgram(Ifindex(), loader::TcDirection::kEgress), new_id);
  EXPECT_EQ(*loader::AttachedTcProgram(Ifindex(), loader::TcDirection::kIngress),
            *loader::ProgramId((*new_dp)->from_net_fd()));
  // The old programs no longer hold the hook: dropping them keeps the new ones attached.
  old_dp->reset();
  EXPECT_EQ(*loader::AttachedTcProgram(Ifindex(), loader::TcDirection::kEgress), new_id);
  ASSERT_TRUE((*new_dp)->DetachNative(Ifindex()).ok());
}

// The pins of <root>/stages/ (loader/datapath.h kStagesDir).
std::vector<std::string> StagePins(const std::string& root) {
  std::vector<std::string> pins;
  for (const auto& e : std::filesystem::directory_iterator(root + "/" + loader::kStagesDir))
    pins.push_back(e.path().filename());
  std::sort(pins.begin(), pins.end());
  return pins;
}

// The program in `slot` of the program array pinned at `pin` (0: empty).
uint32_t StageAt(const std::string& pin, uint32_t slot) {
  int fd = bpf_obj_get(pin.c_str());
  EXPECT_GE(fd, 0) << pin << ": " << strerror(errno);
  uint32_t id = 0;
  if (bpf_map_lookup_elem(fd, &slot, &id) != 0) id = 0;
  close(fd);
  return id;
}

TEST(Stages, AnAttachedProgramsStagesOutliveItsAgentAndGoOnceAnUpgradeReplacesIt) {
  ScratchBpffs fs;
  const std::string dir = fs.path() + "/" + loader::kStagesDir + "/";
  auto old_dp = loader::Datapath::Load(fs.path());
  ASSERT_TRUE(old_dp.ok()) << old_dp.status();
  ASSERT_TRUE((*old_dp)->AttachPod(Ifindex()).ok());
  const auto old_pins = StagePins(fs.path());  // sluice_pod_egress, sluice_netdev, sluice_overlay
  ASSERT_EQ(old_pins.size(), 3u);
  std::string old_pod;
  for (const auto& p : old_pins)
    if (p.rfind("sluice_pod_stages_", 0) == 0) old_pod = dir + p;
  ASSERT_FALSE(old_pod.empty());
  // The agent exits: the attached sluice_from_pod still calls its stage (an array nobody holds
  // open would be emptied by the kernel, and every packet a missing_stage drop).
  old_dp->reset();
  EXPECT_NE(StageAt(old_pod, SLUICE_POD_STAGE_LB4), 0u);

  // An upgraded agent loads its own arrays; the old pod array stays while the old entry program
  // runs on the device, the others (attached nowhere) go at once.
  auto new_dp = loader::Datapath::Load(fs.path());
  ASSERT_TRUE(new_dp.ok()) << new_dp.status();
  auto pins = StagePins(fs.path());
  EXPECT_EQ(pins.size(), 4u);
  EXPECT_NE(std::find(pins.begin(), pins.end(), old_pod.substr(dir.size())), pins.end());
  ASSERT_TRUE((*new_dp)->AttachPod(Ifindex()).ok());
  // The replaced filter lets its program go after an RCU grace period, so the attach's own
  // release may come too early; the agent waits for it once its start has attached every
  // device, as this does.
  auto left = loader::AwaitReplacedStagesReleased(**new_dp, absl::Seconds(10));
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_EQ(*left, 0);
  pins = StagePins(fs.path());
  EXPECT_EQ(pins.size(), 3u);
  EXPECT_EQ(std::find(pins.begin(), pins.end(), old_pod.substr(dir.size())), pins.end())
      << "the replaced build's pod stages are still pinned";
  for (const auto& p : pins) EXPECT_NE(StageAt(dir + p, SLUICE_POD_STAGE_LB4), 0u) << p;
  EXPECT_EQ(*loader::AttachedTcProgram(Ifindex(), loader::TcDirection::kIngress),
            *loader::ProgramId((*new_dp)->from_pod_fd()));
  ASSERT_TRUE(loader::DetachTc(Ifindex(), loader::TcDirection::kIngress).ok());
  ASSERT_TRUE(loader::DetachTc(Ifindex(), loader::TcDirection::kEgress).ok());
}

TEST(Tc, DetachIsIdempotentAndQueryReportsAbsence) {
  ASSERT_TRUE(loader::DetachTc(Ifindex(), loader::TcDirection::kEgress).ok());
  ASSERT_TRUE(loader::DetachTc(Ifindex(), loader::TcDirection::kEgress).ok());
  auto id = loader::AttachedTcProgram(Ifindex(), loader::TcDirection::kEgress);
  EXPECT_FALSE(id.ok());
  EXPECT_TRUE(loader::DetachTc(999999, loader::TcDirection::kIngress).ok())
      << "a vanished interface has nothing left to detach";
}

// ---- XDP (--lb_acceleration) -------------------------------------------------------------------

// A program of no one's in particular, attached without a link as another tool would.
int ForeignXdpProgram() {
  const struct bpf_insn pass[] = {
      {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = BPF_REG_0, .imm = XDP_PASS},
      {.code = BPF_JMP | BPF_EXIT},
  };
  return bpf_prog_load(BPF_PROG_TYPE_XDP, "other_xdp", "GPL", pass, 2, nullptr);
}

TEST(Xdp, AttachesNativeOnAVethThroughAPinnedLinkAndARestartSwapsTheProgramInPlace) {
  ScratchBpffs fs;
  auto old_dp = loader::Datapath::Load(fs.path());
  ASSERT_TRUE(old_dp.ok()) << old_dp.status();
  auto mode = (*old_dp)->AttachXdp(Ifindex());
  ASSERT_TRUE(mode.ok()) << mode.status();
  EXPECT_EQ(*mode, loader::XdpMode::kNative) << "veth has native XDP";
  EXPECT_EQ(*loader::AttachedXdpProgram(Ifindex()), *loader::ProgramId((*old_dp)->xdp_net_fd()));
  const std::string pin = (*old_dp)->LinkPinPath(loader::kXdpLinkName);
  ASSERT_TRUE(std::filesystem::exists(pin));
  int link = bpf_obj_get(pin.c_str());
  ASSERT_GE(link, 0);
  struct bpf_link_info before = {};
  __u32 len = sizeof(before);
  ASSERT_EQ(bpf_obj_get_info_by_fd(link, &before, &len), 0);
  close(link);

  auto new_dp = loader::Datapath::Load(fs.path());  // a restarted agent
  ASSERT_TRUE(new_dp.ok());
  mode = (*new_dp)->AttachXdp(Ifindex());
  ASSERT_TRUE(mode.ok()) << mode.status();
  EXPECT_EQ(*mode, loader::XdpMode::kNative);
  old_dp->reset();
  EXPECT_EQ(*loader::AttachedXdpProgram(Ifindex()), *loader::ProgramId((*new_dp)->xdp_net_fd()));
  link = bpf_obj_get(pin.c_str());
  ASSERT_GE(link, 0);
  struct bpf_link_info after = {};
  len = sizeof(after);
  ASSERT_EQ(bpf_obj_get_info_by_fd(link, &after, &len), 0);
  close(link);
  EXPECT_EQ(after.id, before.id) << "the same link, its program replaced";

  // Disabled: the pin goes and the program with it; twice is fine.
  ASSERT_TRUE((*new_dp)->DetachXdp().ok());
  ASSERT_TRUE((*new_dp)->DetachXdp().ok());
  EXPECT_EQ(*loader::AttachedXdpProgram(Ifindex()), 0u);
  EXPECT_EQ(*loader::AttachedXdpMode(Ifindex()), loader::XdpMode::kNone);
}

TEST(Xdp, ALoadWithoutTheXdpProgramStillDetachesAnEarlierRunsAndSharesTheMaps) {
  ScratchBpffs fs;
  auto old_dp = loader::Datapath::Load(fs.path());
  ASSERT_TRUE(old_dp.ok()) << old_dp.status();
  ASSERT_TRUE((*old_dp)->AttachXdp(Ifindex()).ok());
  sluice_ep4_key key{0x0a0af40a};
  sluice_endpoint ep{};
  ep.endpoint_id = 99;
  ASSERT_TRUE((*old_dp)->endpoints().Update(key, ep).ok());

  // A restarted agent with --lb_acceleration=disabled: sluice_xdp is not loaded.
  auto new_dp = loader::Datapath::Load(fs.path(), {}, loader::Datapath::XdpProgram::kSkip);
  ASSERT_TRUE(new_dp.ok()) << new_dp.status();
  EXPECT_EQ((*new_dp)->xdp_net_fd(), -1);
  EXPECT_EQ((*new_dp)->AttachXdp(Ifindex()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_GE((*new_dp)->from_pod_fd(), 0);
  EXPECT_GE((*new_dp)->from_net_fd(), 0);
  EXPECT_GE((*new_dp)->from_overlay_fd(), 0);
  auto got = (*new_dp)->endpoints().Lookup(key);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->endpoint_id, 99u) << "the pinned maps are the earlier run's";
  ASSERT_TRUE((*new_dp)->DetachXdp().ok());
  old_dp->reset();
  EXPECT_EQ(*loader::AttachedXdpProgram(Ifindex()), 0u);
}

TEST(Xdp, UninstallTakesSluicesXdpProgramOffTheDevice) {
  ScratchBpffs fs;
  {
    auto dp = loader::Datapath::Load(fs.path());
    ASSERT_TRUE(dp.ok());
    auto mode = (*dp)->AttachXdp(Ifindex());
    ASSERT_TRUE(mode.ok()) << mode.status();
    ASSERT_NE(*loader::AttachedXdpProgram(Ifindex()), 0u);
  }  // the agent has stopped; the pinned link keeps the program attached
  ASSERT_NE(*loader::AttachedXdpProgram(Ifindex()), 0u);
  ASSERT_TRUE(loader::RemoveDatapath(fs.path()).ok());
  EXPECT_EQ(*loader::AttachedXdpProgram(Ifindex()), 0u);
}

TEST(Xdp, AnotherProgramsXdpIsNeverReplacedOrDetached) {
  ScratchBpffs fs;
  auto dp = loader::Datapath::Load(fs.path());
  ASSERT_TRUE(dp.ok());
  int other = ForeignXdpProgram();
  ASSERT_GE(other, 0) << strerror(errno);
  ASSERT_EQ(bpf_xdp_attach(Ifindex(), other, XDP_FLAGS_DRV_MODE, nullptr), 0);
  const uint32_t other_id = *loader::ProgramId(other);

  auto mode = (*dp)->AttachXdp(Ifindex());
  ASSERT_TRUE(mode.ok()) << mode.status();
  EXPECT_EQ(*mode, loader::XdpMode::kNone);
  EXPECT_EQ(*loader::AttachedXdpProgram(Ifindex()), other_id);
  EXPECT_FALSE(std::filesystem::exists((*dp)->LinkPinPath(loader::kXdpLinkName)));
  ASSERT_TRUE((*dp)->DetachXdp().ok());
  EXPECT_EQ(*loader::AttachedXdpProgram(Ifindex()), other_id) << "disabled leaves it too";

  ASSERT_EQ(bpf_xdp_detach(Ifindex(), XDP_FLAGS_DRV_MODE, nullptr), 0);
  close(other);
}

TEST(Xdp, GenericModeWhereTheDriverHasNoNativeXdp) {
  // A bridge device has no native XDP.
  ASSERT_EQ(std::system("ip link add sluice-d0 type bridge && ip link set sluice-d0 up"), 0);
  const int bridge = static_cast<int>(if_nametoindex("sluice-d0"));
  ScratchBpffs fs;
  auto dp = loader::Datapath::Load(fs.path());
  ASSERT_TRUE(dp.ok());
  auto mode = (*dp)->AttachXdp(bridge);
  ASSERT_TRUE(mode.ok()) << mode.status();
  EXPECT_EQ(*mode, loader::XdpMode::kGeneric);
  EXPECT_EQ(*loader::AttachedXdpMode(bridge), loader::XdpMode::kGeneric);
  ASSERT_TRUE((*dp)->DetachXdp().ok());
  EXPECT_EQ(*loader::AttachedXdpMode(bridge), loader::XdpMode::kNone);
  ASSERT_EQ(std::system("ip link del sluice-d0"), 0);
}

}  // namespace
}  // namespace sluice::testing
