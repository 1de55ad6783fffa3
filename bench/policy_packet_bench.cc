// Per-packet cost of the NetworkPolicy verdict in the real programs: the egress policy point of
// sluice_from_pod and the ingress policy point of sluice_to_pod (what the node's stack delivers
// to a pod), with 10, 1k and 10k rules selecting the probed pod and 100k ipcache entries, next to
// the same packets with policy off, measured with BPF_PROG_TEST_RUN in the same process. The
// claims are the ratio largest/smallest rule count (the verdict is a constant number of lookups:
// target <= 1.1x) and the cost over policy off.
//
// How the numbers are made:
// - One datapath per variant, each on its own bpffs, so all coexist and rounds interleave them:
//     off        no sluice_policy_ep entry for the pod (--network_policy=false): one lookup;
//     open       an entry without enforced directions (a pod no policy selects): tracked in CT;
//     N rules    ingress and egress enforced; N rules, each allowing one peer identity (pods
//                with one label value) on TCP 8080, in each direction: N sluice_policy4 entries
//                per direction for the pod.
//   Every datapath holds the same 100k ipcache entries (pods 10.128.0.0 + k, /32, 20k label-set
//   identities) plus 0.0.0.0/0 -> world. The probed peer's identity is that of the rule written
//   last.
// - The packets are the same in every variant: egress pod 10.244.0.10 -> peer pod 10.128.x.y
//   TCP 8080 (sluice_from_pod, to the stack: the peer is on another node); ingress peer -> pod
//   (sluice_to_pod). Each is validated before timing: verdict TC_ACT_OK, packet unchanged; the
//   same packet from a peer no rule admits is dropped as policy_denied where enforced.
// - Every packet is judged (docs/policy.md: every packet of the initiating direction is), so the
//   same packet repeated times the steady state of an allowed flow: the reply lookup in CT
//   (miss), sluice_policy_ep, sluice_ipcache4, sluice_policy4 (hit on the peer's identity), the
//   flow's own CT entry (hit). test_run is repeat = 1 per syscall (as lb_packet_bench: the
//   kernel-reported duration of one run); rounds interleave every case in a shuffled order, each
//   round takes the interquartile mean of its runs, the table shows the median over rounds.
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <linux/bpf.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "loader/datapath.h"
#include "support/fixture.h"
#include "support/packet.h"
#include "test_run.h"

namespace sluice::bench {
namespace {

using testing::Bytes;
using testing::Ip4;
using testing::kTcOk;
using testing::kTcRedirect;
using testing::kTcShot;
using testing::Mac;
using testing::Packet;
using testing::ParseMac;

constexpr int kIfindex = 1;  // lo: test_run receives on it; the probed pod's veth
constexpr uint32_t kEndpoint = 1;
constexpr uint32_t kPodIdentity = 200000;  // the probed pod's own identity
constexpr uint32_t kIpcachePods = 100000;  // /32 entries, besides 0.0.0.0/0
constexpr uint32_t kPeerIdentities = 20000;
constexpr uint32_t kPeerBase = 0x0a800000;  // 10.128.0.0
constexpr uint16_t kPort = 8080;
constexpr int kBatch = 2000;  // syscalls per case per round
const char* const kPod = "10.244.0.10";
// A second pod on this node, the probed pod's peer in the pod -> pod cases.
constexpr int kNeighbourIfindex = 4242;
constexpr uint32_t kNeighbourEndpoint = 2;
const char* const kNeighbour = "10.244.0.11";
const Mac kNeighbourMac = ParseMac("02:00:00:00:0b:01");
const Mac kNeighbourHostMac = ParseMac("02:aa:00:00:0b:02");
const Mac kPodMac = ParseMac("02:00:00:00:0a:01");
const Mac kHostMac = ParseMac("02:aa:00:00:0a:02");

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "policy_packet_bench: %s\n", what.c_str());
  std::exit(1);
}

void Check(const absl::Status& st, const std::string& what) {
  if (!st.ok()) Die(absl::StrCat(what, ": ", st.ToString()));
}

using RunOut = TestRunOut;

RunOut TestRun(int prog_fd, const Bytes& in) {
  RunOut r;
  if (!RunTc(prog_fd, in, kIfindex, &r))
    Die(absl::StrCat("BPF_PROG_TEST_RUN: ", std::strerror(errno)));
  return r;
}

int EmptyTcProgram() {
  int fd = LoadEmptyTcProgram();
  if (fd < 0) Die(absl::StrCat("load empty SCHED_CLS program: ", std::strerror(errno)));
  return fd;
}

