// Per-packet cost of Service load balancing in sluice_from_pod at 1, 1k, 10k and 100k Services,
// measured with BPF_PROG_TEST_RUN next to an empty TC program timed the same way in the same
// process. The claims are the ratio 100k/1 Services (O(1) in the number of Services) and the
// cost over the empty program.
//
// How the numbers are made:
// - test_run reuses one skb for all `repeat` runs and map side effects persist, so repeat > 1
//   would time the DNATed packet (no longer addressed to a Service) after run 1, and a CT hit
//   after the first "new" flow. Every syscall here is therefore repeat = 1 on a fresh copy of the
//   input, and the figure is the kernel-reported duration (ktime around the single run: the
//   program, the run loop's overhead and one ktime read; no syscall, skb allocation or copies).
//   The empty program measured with repeat = 1 carries the same overhead, so "- empty" is the
//   program's own work.
// - (a) first packet: a new flow every syscall (16 client pods x distinct source ports), so each
//   run misses conntrack, selects a backend and creates the flow's CT entry (one flow entry).
//   The flows of a batch are deleted from sluice_ct4 after the batch (not timed), so every batch
//   starts with the same CT fill. (b) established: one flow set up once, then the same ACK every
//   syscall: CT hit. (c) reply: the backend's ACK back to the client on that flow (which keeps
//   its backend across the batches): the flow entry hit from the reply side, reverse NAT
//   to the ClusterIP, redirect to the client pod. (The backend pods' endpoints name lo, the
//   interface test_run receives on, so that their packets pass the source check.)
// - The probed Service is the last one programmed; its 3 backends are same-node pods, so both
//   cases run the whole path (service lookup, CT, DNAT, checksums, redirect to the backend pod).
//   Each case is validated before timing: verdict redirect, destination address and port one of
//   the probed Service's backends, the backend pod's MAC, both checksums valid.
// - In the same rounds: the floor of this design (bench/bpf/lb_floor.bpf.c: one hash lookup and
//   a DNAT with direct writes and inline checksums; bench_floor_l4 with the TCP checksum through
//   bpf_l4_csum_replace), non-service pod -> pod traffic through sluice_from_pod, and the same
//   through sluice_from_pod built without its LB step (bench/bpf/pod_egress_no_lb.bpf.c), i.e.
//   what pod -> pod cost before Services, against the same maps. Both validated like the rest.
//   Ports are vouched free of backends (sluice_lb4_nbport) as the agent does after a full sync;
//   the pod -> pod case also runs with nothing vouched (the cost of the reverse NAT lookup the
//   map spares).
// - With --katran_obj=PATH, in the same rounds: Facebook's Katran (its XDP balancer built from its
//   own sources, bench/katran.h), programmed with the probed Service's ClusterIP as its VIP and
//   the probed backends as its reals, given the very packets Sluice's cases get: (a) new flow, a
//   fresh 5-tuple every syscall, a SYN (Katran goes straight to its consistent hashing ring and
//   records the flow in its connection table), and the same as an ACK (a connection table miss
//   first); (b) established, the probe flow's ACK (a connection table hit). Katran's figures are
//   over an empty XDP program timed the same way, Sluice's over the empty TC program; the bench
//   prints Sluice / Katran. Each Katran case is validated before timing (XDP_TX, the original IPv4
//   packet unchanged inside an IPIP header to one of the reals, the router's MAC) and every new
//   flow batch is checked to have recorded every flow (Katran stops recording flows when a CPU
//   sees too many new ones per second, which would make its new flow cheaper). The process is
//   pinned to one CPU (Katran's connection tables are per CPU).
// - With --baseline_obj=PATH (repeatable): a sluice_pod_egress object built from another tree
//   (the code before a change, or a scratch build with a step removed), its sluice_from_pod
//   loaded on the first cluster's maps and timed in the same rounds (first packet, established,
//   pod -> pod), validated like the rest: old vs new in one run.
// - Rounds interleave all cases in a shuffled order; each round takes the interquartile mean of
//   its syscalls (the ns-granular u32 duration and interrupts make single runs coarse); the table
//   shows the median over rounds.
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/bpf.h>
#include <sched.h>

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
#include "agent/service/maglev.h"
#include "bench_lb_floor.skel.h"
#include "bench_pod_egress_no_lb.skel.h"
#include "katran.h"
#include "lb_cluster.h"
#include "loader/backend_ports.h"
#include "loader/datapath.h"
#include "loader/skeleton.h"
#include "support/fixture.h"
#include "support/packet.h"
#include "test_run.h"

namespace sluice::loader {
SLUICE_SKELETON_OPS(bench_lb_floor);
SLUICE_SKELETON_OPS(bench_pod_egress_no_lb);
}  // namespace sluice::loader

