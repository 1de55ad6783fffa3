// sluicectl trace: one made-up packet from a local pod, run with BPF_PROG_TEST_RUN through the
// program attached to that pod's host veth (sluice_from_pod) against this node's live maps, and
// each decision that packet met, read from the same maps with the same lookups:
//
//   the Service frontend it hit (and its name), the backend the program chose (DNAT), the
//   egress policy of the source and the ingress policy of a local destination (the peer's
//   identity and the rule that allows it, or that none does), where it went (a local pod, another
//   node through the tunnel or the FIB, the node's stack, or a reject), the drop reason, and the
//   packet as the program left it.
//
// The run writes what a real first packet writes; the trace takes it back: the conntrack, NAT
// and affinity entries of its own tuple are deleted afterwards (its source port is one no tracked
// flow uses, so they are all its own). Counters are not taken back: a traced drop is counted in
// sluice_drops / sluice_pol_drops like a real one, and a flow monitor listener sees it.
// A packet the program sends to another node is judged there by that node's receiving program
// (sluice_from_overlay on the tunnel device, sluice_from_net natively): the trace prints the
// packet as it left, and `sluicectl trace --arrive HEX` on that node runs the second hop the
// same way (docs/debugging.md).
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <unistd.h>

#include <cstring>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/sluicectl/common.h"
#include "agent/sluicectl/service_names.h"
#include "loader/tc.h"
#include "nlohmann/json.hpp"

