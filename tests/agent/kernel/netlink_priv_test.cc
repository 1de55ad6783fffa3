// Privileged tests of the real LibnlNetlink: every test gets a throwaway "node" netns (the agent
// runs in it, through RunInNetns) and a "pod" netns, and checks the result with iproute2, an
// oracle independent of libnl. Addresses are only ever configured inside those namespaces.
#include <linux/rtnetlink.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/kernel/netlink.h"
#include "agent/kernel/netns.h"
#include "agent/kernel/pod_link_watch.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace sluice::agent {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

struct CmdResult {
  int exit_code = -1;
  std::string out;  // stdout only; stderr goes to the test log
};

CmdResult Sh(const std::string& cmd) {
  CmdResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// `ip -j ...` parsed; an empty array when the command fails (e.g. "Device does not exist").
json IpJson(const std::string& args) {
  CmdResult r = Sh(absl::StrCat("ip -j ", args, " 2>/dev/null"));
  if (r.exit_code != 0 || r.out.empty()) return json::array();
  return json::parse(r.out, nullptr, /*allow_exceptions=*/false);
}

IpAddress Ip(const char* text) { return *IpAddress::Parse(text); }

std::string ReadSysctlIn(const std::string& netns, const std::string& path) {
  CmdResult r = Sh(absl::StrCat("ip netns exec ", netns, " cat ", path));
  return std::string(absl::StripAsciiWhitespace(r.out));
}

ino_t NetnsInodeOfThisThread() {
  struct stat st {};
  if (::stat("/proc/thread-self/ns/net", &st) != 0) return 0;
  return st.st_ino;
}

absl::Status ToStatus(const absl::Status& s) { return s; }
template <typename T>
absl::Status ToStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

// Both accept Status or StatusOr and a streamed message.
#define ASSERT_OK(expr)                                    \
  if (const absl::Status st_ = ToStatus(expr); st_.ok()) { \
  } else                                                   \
    FAIL() << #expr << ": " << st_
#define EXPECT_OK(expr)                                    \
  if (const absl::Status st_ = ToStatus(expr); st_.ok()) { \
  } else                                                   \
    ADD_FAILURE() << #expr << ": " << st_

constexpr uint32_t kMtu = 1400;
const char kPodIfname[] = "eth0";
const char kMark[] = "sluice:nltest/eth0";  // what the agent would set: LinkMark(cid, ifname)

class NetlinkPrivTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    std::string base = absl::StrCat("sluice-t-", ::getpid(), "-", counter++);
    node_ = base + "-node";
    pod_ = base + "-pod";
    host_if_ = absl::StrCat("slct", ::getpid() % 100000, counter.load());
    ASSERT_EQ(Sh("ip netns add " + node_).exit_code, 0);
    node_created_ = true;
    ASSERT_EQ(Sh("ip netns add " + pod_).exit_code, 0);
    pod_created_ = true;
    // The node's lo is up like on a real node (the pod's lo is the runtime's business).
    ASSERT_EQ(Sh(absl::StrCat("ip -n ", node_, " link set lo up")).exit_code, 0);
  }

  void TearDown() override {
    // Deleting the namespaces destroys every interface and route created inside them.
    if (pod_created_) {
      EXPECT_EQ(Sh("ip netns del " + pod_).exit_code, 0);
    }
    if (node_created_) {
      EXPECT_EQ(Sh("ip netns del " + node_).exit_code, 0);
    }
  }

  std::string NodePath() const { return "/var/run/netns/" + node_; }
  std::string PodPath() const { return "/var/run/netns/" + pod_; }

  // Runs fn (returning Status or StatusOr<T>) with the calling thread inside the node netns, as
  // the agent would run there; returns what fn returned.
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

  absl::StatusOr<PodVeth> CreateVeth() {
    return InNode([&] {
      return nl_.CreatePodVeth({.host_ifname = host_if_,
                                .pod_netns_path = PodPath(),
                                .pod_ifname = kPodIfname,
                                .mtu = kMtu,
                                .alias = kMark});
    });
  }

  // Creates and configures both ends for pod 10.244.0.10 behind gateway 10.244.0.1.
  absl::StatusOr<PodVeth> CreateConfiguredPod() {
    absl::StatusOr<PodVeth> veth = CreateVeth();
    if (!veth.ok()) return veth;
    absl::Status s = nl_.ConfigurePodInterface({.netns_path = PodPath(),
                                                .ifname = kPodIfname,
                                                .address = pod_ip_,
                                                .gateway = gateway_,
                                                .mtu = kMtu});
    if (!s.ok()) return s;
    s = InNode([&] { return nl_.ConfigureHostVeth(host_if_, pod_ip_, veth->pod_mac); });
    if (!s.ok()) return s;
    return veth;
  }

  LibnlNetlink nl_;
  std::string node_, pod_, host_if_;
  bool node_created_ = false, pod_created_ = false;
  const IpAddress pod_ip_ = Ip("10.244.0.10");
  const IpAddress gateway_ = Ip("10.244.0.1");
};

