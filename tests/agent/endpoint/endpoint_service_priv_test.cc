// Privileged tests of EndpointService over the real kernel: LibnlNetlink, the BPF datapath loaded
// on a scratch bpffs, a real Ipam and EndpointStore in a scratch directory. The "agent" runs in a
// throwaway node netns (every call goes through RunInNetns) and pods are netns of their own, all
// named "cnihard-<pid>-<n>-...".
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/endpoint/endpoint_service.h"
#include "agent/kernel/netns.h"
#include "agent/policy/reconciler.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "loader/tc.h"
#include "nlohmann/json.hpp"
#include "support/fixture.h"
#include "support/temp_dir.h"

namespace sluice::agent {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

int Sh(const std::string& cmd) {
  int status = std::system((cmd + " >/dev/null 2>&1").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// What the endpoint API server does with a request: decode it once, Handle() the typed request,
// encode the typed reply once (read back here to look at).
json Serve(EndpointService& service, const json& request, int netns_fd = -1) {
  absl::StatusOr<cni::EndpointRequest> decoded = cni::ParseEndpointRequest(request.dump());
  cni::EndpointReply reply =
      decoded.ok() ? service.Handle(*decoded, netns_fd) : cni::FailureReply(decoded.status());
  return json::parse(cni::EncodeReply(reply));
}

class EndpointServicePrivTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    base_ = absl::StrCat("cnihard-", ::getpid(), "-", counter++);
    ASSERT_EQ(Sh("ip netns add " + base_ + "-node"), 0);
    ASSERT_EQ(Sh("ip netns add " + base_ + "-pod"), 0);
    ASSERT_EQ(Sh("ip -n " + base_ + "-node link set lo up"), 0);
    state_dir_ = state_.path();
    bpffs_ = std::make_unique<testing::ScratchBpffs>();
    auto dp = loader::Datapath::Load(bpffs_->path());
    ASSERT_TRUE(dp.ok()) << dp.status();
    dp_ = std::move(*dp);
    auto ipam = Ipam::Open(state_dir_, *IpPrefix::Parse("10.244.7.0/24"));
    ASSERT_TRUE(ipam.ok()) << ipam.status();
    ipam_ = std::move(*ipam);
    auto store = EndpointStore::Open(state_dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    endpoint_dp_ = std::make_unique<BpfEndpointDatapath>(*dp_);
    service_ = std::make_unique<EndpointService>(
        netlink_, *ipam_, *store_, *endpoint_dp_,
        EndpointServiceOptions{.default_mtu = 1400, .lock_timeout = absl::Seconds(2)});
  }

  void TearDown() override {
    service_.reset();
    Sh("ip netns del " + base_ + "-pod");
    Sh("ip netns del " + base_ + "-node");
    dp_.reset();
    bpffs_.reset();
  }

  std::string NodePath() const { return "/var/run/netns/" + base_ + "-node"; }
  std::string PodPath() const { return "/var/run/netns/" + base_ + "-pod"; }

  template <typename Fn>
  auto InNode(Fn fn) -> decltype(fn()) {
    std::optional<decltype(fn())> result;
    absl::Status entered = RunInNetns(NodePath(), [&]() {
      result.emplace(fn());
      return absl::OkStatus();
    });
    if (!entered.ok()) return entered;
    return *std::move(result);
  }

  static json Config(std::optional<json> attachments = std::nullopt, bool with_key = false) {
    json c = {{"cniVersion", "1.1.0"}, {"name", "cnihard-net"}, {"type", "sluice"}};
    if (with_key) c["cni.dev/valid-attachments"] = attachments.value_or(json());
    return c;
  }

  // One endpoint API request through Handle(), as the server would pass it, run in the node.
  json Call(const std::string& command, const std::string& netns, const json& config = Config(),
            const std::string& container_id = "ctr1", const std::string& ifname = "eth0") {
    json request = {{"command", command}, {"containerID", container_id}, {"netns", netns},
                    {"ifName", ifname},   {"args", "K8S_POD_NAME=p"},    {"config", config}};
    absl::StatusOr<json> reply =
        InNode([&]() -> absl::StatusOr<json> { return Serve(*service_, request); });
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? *reply : json();
  }

  // Call(), with the namespace passed the way sluice-cni passes it: `fd` beside the request
  // ("netnsFd"), while `netns` is only the path the runtime named.
  json CallWithFd(const std::string& command, const std::string& netns, int fd,
                  const std::string& container_id = "ctr1") {
    json request = {{"command", command}, {"containerID", container_id}, {"netns", netns},
                    {"ifName", "eth0"},   {"args", "K8S_POD_NAME=p"},    {"config", Config()},
                    {"netnsFd", true}};
    absl::StatusOr<json> reply =
        InNode([&]() -> absl::StatusOr<json> { return Serve(*service_, request, fd); });
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? *reply : json();
  }

  static int Code(const json& reply) { return reply.value("code", 0); }
  static std::string Msg(const json& reply) {
    return reply.value("msg", "") + " | " + reply.value("details", "");
  }

  const Endpoint& Recorded() {
    recorded_ = store_->Get("ctr1", "eth0");
    EXPECT_TRUE(recorded_.has_value());
    if (!recorded_) recorded_.emplace();
    return *recorded_;
  }

  testing::TempDir state_{"sluice-endpoint-service-test"};
  std::string base_, state_dir_;
  std::unique_ptr<testing::ScratchBpffs> bpffs_;
  std::unique_ptr<loader::Datapath> dp_;
  std::unique_ptr<Ipam> ipam_;
  std::unique_ptr<EndpointStore> store_;
  LibnlNetlink netlink_;
  std::unique_ptr<BpfEndpointDatapath> endpoint_dp_;
  std::unique_ptr<EndpointService> service_;
  std::optional<Endpoint> recorded_;
};

TEST_F(EndpointServicePrivTest, AddIntoTheAgentsOwnNetnsIsRefusedAndTouchesNothing) {
  // The node netns by its /var/run path and by /proc, and the namespace of the agent process.
  for (const std::string& path :
       {NodePath(), std::string("/proc/thread-self/ns/net"), std::string("/proc/self/ns/net")}) {
    json reply = Call("ADD", path);
    EXPECT_EQ(reply["ok"], false) << path;
    EXPECT_EQ(Code(reply), api::kCniInvalidEnvironment) << path << ": " << Msg(reply);
    EXPECT_THAT(Msg(reply), HasSubstr("must not be the same")) << path;
  }
  auto links = InNode([&] { return netlink_.ListLinks("slc"); });
  ASSERT_TRUE(links.ok()) << links.status();
  EXPECT_TRUE(links->empty()) << "a veth was created for a refused ADD";
  EXPECT_TRUE(ipam_->Allocated().empty());
  EXPECT_EQ(store_->size(), 0u);
  EXPECT_EQ(Code(Call("CHECK", NodePath())), api::kCniInvalidEnvironment);
}

TEST_F(EndpointServicePrivTest, NetnsThatIsNotANamespaceIsInvalidEnvironmentAndNeverBlocks) {
  const std::string fifo = state_dir_ + "/fifo", file = state_dir_ + "/file";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  ASSERT_EQ(Sh("touch " + file), 0);
  for (const auto& [path, why] : std::vector<std::pair<std::string, std::string>>{
           {fifo, "named pipe"},
           {state_dir_, "directory"},
           {"/dev/null", "character device"},
           {file, "not a namespace file"},
           {"/proc/self/ns/mnt", "not a network namespace"},
           {state_dir_ + "/absent", "No such file"}}) {
    const Clock::time_point start = Clock::now();
    json reply = Call("ADD", path);
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(1)) << path;
    EXPECT_EQ(Code(reply), api::kCniInvalidEnvironment) << path << ": " << Msg(reply);
    EXPECT_THAT(Msg(reply), HasSubstr(why)) << path;
  }
  // Nothing was left holding a lock: GC (exclusive) and a real ADD go through at once.
  EXPECT_EQ(Call("GC", "", Config(json::array(), true))["ok"], true);
  json added = Call("ADD", PodPath());
  EXPECT_EQ(added["ok"], true) << added;
}

TEST_F(EndpointServicePrivTest, AddAndCheckUseThePassedDescriptorAndNeverOpenThePath) {
  // A path the agent cannot resolve (the runtime's private mount): only the descriptor works.
  const std::string hidden = state_dir_ + "/runtime-only/pod";
  const int pod = open(PodPath().c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(pod, 0);
  json added = CallWithFd("ADD", hidden, pod);
  ASSERT_EQ(added["ok"], true) << added;
  EXPECT_EQ(added["result"]["interfaces"][1]["sandbox"], hidden);
  EXPECT_EQ(Recorded().netns, hidden);
  EXPECT_EQ(Sh("ip -n " + base_ + "-pod link show eth0"), 0);
  EXPECT_EQ(CallWithFd("CHECK", hidden, pod)["ok"], true);
  // The same request without its descriptor, or with one that is no network namespace, is 4.
  EXPECT_EQ(Code(CallWithFd("CHECK", hidden, -1)), api::kCniInvalidEnvironment);
  const int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
  json refused = CallWithFd("CHECK", hidden, null);
  EXPECT_EQ(Code(refused), api::kCniInvalidEnvironment) << refused;
  EXPECT_THAT(Msg(refused), HasSubstr(hidden));
  EXPECT_EQ(Code(CallWithFd("ADD", hidden, null, "ctr2")), api::kCniInvalidEnvironment);
  // The node's own namespace by descriptor is refused like by path.
  const int node = open(NodePath().c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_THAT(Msg(CallWithFd("ADD", hidden, node, "ctr3")), HasSubstr("must not be the same"));
  EXPECT_EQ(service_->stats().bad_netns, 4u);
  EXPECT_EQ(ipam_->Allocated().size(), 1u);
  // DEL carries none and needs none.
  EXPECT_EQ(Call("DEL", hidden)["ok"], true);
  EXPECT_EQ(store_->size(), 0u);
  for (int fd : {pod, null, node}) close(fd);
}

TEST_F(EndpointServicePrivTest, AnotherNetworksAddOfALiveInterfaceFailsAndItsDelLeavesIt) {
  json added = Call("ADD", PodPath());
  ASSERT_EQ(added["ok"], true) << added;
  json other = Config();
  other["name"] = "other-net";
  json again = Call("ADD", PodPath(), other);
  EXPECT_EQ(Code(again), api::kSluiceInterfaceExists) << again;
  EXPECT_EQ(Code(Call("CHECK", PodPath(), other)), api::kCniUnknownContainer);
  EXPECT_EQ(Call("DEL", PodPath(), other)["ok"], true);
  EXPECT_EQ(Recorded().network_name, "cnihard-net");
  EXPECT_EQ(Recorded().ipv4 + "/32", added["result"]["ips"][0]["address"]);
  EXPECT_EQ(Call("CHECK", PodPath())["ok"], true);
  EXPECT_EQ(service_->stats().other_network_requests, 2u);
}

// The policy hook as the agent wires it (a PolicyReconciler on the real maps), recording whether
// the pod was reachable (had its endpoint map entry) when its policy state was written.
class ClosingPolicyHook : public EndpointPolicyHook {
 public:
  ClosingPolicyHook(loader::Datapath& dp, PolicyReconciler& rec, const EndpointStore& store)
      : dp_(dp), rec_(rec), store_(store) {}
  absl::Status EndpointAdded(const Endpoint& ep) override {
    sluice_ep4_key k{htonl(IpAddress::Parse(ep.ipv4)->v4_host_order())};
    added_while_reachable = dp_.endpoints().Lookup(k).ok();
    ++added;
    return rec_.WriteNewEndpoint(ep.endpoint_id, /*open=*/false);
  }
  absl::Status EndpointRemoved(const Endpoint& ep) override {
    ++removed;
    // The reconcile this asks for must not find the endpoint recorded (it would write its
    // entries back, and nothing would ask again).
    removed_while_recorded = store_.Get(ep.container_id, ep.ifname).has_value();
    return rec_.RemoveEndpoint(ep.endpoint_id);
  }
  int added = 0, removed = 0;
  bool added_while_reachable = false;
  bool removed_while_recorded = false;

 private:
  loader::Datapath& dp_;
  PolicyReconciler& rec_;
  const EndpointStore& store_;
};

TEST_F(EndpointServicePrivTest, AddWritesTheClosedPolicyStateBeforeThePodIsReachable) {
  BpfPolicyMaps maps(dp_->ipcache4(), dp_->policy4(), dp_->policy_ep());
  PolicyReconciler rec(maps);
  ClosingPolicyHook hook(*dp_, rec, *store_);
  service_->SetPolicyHook(&hook);
  json added = Call("ADD", PodPath());
  ASSERT_EQ(added["ok"], true) << added;
  EXPECT_EQ(hook.added, 1);
  EXPECT_FALSE(hook.added_while_reachable);
  const uint32_t id = Recorded().endpoint_id;
  auto entry = dp_->policy_ep().Lookup(id);
  ASSERT_TRUE(entry.ok()) << entry.status();
  EXPECT_EQ(entry->flags, SLUICE_POLICY_EP_F_INGRESS | SLUICE_POLICY_EP_F_EGRESS);
  EXPECT_TRUE(
      dp_->policy4()
          .Lookup(maps::MakePolicy4Key(id, SLUICE_IDENTITY_HOST, SLUICE_POLICY_INGRESS, 0, 0, 0))
          .ok());
  // Both policy points are attached: the pod's egress (TC ingress) and ingress (TC egress).
  int host_ifindex = Recorded().host_ifindex;
  auto egress_prog =
      InNode([&] { return loader::AttachedTcProgram(host_ifindex, loader::TcDirection::kEgress); });
  ASSERT_TRUE(egress_prog.ok()) << egress_prog.status();
  EXPECT_EQ(*egress_prog, *loader::ProgramId(dp_->to_pod_fd()));

  ASSERT_EQ(Call("DEL", PodPath())["ok"], true);
  EXPECT_EQ(hook.removed, 1);
  EXPECT_FALSE(hook.removed_while_recorded);
  EXPECT_TRUE(absl::IsNotFound(dp_->policy_ep().Lookup(id).status()));
  EXPECT_TRUE(absl::IsNotFound(
      dp_->policy4()
          .Lookup(maps::MakePolicy4Key(id, SLUICE_IDENTITY_HOST, SLUICE_POLICY_INGRESS, 0, 0, 0))
          .status()));
  service_->SetPolicyHook(nullptr);
}

TEST_F(EndpointServicePrivTest, RetriedAddOfTheSameAttachmentAnswersWithTheExistingResult) {
  json first = Call("ADD", PodPath());
  ASSERT_EQ(first["ok"], true) << first;
  const std::string address = first["result"]["ips"][0]["address"];
  // The retry the plugin's code 11 invites, after the first ADD completed in the agent anyway.
  json retry = Call("ADD", PodPath());
  ASSERT_EQ(retry["ok"], true) << retry;
  EXPECT_EQ(retry["result"], first["result"]);
  EXPECT_EQ(service_->stats().add_retries_in_place, 1u);
  EXPECT_EQ(ipam_->Allocated().size(), 1u);

  // A half-broken earlier attachment is redone, not refused with "interface exists".
  ASSERT_EQ(Sh("ip -n " + base_ + "-pod route del default"), 0);
  json redone = Call("ADD", PodPath());
  ASSERT_EQ(redone["ok"], true) << redone;
  EXPECT_EQ(redone["result"]["ips"][0]["address"], address);  // same owner, same address
  EXPECT_EQ(service_->stats().add_retries_in_place, 1u);
  EXPECT_EQ(Call("CHECK", PodPath())["ok"], true);
}

// What `cmd` printed on stdout.
std::string ShOut(const std::string& cmd) {
  std::string out;
  if (FILE* f = ::popen((cmd + " 2>/dev/null").c_str(), "r")) {
    char buf[4096];
    while (std::fgets(buf, sizeof(buf), f) != nullptr) out += buf;
    ::pclose(f);
  }
  return out;
}

TEST_F(EndpointServicePrivTest,
       BandwidthLimitsAreTbfQdiscsTheMapEntrySendsThroughAndCheckSeesThem) {
  json config = Config();
  config["runtimeConfig"] = {{"bandwidth",
                              {{"ingressRate", 8000000},
                               {"ingressBurst", 4294967295ull},  // containerd: none given
                               {"egressRate", 4000000},
                               {"egressBurst", 160000}}}};
  json added = Call("ADD", PodPath(), config);
  ASSERT_EQ(added["ok"], true) << added;
  const Endpoint ep = Recorded();
  EXPECT_EQ(ep.ingress, (BandwidthLimit{8000000, 32768})) << "the default bucket: 32 KiB";
  EXPECT_EQ(ep.egress, (BandwidthLimit{4000000, 20000}));

  // The kernel holds both qdiscs as set, on the host veth and inside the pod.
  const std::string host_qdisc =
      ShOut("tc -n " + base_ + "-node qdisc show dev " + ep.host_ifname + " root");
  EXPECT_THAT(host_qdisc, HasSubstr("qdisc tbf "));
  EXPECT_THAT(host_qdisc, HasSubstr("rate 8Mbit"));
  EXPECT_THAT(ShOut("tc -n " + base_ + "-pod qdisc show dev eth0 root"), HasSubstr("rate 4Mbit"));
  auto host_tbf = InNode([&]() { return netlink_.RootTbf("", ep.host_ifname); });
  ASSERT_TRUE(host_tbf.ok()) << host_tbf.status();
  ASSERT_TRUE(host_tbf->has_value());
  EXPECT_EQ((*host_tbf)->rate_bytes, 1000000u);
  EXPECT_NEAR((*host_tbf)->burst_bytes, 32768, 64);
  EXPECT_EQ((*host_tbf)->limit_bytes, 1000000u / 40 + 32768);
  // Same-node senders reach it through the veth (its qdisc), not with bpf_redirect_peer.
  auto entry = endpoint_dp_->LookupEndpoint(*IpAddress::Parse(ep.ipv4));
  ASSERT_TRUE(entry.ok() && entry->has_value());
  EXPECT_EQ((*entry)->flags, SLUICE_EP_F_INGRESS_SHAPED);
  EXPECT_EQ(Call("CHECK", PodPath(), config)["ok"], true);

  // The pod removes its egress qdisc: CHECK names it.
  ASSERT_EQ(Sh("tc -n " + base_ + "-pod qdisc del dev eth0 root"), 0);
  json check = Call("CHECK", PodPath(), config);
  EXPECT_EQ(Code(check), api::kSluiceCheckFailed) << check;
  EXPECT_THAT(Msg(check), HasSubstr("egress limit's tbf qdisc on eth0 (4000000 bit/s) is missing"));
  EXPECT_EQ(Call("DEL", PodPath(), config)["ok"], true);
}

TEST_F(EndpointServicePrivTest, ABandwidthBurstBelowOneFrameIsInvalidConfigAndMakesNothing) {
  json config = Config();
  config["runtimeConfig"] = {{"bandwidth", {{"ingressRate", 8000000}, {"ingressBurst", 8000}}}};
  json added = Call("ADD", PodPath(), config);
  EXPECT_EQ(Code(added), api::kCniInvalidNetworkConfig) << added;
  EXPECT_THAT(Msg(added), HasSubstr("less than one frame of the pod's MTU 1400"));
  EXPECT_FALSE(store_->Get("ctr1", "eth0").has_value());
  EXPECT_TRUE(ipam_->Allocated().empty());
  EXPECT_EQ(Sh("ip -n " + base_ + "-pod link show eth0"), 1) << "no pod interface made";
}

// DEL answers without waiting for the kernel to unregister the veth: when it answers the pod is
// out of the datapath, its address free, its route and neighbour entry gone and its veth down
// (or already deleted); the reaper deletes the veth, and the pod's end with it, just after.
TEST_F(EndpointServicePrivTest, DelTakesThePodOutAtOnceAndItsVethGoesJustAfter) {
  json added = Call("ADD", PodPath());
  ASSERT_EQ(added["ok"], true) << added;
  const Endpoint ep = Recorded();
  const std::string node = "ip -n " + base_ + "-node ";
  ASSERT_EQ(Sh(node + "route show " + ep.ipv4 + " | grep -q " + ep.host_ifname), 0);

  ASSERT_EQ(Call("DEL", PodPath())["ok"], true);
  EXPECT_FALSE(store_->Get("ctr1", "eth0").has_value());
  EXPECT_TRUE(ipam_->Allocated().empty());
  auto entry = dp_->endpoints().Lookup(sluice_ep4_key{inet_addr(ep.ipv4.c_str())});
  EXPECT_TRUE(absl::IsNotFound(entry.status())) << entry.status();
  EXPECT_EQ(Sh("test -z \"$(" + node + "route show " + ep.ipv4 + ")\""), 0) << "route left";
  EXPECT_EQ(Sh("test -z \"$(" + node + "neigh show " + ep.ipv4 + " | grep PERMANENT)\""), 0)
      << "neighbour entry left";
  EXPECT_NE(Sh(node + "-o link show " + ep.host_ifname + " | grep -q '[<,]UP[,>]'"), 0)
      << "veth still up";

  ASSERT_TRUE(service_->link_reaper().AwaitIdle(absl::Now() + absl::Seconds(10)));
  EXPECT_NE(Sh(node + "link show " + ep.host_ifname), 0) << "host veth left";
  EXPECT_NE(Sh("ip -n " + base_ + "-pod link show eth0"), 0) << "pod end left";
  EXPECT_EQ(service_->link_reaper().stats().deleted, 1u);
}

// The same attachment added again right after its DEL (a runtime retrying a sandbox) waits for
// the queued veth, whose name and pod end it needs, and gets a working attachment; the reaper
// never touches the new veth of the same name.
TEST_F(EndpointServicePrivTest, AddRightAfterDelOfTheSameAttachmentGetsAFreshVeth) {
  ASSERT_EQ(Call("ADD", PodPath())["ok"], true);
  const int old_ifindex = Recorded().host_ifindex;
  for (int round = 0; round < 5; ++round) {
    ASSERT_EQ(Call("DEL", PodPath())["ok"], true) << round;
    json again = Call("ADD", PodPath());
    ASSERT_EQ(again["ok"], true) << round << ": " << Msg(again);
  }
  ASSERT_TRUE(service_->link_reaper().AwaitIdle(absl::Now() + absl::Seconds(10)));
  EXPECT_NE(Recorded().host_ifindex, old_ifindex);
  EXPECT_EQ(Call("CHECK", PodPath())["ok"], true) << "the new attachment lost something";
  EXPECT_EQ(service_->link_reaper().stats().queued, 5u);
  EXPECT_EQ(service_->link_reaper().stats().failed, 0u);
}

TEST_F(EndpointServicePrivTest, CheckNamesEveryMissingResourceAndAddRepairsIt) {
  ASSERT_EQ(Call("ADD", PodPath())["ok"], true);
  ASSERT_EQ(Call("CHECK", PodPath())["ok"], true) << Msg(Call("CHECK", PodPath()));
  const std::string node = base_ + "-node", pod = base_ + "-pod";

  struct Damage {
    std::string name;
    std::function<void()> apply;
    std::string expected;
  };
  std::vector<Damage> damages = {
      {"tc program detached",
       [&] {
         int ifindex = Recorded().host_ifindex;
         ASSERT_TRUE(
             InNode([&] { return loader::DetachTc(ifindex, loader::TcDirection::kIngress); }).ok());
       },
       "pod program is not attached"},
      {"tc egress program (ingress policy) detached",
       [&] {
         int ifindex = Recorded().host_ifindex;
         ASSERT_TRUE(
             InNode([&] { return loader::DetachTc(ifindex, loader::TcDirection::kEgress); }).ok());
       },
       "pod program is not attached"},
      {"host route deleted",
       [&] {
         ASSERT_EQ(Sh(absl::StrCat("ip -n ", node, " route del ", Recorded().ipv4, "/32 dev ",
                                   Recorded().host_ifname)),
                   0);
       },
       "host route"},
      {"neighbour deleted",
       [&] {
         ASSERT_EQ(Sh(absl::StrCat("ip -n ", node, " neigh del ", Recorded().ipv4, " dev ",
                                   Recorded().host_ifname)),
                   0);
       },
       "permanent neighbour"},
      {"IPAM reservation released",
       [&] {
         ASSERT_TRUE(ipam_->Release({"cnihard-net", "ctr1", "eth0"}).ok());
       },
       "IPAM reservation"},
      {"endpoint map entry deleted",
       [&] {
         ASSERT_TRUE(
             endpoint_dp_
                 ->DeleteEndpoint(*IpAddress::Parse(Recorded().ipv4), EndpointDatapath::kAnyIfindex)
                 .ok());
       },
       "endpoint map entry"},
      {"pod gateway route deleted",
       [&] { ASSERT_EQ(Sh(absl::StrCat("ip -n ", pod, " route flush 10.244.7.1/32")), 0); },
       "gateway"},
      {"pod address deleted",
       [&] { ASSERT_EQ(Sh(absl::StrCat("ip -n ", pod, " addr flush dev eth0")), 0); },
       "lost its address"},
  };
  for (const Damage& d : damages) {
    SCOPED_TRACE(d.name);
    d.apply();
    json check = Call("CHECK", PodPath());
    EXPECT_EQ(check["ok"], false);
    EXPECT_EQ(Code(check), api::kSluiceCheckFailed) << Msg(check);
    EXPECT_THAT(Msg(check), HasSubstr(d.expected));
    json repaired = Call("ADD", PodPath());
    EXPECT_EQ(repaired["ok"], true) << repaired;
    json again = Call("CHECK", PodPath());
    EXPECT_EQ(again["ok"], true) << Msg(again);
  }
  // The record itself: CHECK of an attachment never added is "unknown container" (3).
  EXPECT_EQ(Code(Call("CHECK", PodPath(), Config(), "ctr2")), api::kCniUnknownContainer);
}

TEST_F(EndpointServicePrivTest, APodMacSetAfterAddIsFollowedAndAStalePrevResultIsRefused) {
  json added = Call("ADD", PodPath());
  ASSERT_EQ(added["ok"], true) << added;
  const std::string node = base_ + "-node", pod = base_ + "-pod";
  const std::string ip = Recorded().ipv4, old_mac = Recorded().mac;
  const std::string new_mac = "02:5e:00:00:00:09";
  // What a chained tuning with "mac" does; then what the pod link watch calls on hearing it.
  ASSERT_EQ(Sh(absl::StrCat("ip -n ", pod, " link set eth0 address ", new_mac)), 0);
  ASSERT_TRUE(InNode([&] {
                service_->FollowPodLinks({}, /*all=*/true);
                return absl::OkStatus();
              }).ok());

  EXPECT_EQ(Recorded().mac, new_mac);
  auto entry = endpoint_dp_->LookupEndpoint(*IpAddress::Parse(ip));
  ASSERT_TRUE(entry.ok() && entry->has_value()) << entry.status();
  EXPECT_EQ(std::memcmp((*entry)->mac, MacAddress::Parse(new_mac)->bytes.data(), 6), 0);
  EXPECT_EQ(Sh(absl::StrCat("ip -n ", node, " neigh show ", ip, " | grep -q 'lladdr ", new_mac,
                            " PERMANENT'")),
            0)
      << "the node's neighbour entry kept " << old_mac;

  // CHECK with the chain's result (the pod interface with its new MAC) passes; with the result
  // from before the change it is 103, naming both.
  json chained = Config();
  chained["prevResult"] = added["result"];
  chained["prevResult"]["interfaces"][1]["mac"] = new_mac;
  json check = Call("CHECK", PodPath(), chained);
  EXPECT_EQ(check["ok"], true) << Msg(check);
  json stale = Config();
  stale["prevResult"] = added["result"];
  check = Call("CHECK", PodPath(), stale);
  EXPECT_EQ(Code(check), api::kSluiceCheckFailed) << Msg(check);
  EXPECT_THAT(Msg(check),
              HasSubstr(absl::StrCat("has MAC ", new_mac, ", prevResult says ", old_mac)));
}

TEST_F(EndpointServicePrivTest, GcWithoutAListKeepsRecordedEndpointsAndAnEmptyListRemovesThem) {
  ASSERT_EQ(Call("ADD", PodPath())["ok"], true);
  // A leaked reservation (no endpoint record) is collected by every GC.
  ASSERT_TRUE(ipam_->Allocate({"cnihard-net", "leaked", "eth0"}).ok());
  json missing = Call("GC", "", Config());
  EXPECT_EQ(missing["ok"], true) << missing;
  EXPECT_TRUE(store_->Get("ctr1", "eth0").has_value());
  EXPECT_EQ(ipam_->Allocated().size(), 1u);
  json null_list = Call("GC", "", Config(json(), true));
  EXPECT_EQ(null_list["ok"], true) << null_list;
  EXPECT_TRUE(store_->Get("ctr1", "eth0").has_value());
  EXPECT_EQ(Call("CHECK", PodPath())["ok"], true);

  json listed =
      Call("GC", "", Config(json::array({{{"containerID", "ctr1"}, {"ifname", "eth0"}}}), true));
  EXPECT_EQ(listed["ok"], true) << listed;
  EXPECT_TRUE(store_->Get("ctr1", "eth0").has_value());

  json empty = Call("GC", "", Config(json::array(), true));
  EXPECT_EQ(empty["ok"], true) << empty;
  EXPECT_FALSE(store_->Get("ctr1", "eth0").has_value());
  EXPECT_TRUE(ipam_->Allocated().empty());
}

// sluice_ep4 full (filled here with entries of addresses no pod has): an ADD fails with code 104
// naming the map and leaves nothing behind (no address held, no link, no record, no entry); the
// pod added before keeps its endpoint; one free entry and the same ADD succeeds.
TEST_F(EndpointServicePrivTest, AddWithTheEndpointMapFullFailsWithCode104AndLeavesNothing) {
  ASSERT_EQ(Call("ADD", PodPath())["ok"], true);
  const std::string pod2 = base_ + "-pod2";
  ASSERT_EQ(Sh("ip netns add " + pod2), 0);
  const std::string pod2_path = "/var/run/netns/" + pod2;
  bpf_map_info info{};
  uint32_t len = sizeof(info);
  ASSERT_EQ(bpf_obj_get_info_by_fd(dp_->endpoints().fd(), &info, &len), 0);
  const size_t used = *dp_->endpoints().Count();
  std::vector<sluice_ep4_key> keys;
  for (uint32_t i = 0; keys.size() + used < info.max_entries; ++i) {
    keys.push_back(sluice_ep4_key{htonl(0x0a640000u + i)});  // 10.100.0.0 and on
  }
  std::vector<sluice_endpoint> values(keys.size());
  size_t done = 0;
  ASSERT_TRUE(dp_->endpoints().UpdateBatch(keys.data(), values.data(), keys.size(), &done).ok());
  ASSERT_EQ(*dp_->endpoints().Count(), size_t{info.max_entries});

  json full = Call("ADD", pod2_path, Config(), "ctr2");
  EXPECT_EQ(full["ok"], false) << full;
  EXPECT_EQ(Code(full), api::kSluiceMapFull) << full;
  EXPECT_THAT(Msg(full), ::testing::HasSubstr("sluice_ep4 is full")) << full;
  EXPECT_EQ(ipam_->Allocated().size(), 1u);  // ctr1's only
  EXPECT_FALSE(store_->Get("ctr2", "eth0").has_value());
  EXPECT_NE(Sh("ip -n " + pod2 + " link show eth0 >/dev/null 2>&1"), 0) << "eth0 left in pod2";
  // ctr1's host veth only (the node namespace has no other link of that kind).
  EXPECT_EQ(Sh("test \"$(ip -n " + base_ + "-node -o link show type veth | wc -l)\" = 1"), 0)
      << "a host veth left by the failed ADD";
  EXPECT_EQ(store_->List().size(), 1u);
  EXPECT_EQ(*dp_->endpoints().Count(), size_t{info.max_entries});
  // The pod added before is untouched.
  EXPECT_EQ(Call("CHECK", PodPath())["ok"], true);

  ASSERT_TRUE(dp_->endpoints().Delete(keys.back()).ok());
  json added = Call("ADD", pod2_path, Config(), "ctr2");
  EXPECT_EQ(added["ok"], true) << added;
  EXPECT_EQ(ipam_->Allocated().size(), 2u);
  Sh("ip netns del " + pod2);
}

}  // namespace
}  // namespace sluice::agent
