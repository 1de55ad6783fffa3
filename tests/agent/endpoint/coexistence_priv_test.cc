// Coexistence over the real kernel: another plugin's objects on the node (veths named lxc1234 and
// lxc_health, an unmarked veth holding the name Sluice wants, bpf tc filters at pref 1 handle 1
// and at another slot, a route, conflists and a binary in the CNI directories, a pinned map
// directory next to Sluice's root on the same bpffs) survive the agent's start-up restore and GC,
// ADD, DEL, CHECK, attaching and detaching Sluice's programs on the same device, CNI install and a
// datapath reload, while Sluice's own objects keep working. Also the upgrade from an agent that
// named veths "lxc..." and attached at tc 1/1. Everything runs in network namespaces named
// "coexist-<pid>-<n>-..." and a scratch bpffs (standing in for /sys/fs/bpf, so the machine's
// shared one is not touched).
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/bpf.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/endpoint/cni_install.h"
#include "agent/endpoint/endpoint_service.h"
#include "agent/kernel/netns.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "loader/tc.h"
#include "nlohmann/json.hpp"
#include "support/fixture.h"

namespace sluice::agent {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

int Sh(const std::string& cmd) {
  int status = std::system((cmd + " >/dev/null 2>&1").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string ShOut(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A classifier of "another plugin": `return TC_ACT_OK`, named like Cilium's.
int LoadForeignProgram(const char* name) {
  const bpf_insn insns[] = {
      {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = BPF_REG_0, .imm = 0},
      {.code = BPF_JMP | BPF_EXIT},
  };
  return bpf_prog_load(BPF_PROG_TYPE_SCHED_CLS, name, "GPL", insns, 2, nullptr);
}

bpf_tc_attach_point Point(loader::TcDirection dir) {
  return dir == loader::TcDirection::kIngress ? BPF_TC_INGRESS : BPF_TC_EGRESS;
}

// Attaches prog_fd at (priority, handle) as another agent would (the calling thread's netns).
absl::Status AttachAt(int ifindex, loader::TcDirection dir, int prog_fd, uint32_t priority,
                      uint32_t handle) {
  LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = ifindex, .attach_point = Point(dir));
  int err = bpf_tc_hook_create(&hook);
  if (err != 0 && err != -EEXIST) return absl::InternalError(absl::StrCat("clsact: ", err));
  LIBBPF_OPTS(bpf_tc_opts, opts, .prog_fd = prog_fd, .handle = handle, .priority = priority);
  err = bpf_tc_attach(&hook, &opts);
  if (err != 0) return absl::InternalError(absl::StrCat("attach: ", err));
  return absl::OkStatus();
}

// The program id at (priority, handle), or 0 when there is no bpf filter there.
uint32_t ProgramAt(int ifindex, loader::TcDirection dir, uint32_t priority, uint32_t handle) {
  LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = ifindex, .attach_point = Point(dir));
  LIBBPF_OPTS(bpf_tc_opts, opts, .handle = handle, .priority = priority);
  if (bpf_tc_query(&hook, &opts) != 0) return 0;
  return opts.prog_id;
}

uint32_t IdOf(int fd) {
  bpf_prog_info info{};
  uint32_t len = sizeof(info);
  if (bpf_obj_get_info_by_fd(fd, &info, &len) != 0) return 0;
  return info.id;
}

// What the endpoint API server does with a request: decode it once, Handle() the typed request,
// encode the typed reply once (read back here to look at).
json Serve(EndpointService& service, const json& request, int netns_fd = -1) {
  absl::StatusOr<cni::EndpointRequest> decoded = cni::ParseEndpointRequest(request.dump());
  cni::EndpointReply reply =
      decoded.ok() ? service.Handle(*decoded, netns_fd) : cni::FailureReply(decoded.status());
  return json::parse(cni::EncodeReply(reply));
}

class CoexistencePrivTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    base_ = absl::StrCat("coexist-", ::getpid(), "-", counter++);
    for (const char* ns : {"-node", "-pod", "-pod2"}) {
      ASSERT_EQ(Sh("ip netns add " + base_ + ns), 0) << ns;
    }
    ASSERT_EQ(Sh("ip -n " + base_ + "-node link set lo up"), 0);
    char pattern[] = "/tmp/coexist-state.XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    state_dir_ = pattern;
    bpffs_ = std::make_unique<testing::ScratchBpffs>();
    sluice_root_ = bpffs_->path() + "/sluice";
    LoadDatapath();
    auto ipam = Ipam::Open(state_dir_, *IpPrefix::Parse("10.244.9.0/24"));
    ASSERT_TRUE(ipam.ok()) << ipam.status();
    ipam_ = std::move(*ipam);
    auto store = EndpointStore::Open(state_dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    StartService();
  }

  void TearDown() override {
    service_.reset();
    endpoint_dp_.reset();
    for (const char* ns : {"-pod2", "-pod", "-node"}) Sh("ip netns del " + base_ + ns);
    dp_.reset();
    for (int fd : foreign_fds_) close(fd);
    std::error_code ignored;
    std::filesystem::remove_all(bpffs_->path() + "/cilium-coexist", ignored);
    bpffs_.reset();
    std::filesystem::remove_all(state_dir_, ignored);
  }

  void LoadDatapath() {
    auto dp = loader::Datapath::Load(sluice_root_);
    ASSERT_TRUE(dp.ok()) << dp.status();
    dp_ = std::move(*dp);
  }

  // A (re)started agent: a fresh service over the same store, IPAM and datapath.
  void StartService() {
    service_.reset();
    endpoint_dp_ = std::make_unique<BpfEndpointDatapath>(*dp_);
    service_ = std::make_unique<EndpointService>(
        netlink_, *ipam_, *store_, *endpoint_dp_,
        EndpointServiceOptions{.default_mtu = 1400, .lock_timeout = absl::Seconds(2)});
  }

  std::string Node() const { return base_ + "-node"; }
  std::string NetnsPath(const std::string& suffix) const {
    return "/var/run/netns/" + base_ + suffix;
  }

  template <typename Fn>
  auto InNode(Fn fn) -> decltype(fn()) {
    std::optional<decltype(fn())> result;
    absl::Status entered = RunInNetns(NetnsPath("-node"), [&]() {
      result.emplace(fn());
      return absl::OkStatus();
    });
    if (!entered.ok()) return entered;
    return *std::move(result);
  }

  static json Config() {
    return {{"cniVersion", "1.1.0"}, {"name", "coexist-net"}, {"type", "sluice"}};
  }

  json Call(const std::string& command, const std::string& netns, const std::string& container_id,
            const std::string& ifname = "eth0") {
    json request = {{"command", command}, {"containerID", container_id}, {"netns", netns},
                    {"ifName", ifname},   {"args", "K8S_POD_NAME=p"},    {"config", Config()}};
    absl::StatusOr<json> reply =
        InNode([&]() -> absl::StatusOr<json> { return Serve(*service_, request); });
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? *reply : json();
  }

  static std::string Msg(const json& reply) {
    return reply.value("msg", "") + " | " + reply.value("details", "");
  }

  // The node's link `name`, or nullopt.
  std::optional<LinkInfo> NodeLink(const std::string& name) {
    absl::StatusOr<LinkInfo> link = InNode([&] { return netlink_.LinkByName(name); });
    if (!link.ok()) return std::nullopt;
    return *link;
  }

  // A veth pair in the node netns, both ends up, as another plugin would leave it; returns the
  // ifindex of `name`.
  int AddForeignVeth(const std::string& name, const std::string& peer) {
    EXPECT_EQ(Sh(absl::StrCat("ip -n ", Node(), " link add ", name, " type veth peer name ", peer)),
              0)
        << name;
    EXPECT_EQ(Sh(absl::StrCat("ip -n ", Node(), " link set ", name, " up")), 0);
    EXPECT_EQ(Sh(absl::StrCat("ip -n ", Node(), " link set ", peer, " up")), 0);
    std::optional<LinkInfo> link = NodeLink(name);
    EXPECT_TRUE(link.has_value()) << name;
    return link ? link->ifindex : 0;
  }

  // ---- another plugin's objects ----------------------------------------------------------------

  struct Foreign {
    std::map<std::string, int> links;  // name -> ifindex, both ends of each veth
    int dev = 0;                       // ifindex of the device both plugins attach to
    uint32_t ingress_prog = 0, egress_prog = 0, other_prog = 0;
    std::map<std::string, std::string> cni_files;  // path -> contents
    std::string pin;
    uint32_t pinned_map_id = 0;
  };

  static constexpr uint32_t kOtherPriority = 2, kOtherHandle = 7;

  void PlantForeignObjects() {
    for (auto [name, peer] :
         {std::pair{"lxc1234", "lxc1234_peer"}, std::pair{"lxc_health", "lxc_health_p"},
          std::pair{"cilium_host", "cilium_net"}}) {
      foreign_.links[name] = AddForeignVeth(name, peer);
      foreign_.links[peer] = NodeLink(peer) ? NodeLink(peer)->ifindex : 0;
    }
    // The very name Sluice derives for ctr2, taken by a link without Sluice's mark.
    taken_ = HostInterfaceName("ctr2", "eth0");
    foreign_.links[taken_] = AddForeignVeth(taken_, "takenpeer");
    foreign_.links["takenpeer"] = NodeLink("takenpeer") ? NodeLink("takenpeer")->ifindex : 0;

    // Another plugin's route.
    ASSERT_EQ(
        Sh(absl::StrCat("ip -n ", Node(), " route add 10.99.0.0/24 dev lxc1234 proto static")), 0);

    // Its tc filters: pref 1 handle 1 on both hooks of the shared device, plus one elsewhere.
    foreign_.dev = AddForeignVeth("coexdev", "coexdev_peer");
    foreign_.links["coexdev"] = foreign_.dev;
    foreign_.links["coexdev_peer"] = NodeLink("coexdev_peer")->ifindex;
    for (const char* name : {"cil_from_netdev", "cil_to_netdev", "other_filter"}) {
      int fd = LoadForeignProgram(name);
      ASSERT_GE(fd, 0) << name << ": " << errno;
      foreign_fds_.push_back(fd);
    }
    ASSERT_TRUE(InNode([&] {
                  return AttachAt(foreign_.dev, loader::TcDirection::kIngress, foreign_fds_[0], 1,
                                  1);
                }).ok());
    ASSERT_TRUE(InNode([&] {
                  return AttachAt(foreign_.dev, loader::TcDirection::kEgress, foreign_fds_[1], 1,
                                  1);
                }).ok());
    ASSERT_TRUE(InNode([&] {
                  return AttachAt(foreign_.dev, loader::TcDirection::kIngress, foreign_fds_[2],
                                  kOtherPriority, kOtherHandle);
                }).ok());
    foreign_.ingress_prog = IdOf(foreign_fds_[0]);
    foreign_.egress_prog = IdOf(foreign_fds_[1]);
    foreign_.other_prog = IdOf(foreign_fds_[2]);

    // Its CNI configuration (one sorting before Sluice's) and binary.
    conf_dir_ = state_dir_ + "/net.d";
    bin_dir_ = state_dir_ + "/bin";
    std::filesystem::create_directories(conf_dir_);
    std::filesystem::create_directories(bin_dir_);
    foreign_.cni_files[conf_dir_ + "/00-loopback.conf"] =
        R"({"cniVersion": "1.0.0", "name": "lo", "type": "loopback"})";
    foreign_.cni_files[conf_dir_ + "/10-cilium.conflist"] =
        R"({"cniVersion": "1.0.0", "name": "cilium", "plugins": [{"type": "cilium-cni"}]})";
    foreign_.cni_files[bin_dir_ + "/cilium-cni"] = "#!/bin/sh\nexit 0\n";
    for (const auto& [path, text] : foreign_.cni_files) std::ofstream(path) << text;

    // Its pinned map, next to Sluice's root on the same bpffs.
    std::filesystem::create_directories(bpffs_->path() + "/cilium-coexist/tc/globals");
    foreign_.pin = bpffs_->path() + "/cilium-coexist/tc/globals/cilium_foreign";
    int map_fd = bpf_map_create(BPF_MAP_TYPE_ARRAY, "cilium_foreign", 4, 8, 4, nullptr);
    ASSERT_GE(map_fd, 0) << errno;
    foreign_fds_.push_back(map_fd);
    ASSERT_EQ(bpf_obj_pin(map_fd, foreign_.pin.c_str()), 0) << errno;
    bpf_map_info info{};
    uint32_t len = sizeof(info);
    ASSERT_EQ(bpf_obj_get_info_by_fd(map_fd, &info, &len), 0);
    foreign_.pinned_map_id = info.id;
  }

  void ExpectForeignObjectsUntouched(const std::string& when) {
    SCOPED_TRACE(when);
    for (const auto& [name, ifindex] : foreign_.links) {
      std::optional<LinkInfo> link = NodeLink(name);
      ASSERT_TRUE(link.has_value()) << name << " was deleted";
      EXPECT_EQ(link->ifindex, ifindex) << name << " was recreated";
      EXPECT_EQ(link->alias, "") << name << " was marked";
    }
    EXPECT_THAT(ShOut(absl::StrCat("ip -n ", Node(), " route show 10.99.0.0/24 proto static")),
                HasSubstr("dev lxc1234"));
    EXPECT_EQ(InNode([&] {
                return absl::StatusOr<uint32_t>(
                    ProgramAt(foreign_.dev, loader::TcDirection::kIngress, 1, 1));
              }).value_or(0),
              foreign_.ingress_prog);
    EXPECT_EQ(InNode([&] {
                return absl::StatusOr<uint32_t>(
                    ProgramAt(foreign_.dev, loader::TcDirection::kEgress, 1, 1));
              }).value_or(0),
              foreign_.egress_prog);
    EXPECT_EQ(InNode([&] {
                return absl::StatusOr<uint32_t>(ProgramAt(
                    foreign_.dev, loader::TcDirection::kIngress, kOtherPriority, kOtherHandle));
              }).value_or(0),
              foreign_.other_prog);
    for (const auto& [path, text] : foreign_.cni_files) EXPECT_EQ(ReadFile(path), text) << path;
    int fd = bpf_obj_get(foreign_.pin.c_str());
    ASSERT_GE(fd, 0) << foreign_.pin << " is gone";
    bpf_map_info info{};
    uint32_t len = sizeof(info);
    EXPECT_EQ(bpf_obj_get_info_by_fd(fd, &info, &len), 0);
    EXPECT_EQ(info.id, foreign_.pinned_map_id);
    close(fd);
  }

  std::string base_, state_dir_, sluice_root_, conf_dir_, bin_dir_, taken_;
  std::unique_ptr<testing::ScratchBpffs> bpffs_;
  std::unique_ptr<loader::Datapath> dp_;
  std::unique_ptr<Ipam> ipam_;
  std::unique_ptr<EndpointStore> store_;
  LibnlNetlink netlink_;
  std::unique_ptr<BpfEndpointDatapath> endpoint_dp_;
  std::unique_ptr<EndpointService> service_;

  // DEL answers once the veth is down; its deletion follows on the reaper's thread, which must
  // touch no foreign object either.
  void AwaitReaper() {
    ASSERT_TRUE(service_->link_reaper().AwaitIdle(absl::Now() + absl::Seconds(10)));
  }
  Foreign foreign_;
  std::vector<int> foreign_fds_;
};

TEST_F(CoexistencePrivTest, AnotherPluginsObjectsSurviveEverythingTheAgentDoes) {
  PlantForeignObjects();
  // A veth Sluice itself leaked (its mark, no record): start-up GC still collects it.
  ASSERT_EQ(AddForeignVeth("slcleaked0001", "slcleakedpeer") > 0, true);
  ASSERT_EQ(Sh(absl::StrCat("ip -n ", Node(), " link set slcleaked0001 alias sluice:gone/eth0")),
            0);

  // Start-up: restore and GC.
  ASSERT_TRUE(InNode([&] { return service_->Restore(); }).ok());
  EXPECT_FALSE(NodeLink("slcleaked0001").has_value()) << "Sluice's own leaked veth was kept";
  ExpectForeignObjectsUntouched("after start-up restore");

  // ADD works, and marks what it made.
  json add = Call("ADD", NetnsPath("-pod"), "ctr1");
  ASSERT_EQ(add["ok"], true) << Msg(add);
  const std::string mine = HostInterfaceName("ctr1", "eth0");
  EXPECT_TRUE(absl::StartsWith(mine, "slc")) << mine;
  std::optional<LinkInfo> link = NodeLink(mine);
  ASSERT_TRUE(link.has_value());
  EXPECT_EQ(link->alias, LinkMark("ctr1", "eth0"));
  EXPECT_THAT(ShOut(absl::StrCat("ip -n ", base_, "-pod -d link show eth0")),
              HasSubstr("alias sluice:ctr1/eth0"));
  json check = Call("CHECK", NetnsPath("-pod"), "ctr1");
  EXPECT_EQ(check["ok"], true) << Msg(check);
  // Sluice's pod program sits at Sluice's slot.
  EXPECT_EQ(
      InNode([&] {
        return absl::StatusOr<uint32_t>(ProgramAt(link->ifindex, loader::TcDirection::kIngress,
                                                  loader::kTcPriority, loader::kTcHandle));
      }).value_or(0),
      IdOf(dp_->from_pod_fd()));
  ExpectForeignObjectsUntouched("after ADD");

  // ADD whose host veth name is taken by a link without Sluice's mark: a clear error naming the
  // link, nothing deleted, nothing left reserved.
  json refused = Call("ADD", NetnsPath("-pod2"), "ctr2");
  EXPECT_EQ(refused["ok"], false);
  EXPECT_EQ(refused.value("code", 0), api::kSluiceInterfaceExists) << Msg(refused);
  EXPECT_THAT(Msg(refused), HasSubstr(taken_));
  EXPECT_THAT(Msg(refused), HasSubstr("not this endpoint's"));
  EXPECT_FALSE(ipam_->Lookup({"coexist-net", "ctr2", "eth0"}).has_value());
  EXPECT_FALSE(store_->Get("ctr2", "eth0").has_value());
  // DEL of that attachment (no record): the taken name is still not Sluice's.
  EXPECT_EQ(Call("DEL", NetnsPath("-pod2"), "ctr2")["ok"], true);
  AwaitReaper();
  ExpectForeignObjectsUntouched("after a refused ADD and its DEL");

  // Sluice's programs on the device another plugin uses: its own slot only, both ways.
  ASSERT_TRUE(InNode([&] { return dp_->AttachNative(foreign_.dev); }).ok());
  EXPECT_EQ(InNode([&] {
              return loader::AttachedTcProgram(foreign_.dev, loader::TcDirection::kIngress);
            }).value_or(0),
            IdOf(dp_->from_net_fd()));
  EXPECT_EQ(InNode([&] {
              return loader::AttachedTcProgram(foreign_.dev, loader::TcDirection::kEgress);
            }).value_or(0),
            IdOf(dp_->to_net_fd()));
  EXPECT_THAT(ShOut(absl::StrCat("ip netns exec ", Node(), " tc filter show dev coexdev ingress")),
              HasSubstr("pref 1308 bpf chain 0 handle 0x51c sluice_from_net"));
  ExpectForeignObjectsUntouched("after attaching Sluice's programs on the same device");
  // Attaching again (an upgrade's replace) still leaves the foreign programs alone.
  ASSERT_TRUE(InNode([&] { return dp_->AttachNative(foreign_.dev); }).ok());
  ExpectForeignObjectsUntouched("after re-attaching");

  // Peer route sync deletes only protocol-181 routes: the same prefix with another protocol stays.
  ASSERT_TRUE(
      InNode([&] { return netlink_.DeletePeerRoute(*IpPrefix::Parse("10.99.0.0/24")); }).ok());
  ExpectForeignObjectsUntouched("after deleting a peer route of the foreign prefix");

  // CNI install writes only Sluice's conflist and binary.
  const std::string plugin = state_dir_ + "/sluice-cni";
  std::ofstream(plugin) << "plugin";
  ASSERT_TRUE(
      InstallCni({.conf_dir = conf_dir_, .bin_dir = bin_dir_, .plugin_source = plugin}).ok());
  std::set<std::string> files;
  for (const auto& d : {conf_dir_, bin_dir_}) {
    for (const auto& e : std::filesystem::directory_iterator(d)) files.insert(e.path().string());
  }
  EXPECT_EQ(files, (std::set<std::string>{conf_dir_ + "/00-loopback.conf",
                                          conf_dir_ + "/05-sluice.conflist",
                                          conf_dir_ + "/10-cilium.conflist",
                                          bin_dir_ + "/cilium-cni", bin_dir_ + "/sluice"}));
  ExpectForeignObjectsUntouched("after CNI install");

  // A restart: the datapath reloaded from its pins, the service restored.
  service_.reset();
  endpoint_dp_.reset();
  dp_.reset();
  LoadDatapath();
  StartService();
  ASSERT_TRUE(InNode([&] { return service_->Restore(); }).ok());
  EXPECT_TRUE(NodeLink(mine).has_value()) << "Sluice's own endpoint was lost on restart";
  check = Call("CHECK", NetnsPath("-pod"), "ctr1");
  EXPECT_EQ(check["ok"], true) << Msg(check);
  ExpectForeignObjectsUntouched("after a restart");

  // DEL removes what Sluice made, nothing else; so does detaching from the shared device.
  EXPECT_EQ(Call("DEL", NetnsPath("-pod"), "ctr1")["ok"], true);
  AwaitReaper();
  EXPECT_FALSE(NodeLink(mine).has_value());
  ASSERT_TRUE(InNode([&] { return dp_->DetachNative(foreign_.dev); }).ok());
  EXPECT_TRUE(absl::IsNotFound(InNode([&] {
                                 return loader::AttachedTcProgram(foreign_.dev,
                                                                  loader::TcDirection::kIngress);
                               }).status()));
  ExpectForeignObjectsUntouched("after DEL and detach");
}

TEST_F(CoexistencePrivTest, AnUpgradedAgentAdoptsItsRecordedLxcVethsAndTheirOldTcSlot) {
  PlantForeignObjects();
  // What an agent from before the "slc" names and tc slot left: a recorded, unmarked "lxc" veth
  // with its program at tc pref 1 handle 1.
  const std::string legacy = LegacyHostInterfaceName("old1", "eth0");
  ASSERT_EQ(Sh(absl::StrCat("ip -n ", Node(), " link add ", legacy,
                            " type veth peer name eth0 netns ", base_, "-pod")),
            0);
  std::optional<LinkInfo> host = NodeLink(legacy);
  ASSERT_TRUE(host.has_value());
  absl::StatusOr<IpAddress> addr = ipam_->Allocate({"coexist-net", "old1", "eth0"});
  ASSERT_TRUE(addr.ok()) << addr.status();
  absl::StatusOr<PodInterface> pod = netlink_.GetPodInterface(NetnsPath("-pod"), "eth0");
  ASSERT_TRUE(pod.ok()) << pod.status();
  ASSERT_TRUE(
      netlink_.ConfigurePodInterface({NetnsPath("-pod"), "eth0", *addr, ipam_->gateway(), 1400})
          .ok());
  ASSERT_TRUE(
      InNode([&] { return netlink_.ConfigureHostVeth(legacy, *addr, pod->link.mac); }).ok());
  Endpoint old;
  old.container_id = "old1";
  old.ifname = "eth0";
  old.netns = NetnsPath("-pod");
  old.network_name = "coexist-net";
  old.host_ifname = legacy;
  old.host_ifindex = host->ifindex;
  old.ipv4 = addr->ToString();
  old.mac = pod->link.mac.ToString();
  old.host_mac = host->mac.ToString();
  old.mtu = 1400;
  ASSERT_TRUE(store_->Put(old).ok());
  ASSERT_TRUE(InNode([&] {
                return AttachAt(host->ifindex, loader::TcDirection::kIngress, dp_->from_pod_fd(),
                                loader::kLegacyTcPriority, loader::kLegacyTcHandle);
              }).ok());
  // And on the native device, Sluice's old attachment at 1/1 on a device of its own.
  const int native = AddForeignVeth("coexnative", "coexnative_p");
  ASSERT_TRUE(InNode([&] {
                return AttachAt(native, loader::TcDirection::kIngress, dp_->from_net_fd(), 1, 1);
              }).ok());
  ASSERT_TRUE(InNode([&] {
                return AttachAt(native, loader::TcDirection::kEgress, dp_->to_net_fd(), 1, 1);
              }).ok());
  // A record whose veth name is now held by some other link (not the recorded ifindex).
  Endpoint stale = old;
  stale.container_id = "gone1";
  stale.host_ifname = "lxc5e0ab1e0ff1";
  stale.host_ifindex = 999999;
  stale.ipv4 = "10.244.9.250";
  ASSERT_TRUE(store_->Put(stale).ok());
  const int squatter = AddForeignVeth(stale.host_ifname, "squatterpeer");

  ASSERT_TRUE(InNode([&] { return service_->Restore(); }).ok());

  // Adopted: marked in place, same link, program moved to Sluice's slot, old slot empty.
  host = NodeLink(legacy);
  ASSERT_TRUE(host.has_value()) << "the recorded lxc veth was deleted on upgrade";
  EXPECT_EQ(host->ifindex, old.host_ifindex);
  EXPECT_EQ(host->alias, LinkMark("old1", "eth0"));
  EXPECT_EQ(InNode([&] {
              return loader::AttachedTcProgram(host->ifindex, loader::TcDirection::kIngress);
            }).value_or(0),
            IdOf(dp_->from_pod_fd()));
  EXPECT_EQ(InNode([&] {
              return absl::StatusOr<uint32_t>(
                  ProgramAt(host->ifindex, loader::TcDirection::kIngress, loader::kLegacyTcPriority,
                            loader::kLegacyTcHandle));
            }).value_or(1),
            0u)
      << "Sluice's program was left at the legacy slot";
  json check = Call("CHECK", NetnsPath("-pod"), "old1");
  EXPECT_EQ(check["ok"], true) << Msg(check);

  // The record whose name another link holds is dropped; that link is not touched.
  EXPECT_FALSE(store_->Get("gone1", "eth0").has_value());
  std::optional<LinkInfo> kept = NodeLink(stale.host_ifname);
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->ifindex, squatter);
  EXPECT_GE(service_->stats().foreign_links_kept, 1u);