TEST_F(NetlinkPrivTest, CreatePodVethPutsPeerInPodNetnsWithMtuOnBothEnds) {
  absl::StatusOr<PodVeth> veth = CreateVeth();
  ASSERT_OK(veth);

  json pod = IpJson(absl::StrCat("-n ", pod_, " link show dev ", kPodIfname));
  ASSERT_EQ(pod.size(), 1u) << "pod end missing from the pod netns";
  EXPECT_EQ(pod[0]["ifindex"], veth->pod_ifindex);
  EXPECT_EQ(pod[0]["address"], veth->pod_mac.ToString());
  EXPECT_EQ(pod[0]["mtu"], kMtu);

  json host = IpJson(absl::StrCat("-n ", node_, " -d link show dev ", host_if_));
  ASSERT_EQ(host.size(), 1u) << "host end missing from the node netns";
  EXPECT_EQ(host[0]["ifindex"], veth->host_ifindex);
  EXPECT_EQ(host[0]["address"], veth->host_mac.ToString());
  EXPECT_EQ(host[0]["mtu"], kMtu);
  EXPECT_EQ(host[0]["linkinfo"]["info_kind"], "veth");
  EXPECT_FALSE(veth->pod_mac.IsZero());
  EXPECT_NE(veth->pod_mac, veth->host_mac);

  // Nothing leaked into the node netns or the test's own netns under the pod's name.
  EXPECT_TRUE(IpJson(absl::StrCat("-n ", node_, " link show dev ", kPodIfname)).empty());
  EXPECT_TRUE(IpJson(absl::StrCat("link show dev ", host_if_)).empty());
}

TEST_F(NetlinkPrivTest, SecondCreateWithSamePodIfnameIsAlreadyExists) {
  ASSERT_OK(CreateVeth());
  const std::string other_host_if = host_if_ + "b";
  absl::StatusOr<PodVeth> again = InNode([&] {
    return nl_.CreatePodVeth({.host_ifname = other_host_if,
                              .pod_netns_path = PodPath(),
                              .pod_ifname = kPodIfname,
                              .mtu = kMtu});
  });
  EXPECT_TRUE(absl::IsAlreadyExists(again.status())) << again.status();
  EXPECT_THAT(again.status().message(), HasSubstr(PodPath()));
  EXPECT_TRUE(IpJson(absl::StrCat("-n ", node_, " link show dev ", other_host_if)).empty());
  // The first pair is untouched.
  EXPECT_EQ(IpJson(absl::StrCat("-n ", node_, " link show dev ", host_if_)).size(), 1u);
}

TEST_F(NetlinkPrivTest, CreatePodVethMarksBothEnds) {
  ASSERT_OK(CreateVeth());
  json host = IpJson(absl::StrCat("-n ", node_, " link show dev ", host_if_));
  ASSERT_EQ(host.size(), 1u);
  EXPECT_EQ(host[0].value("ifalias", ""), kMark);
  json pod = IpJson(absl::StrCat("-n ", pod_, " link show dev ", kPodIfname));
  ASSERT_EQ(pod.size(), 1u);
  EXPECT_EQ(pod[0].value("ifalias", ""), kMark);
  absl::StatusOr<LinkInfo> link = InNode([&] { return nl_.LinkByName(host_if_); });
  ASSERT_OK(link);
  EXPECT_EQ(link->alias, kMark);
}