namespace sluice::ctl {
namespace {

constexpr char kUsage[] =
    "usage: sluicectl trace --from NAMESPACE/POD|ADDR --to ADDR:PORT [--proto tcp|udp]\n"
    "                       [--flags S|SA|A|F|R|P...] [--sport N] [--size N] [-o table|json]\n"
    "       sluicectl trace --arrive HEX [--dev NAME] [-o table|json]\n"
    "Runs one packet from a local pod through this node's live program and maps and prints\n"
    "each decision; its conntrack, NAT and affinity entries are removed afterwards. --arrive\n"
    "runs a packet another node's trace sent here (its outputHex) through this node's\n"
    "receiving program (the tunnel device's, or --dev's ingress).\n"
    "Exit status: 0 when the packet goes on (delivered, forwarded, to the node's stack), 3 when\n"
    "it is dropped or rejected, 1 on an error, 2 on a usage error.\n";

struct Options {
  std::string from;
  std::vector<uint8_t> arrive;  // --arrive: a frame to run through the receiving program
  std::string dev;              // --arrive's device (default: the tunnel device, else the one
                                // with sluice_from_net)
  uint32_t daddr = 0;  // network order
  uint16_t dport = 0;
  uint8_t proto = IPPROTO_TCP;
  uint8_t tcp_flags = 0x02;  // SYN
  uint16_t sport = 0;        // 0: pick a free one
  size_t payload = 0;
  bool json = false;
};

int UsageError(const std::string& why) {
  std::fprintf(stderr, "sluicectl trace: %s\n%s", why.c_str(), kUsage);
  return 2;
}

bool ParseAddr(const std::string& s, uint32_t* be) {
  in_addr a{};
  if (inet_pton(AF_INET, s.c_str(), &a) != 1) return false;
  *be = a.s_addr;
  return true;
}

bool ParseTcpFlags(const std::string& s, uint8_t* out) {
  uint8_t f = 0;
  for (char c : s) {
    switch (c) {
      case 'F': f |= 0x01; break;
      case 'S': f |= 0x02; break;
      case 'R': f |= 0x04; break;
      case 'P': f |= 0x08; break;
      case 'A': f |= 0x10; break;
      case 'U': f |= 0x20; break;
      default: return false;
    }
  }
  *out = f;
  return !s.empty();
}

std::string TcpFlags(uint8_t f) {
  std::string out;
  const std::pair<uint8_t, char> kBits[] = {{0x02, 'S'}, {0x10, 'A'}, {0x01, 'F'},
                                            {0x04, 'R'}, {0x08, 'P'}, {0x20, 'U'}};
  for (const auto& [bit, c] : kBits) {
    if (f & bit) out += c;
  }
  return out;
}

// Returns 0 with *o filled, or the exit code of a usage error.
int ParseOptions(const std::vector<std::string>& args, Options* o) {
  bool have_to = false;
  o->json = JsonOutput();
  for (size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i], value;
    if (name == "--help" || name == "-h") {
      std::printf("%s", kUsage);
      return -1;
    }
    if (auto eq = name.find('='); eq != std::string::npos && name.rfind("--", 0) == 0) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else {
      if (i + 1 >= args.size()) return UsageError(absl::StrCat(name, ": wants a value"));
      value = args[++i];
    }
    if (name == "--from") {
      o->from = value;
    } else if (name == "--arrive") {
      if (value.size() % 2 != 0 || value.size() < 2 * 34 || value.size() > 2 * 2048) {
        return UsageError("--arrive: want the hex of one Ethernet frame (34-2048 bytes)");
      }
      for (size_t k = 0; k < value.size(); k += 2) {
        int byte = 0;
        if (!absl::SimpleHexAtoi(value.substr(k, 2), &byte)) {
          return UsageError("--arrive: not hex");
        }
        o->arrive.push_back(static_cast<uint8_t>(byte));
      }
    } else if (name == "--dev") {
      o->dev = value;
    } else if (name == "--to") {
      std::vector<std::string> parts = absl::StrSplit(value, ':');
      uint32_t port = 0;
      if (parts.size() != 2 || !ParseAddr(parts[0], &o->daddr) ||
          !absl::SimpleAtoi(parts[1], &port) || port == 0 || port > 65535) {
        return UsageError(absl::StrCat("--to ", value, ": want IPv4ADDR:PORT (port 1-65535)"));
      }
      o->dport = static_cast<uint16_t>(port);
      have_to = true;
    } else if (name == "--proto") {
      if (value == "tcp") {
        o->proto = IPPROTO_TCP;
      } else if (value == "udp") {
        o->proto = IPPROTO_UDP;
      } else {
        return UsageError(absl::StrCat("--proto ", value, ": want tcp or udp"));
      }
    } else if (name == "--flags") {
      if (!ParseTcpFlags(value, &o->tcp_flags)) {
        return UsageError(absl::StrCat("--flags ", value, ": want letters of S A F R P U"));
      }
    } else if (name == "--sport") {
      uint32_t port = 0;
      if (!absl::SimpleAtoi(value, &port) || port == 0 || port > 65535) {
        return UsageError(absl::StrCat("--sport ", value, ": want 1-65535"));
      }
      o->sport = static_cast<uint16_t>(port);
    } else if (name == "--size") {
      if (!absl::SimpleAtoi(value, &o->payload) || o->payload > 1400) {
        return UsageError(absl::StrCat("--size ", value, ": want 0-1400 payload bytes"));
      }
    } else if (name == "-o" || name == "--output") {
      if (value != "json" && value != "table") {
        return UsageError(absl::StrCat("-o ", value, ": want table or json"));
      }
      o->json = value == "json";
    } else {
      return UsageError(absl::StrCat("unknown option ", name));
    }
  }
  if (!o->arrive.empty()) {
    if (!o->from.empty() || have_to) return UsageError("--arrive takes no --from or --to");
    return 0;
  }
  if (o->from.empty()) return UsageError("--from is required");
  if (!have_to) return UsageError("--to is required");
  return 0;
}

uint16_t Checksum(const uint8_t* p, size_t n, uint32_t sum = 0) {
  for (size_t i = 0; i + 1 < n; i += 2) sum += (p[i] << 8) | p[i + 1];
  if (n & 1) sum += p[n - 1] << 8;
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<uint16_t>(~sum);
}

void Put16(std::vector<uint8_t>& b, size_t at, uint16_t host) {
  b[at] = host >> 8;
  b[at + 1] = host & 0xff;
}

// Ethernet (pod MAC -> gateway MAC) + IPv4 + TCP or UDP, checksums filled in.
std::vector<uint8_t> BuildPacket(const sluice_endpoint& src, uint32_t saddr, uint16_t sport,
                                 const Options& o) {
  const size_t l4 = o.proto == IPPROTO_TCP ? 20 : 8;
  std::vector<uint8_t> b(14 + 20 + l4 + o.payload, 0);
  std::memcpy(&b[0], src.host_mac, 6);
  std::memcpy(&b[6], src.mac, 6);
  Put16(b, 12, ETH_P_IP);
  uint8_t* ip = &b[14];
  ip[0] = 0x45;
  Put16(b, 16, static_cast<uint16_t>(20 + l4 + o.payload));
  Put16(b, 18, static_cast<uint16_t>(std::random_device{}()));  // id
  Put16(b, 20, 0x4000);                                             // DF
  ip[8] = 64;
  ip[9] = o.proto;
  std::memcpy(ip + 12, &saddr, 4);
  std::memcpy(ip + 16, &o.daddr, 4);
  Put16(b, 24, Checksum(ip, 20));
  const size_t t = 34;
  Put16(b, t, sport);
  Put16(b, t + 2, o.dport);
  if (o.proto == IPPROTO_TCP) {
    uint32_t seq = std::random_device{}();
    for (int i = 0; i < 4; ++i) b[t + 4 + i] = seq >> (24 - 8 * i);
    b[t + 12] = 5 << 4;
    b[t + 13] = o.tcp_flags;
    Put16(b, t + 14, 64240);
  } else {
    Put16(b, t + 4, static_cast<uint16_t>(8 + o.payload));
  }
  for (size_t i = 0; i < o.payload; ++i) b[t + l4 + i] = 'x';
  // The pseudo-header: addresses, protocol, L4 length.
  const size_t l4len = l4 + o.payload;
  uint32_t sum = 0;
  for (int i = 12; i < 20; i += 2) sum += (ip[i] << 8) | ip[i + 1];
  sum += o.proto + static_cast<uint32_t>(l4len);
  uint16_t c = Checksum(&b[t], l4len, sum);
  if (o.proto == IPPROTO_UDP && c == 0) c = 0xffff;
  Put16(b, t + (o.proto == IPPROTO_TCP ? 16 : 6), c);
  return b;
}

struct Parsed {
  bool ok = false;
  uint32_t saddr = 0, daddr = 0;  // network order
  uint16_t sport = 0, dport = 0;  // host order
  uint8_t proto = 0, tcp_flags = 0, icmp_type = 0;
  size_t length = 0;
};

Parsed Parse(const uint8_t* b, size_t n) {
  Parsed p;
  p.length = n;
  if (n < 34 || b[12] != 0x08 || b[13] != 0x00) return p;
  const uint8_t* ip = b + 14;
  const size_t ihl = (ip[0] & 0x0f) * 4;
  if (ihl < 20 || n < 14 + ihl) return p;
  p.proto = ip[9];
  std::memcpy(&p.saddr, ip + 12, 4);
  std::memcpy(&p.daddr, ip + 16, 4);
  const uint8_t* l4 = ip + ihl;
  const size_t left = n - 14 - ihl;
  if ((p.proto == IPPROTO_TCP && left >= 14) || (p.proto == IPPROTO_UDP && left >= 8)) {
    p.sport = (l4[0] << 8) | l4[1];
    p.dport = (l4[2] << 8) | l4[3];
    if (p.proto == IPPROTO_TCP) p.tcp_flags = l4[13];
  } else if (p.proto == IPPROTO_ICMP && left >= 1) {
    p.icmp_type = l4[0];
  }
  p.ok = true;
  return p;
}

std::string Describe(const Parsed& p) {
  if (!p.ok) return absl::StrCat("(not IPv4, ", p.length, " bytes)");
  std::string s = absl::StrCat(Proto(p.proto), " ", Ip(p.saddr));
  if (p.proto == IPPROTO_TCP || p.proto == IPPROTO_UDP) {
    absl::StrAppend(&s, ":", p.sport, " -> ", Ip(p.daddr), ":", p.dport);
    if (p.proto == IPPROTO_TCP) absl::StrAppend(&s, " [", TcpFlags(p.tcp_flags), "]");
  } else {
    absl::StrAppend(&s, " -> ", Ip(p.daddr));
    if (p.proto == IPPROTO_ICMP) absl::StrAppend(&s, " type ", p.icmp_type);
  }
  absl::StrAppend(&s, ", ", p.length, " bytes");
  return s;
}

nlohmann::json PacketJson(const Parsed& p) {
  nlohmann::json j = {{"length", p.length}};
  if (!p.ok) return j;
  j["proto"] = Proto(p.proto);
  j["source"] = Ip(p.saddr);
  j["destination"] = Ip(p.daddr);
  if (p.proto == IPPROTO_TCP || p.proto == IPPROTO_UDP) {
    j["sourcePort"] = p.sport;
    j["destinationPort"] = p.dport;
  }
  if (p.proto == IPPROTO_TCP) j["tcpFlags"] = TcpFlags(p.tcp_flags);
  if (p.proto == IPPROTO_ICMP) j["icmpType"] = p.icmp_type;
  return j;
}

// Whether a conntrack / NAT tuple is the trace's own: it names the traced source address and
// port on either side.
bool Mine(uint32_t a1, uint16_t p1, uint32_t a2, uint16_t p2, uint32_t saddr, uint16_t sport_be) {
  return (a1 == saddr && p1 == sport_be) || (a2 == saddr && p2 == sport_be);
}

// The state one run of the program may write, restricted to the trace's own tuple.
struct Footprint {
  std::vector<std::pair<maps::Ct4Map*, sluice_ct4_key>> ct;  // sluice_ct4 or _any
  std::vector<sluice_nat4_key> snat, rnat;
  std::set<std::pair<uint32_t, uint32_t>> affinity;  // (client, rev_nat_id)
};

// Both conntrack maps: TCP in sluice_ct4, the rest in sluice_ct4_any.
using CtMaps = std::vector<maps::Ct4Map*>;

absl::StatusOr<Footprint> Collect(const CtMaps& cts, const maps::NatMap& snat,
                                  const maps::NatMap& rnat, const maps::Lb4AffinityMap& aff,
                                  uint32_t saddr, uint16_t sport_be) {
  Footprint f;
  absl::Status st;
  for (maps::Ct4Map* ct : cts) {
    st = ct->ForEach([&](const sluice_ct4_key& k, const sluice_ct4_entry&) {
      if (Mine(k.saddr, k.sport, k.daddr, k.dport, saddr, sport_be)) f.ct.emplace_back(ct, k);
    });
    if (!st.ok()) return st;
  }
  for (auto pair : {std::pair{&snat, &f.snat}, std::pair{&rnat, &f.rnat}}) {
    auto* out = pair.second;  // not a structured binding: clang 14 cannot capture one
    st = pair.first->ForEach([&](const sluice_nat4_key& k, const sluice_nat4_entry& v) {
      if (Mine(k.saddr, k.sport, k.daddr, k.dport, saddr, sport_be) ||
          (v.addr == saddr && v.port == sport_be)) {
        out->push_back(k);
      }
    });
    if (!st.ok()) return st;
  }
  st = aff.ForEach([&](const sluice_lb4_affinity_key& k, const sluice_lb4_affinity&) {
    if (k.client_addr == saddr) f.affinity.insert({k.client_addr, k.rev_nat_id});
  });
  if (!st.ok()) return st;
  return f;
}

// A free source port: no tracked flow of the pod uses it, so whatever the run writes with it is
// the trace's.
absl::StatusOr<uint16_t> FreePort(const CtMaps& ct, const maps::NatMap& snat,
                                  const maps::NatMap& rnat, const maps::Lb4AffinityMap& aff,
                                  uint32_t saddr) {
  std::mt19937 rng(std::random_device{}());
  for (int tries = 0; tries < 16; ++tries) {
    auto port = static_cast<uint16_t>(40000 + rng() % 20000);
    auto f = Collect(ct, snat, rnat, aff, saddr, htons(port));
    if (!f.ok()) return f.status();
    if (f->ct.empty() && f->snat.empty() && f->rnat.empty()) return port;
  }
  return absl::ResourceExhaustedError("no free source port found in 16 tries");
}

std::string PodOrAddr(const std::map<std::string, std::string>& pods, uint32_t addr) {
  auto it = pods.find(Ip(addr));
  return it == pods.end() ? Ip(addr) : it->second + " (" + Ip(addr) + ")";
}

struct Step {
  std::string stage;   // "service", "dnat", "policy-egress", "policy-ingress", "delivery", ...
  std::string result;  // one line for people
  nlohmann::json detail = nlohmann::json::object();
};

// The policy point of `endpoint_id` in `dir` for a peer address, judged with the datapath's own
// lookups: sluice_policy_ep, the ipcache (longest prefix), sluice_policy4 with the peer's
// identity, then with "any peer".
Step PolicyStep(uint32_t endpoint_id, uint8_t dir, uint32_t peer, uint8_t proto, uint16_t port,
                const std::map<uint32_t, std::string>& identities) {
  Step s;
  s.stage = dir == SLUICE_POLICY_INGRESS ? "policy-ingress" : "policy-egress";
  const char* way = dir == SLUICE_POLICY_INGRESS ? "ingress" : "egress";
  auto pep = OpenOrDie<maps::PolicyEndpointMap>(maps::name::sluice_policy_ep).Lookup(endpoint_id);
  const uint8_t flag =
      dir == SLUICE_POLICY_INGRESS ? SLUICE_POLICY_EP_F_INGRESS : SLUICE_POLICY_EP_F_EGRESS;
  if (!pep.ok() || (pep->flags & flag) == 0) {
    s.result = absl::StrCat("open: no NetworkPolicy selects endpoint ", endpoint_id, " for ", way);
    s.detail = {{"enforced", false}, {"endpointID", endpoint_id}};
    return s;
  }
  auto ipcache = OpenOrDie<maps::Ipcache4Map>(maps::name::sluice_ipcache4);
  sluice_lpm4_key ik{32, peer};
  auto ie = ipcache.Lookup(ik);
  const uint32_t identity = ie.ok() ? ie->identity : uint32_t{SLUICE_IDENTITY_WORLD};
  auto label = [&](uint32_t id) {
    auto it = identities.find(id);
    return absl::StrCat(id, " (", it == identities.end() ? "unknown" : it->second, ")");
  };
  auto policy = OpenOrDie<maps::Policy4Map>(maps::name::sluice_policy4);
  sluice_policy4_key key{};
  key.prefixlen = SLUICE_POLICY4_PREFIX_FULL;
  key.endpoint_id = htonl(endpoint_id);
  key.direction = dir;
  key.proto = proto;
  key.port = htons(port);
  std::string by;
  for (uint32_t id : {identity, static_cast<uint32_t>(SLUICE_IDENTITY_ANY)}) {
    key.identity = htonl(id);
    auto e = policy.Lookup(key);
    if (e.ok() && e->verdict == SLUICE_POLICY_ALLOW) {
      by = id == SLUICE_IDENTITY_ANY ? "a rule for any peer" : "a rule for identity " + label(id);
      break;
    }
  }
  s.detail = {{"enforced", true},
              {"endpointID", endpoint_id},
              {"peer", Ip(peer)},
              {"peerIdentity", identity},
              {"allowed", !by.empty()}};
  s.result = by.empty() ? absl::StrCat("denied: no ", way, " rule of endpoint ", endpoint_id,
                                       " allows peer ", Ip(peer), " = identity ", label(identity),
                                       " on ", Proto(proto), "/", port)
                        : absl::StrCat("allowed: ", Ip(peer), " = identity ", label(identity),
                                       ", by ", by, " on ", Proto(proto), "/", port);
  return s;
}

const char* DropName(uint32_t reason) { return sluice_drop_reason_name(reason); }

// This CPU's count of each drop reason, both directions: the run happens on this CPU (the trace
// pins itself).
std::vector<uint64_t> DropsOnCpu(const maps::DropMap& drops, int cpu) {
  std::vector<uint64_t> out(SLUICE_DROP_MAX, 0);
  for (uint32_t r = 0; r < SLUICE_DROP_MAX; ++r) {
    for (uint32_t dir = 0; dir < SLUICE_DROP_DIR_MAX; ++dir) {
      auto v = drops.Lookup(SLUICE_DROP_KEY(r, dir));
      if (v.ok() && cpu < static_cast<int>(v->size())) out[r] += (*v)[cpu].packets;
    }
  }
  return out;
}

std::string Hex(const uint8_t* p, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += kDigits[p[i] >> 4];
    out += kDigits[p[i] & 0xf];
  }
  return out;
}