  // The native device: attaching moves Sluice's programs off 1/1 (new slot first, then the old
  // one removed); the foreign device's 1/1 programs (not Sluice's) stay.
  ASSERT_TRUE(InNode([&] { return dp_->AttachNative(native); }).ok());
  ASSERT_TRUE(InNode([&] { return dp_->AttachNative(foreign_.dev); }).ok());
  for (auto dir : {loader::TcDirection::kIngress, loader::TcDirection::kEgress}) {
    EXPECT_EQ(
        InNode([&] { return absl::StatusOr<uint32_t>(ProgramAt(native, dir, 1, 1)); }).value_or(1),
        0u);
    EXPECT_NE(InNode([&] { return loader::AttachedTcProgram(native, dir); }).value_or(0), 0u);
  }
  ExpectForeignObjectsUntouched("after the upgrade's restore and attach");

  // The adopted endpoint is cleaned by its record.
  EXPECT_EQ(Call("DEL", NetnsPath("-pod"), "old1")["ok"], true);
  AwaitReaper();
  EXPECT_FALSE(NodeLink(legacy).has_value());
  EXPECT_FALSE(ipam_->Lookup({"coexist-net", "old1", "eth0"}).has_value());
  ExpectForeignObjectsUntouched("after DEL of the adopted endpoint");
}

}  // namespace
}  // namespace sluice::agent