TEST_F(NetlinkPrivTest, StaleHostVethFromACrashIsReplaced) {
  ASSERT_EQ(
      Sh(absl::StrCat("ip -n ", node_, " link add ", host_if_, " type veth peer name stalepeer"))
          .exit_code,
      0);
  // A crashed attempt of the same attachment left it: it carries the same mark.
  ASSERT_EQ(Sh(absl::StrCat("ip -n ", node_, " link set ", host_if_, " alias ", kMark)).exit_code,
            0);
  absl::StatusOr<PodVeth> veth = CreateVeth();
  ASSERT_OK(veth);
  EXPECT_TRUE(IpJson(absl::StrCat("-n ", node_, " link show dev stalepeer")).empty());
  json host = IpJson(absl::StrCat("-n ", node_, " link show dev ", host_if_));
  ASSERT_EQ(host.size(), 1u);
  EXPECT_EQ(host[0]["ifindex"], veth->host_ifindex);
  EXPECT_EQ(IpJson(absl::StrCat("-n ", pod_, " link show dev ", kPodIfname)).size(), 1u);
}

TEST_F(NetlinkPrivTest, HostNameTakenByAVethWithoutTheMarkIsNotDeleted) {
  // Another plugin's veth, and one marked for another attachment: neither is this one's.
  for (const std::string alias : {"", "sluice:other/eth0"}) {
    SCOPED_TRACE(alias);
    ASSERT_EQ(Sh(absl::StrCat("ip -n ", node_, " link add ", host_if_,
                              " type veth peer name foreignpeer"))
                  .exit_code,
              0);
    if (!alias.empty()) {
      ASSERT_EQ(
          Sh(absl::StrCat("ip -n ", node_, " link set ", host_if_, " alias ", alias)).exit_code, 0);
    }
    json before = IpJson(absl::StrCat("-n ", node_, " link show dev ", host_if_));
    ASSERT_EQ(before.size(), 1u);
    absl::StatusOr<PodVeth> veth = CreateVeth();
    EXPECT_TRUE(absl::IsAlreadyExists(veth.status())) << veth.status();
    EXPECT_THAT(veth.status().message(), HasSubstr(host_if_));
    EXPECT_THAT(veth.status().message(), HasSubstr("not this endpoint's"));
    json after = IpJson(absl::StrCat("-n ", node_, " link show dev ", host_if_));
    ASSERT_EQ(after.size(), 1u);
    EXPECT_EQ(after[0]["ifindex"], before[0]["ifindex"]);
    EXPECT_EQ(IpJson(absl::StrCat("-n ", node_, " link show dev foreignpeer")).size(), 1u);
    EXPECT_TRUE(IpJson(absl::StrCat("-n ", pod_, " link show dev ", kPodIfname)).empty());
    ASSERT_EQ(Sh(absl::StrCat("ip -n ", node_, " link del ", host_if_)).exit_code, 0);
  }
}

TEST_F(NetlinkPrivTest, DeleteLinkByIndexAndSetLinkAlias) {
  absl::StatusOr<PodVeth> veth = CreateVeth();
  ASSERT_OK(veth);
  ASSERT_OK(InNode([&] { return nl_.SetLinkAlias(veth->host_ifindex, "sluice:adopted/eth0"); }));
  absl::StatusOr<LinkInfo> link = InNode([&] { return nl_.LinkByName(host_if_); });
  ASSERT_OK(link);
  EXPECT_EQ(link->alias, "sluice:adopted/eth0");
  absl::StatusOr<std::vector<LinkInfo>> all = InNode([&] { return nl_.ListLinks(""); });
  ASSERT_OK(all);
  bool listed = false;
  for (const LinkInfo& l : *all) listed |= l.name == host_if_ && l.alias == "sluice:adopted/eth0";
  EXPECT_TRUE(listed);
  ASSERT_OK(InNode([&] { return nl_.DeleteLinkByIndex(veth->host_ifindex); }));
  EXPECT_TRUE(IpJson(absl::StrCat("-n ", node_, " link show dev ", host_if_)).empty());
  EXPECT_TRUE(IpJson(absl::StrCat("-n ", pod_, " link show dev ", kPodIfname)).empty());
  EXPECT_OK(InNode([&] { return nl_.DeleteLinkByIndex(veth->host_ifindex); }));  // absent: OK
}