// The live maps a run reads and writes.
struct LiveMaps {
  maps::EndpointMap eps = OpenOrDie<maps::EndpointMap>(maps::name::sluice_ep4);
  maps::Ct4Map ct = OpenOrDie<maps::Ct4Map>(maps::name::sluice_ct4);
  maps::Ct4Map ct_any = OpenOrDie<maps::Ct4Map>(maps::name::sluice_ct4_any);
  CtMaps cts() { return {&ct, &ct_any}; }
  maps::NatMap snat = OpenOrDie<maps::NatMap>(maps::name::sluice_snat4);
  maps::NatMap rnat = OpenOrDie<maps::NatMap>(maps::name::sluice_rnat4);
  maps::Lb4AffinityMap aff = OpenOrDie<maps::Lb4AffinityMap>(maps::name::sluice_lb4_aff);
  maps::DropMap drops = OpenOrDie<maps::DropMap>(maps::name::sluice_drops);
};

// One run of one program on one frame, and what it left.
struct Hop {
  uint32_t prog_id = 0;
  uint32_t ifindex = 0;
  std::vector<uint8_t> in, out;
  int verdict = 0;
  std::string drop_reason;
  bool pinned = false;
  size_t undone_ct = 0, undone_nat = 0, undone_aff = 0;
};