namespace sluice::bench {
namespace {

// Must match bench/bpf/lb_floor.bpf.c (a bench-only map, not part of the map ABI).
struct FloorKey {
  uint32_t addr;
  uint16_t port;
  uint8_t proto;
  uint8_t pad;
};
struct FloorBackend {
  uint32_t addr;
  uint16_t port;
  uint16_t pad;
  uint32_t ifindex;
  uint8_t mac[6];
  uint8_t pad2[2];
};
static_assert(sizeof(FloorKey) == 8 && sizeof(FloorBackend) == 20);

using testing::Bytes;
using testing::Ip4;
using testing::kTcOk;
using testing::kTcRedirect;
using testing::Mac;
using testing::Packet;
using testing::ParseMac;

constexpr int kIfindex = 1;  // lo: test_run receives on it, so the source check passes
constexpr uint32_t kBackendsPerService = 3;
constexpr int kClients = 16;  // 10.244.0.100 .. 115
constexpr int kBatch = 2000;  // syscalls per case per round
constexpr uint16_t kFirstSport = 1024;
const Mac kClientMac = ParseMac("02:00:00:00:0a:01");
const Mac kClientHostMac = ParseMac("02:aa:00:00:0a:02");
const Mac kRouterMac = ParseMac("02:ee:00:00:00:01");  // Katran's default router

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "lb_packet_bench: %s\n", what.c_str());
  std::exit(1);
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

std::string ClientIp(int c) { return absl::StrFormat("10.244.0.%d", 100 + c); }
std::string Dotted(uint32_t be) { return testing::FormatIp4(be); }

Bytes ToService(uint32_t n, int client, uint16_t sport, uint8_t flags) {
  return Packet::Eth(kClientMac, kClientHostMac)
      .IPv4(ClientIp(client), Dotted(ClusterIp(n - 1)))
      .TCP(sport, kServicePort, flags)
      .Payload("GET / HTTP/1.1\r\n\r\n")
      .Build();
}

Mac BackendPodMac(int j) { return ParseMac(absl::StrFormat("02:00:00:00:b0:%02x", j + 1)); }

// One datapath per Service count, each on its own bpffs so all four coexist and rounds can
// interleave them.
struct Cluster {
  uint32_t n = 0;
  std::unique_ptr<testing::ScratchBpffs> bpffs;
  std::unique_ptr<loader::Datapath> dp;
  std::vector<LbBackend> probed;
  uint32_t next_flow = 0;  // for (a): client and source port of the next new flow
};

void AddEndpoint(loader::Datapath& dp, uint32_t addr, const Mac& mac, const Mac& host_mac,
                 int ifindex, uint32_t id) {
  sluice_ep4_key key{addr};
  sluice_endpoint ep{};
  ep.ifindex = ifindex;
  std::memcpy(ep.mac, mac.data(), 6);
  std::memcpy(ep.host_mac, host_mac.data(), 6);
  ep.endpoint_id = id;
  if (auto st = dp.endpoint_table().Upsert(key.addr, ep); !st.ok()) Die(st.ToString());
}

// Vouches for every port but the backends', or for none.
void SetVouched(Cluster& c, bool on) {
  loader::NonBackendPorts ports(c.dp->lb4_non_backend_ports());
  if (on) {
    if (auto v = ports.Vouch({htons(kBackendPort)}, {}); !v.ok()) Die(v.status().ToString());
    return;
  }
  for (__u32 w = 0; w < SLUICE_LB4_NBPORT_WORDS; ++w) {
    if (auto st = c.dp->lb4_non_backend_ports().Update(w, 0); !st.ok()) Die(st.ToString());
  }
}

std::unique_ptr<Cluster> MakeCluster(uint32_t n) {
  auto c = std::make_unique<Cluster>();
  c->n = n;
  c->bpffs = std::make_unique<testing::ScratchBpffs>();
  auto dp = loader::Datapath::Load(c->bpffs->path());
  if (!dp.ok()) Die(absl::StrCat("Datapath::Load: ", dp.status().ToString()));
  c->dp = std::move(*dp);
  // The node as the agent configures it: pods 10.244.0.0/16 behind gateway 10.244.0.1, the
  // ClusterIP range 172.30.0.0/15 (lb_cluster.h: up to 131071 Services).
  sluice_node_config cfg{};
  cfg.pod_cidr4 = Ip4("10.244.0.0");
  cfg.pod_cidr4_len = 16;
  cfg.gateway_ip4 = Ip4("10.244.0.1");
  cfg.service_cidr4 = htonl(kClusterIpBase);
  cfg.service_cidr4_len = 15;
  if (auto st = c->dp->node_config().Update(0, cfg); !st.ok()) Die(st.ToString());
  for (int i = 0; i < kClients; ++i)
    AddEndpoint(*c->dp, Ip4(ClientIp(i)), kClientMac, kClientHostMac, kIfindex, 1 + i);
  for (uint32_t j = 0; j < kBackendsPerService; ++j) {
    uint32_t addr = Ip4(absl::StrFormat("10.244.0.%d", 21 + j));
    AddEndpoint(*c->dp, addr, BackendPodMac(j), kClientHostMac, kIfindex, 100 + j);
    c->probed.push_back({(n - 1) * kBackendsPerService + j + 1, addr, kBackendPort});
  }
  if (auto st = ProgramCluster(*c->dp, n, kBackendsPerService, c->probed); !st.ok())
    Die(absl::StrCat(n, " services: ", st.ToString()));
  // As the agent's pruning pass does: every port but the backends' is vouched free of backends.
  SetVouched(*c, true);
  // As the agent's conntrack GC does after a pass that found no flow with a forward and a reply
  // entry (none is made here): the datapath skips their lookups (maps/conntrack.h).
  if (auto st = c->dp->ct_pairs().Update(SLUICE_CT_PAIRS_CLEAR, 1); !st.ok()) Die(st.ToString());
  auto count = c->dp->lb4_services().Count();
  if (!count.ok() || *count != n * (kBackendsPerService + 1))
    Die(absl::StrCat("sluice_lb4_svc holds ", count.ok() ? *count : 0, " entries, want ",
                     n * (kBackendsPerService + 1)));
  return c;
}

// Index of the probed backend a packet was DNATed and redirected to, or -1.
int CheckDnat(const Cluster& c, const RunOut& r) {
  if (r.verdict != kTcRedirect) return -1;
  auto d = testing::Decode(r.out);
  if (!d || !d->ip_csum_ok || !d->l4_csum_ok) return -1;
  for (size_t j = 0; j < c.probed.size(); ++j) {
    if (d->ip_dst == c.probed[j].addr && d->dport == c.probed[j].port &&
        d->eth_dst == BackendPodMac(static_cast<int>(j)))
      return static_cast<int>(j);
  }
  return -1;
}

// Deletes the new flows a batch made; the probe flow (client 0, port 999), which the established
// and reply cases time, keeps its entries and its backend.
void ClearCt(Cluster& c) {
  const uint32_t probe_client = Ip4(ClientIp(0));
  const uint16_t probe_port = htons(999);
  std::vector<sluice_ct4_key> keys;
  auto st = c.dp->ct4().ForEach([&](const sluice_ct4_key& k, const sluice_ct4_entry&) {
    const bool probe = (k.saddr == probe_client && k.sport == probe_port) ||
                       (k.daddr == probe_client && k.dport == probe_port);
    if (!probe) keys.push_back(k);
  });
  if (!st.ok()) Die(st.ToString());
  for (const auto& k : keys) (void)c.dp->ct4().Delete(k);
}

// to_maglev: to the probed Service's Maglev twin (ProgramMaglevTwin) instead.
Bytes NextNewFlow(Cluster& c, bool to_maglev = false) {
  const uint32_t ports = 65535 - kFirstSport;
  uint32_t f = c.next_flow++;
  int client = static_cast<int>((f / ports) % kClients);
  return ToService(to_maglev ? c.n + 1 : c.n, client,
                   static_cast<uint16_t>(kFirstSport + f % ports), sluice::testing::kTcpSyn);
}

// The probed Service again at the next ClusterIP (ClusterIp(n)), with the same backends, as the
// agent writes a Maglev frontend: its table (agent/service/maglev.h, kDefaultMaglevTableSize
// slots) swapped into sluice_lb4_mag, then the master with SLUICE_SVC_F_MAGLEV.
void ProgramMaglevTwin(Cluster& c) {
  const uint32_t addr = ClusterIp(c.n);
  if (auto st = ProgramService(*c.dp, addr, kServicePort, c.n + 1, c.probed); !st.ok())
    Die(absl::StrCat("Maglev twin: ", st.ToString()));
  std::vector<sluice::agent::MaglevBackend> identities;
  for (const LbBackend& b : c.probed) identities.push_back({b.addr, b.port, IPPROTO_TCP, 1});
  std::vector<uint32_t> table;
  for (uint32_t i : sluice::agent::MaglevTable(identities, sluice::agent::kDefaultMaglevTableSize))
    table.push_back(c.probed[i].id);
  auto fd = sluice::maps::MaglevTables::Create(table);
  if (!fd.ok()) Die(fd.status().ToString());
  if (auto st = c.dp->lb4_maglev().Swap(SvcKey(addr, kServicePort, 0), *fd); !st.ok())
    Die(st.ToString());
  auto master = c.dp->lb4_services().Lookup(SvcKey(addr, kServicePort, 0));
  if (!master.ok()) Die(master.status().ToString());
  master->flags |= SLUICE_SVC_F_MAGLEV;
  if (auto st = c.dp->lb4_services().Update(SvcKey(addr, kServicePort, 0), *master); !st.ok())
    Die(st.ToString());
}

// Non-service pod -> pod: client 0 to the probed Service's first backend pod, directly.
Bytes PodToPod(const Cluster& c) {
  return Packet::Eth(kClientMac, kClientHostMac)
      .IPv4(ClientIp(0), Dotted(c.probed[0].addr))
      .TCP(40000, kBackendPort, sluice::testing::kTcpAck)
      .Payload("GET / HTTP/1.1\r\n\r\n")
      .Build();
}

// A pod -> pod packet delivered unchanged to backend pod 0.
bool CheckPodToPod(const Cluster& c, const RunOut& r) {
  if (r.verdict != kTcRedirect) return false;
  auto d = testing::Decode(r.out);
  return d && d->ip_csum_ok && d->l4_csum_ok && d->ip_dst == c.probed[0].addr &&
         d->dport == c.probed[0].port && d->eth_dst == BackendPodMac(0);
}

// Index of the real a Katran run encapsulated `in` to, or -1: XDP_TX, the router's MAC, an IPIP
// header with a valid checksum to one of the reals, and the original IPv4 packet unchanged inside.
int CheckKatran(const Katran& k, const Bytes& in, const RunOut& r) {
  constexpr size_t kEth = 14, kIp = 20;
  if (r.verdict != kXdpTx || r.out.size() != in.size() + kIp) return -1;
  auto d = testing::Decode(r.out);
  if (!d || d->ethertype != 0x0800 || d->proto != IPPROTO_IPIP || !d->ip_csum_ok ||
      d->eth_dst != kRouterMac || !std::equal(in.begin(), in.begin() + 6, d->eth_src.begin()))
    return -1;
  if (!std::equal(in.begin() + kEth, in.end(), r.out.begin() + kEth + kIp)) return -1;
  for (size_t j = 0; j < k.reals(); ++j)
    if (d->ip_dst == k.real(j)) return static_cast<int>(j);
  return -1;
}

RunOut XdpRun(int prog_fd, const Bytes& in) {
  RunOut r;
  if (!RunXdp(prog_fd, in, &r))
    Die(absl::StrCat("BPF_PROG_TEST_RUN (XDP): ", std::strerror(errno)));
  return r;
}

// A sluice_pod_egress object built elsewhere (--baseline_obj), loaded on the maps pinned under
// pin_root. Its sluice_from_pod's fd.
int LoadBaselineObject(const std::string& path, const std::string& pin_root) {
  LIBBPF_OPTS(bpf_object_open_opts, opts, .pin_root_path = pin_root.c_str());
  struct bpf_object* obj = bpf_object__open_file(path.c_str(), &opts);
  if (!obj) Die(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  if (int err = bpf_object__load(obj); err)
    Die(absl::StrCat("load ", path, " on the pins under ", pin_root, ": ", std::strerror(-err)));
  struct bpf_program* prog = bpf_object__find_program_by_name(obj, "sluice_from_pod");
  if (!prog) Die(absl::StrCat(path, ": no program sluice_from_pod"));
  return bpf_program__fd(prog);  // the object lives as long as the process
}

enum class Kind {
  kEmpty,
  kEmptyXdp,
  kKatranNew,
  kKatranMiss,
  kKatranEstablished,
  kBaseFirst,
  kBaseEstablished,
  kBasePodToPod,
  kFirst,
  kEstablished,
  kReply,
  kFloor,
  kFloorL4,
  kPodToPod,
  kPodToPodNoLb,
  kPodToPodUnvouched,
  kFirstMaglev,
};

struct Case {
  std::string label;
  Kind kind;
  Cluster* cluster;  // null for the empty program
  std::vector<double> rounds;
  int fd = -1;      // the program, when not the cluster's sluice_from_pod
  Bytes in = {};    // the packet, for the cases that run one packet
  size_t base = 0;  // which --baseline_obj, for the kBase* cases
};

}  // namespace
}  // namespace sluice::bench