TEST_F(NetlinkPrivTest, HostNameTakenByNonVethIsNotDeleted) {
  // A bridge, not a dummy: the CI kernel is built without CONFIG_DUMMY.
  ASSERT_EQ(Sh(absl::StrCat("ip -n ", node_, " link add ", host_if_, " type bridge")).exit_code, 0);
  absl::StatusOr<PodVeth> veth = CreateVeth();
  EXPECT_TRUE(absl::IsAlreadyExists(veth.status())) << veth.status();
  json host = IpJson(absl::StrCat("-n ", node_, " -d link show dev ", host_if_));
  ASSERT_EQ(host.size(), 1u);
  EXPECT_EQ(host[0]["linkinfo"]["info_kind"], "bridge");
  EXPECT_TRUE(IpJson(absl::StrCat("-n ", pod_, " link show dev ", kPodIfname)).empty());
}

TEST_F(NetlinkPrivTest, CreatePodVethInMissingNetnsIsNotFound) {
  absl::StatusOr<PodVeth> veth = InNode([&] {
    return nl_.CreatePodVeth({.host_ifname = host_if_,
                              .pod_netns_path = "/var/run/netns/sluice-t-does-not-exist",
                              .pod_ifname = kPodIfname,
                              .mtu = kMtu});
  });
  EXPECT_TRUE(absl::IsNotFound(veth.status())) << veth.status();
  EXPECT_THAT(veth.status().message(), HasSubstr("/var/run/netns/sluice-t-does-not-exist"));
  EXPECT_TRUE(IpJson(absl::StrCat("-n ", node_, " link show dev ", host_if_)).empty());
}

TEST_F(NetlinkPrivTest, ConfigurePodInterfaceSetsAddressRoutesAndDisablesIpv6) {
  ASSERT_OK(CreateVeth());
  PodInterfaceConfig config{.netns_path = PodPath(),
                            .ifname = kPodIfname,
                            .address = pod_ip_,
                            .gateway = gateway_,
                            .mtu = kMtu};
  ASSERT_OK(nl_.ConfigurePodInterface(config));
  ASSERT_OK(nl_.ConfigurePodInterface(config)) << "not idempotent";

  json link = IpJson(absl::StrCat("-n ", pod_, " addr show dev ", kPodIfname));
  ASSERT_EQ(link.size(), 1u);
  EXPECT_THAT(link[0]["flags"].dump(), HasSubstr("\"UP\""));
  ASSERT_EQ(link[0]["addr_info"].size(), 1u) << link.dump();  // IPv4 only: no fe80::
  EXPECT_EQ(link[0]["addr_info"][0]["local"], "10.244.0.10");
  EXPECT_EQ(link[0]["addr_info"][0]["prefixlen"], 32);

  json routes = IpJson(absl::StrCat("-n ", pod_, " -4 route show table main"));
  ASSERT_EQ(routes.size(), 2u) << routes.dump();
  bool saw_default = false, saw_gateway = false;
  for (const json& r : routes) {
    EXPECT_EQ(r["dev"], kPodIfname) << r.dump();
    if (r["dst"] == "default") {
      saw_default = true;
      EXPECT_EQ(r["gateway"], "10.244.0.1");
    } else if (r["dst"] == "10.244.0.1") {
      saw_gateway = true;
      EXPECT_EQ(r["scope"], "link");
    }
  }
  EXPECT_TRUE(saw_default) << routes.dump();
  EXPECT_TRUE(saw_gateway) << routes.dump();

  EXPECT_EQ(ReadSysctlIn(pod_, "/proc/sys/net/ipv6/conf/eth0/disable_ipv6"), "1");
  // lo is the runtime's: still down.
  json lo = IpJson(absl::StrCat("-n ", pod_, " link show dev lo"));
  ASSERT_EQ(lo.size(), 1u);
  EXPECT_THAT(lo[0]["flags"].dump(), ::testing::Not(HasSubstr("\"UP\"")));
}