// Peer pod k of the ipcache and its identity (20k label sets over 100k pods).
uint32_t PeerAddr(uint32_t k) { return htonl(kPeerBase + k); }
uint32_t PeerIdentity(uint32_t k) { return SLUICE_IDENTITY_MIN_DYNAMIC + k % kPeerIdentities; }
// A peer pod whose identity is `identity` (the first one, k < kPeerIdentities).
uint32_t PeerOf(uint32_t identity) { return identity - SLUICE_IDENTITY_MIN_DYNAMIC; }

Bytes Egress(uint32_t peer_be) {
  return Packet::Eth(kPodMac, kHostMac)
      .IPv4(kPod, testing::FormatIp4(peer_be))
      .TCP(40000, kPort, sluice::testing::kTcpAck)
      .Payload("GET / HTTP/1.1\r\n\r\n")
      .Build();
}
Bytes Ingress(uint32_t peer_be) {
  return Packet::Eth(kHostMac, kPodMac)
      .IPv4(testing::FormatIp4(peer_be), kPod)
      .TCP(40000, kPort, sluice::testing::kTcpAck)
      .Payload("GET / HTTP/1.1\r\n\r\n")
      .Build();
}

// The probed pod to its neighbour on this node (sluice_from_pod: A's egress point, then the
// neighbour's ingress point, then bpf_redirect_peer).
Bytes PodToPod(uint16_t dport = kPort) {
  return Packet::Eth(kPodMac, kHostMac)
      .IPv4(kPod, kNeighbour)
      .TCP(40000, dport, sluice::testing::kTcpAck)
      .Payload("GET / HTTP/1.1\r\n\r\n")
      .Build();
}

enum class Mode { kOff, kOpen, kEnforced };

struct Variant {
  std::string name;
  Mode mode;
  uint32_t rules = 0;
  std::unique_ptr<testing::ScratchBpffs> bpffs;
  std::unique_ptr<loader::Datapath> dp;
  uint32_t peer = 0;  // the probed peer's address (network order)
};

std::unique_ptr<Variant> MakeVariant(std::string name, Mode mode, uint32_t rules) {
  auto v = std::make_unique<Variant>();
  v->name = std::move(name);
  v->mode = mode;
  v->rules = rules;
  v->bpffs = std::make_unique<testing::ScratchBpffs>();
  auto dp = loader::Datapath::Load(v->bpffs->path());
  if (!dp.ok()) Die(absl::StrCat("Datapath::Load: ", dp.status().ToString()));
  v->dp = std::move(*dp);
  sluice_ep4_key key{Ip4(kPod)};
  sluice_endpoint ep{};
  ep.ifindex = kIfindex;
  std::memcpy(ep.mac, kPodMac.data(), 6);
  std::memcpy(ep.host_mac, kHostMac.data(), 6);
  ep.endpoint_id = kEndpoint;
  Check(v->dp->endpoint_table().Upsert(key.addr, ep), "sluice_ep4");
  sluice_endpoint neighbour{};
  neighbour.ifindex = kNeighbourIfindex;
  std::memcpy(neighbour.mac, kNeighbourMac.data(), 6);
  std::memcpy(neighbour.host_mac, kNeighbourHostMac.data(), 6);
  neighbour.endpoint_id = kNeighbourEndpoint;
  Check(v->dp->endpoint_table().Upsert(Ip4(kNeighbour), neighbour), "sluice_ep4 neighbour");

  sluice_ipcache4_entry id{};
  id.identity = SLUICE_IDENTITY_WORLD;
  Check(v->dp->ipcache4().Update({0, 0}, id), "ipcache 0.0.0.0/0");
  for (uint32_t k = 0; k < kIpcachePods; ++k) {
    id.identity = PeerIdentity(k);
    Check(v->dp->ipcache4().Update({32, PeerAddr(k)}, id), "ipcache");
  }
  id.identity = kPodIdentity;
  Check(v->dp->ipcache4().Update({32, Ip4(kPod)}, id), "ipcache pod");

  if (mode != Mode::kOff) {
    sluice_policy_ep_entry pe{};
    pe.identity = kPodIdentity;
    if (mode == Mode::kEnforced) pe.flags = SLUICE_POLICY_EP_F_INGRESS | SLUICE_POLICY_EP_F_EGRESS;
    Check(v->dp->policy_ep().Update(kEndpoint, pe), "sluice_policy_ep");
    Check(v->dp->policy_ep().Update(kNeighbourEndpoint, pe), "sluice_policy_ep neighbour");
  }
  // Rule i allows peer identity 256 + i on TCP 8080, in both directions; the probed peer has the
  // identity of the last one.
  sluice_policy4_entry allow{};
  allow.verdict = SLUICE_POLICY_ALLOW;
  for (uint32_t i = 0; i < rules; ++i) {
    for (uint8_t dir : {SLUICE_POLICY_INGRESS, SLUICE_POLICY_EGRESS}) {
      auto k = maps::MakePolicy4Key(kEndpoint, SLUICE_IDENTITY_MIN_DYNAMIC + i, dir, IPPROTO_TCP,
                                    kPort, 24);
      Check(v->dp->policy4().Update(k, allow), "sluice_policy4");
    }
  }
  uint32_t probed = rules > 0 ? SLUICE_IDENTITY_MIN_DYNAMIC + rules - 1 : PeerIdentity(77);
  // The neighbour has the probed identity (the probed pod's egress admits it) and admits the
  // probed pod on TCP 8080 at its ingress.
  id.identity = probed;
  Check(v->dp->ipcache4().Update({32, Ip4(kNeighbour)}, id), "ipcache neighbour");
  if (mode == Mode::kEnforced) {
    auto k = maps::MakePolicy4Key(kNeighbourEndpoint, kPodIdentity, SLUICE_POLICY_INGRESS,
                                  IPPROTO_TCP, kPort, 24);
    Check(v->dp->policy4().Update(k, allow), "sluice_policy4 neighbour");
  }
  // A peer further into the ipcache than the first 10k: the last pod with the probed identity.
  uint32_t k = PeerOf(probed);
  while (k + kPeerIdentities < kIpcachePods) k += kPeerIdentities;
  v->peer = PeerAddr(k);
  return v;
}