// Runs prog_id on `in` as received on ifindex, then deletes the state the run wrote for the
// tuple (saddr, sport) — which must have none before (a free port).
absl::StatusOr<Hop> RunHop(LiveMaps& m, uint32_t prog_id, uint32_t ifindex,
                           std::vector<uint8_t> in, uint32_t saddr, uint16_t sport) {
  Hop h;
  h.prog_id = prog_id;
  h.ifindex = ifindex;
  h.in = std::move(in);
  h.out.resize(h.in.size() + 256);
  auto before = Collect(m.cts(), m.snat, m.rnat, m.aff, saddr, htons(sport));
  if (!before.ok()) return before.status();
  if (!before->ct.empty() || !before->snat.empty() || !before->rnat.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        Ip(saddr), ":", sport, " is in use by a tracked flow here; pick another --sport"));
  }
  const int prog_fd = bpf_prog_get_fd_by_id(prog_id);
  if (prog_fd < 0) return absl::NotFoundError(absl::StrCat("program ", prog_id, ": ",
                                                           std::strerror(errno)));
  __sk_buff ctx{};
  ctx.ifindex = ifindex;
  // Pin to one CPU so that the drop counter of this CPU tells the run's drop reason.
  const int cpu = sched_getcpu();
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  h.pinned = cpu >= 0 && sched_setaffinity(0, sizeof(set), &set) == 0;
  std::vector<uint64_t> drops_before = DropsOnCpu(m.drops, cpu);
  LIBBPF_OPTS(bpf_test_run_opts, run, .data_in = h.in.data(), .data_out = h.out.data(),
              .data_size_in = static_cast<__u32>(h.in.size()),
              .data_size_out = static_cast<__u32>(h.out.size()), .ctx_in = &ctx,
              .ctx_size_in = sizeof(ctx), .repeat = 1);
  const int rc = bpf_prog_test_run_opts(prog_fd, &run);
  const int run_errno = errno;
  std::vector<uint64_t> drops_after = DropsOnCpu(m.drops, cpu);
  ::close(prog_fd);

  // Take back what the run wrote for the trace's tuple.
  auto after = Collect(m.cts(), m.snat, m.rnat, m.aff, saddr, htons(sport));
  if (after.ok()) {
    for (const auto& [ct, k] : after->ct) {
      h.undone_ct += ct->Delete(k).ok() ? 1 : 0;
    }
    for (const auto& k : after->snat) h.undone_nat += m.snat.Delete(k).ok() ? 1 : 0;
    for (const auto& k : after->rnat) h.undone_nat += m.rnat.Delete(k).ok() ? 1 : 0;
    for (const auto& [client, rev] : after->affinity) {
      if (before->affinity.count({client, rev})) continue;  // the pod's own, older
      h.undone_aff += m.aff.Delete(sluice_lb4_affinity_key{client, rev}).ok() ? 1 : 0;
    }
  }
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("BPF_PROG_TEST_RUN: ", std::strerror(run_errno)));
  }
  h.out.resize(run.data_size_out);
  h.verdict = static_cast<int>(run.retval);
  for (uint32_t r = 0; r < SLUICE_DROP_MAX; ++r) {
    if (drops_after[r] > drops_before[r]) h.drop_reason = DropName(r);
  }
  return h;
}