int main(int argc, char** argv) {
  using namespace sluice::bench;
  int rounds = 9;
  std::vector<uint32_t> counts = {1, 1000, 10000, 100000};
  std::string katran_obj;
  std::vector<std::string> baseline_objs;
  uint32_t katran_lru = SLUICE_CT4_MAX_ENTRIES;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--katran_obj=", 0) == 0) {
      katran_obj = a.substr(13);
    } else if (a.rfind("--katran_lru=", 0) == 0) {
      katran_lru = static_cast<uint32_t>(std::strtoul(a.c_str() + 13, nullptr, 10));
    } else if (a.rfind("--baseline_obj=", 0) == 0) {
      baseline_objs.push_back(a.substr(15));
    } else if (a.rfind("--rounds=", 0) == 0) {
      rounds = std::atoi(a.c_str() + 9);
    } else if (a.rfind("--services=", 0) == 0) {
      counts.clear();
      for (const char* p = a.c_str() + 11; *p;) {
        counts.push_back(static_cast<uint32_t>(std::strtoul(p, const_cast<char**>(&p), 10)));
        if (*p == ',') ++p;
      }
    } else {
      std::fprintf(stderr,
                   "usage: %s [--rounds=N] [--services=1,1000,10000,100000] "
                   "[--katran_obj=PATH [--katran_lru=FLOWS_PER_CPU]] [--baseline_obj=PATH]...\n",
                   argv[0]);
      return 2;
    }
  }
  // Katran's connection tables are per CPU: the established flow is a hit only on the CPU that
  // recorded it. Every case then runs on one CPU.
  if (!katran_obj.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) != 0) Die("sched_getaffinity");
    if (CPU_COUNT(&set) != 1) {
      const int cpu = sched_getcpu();
      CPU_ZERO(&set);
      CPU_SET(cpu, &set);
      if (sched_setaffinity(0, sizeof(set), &set) != 0) Die("sched_setaffinity");
      std::fprintf(stderr, "lb_packet_bench: pinned to CPU %d (taskset -c N chooses)\n", cpu);
    }
  }

  const int empty_fd = EmptyTcProgram();
  std::vector<std::unique_ptr<Cluster>> clusters;
  for (uint32_t n : counts) {
    std::fprintf(stderr, "lb_packet_bench: programming %u services x %u backends\n", n,
                 kBackendsPerService);
    clusters.push_back(MakeCluster(n));
  }

  // The established flow of each cluster and its backend's reply, and validation of the cases.
  std::map<Cluster*, Bytes> established, reply;
  for (auto& c : clusters) {
    auto syn = ToService(c->n, 0, 999, sluice::testing::kTcpSyn);
    auto first = TestRun(c->dp->from_pod_fd(), syn);
    int be = CheckDnat(*c, first);
    if (be < 0)
      Die(absl::StrCat(c->n, " services, new flow: ", sluice::testing::Describe(first.out)));
    established[c.get()] = ToService(c->n, 0, 999, sluice::testing::kTcpAck);
    reply[c.get()] = Packet::Eth(BackendPodMac(be), kClientHostMac)
                         .IPv4(Dotted(c->probed[be].addr), ClientIp(0))
                         .TCP(kBackendPort, 999, sluice::testing::kTcpAck)
                         .Payload("HTTP/1.1 200 OK\r\n\r\n")
                         .Build();
    auto back = TestRun(c->dp->from_pod_fd(), reply[c.get()]);
    auto d = sluice::testing::Decode(back.out);
    if (back.verdict != kTcRedirect || !d || !d->ip_csum_ok || !d->l4_csum_ok ||
        d->ip_src != ClusterIp(c->n - 1) || d->sport != kServicePort ||
        d->ip_dst != Ip4(ClientIp(0)) || d->eth_dst != kClientMac)
      Die(absl::StrCat(c->n, " services, reply: ", sluice::testing::Describe(back.out)));
    for (int k = 0; k < 3; ++k) {
      auto r = TestRun(c->dp->from_pod_fd(), established[c.get()]);
      if (CheckDnat(*c, r) != be)
        Die(absl::StrCat(c->n, " services, established flow left its backend: ",
                         sluice::testing::Describe(r.out)));
    }
    // New flows land on every backend of the probed service.
    std::vector<int> hits(kBackendsPerService, 0);
    for (int k = 0; k < 300; ++k) {
      auto r = TestRun(c->dp->from_pod_fd(), NextNewFlow(*c));
      int j = CheckDnat(*c, r);
      if (j < 0) Die(absl::StrCat(c->n, " services, new flow: ", sluice::testing::Describe(r.out)));
      ++hits[j];
    }
    for (int h : hits)
      if (h == 0) Die(absl::StrCat(c->n, " services: a backend never selected in 300 new flows"));
    ClearCt(*c);
    (void)TestRun(c->dp->from_pod_fd(), syn);  // re-create the established flow
  }

  // The floor, programmed with the first cluster's probed Service and backend 0; and the
  // program without LB, on the first cluster's maps.
  Cluster& c0 = *clusters.front();
  auto floor = sluice::loader::Skeleton<bench_lb_floor>::OpenAndLoad(c0.bpffs->path());
  if (!floor.ok()) Die(absl::StrCat("load bench_lb_floor: ", floor.status().ToString()));
  FloorKey fkey{ClusterIp(c0.n - 1), htons(kServicePort), IPPROTO_TCP, 0};
  FloorBackend fbe{};
  fbe.addr = c0.probed[0].addr;
  fbe.port = htons(c0.probed[0].port);
  fbe.ifindex = 4000;
  auto mac0 = BackendPodMac(0);
  std::memcpy(fbe.mac, mac0.data(), 6);
  if (bpf_map_update_elem(bpf_map__fd((**floor)->maps.bench_floor4), &fkey, &fbe, BPF_ANY))
    Die(absl::StrCat("bench_floor4 update: ", std::strerror(errno)));
  auto no_lb = sluice::loader::Skeleton<bench_pod_egress_no_lb>::OpenAndLoad(c0.bpffs->path());
  if (!no_lb.ok()) Die(absl::StrCat("load bench_pod_egress_no_lb: ", no_lb.status().ToString()));
  const int floor_fd = bpf_program__fd((**floor)->progs.bench_floor);
  const int floor_l4_fd = bpf_program__fd((**floor)->progs.bench_floor_l4);
  const int no_lb_fd = bpf_program__fd((**no_lb)->progs.sluice_from_pod);
  const Bytes floor_in = ToService(c0.n, 0, 999, sluice::testing::kTcpAck);
  for (int fd : {floor_fd, floor_l4_fd})
    if (CheckDnat(c0, TestRun(fd, floor_in)) != 0)
      Die(absl::StrCat("floor program: ", sluice::testing::Describe(TestRun(fd, floor_in).out)));
  const Bytes p2p_in = PodToPod(c0);
  for (int fd : {c0.dp->from_pod_fd(), no_lb_fd})
    if (!CheckPodToPod(c0, TestRun(fd, p2p_in)))
      Die(absl::StrCat("pod -> pod: ", sluice::testing::Describe(TestRun(fd, p2p_in).out)));

  // The Maglev twin of the first cluster's probed Service: new flows land on every backend, and
  // a flow given again after its conntrack entry is gone lands where it did.
  ProgramMaglevTwin(c0);
  {
    std::vector<int> hits(kBackendsPerService, 0);
    std::vector<Bytes> flows;
    std::vector<int> first;
    for (int k = 0; k < 300; ++k) {
      flows.push_back(NextNewFlow(c0, true));
      int j = CheckDnat(c0, TestRun(c0.dp->from_pod_fd(), flows.back()));
      if (j < 0) Die("Maglev twin, new flow: " + sluice::testing::Describe(flows.back()));
      ++hits[j];
      first.push_back(j);
    }
    for (int h : hits)
      if (h == 0) Die("Maglev twin: a backend never selected in 300 new flows");
    ClearCt(c0);
    for (int k = 0; k < 300; ++k)
      if (CheckDnat(c0, TestRun(c0.dp->from_pod_fd(), flows[k])) != first[k])
        Die("Maglev twin: a flow seen again without conntrack changed its backend");
    ClearCt(c0);
  }

  // Katran, programmed with the first cluster's probed Service as its VIP and its backends as
  // its reals, fed the same packets.
  std::unique_ptr<Katran> katran;
  int empty_xdp_fd = -1;
  uint32_t katran_next_flow = 0;  // as Cluster::next_flow, for Katran's new flows
  auto katran_new_flow = [&](uint8_t flags) {
    const uint32_t ports = 65535 - kFirstSport;
    uint32_t f = katran_next_flow++;
    return ToService(c0.n, static_cast<int>((f / ports) % kClients),
                     static_cast<uint16_t>(kFirstSport + f % ports), flags);
  };
  const uint32_t probe_client = Ip4(ClientIp(0));
  // Deletes a batch's flows from Katran's connection tables (untimed) and checks that it
  // recorded every one of them: under a new-flow rate it takes for a flood, Katran stops
  // recording flows, which would time a cheaper path.
  auto katran_clear = [&](size_t expected, const std::string& what) {
    auto n = katran->ClearFlows(probe_client, htons(999));
    if (!n.ok()) Die(n.status().ToString());
    if (*n != expected)
      Die(absl::StrCat(what, ": Katran recorded ", *n, " of ", expected, " new flows"));
  };
  const Bytes katran_est_in = ToService(c0.n, 0, 999, sluice::testing::kTcpAck);
  if (!katran_obj.empty()) {
    std::vector<uint32_t> reals;
    for (const auto& b : c0.probed) reals.push_back(b.addr);
    auto k =
        Katran::Load(katran_obj, ClusterIp(c0.n - 1), kServicePort, reals, katran_lru, kRouterMac);
    if (!k.ok()) Die(absl::StrCat("Katran: ", k.status().ToString()));
    katran = std::move(*k);
    empty_xdp_fd = LoadEmptyXdpProgram();
    if (empty_xdp_fd < 0) Die(absl::StrCat("load empty XDP program: ", std::strerror(errno)));
    // The probe flow: its SYN records it, its ACKs stay on the same real.
    const Bytes syn = ToService(c0.n, 0, 999, sluice::testing::kTcpSyn);
    int real = CheckKatran(*katran, syn, XdpRun(katran->prog_fd(), syn));
    if (real < 0)
      Die(absl::StrCat("Katran, SYN: ",
                       sluice::testing::Describe(XdpRun(katran->prog_fd(), syn).out)));
    for (int k2 = 0; k2 < 3; ++k2) {
      auto r = XdpRun(katran->prog_fd(), katran_est_in);
      if (CheckKatran(*katran, katran_est_in, r) != real)
        Die(absl::StrCat("Katran, established flow left its real: ",
                         sluice::testing::Describe(r.out)));
    }
    // New flows (SYN, and ACK: a connection table miss) land on every real.
    for (uint8_t flags : {sluice::testing::kTcpSyn, sluice::testing::kTcpAck}) {
      std::vector<int> hits(katran->reals(), 0);
      for (int k2 = 0; k2 < 300; ++k2) {
        auto in = katran_new_flow(flags);
        int j = CheckKatran(*katran, in, XdpRun(katran->prog_fd(), in));
        if (j < 0)
          Die(absl::StrCat("Katran, new flow: ",
                           sluice::testing::Describe(XdpRun(katran->prog_fd(), in).out)));
        ++hits[j];
      }
      for (int h : hits)
        if (h == 0) Die("Katran: a real never selected in 300 new flows");
      katran_clear(300, "Katran validation");
    }
  }
  // The code before a change (--baseline_obj), on the first cluster's maps.
  std::vector<int> base_fds;
  for (const auto& path : baseline_objs) {
    const int base_fd = LoadBaselineObject(path, c0.bpffs->path());
    base_fds.push_back(base_fd);
    if (!CheckPodToPod(c0, TestRun(base_fd, p2p_in)))
      Die(absl::StrCat("baseline pod -> pod: ",
                       sluice::testing::Describe(TestRun(base_fd, p2p_in).out)));
    if (CheckDnat(c0, TestRun(base_fd, established[&c0])) < 0)
      Die("baseline: established flow not sent to a backend");
    for (int k2 = 0; k2 < 300; ++k2) {
      auto r = TestRun(base_fd, NextNewFlow(c0));
      if (CheckDnat(c0, r) < 0)
        Die(absl::StrCat("baseline new flow: ", sluice::testing::Describe(r.out)));
    }
    ClearCt(c0);
  }

  std::vector<Case> cases;
  cases.push_back({"empty TC program (r0 = 0; exit)", Kind::kEmpty, nullptr, {}});
  if (katran) {
    cases.push_back({"empty XDP program (r0 = XDP_PASS)", Kind::kEmptyXdp, &c0, {}});
    cases.push_back({"Katran new flow (SYN)", Kind::kKatranNew, &c0, {}});
    cases.push_back({"Katran new flow (ACK: conn table miss)", Kind::kKatranMiss, &c0, {}});
    cases.push_back({"Katran established (conn table hit)", Kind::kKatranEstablished, &c0, {}});
  }
  for (size_t b = 0; b < base_fds.size(); ++b) {
    const std::string obj = absl::StrCat("baseline obj ", b + 1, ": ");
    cases.push_back({obj + "first packet", Kind::kBaseFirst, &c0, {}, base_fds[b], {}, b});
    cases.push_back(
        {obj + "established", Kind::kBaseEstablished, &c0, {}, base_fds[b], established[&c0], b});
    cases.push_back({obj + "pod -> pod", Kind::kBasePodToPod, &c0, {}, base_fds[b], p2p_in, b});
  }
  cases.push_back(
      {"floor: 1 lookup + DNAT, inline csums", Kind::kFloor, &c0, {}, floor_fd, floor_in});
  cases.push_back(
      {"floor, L4 csum by bpf_l4_csum_replace", Kind::kFloorL4, &c0, {}, floor_l4_fd, floor_in});
  cases.push_back(
      {"pod -> pod, no service", Kind::kPodToPod, &c0, {}, c0.dp->from_pod_fd(), p2p_in});
  cases.push_back(
      {"pod -> pod, from_pod without LB", Kind::kPodToPodNoLb, &c0, {}, no_lb_fd, p2p_in});
  // The same with sluice_lb4_nbport all zero (nothing vouched): what the LB step cost before
  // the agent vouched for ports, a reverse NAT conntrack lookup that misses.
  cases.push_back({"pod -> pod, no service, no port vouched",
                   Kind::kPodToPodUnvouched,
                   &c0,
                   {},
                   c0.dp->from_pod_fd(),
                   p2p_in});
  cases.push_back({absl::StrFormat("(a) first packet, Maglev,    %u svc", c0.n),
                   Kind::kFirstMaglev,
                   &c0,
                   {}});
  for (auto& c : clusters) {
    cases.push_back(
        {absl::StrFormat("(a) first packet (CT miss), %u svc", c->n), Kind::kFirst, c.get(), {}});
    cases.push_back({absl::StrFormat("(b) established (CT hit),   %u svc", c->n),
                     Kind::kEstablished,
                     c.get(),
                     {}});
    cases.push_back(
        {absl::StrFormat("(c) reply (reverse NAT),    %u svc", c->n), Kind::kReply, c.get(), {}});
  }

  std::mt19937 rng(42);
  std::vector<size_t> order(cases.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const Bytes empty_in = ToService(1, 0, 999, sluice::testing::kTcpAck);
  for (int round = 0; round < rounds; ++round) {
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t idx : order) {
      Case& cs = cases[idx];
      std::vector<uint32_t> ns;
      ns.reserve(kBatch);
      if (cs.kind == Kind::kEmpty) {
        for (int k = 0; k < kBatch; ++k) ns.push_back(TestRun(empty_fd, empty_in).ns);
      } else if (cs.kind == Kind::kEmptyXdp) {
        for (int k = 0; k < kBatch; ++k) ns.push_back(XdpRun(empty_xdp_fd, empty_in).ns);
      } else if (cs.kind == Kind::kKatranEstablished) {
        for (int k = 0; k < kBatch; ++k) {
          auto r = XdpRun(katran->prog_fd(), katran_est_in);
          if (r.verdict != kXdpTx) Die(cs.label + ": verdict changed");
          ns.push_back(r.ns);
        }
      } else if (cs.kind == Kind::kKatranNew || cs.kind == Kind::kKatranMiss) {
        std::vector<Bytes> flows;
        for (int k = 0; k < kBatch; ++k)
          flows.push_back(katran_new_flow(cs.kind == Kind::kKatranNew ? sluice::testing::kTcpSyn
                                                                      : sluice::testing::kTcpAck));
        for (const auto& in : flows) {
          auto r = XdpRun(katran->prog_fd(), in);
          if (r.verdict != kXdpTx) Die(cs.label + ": verdict changed");
          ns.push_back(r.ns);
        }
        katran_clear(kBatch, cs.label);
      } else if (cs.kind == Kind::kBaseFirst) {
        std::vector<Bytes> flows;
        for (int k = 0; k < kBatch; ++k) flows.push_back(NextNewFlow(c0));
        for (const auto& in : flows) {
          auto r = TestRun(cs.fd, in);
          if (r.verdict != kTcRedirect) Die(cs.label + ": verdict changed");
          ns.push_back(r.ns);
        }
        ClearCt(c0);
      } else if (cs.fd >= 0) {
        if (cs.kind == Kind::kPodToPodUnvouched) SetVouched(c0, false);
        for (int k = 0; k < kBatch; ++k) {
          auto r = TestRun(cs.fd, cs.in);
          if (r.verdict != kTcRedirect) Die(cs.label + ": verdict changed");
          ns.push_back(r.ns);
        }
        if (cs.kind == Kind::kPodToPodUnvouched) SetVouched(c0, true);
      } else if (cs.kind == Kind::kEstablished || cs.kind == Kind::kReply) {
        const Bytes& in = (cs.kind == Kind::kReply ? reply : established)[cs.cluster];
        for (int k = 0; k < kBatch; ++k) {
          auto r = TestRun(cs.cluster->dp->from_pod_fd(), in);
          if (r.verdict != kTcRedirect) Die(cs.label + ": verdict changed");
          ns.push_back(r.ns);
        }
      } else {
        std::vector<Bytes> flows;
        for (int k = 0; k < kBatch; ++k)
          flows.push_back(NextNewFlow(*cs.cluster, cs.kind == Kind::kFirstMaglev));
        for (const auto& in : flows) {
          auto r = TestRun(cs.cluster->dp->from_pod_fd(), in);
          if (r.verdict != kTcRedirect) Die(cs.label + ": verdict changed");
          ns.push_back(r.ns);
        }
        ClearCt(*cs.cluster);
      }
      cs.rounds.push_back(InterquartileMean(ns));
    }
  }

  const double empty = Median(cases[0].rounds);
  // bpf_stats_enabled adds two clock reads to every program run (the empty one too): the
  // "- empty" column is immune to it, the "x empty" ratio is not.
  std::string stats = "?";
  if (FILE* f = std::fopen("/proc/sys/kernel/bpf_stats_enabled", "r")) {
    char buf[8] = {};
    if (std::fgets(buf, sizeof(buf), f)) stats = std::string(1, buf[0]);
    std::fclose(f);
  }
  std::printf(
      "\n== Service LB in sluice_from_pod: BPF_PROG_TEST_RUN kernel duration, repeat=1, "
      "median over %d rounds of the interquartile mean of %d runs; %u backends per service; "
      "kernel.bpf_stats_enabled=%s\n",
      rounds, kBatch, kBackendsPerService, stats.c_str());
  std::printf("%-46s %9s %10s %10s\n", "case", "ns/pkt", "- empty", "x empty");
  std::map<std::pair<Kind, uint32_t>, double> med;
  std::map<std::pair<size_t, Kind>, double> base_med;
  for (auto& cs : cases) {
    double m = Median(cs.rounds);
    if (cs.cluster) med[{cs.kind, cs.cluster->n}] = m;
    if (cs.kind == Kind::kBaseFirst || cs.kind == Kind::kBaseEstablished ||
        cs.kind == Kind::kBasePodToPod)
      base_med[{cs.base, cs.kind}] = m;
    std::printf("%-46s %9.1f %10.1f %9.2fx\n", cs.label.c_str(), m, m - empty, m / empty);
  }
  // Everything over the empty program (the per-run overhead test_run adds to every case).
  const double floor_ns = med[{Kind::kFloor, c0.n}] - empty;
  const double floor_l4_ns = med[{Kind::kFloorL4, c0.n}] - empty;
  const double p2p = med[{Kind::kPodToPod, c0.n}] - empty;
  const double p2p_no_lb = med[{Kind::kPodToPodNoLb, c0.n}] - empty;
  std::printf("\nover the empty program, %u svc: floor %.1f ns (with the L4 csum helper %.1f ns)\n",
              c0.n, floor_ns, floor_l4_ns);
  std::printf("%-28s %9s %9s %9s %9s\n", "", "- empty", "target", "x floor", "- floor");
  auto row = [&](const char* what, double v, const char* target) {
    std::printf("%-28s %9.1f %9s %8.2fx %9.1f\n", what, v, target, v / floor_ns, v - floor_ns);
  };
  row("established (CT hit)", med[{Kind::kEstablished, c0.n}] - empty, "<= 180");
  row("first packet (CT miss)", med[{Kind::kFirst, c0.n}] - empty, "<= 600");
  row("reply (reverse NAT)", med[{Kind::kReply, c0.n}] - empty, "");
  row("pod -> pod, no service", p2p, "");
  row("pod -> pod, without LB", p2p_no_lb, "");
  std::printf("pod -> pod: the LB step costs non-service traffic %.1f ns (target <= 10)\n",
              p2p - p2p_no_lb);
  std::printf("pod -> pod: ... and %.1f ns with no port vouched (sluice_lb4_nbport all zero)\n",
              med[{Kind::kPodToPodUnvouched, c0.n}] - empty - p2p_no_lb);
  const double first_random = med[{Kind::kFirst, c0.n}] - empty;
  const double first_maglev = med[{Kind::kFirstMaglev, c0.n}] - empty;
  std::printf("first packet, %u svc: Maglev %.1f ns, random %.1f ns over empty: Maglev/random "
              "%.3fx (target <= 1.0)\n",
              c0.n, first_maglev, first_random, first_maglev / first_random);
  const uint32_t lo = counts.front(), hi = counts.back();
  for (Kind k : {Kind::kFirst, Kind::kEstablished}) {
    double a = med[{k, lo}], b = med[{k, hi}];
    std::printf("%s: %u/%u services = %.3fx (target <= 1.1); over empty: %.3fx\n",
                k == Kind::kFirst ? "(a) first packet" : "(b) established ", hi, lo, b / a,
                (b - empty) / (a - empty));
  }
  if (katran) {
    // Each program over the empty program of its own hook: what the program itself costs.
    const double empty_xdp = med[{Kind::kEmptyXdp, c0.n}];
    const double k_new = med[{Kind::kKatranNew, c0.n}] - empty_xdp;
    const double k_miss = med[{Kind::kKatranMiss, c0.n}] - empty_xdp;
    const double k_est = med[{Kind::kKatranEstablished, c0.n}] - empty_xdp;
    const double s_first = med[{Kind::kFirst, c0.n}] - empty;
    const double s_est = med[{Kind::kEstablished, c0.n}] - empty;
    std::printf(
        "\n== Sluice (sluice_from_pod, TC) vs Katran (balancer_ingress, XDP), the same packets, "
        "%u svc; each over the empty program of its hook (TC %.1f ns, XDP %.1f ns); Katran's "
        "connection tables %u flows per CPU\n",
        c0.n, empty, empty_xdp, katran_lru);
    std::printf("%-42s %9s %9s %13s %8s\n", "", "Katran", "Sluice", "Sluice/Katran", "target");
    std::printf("%-42s %9.1f %9.1f %12.2fx %8s\n", "first packet (SYN) / Katran new flow (SYN)",
                k_new, s_first, s_first / k_new, "<= 0.9");
    std::printf("%-42s %9.1f %9.1f %12.2fx %8s\n", "first packet, Maglev / Katran new flow (SYN)",
                k_new, first_maglev, first_maglev / k_new, "< 1");
    std::printf("%-42s %9.1f %9.1f %12.2fx %8s\n", "first packet / Katran conn table miss (ACK)",
                k_miss, s_first, s_first / k_miss, "");
    std::printf("%-42s %9.1f %9.1f %12.2fx %8s\n", "established", k_est, s_est, s_est / k_est,
                "<= 0.8");
  }
  for (size_t b = 0; b < base_fds.size(); ++b) {
    std::printf(
        "\n== this build's sluice_from_pod vs --baseline_obj %s, %u svc, over the empty "
        "program\n",
        baseline_objs[b].c_str(), c0.n);
    std::printf("%-28s %9s %9s %9s\n", "", "baseline", "this", "this/base");
    auto vs = [&](const char* what, Kind base, Kind now) {
      double o = base_med[{b, base}] - empty, n = med[{now, c0.n}] - empty;
      std::printf("%-28s %9.1f %9.1f %8.3fx\n", what, o, n, n / o);
    };
    vs("first packet (CT miss)", Kind::kBaseFirst, Kind::kFirst);
    vs("established (CT hit)", Kind::kBaseEstablished, Kind::kEstablished);
    vs("pod -> pod, no service", Kind::kBasePodToPod, Kind::kPodToPod);
  }
  return 0;
}