bool PassedUnchanged(const RunOut& r, const Bytes& in) { return r.verdict == kTcOk && r.out == in; }

void Validate(Variant& v) {
  auto egress = Egress(v.peer), ingress = Ingress(v.peer), p2p = PodToPod();
  for (int k = 0; k < 3; ++k) {
    auto r = TestRun(v.dp->from_pod_fd(), p2p);
    if (r.verdict != kTcRedirect) Die(v.name + ": pod -> pod packet not redirected");
    if (!PassedUnchanged(TestRun(v.dp->from_pod_fd(), egress), egress))
      Die(v.name + ": egress packet not passed unchanged");
    if (!PassedUnchanged(TestRun(v.dp->to_pod_fd(), ingress), ingress))
      Die(v.name + ": ingress packet not passed unchanged");
  }
  // A peer no rule admits: the identity just past the rules (or any, without rules).
  uint32_t denied_peer = PeerAddr(PeerOf(SLUICE_IDENTITY_MIN_DYNAMIC + v.rules));
  int want = v.mode == Mode::kEnforced ? kTcShot : kTcOk;
  if (TestRun(v.dp->from_pod_fd(), Egress(denied_peer)).verdict != want)
    Die(v.name + ": egress to a peer no rule admits: unexpected verdict");
  if (TestRun(v.dp->to_pod_fd(), Ingress(denied_peer)).verdict != want)
    Die(v.name + ": ingress from a peer no rule admits: unexpected verdict");
  // A port the neighbour's ingress does not admit (the probed pod's egress does not either).
  if (TestRun(v.dp->from_pod_fd(), PodToPod(kPort + 1)).verdict !=
      (v.mode == Mode::kEnforced ? kTcShot : kTcRedirect))
    Die(v.name + ": pod -> pod on a port no rule admits: unexpected verdict");
  if (v.mode == Mode::kEnforced) {
    auto count = v.dp->policy4().Count();
    if (!count.ok() || *count != 2 * v.rules + 1)
      Die(absl::StrCat(v.name, ": sluice_policy4 holds ", count.ok() ? *count : 0, " entries"));
  }
}

enum class Point { kEgress, kIngress, kPodToPod };

struct Case {
  std::string label;
  Variant* variant;  // null: the empty program
  Point point;
  int fd;
  Bytes in;
  int verdict;
  std::vector<double> rounds;
};

}  // namespace
}  // namespace sluice::bench