// What a hop decided, as steps. `source` is the sending endpoint for the first hop (its egress
// policy point applies), or null for a packet arriving from another node.
struct Judged {
  std::vector<Step> steps;
  std::string outcome;
  std::string next_node;  // the node the packet went to, when it left through tunnel or FIB
};

Judged Judge(LiveMaps& m, const Hop& h, const sluice_endpoint* source,
             std::map<std::string, std::string>& pods,
             const std::map<uint32_t, std::string>& identities) {
  Judged j;
  const Parsed sent = Parse(h.in.data(), h.in.size());
  const Parsed left = Parse(h.out.data(), h.out.size());
  // Service frontends: the master entry of the destination, the pods' scope first.
  bool service_hit = false;
  for (uint8_t scope : {uint8_t{SLUICE_LB_SCOPE_INTERNAL}, uint8_t{SLUICE_LB_SCOPE_EXTERNAL}}) {
    sluice_lb4_key k{};
    k.addr = sent.daddr;
    k.dport = htons(sent.dport);
    k.proto = sent.proto;
    k.scope = scope;
    auto master = OpenOrDie<maps::Lb4ServiceMap>(maps::name::sluice_lb4_svc).Lookup(k);
    if (!master.ok()) continue;
    ServiceNames names = LoadServiceNames();
    const Named* n = names.Find(Ip(sent.daddr), sent.dport, Proto(sent.proto),
                                (master->flags & SLUICE_SVC_F_NODEPORT) != 0);
    Step s{"service", "", {}};
    s.result = absl::StrCat("frontend ", Ip(sent.daddr), ":", sent.dport, "/", Proto(sent.proto),
                            " (", SvcFlags(master->flags), ", ", master->count,
                            " backend slot(s))", n ? " of Service " + n->service : "");
    if (n && !n->why_empty.empty()) absl::StrAppend(&s.result, "; serves nothing: ", n->why_empty);
    s.detail = {{"frontend", absl::StrCat(Ip(sent.daddr), ":", sent.dport)},
                {"flags", SvcFlags(master->flags)},
                {"backendSlots", master->count},
                {"service", n ? n->service : ""}};
    j.steps.push_back(s);
    service_hit = true;
    break;
  }
  if (!service_hit) j.steps.push_back({"service", "no Service frontend: not translated", {}});

  // What the program did to the packet. A reject turns it around, to its own source.
  const bool rejected = source != nullptr && left.ok && left.daddr == sent.saddr &&
                        (left.proto == IPPROTO_ICMP ||
                         (left.proto == IPPROTO_TCP && (left.tcp_flags & 0x04) != 0));
  if (left.ok && !rejected && (left.daddr != sent.daddr || left.dport != sent.dport)) {
    j.steps.push_back({"dnat",
                       absl::StrCat("backend ", PodOrAddr(pods, left.daddr), ":", left.dport),
                       {{"backend", absl::StrCat(Ip(left.daddr), ":", left.dport)},
                        {"pod", pods.count(Ip(left.daddr)) ? pods[Ip(left.daddr)] : ""}}});
  }
  if (left.ok && !rejected && (left.saddr != sent.saddr || left.sport != sent.sport)) {
    j.steps.push_back({"snat", absl::StrCat("source ", Ip(left.saddr), ":", left.sport), {}});
  }

  // Policy, on the real addresses: the source's egress, a local destination's ingress.
  const Parsed& real = left.ok && !rejected ? left : sent;
  if (!rejected && source != nullptr) {
    j.steps.push_back(PolicyStep(source->endpoint_id, SLUICE_POLICY_EGRESS, real.daddr,
                                 real.proto, real.dport, identities));
  }
  auto dst = m.eps.Lookup(sluice_ep4_key{real.daddr});
  if (!rejected && dst.ok()) {
    j.steps.push_back(PolicyStep(dst->endpoint_id, SLUICE_POLICY_INGRESS, real.saddr,
                                 real.proto, real.dport, identities));
  }

  // The verdict, the drop reason and where the packet went.
  if (h.verdict == TC_ACT_SHOT) {
    j.outcome = "dropped";
    j.steps.push_back(
        {"verdict",
         absl::StrCat("dropped: ", h.drop_reason.empty() ? "(reason not seen)" : h.drop_reason),
         {{"dropReason", h.drop_reason}}});
  } else if (rejected) {
    j.outcome = "rejected";
    j.steps.push_back({"verdict",
                       absl::StrCat("rejected: the Service has no usable endpoint; the pod gets ",
                                    left.proto == IPPROTO_TCP ? "a TCP RST" : "ICMP unreachable"),
                       {}});
  } else if (h.verdict == TC_ACT_REDIRECT && dst.ok()) {
    j.outcome = "delivered";
    j.steps.push_back({"delivery",
                       absl::StrCat("to local pod ", PodOrAddr(pods, real.daddr),
                                    " via host veth #", dst->ifindex, " (bpf_redirect_peer)"),
                       {{"ifindex", dst->ifindex}}});
  } else if (h.verdict == TC_ACT_REDIRECT) {
    auto tunnel = OpenOrDie<maps::Tunnel4Map>(maps::name::sluice_tunnel4);
    auto node = OpenOrDie<maps::NodeConfigMap>(maps::name::sluice_node).Lookup(0);
    auto t = tunnel.Lookup(sluice_lpm4_key{32, real.daddr});
    const bool tunnelled = node.ok() && node->tunnel_ifindex != 0;
    j.outcome = "forwarded";
    if (t.ok()) j.next_node = Ip(t->node_ip4);
    j.steps.push_back(
        {"delivery",
         t.ok() ? absl::StrCat("to node ", Ip(t->node_ip4),
                               tunnelled ? " through the VXLAN tunnel (sluice_vxlan)"
                                         : " by the FIB (native routing)")
                : "routed by the FIB (bpf_redirect_neigh)",
         {{"node", j.next_node}, {"tunnel", t.ok() && tunnelled}}});
  } else if (h.verdict == TC_ACT_OK) {
    j.outcome = "to-stack";
    j.steps.push_back({"delivery", "passed to the node's stack (the node itself, or routed out)",
                       {}});
  } else {
    j.outcome = absl::StrCat("tc-verdict-", h.verdict);
  }
  return j;
}