TEST_F(NetlinkPrivTest, GetPodInterfaceReportsWhatConfigurePodInterfaceSet) {
  absl::StatusOr<PodVeth> veth = CreateVeth();
  ASSERT_OK(veth);
  ASSERT_OK(nl_.ConfigurePodInterface({.netns_path = PodPath(),
                                       .ifname = kPodIfname,
                                       .address = pod_ip_,
                                       .gateway = gateway_,
                                       .mtu = kMtu}));
  absl::StatusOr<PodInterface> pod = nl_.GetPodInterface(PodPath(), kPodIfname);
  ASSERT_OK(pod);
  EXPECT_EQ(pod->link.ifindex, veth->pod_ifindex);
  EXPECT_EQ(pod->link.mac, veth->pod_mac);
  EXPECT_EQ(pod->link.mtu, kMtu);
  EXPECT_TRUE(pod->link.up);
  EXPECT_THAT(pod->addresses, ::testing::ElementsAre(InterfaceAddress::Host(pod_ip_)));
  ASSERT_EQ(pod->routes.size(), 2u);
  bool saw_default = false, saw_gateway = false;
  for (const RouteInfo& r : pod->routes) {
    EXPECT_EQ(r.oif, veth->pod_ifindex);
    if (r.dst.length() == 0) {
      saw_default = true;
      EXPECT_EQ(r.gateway, gateway_);
    } else if (r.dst.network() == gateway_ && r.dst.length() == 32) {
      saw_gateway = true;
      EXPECT_EQ(r.gateway, std::nullopt);
      EXPECT_EQ(r.scope, RT_SCOPE_LINK);
    }
  }
  EXPECT_TRUE(saw_default);
  EXPECT_TRUE(saw_gateway);

  absl::StatusOr<PodInterface> missing = nl_.GetPodInterface(PodPath(), "eth9");
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
}

TEST_F(NetlinkPrivTest, ConfigureHostVethInstallsRouteNeighbourAndSysctls) {
  absl::StatusOr<PodVeth> veth = CreateVeth();
  ASSERT_OK(veth);
  ASSERT_OK(InNode([&] { return nl_.ConfigureHostVeth(host_if_, pod_ip_, veth->pod_mac); }));
  ASSERT_OK(InNode([&] { return nl_.ConfigureHostVeth(host_if_, pod_ip_, veth->pod_mac); }))
      << "not idempotent";

  json link = IpJson(absl::StrCat("-n ", node_, " link show dev ", host_if_));
  ASSERT_EQ(link.size(), 1u);
  EXPECT_THAT(link[0]["flags"].dump(), HasSubstr("\"UP\""));

  json routes = IpJson(absl::StrCat("-n ", node_, " -4 route show 10.244.0.10/32"));
  ASSERT_EQ(routes.size(), 1u) << routes.dump();
  EXPECT_EQ(routes[0]["dev"], host_if_);
  EXPECT_EQ(routes[0]["scope"], "link");
  EXPECT_FALSE(routes[0].contains("gateway"));

  json neigh = IpJson(absl::StrCat("-n ", node_, " neigh show dev ", host_if_));
  ASSERT_EQ(neigh.size(), 1u) << neigh.dump();
  EXPECT_EQ(neigh[0]["dst"], "10.244.0.10");
  EXPECT_EQ(neigh[0]["lladdr"], veth->pod_mac.ToString());
  EXPECT_THAT(neigh[0]["state"].dump(), HasSubstr("PERMANENT"));

  EXPECT_EQ(ReadSysctlIn(node_, absl::StrCat("/proc/sys/net/ipv4/conf/", host_if_, "/rp_filter")),
            "0");
  EXPECT_EQ(ReadSysctlIn(node_, absl::StrCat("/proc/sys/net/ipv4/conf/", host_if_, "/forwarding")),
            "1");
}

