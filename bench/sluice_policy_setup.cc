// Programs the Sluice datapath for the NetworkPolicy connection benchmark
// (policy_conn_bench.sh): loads the real Datapath on a bpffs, writes the two pods' endpoint
// entries and attaches the pod programs to their host-side veths (as sluice_lb_setup does), then
// writes what the agent's PolicyReconciler would for one policy with N ingress rules selecting
// the server pod: each rule admits one peer pod (its own identity) on TCP 8080, the client pod's
// rule last. Every pod of the node gets its sluice_policy_ep entry (the client's: open), and the
// ipcache holds 0.0.0.0/0 (world), both pods and the N - 1 other peers.
//
// usage: sluice_policy_setup --bpffs=DIR --client=IP,HOST_IFNAME,POD_MAC,HOST_MAC
//          --server=IP,HOST_IFNAME,POD_MAC,HOST_MAC --rules=N   (0: policy off, no entries)
// Run it in the node's network namespace; the programs stay attached after it exits.
#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "loader/datapath.h"
#include "support/fixture.h"
#include "support/packet.h"

namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "sluice_policy_setup: %s\n", what.c_str());
  std::exit(1);
}

void Check(const absl::Status& st, const std::string& what) {
  if (!st.ok()) Die(absl::StrCat(what, ": ", st.ToString()));
}

struct PodSpec {
  uint32_t addr = 0;
  std::string host_if;
  sluice::testing::Mac mac, host_mac;
};

PodSpec ParsePod(const char* v) {
  std::vector<std::string> f = absl::StrSplit(v, ',');
  if (f.size() != 4) Die(absl::StrCat("bad pod ", v));
  return {sluice::testing::Ip4(f[0]), f[1], sluice::testing::ParseMac(f[2]),
          sluice::testing::ParseMac(f[3])};
}

constexpr uint32_t kClientId = 1, kServerId = 2;
constexpr uint32_t kServerIdentity = 200000;
constexpr uint16_t kPort = 8080;
constexpr uint32_t kPeerBase = 0x0a800000;  // 10.128.0.0: the peers of the other rules

}  // namespace

int main(int argc, char** argv) {
  std::string bpffs;
  PodSpec client, server;
  long rules = -1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&](const char* flag) -> const char* {
      size_t n = std::strlen(flag);
      return a.compare(0, n, flag) == 0 ? a.c_str() + n : nullptr;
    };
    if (const char* v = val("--bpffs=")) {
      bpffs = v;
    } else if (const char* v = val("--client=")) {
      client = ParsePod(v);
    } else if (const char* v = val("--server=")) {
      server = ParsePod(v);
    } else if (const char* v = val("--rules=")) {
      rules = std::strtol(v, nullptr, 10);
    } else {
      Die(absl::StrCat("unknown argument ", a));
    }
  }
  if (bpffs.empty() || client.host_if.empty() || server.host_if.empty() || rules < 0 ||
      rules > 1000000)
    Die("need --bpffs, --client, --server and --rules (0..1000000)");

  auto t0 = std::chrono::steady_clock::now();
  auto dp = sluice::loader::Datapath::Load(bpffs);
  if (!dp.ok()) Die(absl::StrCat("Datapath::Load: ", dp.status().ToString()));
  for (auto [p, id] : {std::pair{&client, kClientId}, std::pair{&server, kServerId}}) {
    int ifindex = static_cast<int>(if_nametoindex(p->host_if.c_str()));
    if (ifindex == 0) Die(absl::StrCat("no interface ", p->host_if));
    Check(sluice::testing::AddEndpoint(**dp, p->addr, ifindex, p->mac, p->host_mac, id),
          absl::StrCat("endpoint ", p->host_if));
    // As the agent does at ADD: the policy entry before the first packet (open until the
    // controller writes the pod's real state).
    if (rules > 0) {
      sluice_policy_ep_entry pe{};
      pe.identity = id == kServerId ? kServerIdentity : SLUICE_IDENTITY_MIN_DYNAMIC + rules - 1;
      Check((*dp)->policy_ep().Update(id, pe), "sluice_policy_ep");
    }
    Check((*dp)->AttachPod(ifindex), absl::StrCat("attach ", p->host_if));
  }

  auto t1 = std::chrono::steady_clock::now();
  if (rules > 0) {
    // The reconciler's order: allows, then the ipcache, then the enforce bit.
    sluice_policy4_entry allow{};
    allow.verdict = SLUICE_POLICY_ALLOW;
    for (long i = 0; i < rules; ++i) {
      Check((*dp)->policy4().Update(
                sluice::maps::MakePolicy4Key(kServerId, SLUICE_IDENTITY_MIN_DYNAMIC + i,
                                             SLUICE_POLICY_INGRESS, IPPROTO_TCP, kPort, 24),
                allow),
            "sluice_policy4");
    }
    sluice_ipcache4_entry e{};
    e.identity = SLUICE_IDENTITY_WORLD;
    Check((*dp)->ipcache4().Update({0, 0}, e), "ipcache");
    for (long i = 0; i + 1 < rules; ++i) {
      e.identity = SLUICE_IDENTITY_MIN_DYNAMIC + i;
      Check((*dp)->ipcache4().Update({32, htonl(kPeerBase + 1 + i)}, e), "ipcache");
    }
    e.identity = SLUICE_IDENTITY_MIN_DYNAMIC + rules - 1;
    Check((*dp)->ipcache4().Update({32, client.addr}, e), "ipcache client");
    e.identity = kServerIdentity;
    Check((*dp)->ipcache4().Update({32, server.addr}, e), "ipcache server");
    sluice_policy_ep_entry pe{};
    pe.identity = kServerIdentity;
    pe.flags = SLUICE_POLICY_EP_F_INGRESS;
    Check((*dp)->policy_ep().Update(kServerId, pe), "sluice_policy_ep");
  }
  auto t2 = std::chrono::steady_clock::now();
  auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
  std::printf("load_ms=%.1f program_ms=%.1f rules=%ld\n", ms(t1 - t0), ms(t2 - t1), rules);
  return 0;
}