nlohmann::json HopJson(const Hop& h, const Judged& j) {
  nlohmann::json out = {
      {"program", ProgName(h.prog_id)},
      {"programID", h.prog_id},
      {"ifindex", h.ifindex},
      {"packet", PacketJson(Parse(h.in.data(), h.in.size()))},
      {"steps", nlohmann::json::array()},
      {"outcome", j.outcome},
      {"tcVerdict", h.verdict},
      {"dropReason", h.drop_reason},
      {"output", PacketJson(Parse(h.out.data(), h.out.size()))},
      {"outputHex", Hex(h.out.data(), h.out.size())},
      {"undone", {{"conntrack", h.undone_ct}, {"nat", h.undone_nat}, {"affinity", h.undone_aff}}},
      {"pinnedCPU", h.pinned},
  };
  if (!j.next_node.empty()) out["nextNode"] = j.next_node;
  for (const auto& s : j.steps) {
    nlohmann::json d = s.detail;
    d["stage"] = s.stage;
    d["result"] = s.result;
    out["steps"].push_back(d);
  }
  return out;
}

void PrintHop(const std::string& title, const Hop& h, const Judged& j) {
  std::printf("trace  %s, %s (program %u) on #%u\n", title.c_str(), ProgName(h.prog_id).c_str(),
              h.prog_id, h.ifindex);
  for (const auto& s : j.steps) std::printf("  %-15s %s\n", s.stage.c_str(), s.result.c_str());
  std::printf("  %-15s %s\n", "packet out", Describe(Parse(h.out.data(), h.out.size())).c_str());
  std::printf("  %-15s %zu conntrack, %zu NAT, %zu affinity entries of the trace removed\n",
              "undone", h.undone_ct, h.undone_nat, h.undone_aff);
  if (!h.pinned) std::printf("  (could not pin to one CPU: the drop reason may be another's)\n");
  if (!j.next_node.empty()) {
    std::printf("  %-15s on node %s: sluicectl trace --arrive %s\n", "next hop",
                j.next_node.c_str(), Hex(h.out.data(), h.out.size()).c_str());
  }
}