TEST_F(NetlinkPrivTest, NodePingsConfiguredPodWithoutBpf) {
  ASSERT_OK(InNode(
      [&] { return nl_.EnsureDummyWithAddress("sluice_host", InterfaceAddress::Host(gateway_)); }));
  ASSERT_OK(CreateConfiguredPod());
  // Poll with a deadline: the first echo can race the pod's ARP for its gateway.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  CmdResult ping;
  do {
    ping = Sh(absl::StrCat("ip netns exec ", node_, " ping -c1 -W2 10.244.0.10"));
  } while (ping.exit_code != 0 && std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(ping.exit_code, 0) << ping.out;
}

TEST_F(NetlinkPrivTest, DeleteLinkRemovesBothEndsAndIsIdempotent) {
  ASSERT_OK(CreateVeth());
  ASSERT_OK(InNode([&] { return nl_.DeleteLink(host_if_); }));
  EXPECT_TRUE(IpJson(absl::StrCat("-n ", node_, " link show dev ", host_if_)).empty());
  EXPECT_TRUE(IpJson(absl::StrCat("-n ", pod_, " link show dev ", kPodIfname)).empty());
  absl::StatusOr<bool> pod_side = nl_.LinkExistsInNetns(PodPath(), kPodIfname);
  ASSERT_OK(pod_side);
  EXPECT_FALSE(*pod_side);
  EXPECT_OK(InNode([&] { return nl_.DeleteLink(host_if_); }));
  // The pod name is free again.
  EXPECT_OK(CreateVeth());
}

TEST_F(NetlinkPrivTest, LinkQueriesSeeOnlyTheCallersNetns) {
  absl::StatusOr<PodVeth> veth = CreateVeth();
  ASSERT_OK(veth);
  ASSERT_EQ(Sh(absl::StrCat("ip -n ", node_, " link add other0 type bridge")).exit_code, 0);

  absl::StatusOr<LinkInfo> link = InNode([&] { return nl_.LinkByName(host_if_); });
  ASSERT_OK(link);
  EXPECT_EQ(link->name, host_if_);
  EXPECT_EQ(link->ifindex, veth->host_ifindex);
  EXPECT_EQ(link->mac, veth->host_mac);
  EXPECT_EQ(link->mtu, kMtu);
  EXPECT_FALSE(link->up);

  absl::StatusOr<LinkInfo> missing = InNode([&] { return nl_.LinkByName(kPodIfname); });
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();

  absl::StatusOr<std::vector<LinkInfo>> lxc = InNode([&] { return nl_.ListLinks("slc"); });
  ASSERT_OK(lxc);
  ASSERT_EQ(lxc->size(), 1u);
  EXPECT_EQ((*lxc)[0].name, host_if_);

  absl::StatusOr<bool> in_pod = nl_.LinkExistsInNetns(PodPath(), kPodIfname);
  ASSERT_OK(in_pod);
  EXPECT_TRUE(*in_pod);
  absl::StatusOr<bool> host_in_pod = nl_.LinkExistsInNetns(PodPath(), host_if_);
  ASSERT_OK(host_in_pod);
  EXPECT_FALSE(*host_in_pod);
  absl::StatusOr<bool> no_netns = nl_.LinkExistsInNetns("/var/run/netns/sluice-t-gone", "eth0");
  EXPECT_TRUE(absl::IsNotFound(no_netns.status())) << no_netns.status();
}

TEST_F(NetlinkPrivTest, EnsureDummyWithAddressIsIdempotentAndRejectsForeignDevices) {
  const InterfaceAddress gw = InterfaceAddress::Host(gateway_);
  ASSERT_OK(InNode([&] { return nl_.EnsureDummyWithAddress("sluice_host", gw); }));
  ASSERT_OK(InNode([&] { return nl_.EnsureDummyWithAddress("sluice_host", gw); }));
  json dev = IpJson(absl::StrCat("-n ", node_, " -d addr show dev sluice_host"));
  ASSERT_EQ(dev.size(), 1u);
  EXPECT_THAT(dev[0]["flags"].dump(), HasSubstr("\"UP\""));
  if (dev[0]["linkinfo"]["info_kind"] != "dummy") {
    // Kernel without CONFIG_DUMMY: the stand-in veth pair, both ends up.
    EXPECT_EQ(dev[0]["linkinfo"]["info_kind"], "veth");
    json peer = IpJson(absl::StrCat("-n ", node_, " link show dev sluice_net"));
    ASSERT_EQ(peer.size(), 1u);
    EXPECT_EQ(dev[0]["link"], "sluice_net");
    EXPECT_THAT(peer[0]["flags"].dump(), HasSubstr("\"UP\""));
  }
  json v4 = json::array();
  for (const json& a : dev[0]["addr_info"]) {
    if (a["family"] == "inet") v4.push_back(a);
  }
  ASSERT_EQ(v4.size(), 1u) << dev.dump();
  EXPECT_EQ(v4[0]["local"], "10.244.0.1");
  EXPECT_EQ(v4[0]["prefixlen"], 32);

  // A pod's veth or a bridge under that name is not taken over.
  ASSERT_OK(CreateVeth());
  absl::Status pod_veth = InNode([&] { return nl_.EnsureDummyWithAddress(host_if_, gw); });
  EXPECT_TRUE(absl::IsFailedPrecondition(pod_veth)) << pod_veth;
  ASSERT_EQ(Sh(absl::StrCat("ip -n ", node_, " link add br0 type bridge")).exit_code, 0);
  absl::Status bridge = InNode([&] { return nl_.EnsureDummyWithAddress("br0", gw); });
  EXPECT_TRUE(absl::IsFailedPrecondition(bridge)) << bridge;
  EXPECT_TRUE(IpJson(absl::StrCat("-n ", node_, " -4 addr show dev br0"))[0]["addr_info"].empty());
}

TEST_F(NetlinkPrivTest, DefaultRouteDeviceAndFirstAddressOfTheNodeNetns) {
  absl::StatusOr<std::string> none = InNode([&] { return nl_.DefaultRouteDevice(); });
  EXPECT_TRUE(absl::IsNotFound(none.status())) << none.status();

  for (const char* cmd :
       {"link add uplink0 type veth peer name uplink1", "link set uplink1 up",
        "link set uplink0 up", "addr add 172.31.255.2/24 dev uplink0",
        "addr add 172.31.255.3/24 dev uplink0", "route add default via 172.31.255.1 dev uplink0"}) {
    ASSERT_EQ(Sh(absl::StrCat("ip -n ", node_, " ", cmd)).exit_code, 0) << cmd;
  }
  absl::StatusOr<std::string> dev = InNode([&] { return nl_.DefaultRouteDevice(); });
  ASSERT_OK(dev);
  EXPECT_EQ(*dev, "uplink0");
  absl::StatusOr<IpAddress> addr = InNode([&] { return nl_.FirstIPv4Address("uplink0"); });
  ASSERT_OK(addr);
  EXPECT_EQ(*addr, Ip("172.31.255.2"));
  absl::StatusOr<IpAddress> lo_only = InNode([&] { return nl_.FirstIPv4Address("lo"); });
  ASSERT_OK(lo_only);
  EXPECT_EQ(*lo_only, Ip("127.0.0.1"));
}

TEST_F(NetlinkPrivTest, SetSysctlWritesOnlyTheCallersNetns) {
  // A new namespace copies net.ipv4.ip_forward from the machine's root namespace (1 on any
  // Kubernetes node or container host): the case starts both at 0 itself. The test's own
  // namespace starts at 0 (tests/support/privileged_main.cc).
  for (const std::string& ns : {node_, pod_}) {
    ASSERT_EQ(Sh(absl::StrCat("ip netns exec ", ns, " sysctl -qw net.ipv4.ip_forward=0")).exit_code,
              0);
  }
  ASSERT_EQ(ReadSysctlIn(node_, "/proc/sys/net/ipv4/ip_forward"), "0");
  ASSERT_OK(InNode([&] { return nl_.SetSysctl("net.ipv4.ip_forward", "1"); }));
  EXPECT_EQ(ReadSysctlIn(node_, "/proc/sys/net/ipv4/ip_forward"), "1");
  EXPECT_EQ(ReadSysctlIn(pod_, "/proc/sys/net/ipv4/ip_forward"), "0");
  EXPECT_EQ(absl::StripAsciiWhitespace(Sh("cat /proc/sys/net/ipv4/ip_forward").out), "0")
      << "the test's own namespace";
  absl::Status missing = InNode([&] { return nl_.SetSysctl("net.ipv4.no_such_knob", "1"); });
  EXPECT_TRUE(absl::IsNotFound(missing)) << missing;
}

TEST_F(NetlinkPrivTest, RunInNetnsLeavesTheCallingThreadWhereItWas) {
  const ino_t before = NetnsInodeOfThisThread();
  ino_t inside = 0;
  ASSERT_OK(RunInNetns(PodPath(), [&] {
    inside = NetnsInodeOfThisThread();
    return absl::OkStatus();
  }));
  EXPECT_NE(inside, before);
  struct stat st {};
  ASSERT_EQ(::stat(PodPath().c_str(), &st), 0);
  EXPECT_EQ(inside, st.st_ino);
  EXPECT_EQ(NetnsInodeOfThisThread(), before);

  absl::Status propagated =
      RunInNetns(PodPath(), [] { return absl::InternalError("from inside"); });
  EXPECT_THAT(propagated.message(), HasSubstr("from inside"));
}

TEST_F(NetlinkPrivTest, RunInNetnsOnMissingPathIsNotFoundNamingThePath) {
  bool ran = false;
  absl::Status s = RunInNetns("/var/run/netns/sluice-t-missing", [&] {
    ran = true;
    return absl::OkStatus();
  });
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("/var/run/netns/sluice-t-missing"));
  EXPECT_FALSE(ran);
}