int main(int argc, char** argv) {
  using namespace sluice::bench;
  int rounds = 9;
  std::vector<uint32_t> counts = {10, 1000, 10000};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--rounds=", 0) == 0) {
      rounds = std::atoi(a.c_str() + 9);
    } else if (a.rfind("--rules=", 0) == 0) {
      counts.clear();
      for (const char* p = a.c_str() + 8; *p;) {
        counts.push_back(static_cast<uint32_t>(std::strtoul(p, const_cast<char**>(&p), 10)));
        if (*p == ',') ++p;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--rounds=N] [--rules=10,1000,10000]\n", argv[0]);
      return 2;
    }
  }
  if (counts.empty() || rounds < 1) Die("nothing to measure");
  for (uint32_t n : counts)
    if (n == 0 || n > kPeerIdentities - 1) Die("--rules: each count in 1..19999");

  const int empty_fd = EmptyTcProgram();
  std::vector<std::unique_ptr<Variant>> variants;
  std::fprintf(stderr, "policy_packet_bench: %u ipcache entries per datapath\n", kIpcachePods);
  variants.push_back(MakeVariant("policy off (no sluice_policy_ep entry)", Mode::kOff, 0));
  variants.push_back(MakeVariant("open (entry, no direction enforced)", Mode::kOpen, 0));
  for (uint32_t n : counts) {
    std::fprintf(stderr, "policy_packet_bench: programming %u rules per direction\n", n);
    variants.push_back(MakeVariant(absl::StrFormat("%u rules", n), Mode::kEnforced, n));
  }
  for (auto& v : variants) Validate(*v);

  std::vector<Case> cases;
  cases.push_back(
      {"empty TC program", nullptr, Point::kEgress, empty_fd, Egress(PeerAddr(0)), kTcOk, {}});
  for (auto& v : variants) {
    cases.push_back({absl::StrCat("egress  ", v->name),
                     v.get(),
                     Point::kEgress,
                     v->dp->from_pod_fd(),
                     Egress(v->peer),
                     kTcOk,
                     {}});
    cases.push_back({absl::StrCat("ingress ", v->name),
                     v.get(),
                     Point::kIngress,
                     v->dp->to_pod_fd(),
                     Ingress(v->peer),
                     kTcOk,
                     {}});
    cases.push_back({absl::StrCat("pod->pod ", v->name),
                     v.get(),
                     Point::kPodToPod,
                     v->dp->from_pod_fd(),
                     PodToPod(),
                     kTcRedirect,
                     {}});
  }

  std::mt19937 rng(42);
  std::vector<size_t> order(cases.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (int round = 0; round < rounds; ++round) {
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t idx : order) {
      Case& cs = cases[idx];
      std::vector<uint32_t> ns;
      ns.reserve(kBatch);
      for (int k = 0; k < kBatch; ++k) {
        auto r = TestRun(cs.fd, cs.in);
        if (r.verdict != cs.verdict) Die(cs.label + ": verdict changed");
        ns.push_back(r.ns);
      }
      cs.rounds.push_back(InterquartileMean(ns));
    }
  }

  const double empty = Median(cases[0].rounds);
  std::printf(
      "\n== NetworkPolicy verdict per packet: BPF_PROG_TEST_RUN kernel duration, repeat=1, "
      "median over %d rounds of the interquartile mean of %d runs; %u ipcache entries\n",
      rounds, kBatch, kIpcachePods + 2);
  std::printf("%-50s %9s %10s\n", "case", "ns/pkt", "- empty");
  std::map<std::pair<Point, std::string>, double> med;
  for (auto& cs : cases) {
    double m = Median(cs.rounds);
    if (cs.variant) med[{cs.point, cs.variant->name}] = m;
    std::printf("%-50s %9.1f %10.1f\n", cs.label.c_str(), m, m - empty);
  }
  const std::string lo = absl::StrFormat("%u rules", counts.front());
  const std::string hi = absl::StrFormat("%u rules", counts.back());
  const std::string off = variants[0]->name, open = variants[1]->name;
  std::printf("\n");
  for (Point egress : {Point::kEgress, Point::kIngress}) {
    const char* dir = egress == Point::kEgress ? "egress " : "ingress";
    double a = med[{egress, lo}], b = med[{egress, hi}];
    std::printf("%s: %u/%u rules = %.3fx (target <= 1.1); over empty: %.3fx\n", dir, counts.back(),
                counts.front(), b / a, (b - empty) / (a - empty));
    for (uint32_t n : counts) {
      double e = med[{egress, absl::StrFormat("%u rules", n)}];
      std::printf("%s: %u rules vs policy off %.3fx (+%.1f ns), vs open %.3fx (+%.1f ns)\n", dir, n,
                  e / med[{egress, off}], e - med[{egress, off}], e / med[{egress, open}],
                  e - med[{egress, open}]);
    }
  }
  // Both policy points of a flow between two pods of this node, in one program.
  const double p2p_off = med[{Point::kPodToPod, off}] - empty;
  const double p2p_open = med[{Point::kPodToPod, open}] - empty;
  const double one_point = med[{Point::kEgress, open}] - med[{Point::kEgress, off}];
  std::printf(
      "pod -> pod on this node: open %.1f ns over empty vs policy off %.1f: +%.1f ns for two "
      "policy points (one open egress point alone: +%.1f ns)\n",
      p2p_open, p2p_off, p2p_open - p2p_off, one_point);
  for (uint32_t n : counts) {
    double e = med[{Point::kPodToPod, absl::StrFormat("%u rules", n)}] - empty;
    std::printf("pod -> pod on this node: %u rules %.1f ns over empty, +%.1f ns over policy off\n",
                n, e, e - p2p_off);
  }
  return 0;
}