// The device whose ingress receives other nodes' packets: --dev, else the tunnel device, else
// the interface running sluice_from_net.
absl::StatusOr<std::pair<uint32_t, uint32_t>> ReceivingProgram(const std::string& dev) {
  std::vector<uint32_t> candidates;
  if (!dev.empty()) {
    uint32_t idx = if_nametoindex(dev.c_str());
    if (idx == 0) return absl::NotFoundError(absl::StrCat("no device ", dev));
    candidates.push_back(idx);
  } else {
    auto node = OpenOrDie<maps::NodeConfigMap>(maps::name::sluice_node).Lookup(0);
    if (node.ok() && node->tunnel_ifindex != 0) candidates.push_back(node->tunnel_ifindex);
  }
  libbpf_print_fn_t old = libbpf_set_print(nullptr);
  if (candidates.empty()) {
    struct if_nameindex* all = if_nameindex();
    for (struct if_nameindex* i = all; all && i->if_index != 0; ++i) {
      auto id = loader::AttachedTcProgram(static_cast<int>(i->if_index),
                                          loader::TcDirection::kIngress);
      if (id.ok() && ProgName(*id) == "sluice_from_net") candidates.push_back(i->if_index);
    }
    if (all) if_freenameindex(all);
  }
  for (uint32_t idx : candidates) {
    auto id = loader::AttachedTcProgram(static_cast<int>(idx), loader::TcDirection::kIngress);
    if (id.ok()) {
      libbpf_set_print(old);
      return std::pair{*id, idx};
    }
  }
  libbpf_set_print(old);
  return absl::NotFoundError("no Sluice program receives other nodes' packets here (--dev?)");
}

int Fail(const absl::Status& st) {
  std::fprintf(stderr, "sluicectl trace: %s\n", std::string(st.message()).c_str());
  return 1;
}

// A drop is an answer, but not a success: scripts (and `&&`) see it in the exit status.
constexpr int kExitDropped = 3;
int ExitCodeOf(const std::string& outcome) {
  return outcome == "dropped" || outcome == "rejected" ? kExitDropped : 0;
}

}  // namespace