TEST_F(NetlinkPrivTest, PodLinkWatchHearsAMacSetInThePodAndPeerLinkReadsIt) {
  absl::StatusOr<PodVeth> veth = CreateVeth();
  ASSERT_OK(veth);
  absl::StatusOr<LinkInfo> host = InNode([&] { return nl_.LinkByName(host_if_); });
  ASSERT_OK(host);
  ASSERT_GE(host->peer_netnsid, 0) << "the node netns has no id for the pod's";
  EXPECT_EQ(host->peer_ifindex, veth->pod_ifindex);

  const PeerLinkChange pod_link{host->peer_netnsid, veth->pod_ifindex};
  absl::Mutex mu;
  bool heard = false;
  auto watch = InNode([&] {
    return PodLinkWatch::Start([&](const std::vector<PeerLinkChange>& changes, bool) {
      absl::MutexLock l(&mu);
      for (const auto& c : changes) heard |= c == pod_link;
    });
  });
  ASSERT_OK(watch);
  // What tuning's "mac" does: RTM_SETLINK inside the pod netns, the link up.
  ASSERT_EQ(Sh(absl::StrCat("ip -n ", pod_, " link set ", kPodIfname, " up")).exit_code, 0);
  ASSERT_EQ(Sh(absl::StrCat("ip -n ", pod_, " link set ", kPodIfname, " address 02:5e:00:00:00:07"))
                .exit_code,
            0);
  EXPECT_TRUE(mu.LockWhenWithTimeout(absl::Condition(&heard), absl::Seconds(5)))
      << "no change heard for the pod's link";
  mu.Unlock();
  absl::StatusOr<LinkInfo> peer = InNode([&] { return nl_.PeerLink(host_if_); });
  ASSERT_OK(peer);
  EXPECT_EQ(peer->mac.ToString(), "02:5e:00:00:00:07");
  EXPECT_EQ(peer->ifindex, veth->pod_ifindex);
}

}  // namespace
}  // namespace sluice::agent