int Trace(const std::vector<std::string>& args) {
  Options o;
  if (int rc = ParseOptions(args, &o); rc != 0) return rc < 0 ? 0 : rc;
  LiveMaps m;
  auto pods = PodNamesByAddress();
  const std::map<uint32_t, std::string> identities = IdentityNames();

  if (!o.arrive.empty()) {
    // The second hop: a frame another node's trace sent here.
    const Parsed p = Parse(o.arrive.data(), o.arrive.size());
    if (!p.ok) return Fail(absl::InvalidArgumentError("--arrive: no IPv4 frame"));
    auto prog = ReceivingProgram(o.dev);
    if (!prog.ok()) return Fail(prog.status());
    auto hop = RunHop(m, prog->first, prog->second, o.arrive, p.saddr, p.sport);
    if (!hop.ok()) return Fail(hop.status());
    Judged j = Judge(m, *hop, nullptr, pods, identities);
    // Passed to the stack for a local pod (native routing): the stack routes it out of the pod's
    // host veth, whose egress program (sluice_to_pod) is the pod's ingress policy point.
    const Parsed left = Parse(hop->out.data(), hop->out.size());
    auto dst = m.eps.Lookup(sluice_ep4_key{left.daddr});
    std::optional<Hop> veth;
    std::optional<Judged> veth_judged;
    if (j.outcome == "to-stack" && left.ok && dst.ok()) {
      auto to_pod = loader::AttachedTcProgram(static_cast<int>(dst->ifindex),
                                              loader::TcDirection::kEgress);
      if (!to_pod.ok()) return Fail(to_pod.status());
      std::vector<uint8_t> frame = hop->out;  // as the stack sends it: host veth -> pod
      std::memcpy(&frame[0], dst->mac, 6);
      std::memcpy(&frame[6], dst->host_mac, 6);
      auto h = RunHop(m, *to_pod, dst->ifindex, std::move(frame), left.saddr, left.sport);
      if (!h.ok()) return Fail(h.status());
      veth = std::move(*h);
      Judged v;
      if (veth->verdict == TC_ACT_SHOT) {
        v.outcome = "dropped";
        v.steps.push_back({"verdict",
                           absl::StrCat("dropped: ", veth->drop_reason.empty()
                                                         ? "(reason not seen)"
                                                         : veth->drop_reason),
                           {{"dropReason", veth->drop_reason}}});
      } else {
        v.outcome = "delivered";
        v.steps.push_back({"delivery",
                           absl::StrCat("to local pod ", PodOrAddr(pods, left.daddr),
                                        " out of host veth #", dst->ifindex, " (by the stack)"),
                           {{"ifindex", dst->ifindex}}});
      }
      veth_judged = std::move(v);
    }
    if (o.json) {
      nlohmann::json out = HopJson(*hop, j);
      if (veth) {
        out["stackDelivery"] = HopJson(*veth, *veth_judged);
        out["outcome"] = veth_judged->outcome;
        out["dropReason"] = veth->drop_reason;
      }
      PrintJson(out);
    } else {
      PrintHop(absl::StrCat(Describe(p), " arriving"), *hop, j);
      if (veth) PrintHop("then out of the pod's host veth", *veth, *veth_judged);
    }
    return ExitCodeOf(veth_judged ? veth_judged->outcome : j.outcome);
  }

  // The source: a local endpoint, by pod name or address.
  uint32_t saddr = 0;
  if (!ParseAddr(o.from, &saddr)) {
    for (const auto& [addr, name] : pods) {
      if (name == o.from) ParseAddr(addr, &saddr);
    }
    if (saddr == 0) {
      return Fail(absl::NotFoundError(
          absl::StrCat(o.from, " is no pod of this node's endpoints")));
    }
  }
  auto src = m.eps.Lookup(sluice_ep4_key{saddr});
  if (!src.ok()) {
    return Fail(absl::NotFoundError(
        absl::StrCat(Ip(saddr), " is no local endpoint (not in sluice_ep4)")));
  }
  auto prog_id = loader::AttachedTcProgram(static_cast<int>(src->ifindex),
                                           loader::TcDirection::kIngress);
  if (!prog_id.ok()) {
    return Fail(absl::NotFoundError(absl::StrCat("no Sluice program on the pod's host veth #",
                                                 src->ifindex, ": ",
                                                 prog_id.status().message())));
  }
  uint16_t sport = o.sport;
  if (sport == 0) {
    auto port = FreePort(m.cts(), m.snat, m.rnat, m.aff, saddr);
    if (!port.ok()) return Fail(port.status());
    sport = *port;
  }
  auto hop = RunHop(m, *prog_id, src->ifindex, BuildPacket(*src, saddr, sport, o), saddr, sport);
  if (!hop.ok()) return Fail(hop.status());
  Judged j = Judge(m, *hop, &*src, pods, identities);
  if (o.json) {
    nlohmann::json out = HopJson(*hop, j);
    out["source"] = {{"pod", pods.count(Ip(saddr)) ? pods[Ip(saddr)] : ""},
                     {"address", Ip(saddr)},
                     {"endpointID", src->endpoint_id}};
    PrintJson(out);
    return ExitCodeOf(j.outcome);
  }
  PrintHop(absl::StrCat(Describe(Parse(hop->in.data(), hop->in.size())), " from ",
                        PodOrAddr(pods, saddr)),
           *hop, j);
  return ExitCodeOf(j.outcome);
}

}  // namespace sluice::ctl
