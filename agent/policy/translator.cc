#include "agent/policy/translator.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace sluice::agent {
namespace {

using k8s::LabelSelector;
using k8s::StringMap;

constexpr uint8_t kIngress = SLUICE_POLICY_INGRESS;
constexpr uint8_t kEgress = SLUICE_POLICY_EGRESS;

// 0 for a protocol the datapath does not know (such a rule is refused before it gets here).
uint8_t IpProto(k8s::Protocol p) { return k8s::IpProtocolNumber(p).value_or(0); }

// ---- selectors -----------------------------------------------------------------------------

absl::Status ValidateSelector(const LabelSelector& s) {
  if (!s.error.empty()) return absl::InvalidArgumentError(s.error);
  for (const auto& req : s.match_expressions) {
    if (req.key.empty()) return absl::InvalidArgumentError("matchExpressions: empty key");
    if (req.op == "In" || req.op == "NotIn") {
      if (req.values.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("matchExpressions ", req.key, " ", req.op, ": no values"));
      }
    } else if (req.op == "Exists" || req.op == "DoesNotExist") {
      if (!req.values.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("matchExpressions ", req.key, " ", req.op, ": values given"));
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("matchExpressions ", req.key, ": unknown operator \"", req.op, "\""));
    }
  }
  return absl::OkStatus();
}

// Only for selectors that passed ValidateSelector.
bool Matches(const LabelSelector& s, const StringMap& labels) {
  for (const auto& [k, v] : s.match_labels) {
    auto it = labels.find(k);
    if (it == labels.end() || it->second != v) return false;
  }
  for (const auto& req : s.match_expressions) {
    auto it = labels.find(req.key);
    const bool has = it != labels.end();
    const bool in = has && std::find(req.values.begin(), req.values.end(), it->second) !=
                               req.values.end();
    if (req.op == "In" && !in) return false;
    if (req.op == "NotIn" && in) return false;
    if (req.op == "Exists" && !has) return false;
    if (req.op == "DoesNotExist" && has) return false;
  }
  return true;
}

// ---- prefixes ------------------------------------------------------------------------------

// A CIDR with its host bits cleared ("10.1.2.3/16" -> 10.1.0.0/16), as ipBlock allows.
absl::StatusOr<IpPrefix> ParseMaskedPrefix(const std::string& text) {
  std::pair<std::string, std::string> parts = absl::StrSplit(text, absl::MaxSplits('/', 1));
  int length = -1;
  absl::StatusOr<IpAddress> addr = IpAddress::Parse(parts.first);
  if (!addr.ok() || parts.second.empty() || !absl::SimpleAtoi(parts.second, &length) ||
      length < 0 || length > addr->bit_length()) {
    return absl::InvalidArgumentError(absl::StrCat("invalid CIDR \"", text, "\""));
  }
  std::array<uint8_t, 16> bytes = addr->bytes();
  for (int i = 0; i < addr->bit_length() / 8; ++i) {
    int keep = std::clamp(length - i * 8, 0, 8);
    bytes[i] &= static_cast<uint8_t>(keep == 0 ? 0 : 0xff << (8 - keep));
  }
  char buf[INET6_ADDRSTRLEN];
  inet_ntop(addr->is_v4() ? AF_INET : AF_INET6, bytes.data(), buf, sizeof(buf));
  absl::StatusOr<IpAddress> network = IpAddress::Parse(buf);
  if (!network.ok()) return network.status();
  return IpPrefix::Make(*network, length);
}

// `outer` contains all of `inner`.
bool Covers(const IpPrefix& outer, const IpPrefix& inner) {
  return outer.length() <= inner.length() && outer.Contains(inner.network());
}

IpPrefix Host32(const IpAddress& a) { return *IpPrefix::Make(a, a.bit_length()); }

// ---- policies, validated -------------------------------------------------------------------

struct CompiledPeer {
  bool is_block = false;
  // selectors
  std::optional<LabelSelector> pod_selector;
  std::optional<LabelSelector> namespace_selector;
  // ipBlock (IPv4 only: an IPv6 block matches no IPv4 address)
  bool v4 = true;
  IpPrefix cidr;
  std::vector<IpPrefix> except;
};

struct CompiledPort {
  uint8_t proto = 0;
  bool all_ports = false;
  uint16_t first = 0, last = 0;
  std::string name;  // a named port when not empty
};

struct CompiledRule {
  std::vector<CompiledPeer> peers;  // empty: every peer
  std::vector<CompiledPort> ports;  // empty: every protocol and port
};

struct CompiledPolicy {
  std::shared_ptr<const k8s::NetworkPolicy> source;  // set with a cache
  std::string key;
  std::string ns;
  LabelSelector pod_selector;  // validated
  bool ingress = false, egress = false;
  std::vector<CompiledRule> ingress_rules, egress_rules;
};

absl::StatusOr<CompiledPeer> CompilePeer(const k8s::NetworkPolicyPeer& peer) {
  CompiledPeer out;
  const bool has_selector = peer.pod_selector || peer.namespace_selector;
  if (peer.ip_block && has_selector) {
    return absl::InvalidArgumentError("a peer with ipBlock and a selector");
  }
  if (!peer.ip_block && !has_selector) return absl::InvalidArgumentError("an empty peer");
  if (has_selector) {
    for (const auto* sel : {&peer.pod_selector, &peer.namespace_selector}) {
      if (!sel->has_value()) continue;
      absl::Status st = ValidateSelector(**sel);
      if (!st.ok()) return st;
    }
    out.pod_selector = peer.pod_selector;
    out.namespace_selector = peer.namespace_selector;
    return out;
  }
  out.is_block = true;
  absl::StatusOr<IpPrefix> cidr = ParseMaskedPrefix(peer.ip_block->cidr);
  if (!cidr.ok()) return absl::InvalidArgumentError(absl::StrCat("ipBlock: ", cidr.status().message()));
  out.cidr = *cidr;
  out.v4 = cidr->network().is_v4();
  for (const std::string& text : peer.ip_block->except) {
    absl::StatusOr<IpPrefix> ex = ParseMaskedPrefix(text);
    if (!ex.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("ipBlock except: ", ex.status().message()));
    }
    if (!Covers(*cidr, *ex)) {
      return absl::InvalidArgumentError(
          absl::StrCat("ipBlock except ", ex->ToString(), " is not inside ", cidr->ToString()));
    }
    out.except.push_back(*ex);
  }
  return out;
}

absl::StatusOr<CompiledPort> CompilePort(const k8s::NetworkPolicyPort& port) {
  CompiledPort out;
  k8s::Protocol proto = k8s::ParseProtocol(port.protocol);
  if (proto == k8s::Protocol::kUnknown) {
    return absl::InvalidArgumentError(absl::StrCat("unknown protocol \"", port.protocol, "\""));
  }
  out.proto = IpProto(proto);
  if (!port.port) {
    if (port.end_port) return absl::InvalidArgumentError("endPort without port");
    out.all_ports = true;
    return out;
  }
  if (port.port->is_name) {
    if (port.end_port) return absl::InvalidArgumentError("endPort with a named port");
    if (port.port->name.empty()) return absl::InvalidArgumentError("empty port name");
    out.name = port.port->name;
    return out;
  }
  int64_t first = port.port->number;
  int64_t last = port.end_port.value_or(first);
  if (first < 1 || first > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("port ", first, " out of range"));
  }
  if (last < first || last > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("endPort ", last, " out of range"));
  }
  out.first = static_cast<uint16_t>(first);
  out.last = static_cast<uint16_t>(last);
  return out;
}

absl::StatusOr<CompiledRule> CompileRule(const k8s::NetworkPolicyRule& rule) {
  if (!rule.error.empty()) return absl::InvalidArgumentError(rule.error);
  CompiledRule out;
  for (const auto& peer : rule.peers) {
    absl::StatusOr<CompiledPeer> p = CompilePeer(peer);
    if (!p.ok()) return p.status();
    out.peers.push_back(std::move(*p));
  }
  for (const auto& port : rule.ports) {
    absl::StatusOr<CompiledPort> p = CompilePort(port);
    if (!p.ok()) return p.status();
    out.ports.push_back(std::move(*p));
  }
  return out;
}

CompiledPolicy CompilePolicy(const k8s::NetworkPolicy& np, std::vector<PolicyProblem>* problems) {
  CompiledPolicy out;
  out.key = np.meta.Key();
  out.ns = np.meta.namespace_;
  auto problem = [&](std::string where, absl::string_view reason) {
    if (problems) problems->push_back({out.key, std::move(where), std::string(reason)});
  };
  const k8s::NetworkPolicySpec& spec = np.spec;
  if (!spec.error.empty()) {
    // Nothing of it can be trusted: every pod of the namespace, both directions, no allow.
    problem("spec", spec.error);
    out.ingress = out.egress = true;
    return out;
  }
  if (spec.policy_types.empty()) {
    out.ingress = true;
    out.egress = !spec.egress.empty();
  } else {
    for (const std::string& t : spec.policy_types) {
      if (t == "Ingress") {
        out.ingress = true;
      } else if (t == "Egress") {
        out.egress = true;
      } else {
        problem("policyTypes", absl::StrCat("unknown policy type \"", t, "\": enforcing both"));
        out.ingress = out.egress = true;
      }
    }
  }
  if (absl::Status st = ValidateSelector(spec.pod_selector); !st.ok()) {
    // Which pods it means is unknown: it selects them all and allows nothing.
    problem("podSelector", st.message());
    return out;
  }
  out.pod_selector = spec.pod_selector;
  auto compile_rules = [&](const std::vector<k8s::NetworkPolicyRule>& rules, const char* dir,
                           std::vector<CompiledRule>* compiled) {
    for (size_t i = 0; i < rules.size(); ++i) {
      absl::StatusOr<CompiledRule> r = CompileRule(rules[i]);
      if (!r.ok()) {
        problem(absl::StrCat(dir, "[", i, "]"), r.status().message());
        continue;
      }
      compiled->push_back(std::move(*r));
    }
  };
  if (out.ingress) compile_rules(spec.ingress, "ingress", &out.ingress_rules);
  if (out.egress) compile_rules(spec.egress, "egress", &out.egress_rules);
  return out;
}


bool Selects(const CompiledPolicy& p, const k8s::Pod& pod) {
  return p.ns == pod.meta.namespace_ && Matches(p.pod_selector, pod.meta.labels);
}

std::string NamedPortKey(uint8_t proto, std::string_view name) {
  const char* p = proto == IPPROTO_UDP ? "UDP" : proto == IPPROTO_SCTP ? "SCTP" : "TCP";
  return absl::StrCat(p, "/", std::string(name));
}

// ---- what an identity is, read back from its labels -----------------------------------------

struct IdentityView {
  uint32_t id = 0;
  bool is_pod = false;  // has a namespace: selectors may match it
  bool is_host = false;
  std::string ns;
  StringMap pod_labels, ns_labels;
  std::set<IpPrefix> cidrs;
  std::map<std::string, uint16_t> named_ports;  // "TCP/name" -> port
};

IdentityView ViewOf(uint32_t id, const LabelSet& labels) {
  IdentityView v;
  v.id = id;
  for (const std::string& l : labels) {
    std::string_view s = l;
    auto split = [](std::string_view kv) {
      size_t eq = kv.find('=');
      if (eq == std::string_view::npos) return std::pair<std::string, std::string>{kv, ""};
      return std::pair<std::string, std::string>{kv.substr(0, eq), kv.substr(eq + 1)};
    };
    if (s.starts_with(kNamespaceLabelSource)) {
      auto [k, val] = split(s.substr(kNamespaceLabelSource.size()));
      v.ns_labels[k] = val;
    } else if (s.starts_with(kNamespaceNameLabel)) {
      v.ns = std::string(s.substr(kNamespaceNameLabel.size()));
      v.is_pod = true;
    } else if (s.starts_with(kPodLabelSource)) {
      auto [k, val] = split(s.substr(kPodLabelSource.size()));
      v.pod_labels[k] = val;
    } else if (s.starts_with(kCidrSource)) {
      absl::StatusOr<IpPrefix> p = IpPrefix::Parse(std::string(s.substr(kCidrSource.size())));
      if (p.ok()) v.cidrs.insert(*p);
    } else if (s.starts_with(kNamedPortSource)) {
      auto [k, val] = split(s.substr(kNamedPortSource.size()));
      uint32_t port = 0;
      if (absl::SimpleAtoi(val, &port) && port <= 65535) v.named_ports[k] = port;
    } else if (s == absl::StrCat(std::string(kReservedSource), "host")) {
      v.is_host = true;
    }
  }
  return v;
}

// Thousands of addresses share a few hundred label sets: hashed once each instead of compared
// along a tree path.
struct LabelSetHash {
  size_t operator()(const LabelSet& labels) const {
    size_t h = labels.size();
    for (const std::string& l : labels) h = h * 1000003u ^ std::hash<std::string_view>{}(l);
    return h;
  }
};
// The same for label sets held elsewhere (a cache entry, an Addresses' storage), by content.
struct LabelSetPtrHash {
  size_t operator()(const LabelSet* labels) const { return LabelSetHash{}(*labels); }
};
struct LabelSetPtrEq {
  bool operator()(const LabelSet* a, const LabelSet* b) const { return *a == *b; }
};

// The label set of a reserved identity, built once.
const LabelSet& ReservedSet(uint32_t identity) {
  static const auto* const kSets = [] {
    auto* m = new std::map<uint32_t, LabelSet>;
    for (uint32_t r = SLUICE_IDENTITY_HOST; r <= SLUICE_IDENTITY_REMOTE_NODE; ++r) {
      (*m)[r] = ReservedLabels(r);
    }
    return m;
  }();
  return kSets->at(identity);
}

}  // namespace

struct TranslationCache::State {
  uint64_t batch = 0;  // entries not used in the latest batch are dropped at its end
  struct Policy {
    std::shared_ptr<const k8s::NetworkPolicy> np;
    std::string key;
    CompiledPolicy compiled;
    std::vector<PolicyProblem> problems;
    uint64_t used = 0;
  };
  std::unordered_map<const k8s::NetworkPolicy*, Policy> policies;
  // Every label set the entries below hold, once: equal sets share one entry, so that a batch
  // hashes and compares pointers, and the ones addresses have, walked in order, are the sorted
  // list Assign takes.
  struct Interned {
    uint64_t used = 0;       // the latest batch an entry below held it (else it is dropped)
    uint64_t addressed = 0;  // the latest batch an address had it
    uint64_t resolved = 0;   // the batch `id` was found in
    bool numbered = false;   // `id` is the allocator's (else the set had no number)
    uint32_t id = 0;
    uint64_t serial = 0;     // unique to this entry: equal serials, equal label sets
  };
  std::map<LabelSet, Interned> interned;
  uint64_t next_serial = 1;
  using Handle = std::map<LabelSet, Interned>::value_type*;
  Handle Intern(LabelSet labels) {
    auto [it, inserted] = interned.try_emplace(std::move(labels));
    if (inserted) it->second.serial = next_serial++;
    it->second.used = batch;
    return &*it;
  }
  // Whether the addresses' label sets are those of the batch before: counted as they are marked.
  size_t addressed_before = 0;  // how many the batch before had
  size_t addressed_kept = 0;    // of this batch's, how many the batch before had too
  size_t addressed_now = 0;
  void MarkAddressed(Interned& e) {
    if (e.addressed == batch) return;
    if (e.addressed + 1 == batch) ++addressed_kept;
    ++addressed_now;
    e.addressed = batch;
  }
  bool AddressedUnchanged() const {
    return addressed_kept == addressed_before && addressed_now == addressed_before;
  }
  absl::Status last_assign;  // what Assign said the last time it ran
  bool assigned = false;     // it has run with this cache
  struct Pod {
    std::shared_ptr<const k8s::Pod> pod;
    std::shared_ptr<const k8s::Namespace> ns;  // the Namespace object its labels were read from
    std::string key;
    Handle labels = nullptr;   // sorted, unique; without cidr: labels
    std::vector<IpPrefix> v4;  // its IPv4 pod IPs, as /32s
    // The label set of each address it claimed, where cidr: labels make it differ from
    // `labels`.
    struct Addressed {
      IpPrefix prefix;
      Handle labels = nullptr;  // nullptr: `labels`; else with the cidr: labels of `prefix`
    };
    std::vector<Addressed> addressed;
    uint64_t used = 0;
  };
  std::unordered_map<const k8s::Pod*, Pod> pods;
  // Each pod key's latest object in `pods`: a new object of a pod that reads the same to the
  // translator (status churn) takes its previous object's entry instead of computing it again.
  std::unordered_map<std::string, const k8s::Pod*> pod_by_key;
  std::set<std::pair<uint8_t, std::string>> named;  // the egress named ports of `pods`' labels
  std::set<IpPrefix> referenced;  // the ipBlock prefixes of `pods`' addressed labels
  // The identities of the latest translation, and how they differ from the one before.
  std::map<uint32_t, LabelSet> view_labels;
  std::map<uint32_t, uint64_t> view_serials;  // the interned entry each view was made from
  std::map<uint32_t, IdentityView> views;
  uint64_t views_gen = 0;
  std::vector<uint32_t> removed, added;  // from views_gen - 1 to views_gen, sorted
  struct Peers {
    uint64_t gen = 0;  // the views_gen `targets` was made for
    std::vector<uint32_t> targets;
    uint64_t version = 0;  // unique among all entries; new whenever targets or their views change
    uint64_t used = 0;
  };
  std::map<const CompiledRule*, Peers> peers;  // rules of `policies`' entries
  uint64_t next_version = 1;
  // An endpoint's result with everything it was computed from: equal inputs, equal result.
  struct EndpointInputs {
    uint32_t identity = 0;
    std::string pod_key;
    std::shared_ptr<const k8s::Pod> pod;
    std::vector<std::shared_ptr<const k8s::NetworkPolicy>> policies;  // those that apply to it
    std::vector<uint64_t> peer_versions;  // of their rules, in order
    uint64_t views_gen = 0;  // when a rule reads every identity (egress named port to anyone)
    std::vector<uint32_t> host_ids;
    bool operator==(const EndpointInputs&) const = default;
  };
  struct Endpoint {
    EndpointInputs inputs;
    EndpointPolicy result;
    uint64_t used = 0;
  };
  std::map<uint32_t, Endpoint> endpoints;
};

TranslationCache::TranslationCache() : state_(std::make_unique<State>()) {}
TranslationCache::~TranslationCache() = default;

namespace {

using CacheState = TranslationCache::State;

// The policies sorted by key, compiled (from `cache` when it has the object); `storage` holds the
// ones compiled without a cache.
std::vector<const CompiledPolicy*> CompileAll(const PolicyInput& in,
                                              std::vector<PolicyProblem>* problems,
                                              CacheState* cache,
                                              std::vector<std::unique_ptr<CompiledPolicy>>* storage) {
  std::vector<std::pair<std::string, const std::shared_ptr<const k8s::NetworkPolicy>*>> sorted;
  for (const auto& np : in.policies) {
    if (!np) continue;
    if (cache) {
      auto it = cache->policies.find(np.get());
      if (it != cache->policies.end()) {
        sorted.emplace_back(it->second.key, &np);
        continue;
      }
    }
    sorted.emplace_back(np->meta.Key(), &np);
  }
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<const CompiledPolicy*> out;
  for (const auto& [key, np] : sorted) {
    if (!cache) {
      storage->push_back(std::make_unique<CompiledPolicy>(CompilePolicy(**np, problems)));
      out.push_back(storage->back().get());
      continue;
    }
    auto [it, inserted] = cache->policies.try_emplace(np->get());
    CacheState::Policy& e = it->second;
    if (inserted) {
      e.np = *np;
      e.key = key;
      e.compiled = CompilePolicy(**np, &e.problems);
      e.compiled.source = *np;
    }
    e.used = cache->batch;
    if (problems) problems->insert(problems->end(), e.problems.begin(), e.problems.end());
    out.push_back(&e.compiled);
  }
  return out;
}

bool PeerMatches(const CompiledPeer& p, const std::string& policy_ns, const IdentityView& v) {
  if (p.is_block) {
    if (!p.v4 || !v.cidrs.contains(p.cidr)) return false;
    for (const IpPrefix& ex : p.except) {
      if (v.cidrs.contains(ex)) return false;
    }
    return true;
  }
  if (!v.is_pod) return false;
  if (p.namespace_selector) {
    if (!Matches(*p.namespace_selector, v.ns_labels)) return false;
  } else if (v.ns != policy_ns) {
    return false;
  }
  return !p.pod_selector || Matches(*p.pod_selector, v.pod_labels);
}

// ---- allow entries -------------------------------------------------------------------------

void AddPortRange(std::set<PolicyAllow>* out, uint32_t id, uint8_t dir, uint8_t proto,
                  uint16_t first, uint16_t last) {
  for (auto [port, n] : PortRangePrefixes(first, last)) {
    out->insert({id, dir, proto, port, static_cast<uint8_t>(8 + n)});
  }
}

// The entry of `a`'s identity, direction (and protocol) that allows the first `bits` of what `a`
// allows: 0 = every protocol, 8 = every port of the protocol, 8 + n = its top n port bits.
PolicyAllow Shorter(const PolicyAllow& a, int bits) {
  PolicyAllow shorter{a.identity, a.direction, 0, 0, static_cast<uint8_t>(bits)};
  if (bits >= 8) {
    shorter.proto = a.proto;
    int port_bits = bits - 8;
    uint16_t mask = port_bits == 0 ? 0 : static_cast<uint16_t>(0xffffu << (16 - port_bits));
    shorter.port = a.port & mask;
  }
  return shorter;
}

// Drops entries that a shorter prefix of the same identity and direction already allows.
std::vector<PolicyAllow> Minimal(const std::set<PolicyAllow>& all) {
  std::vector<PolicyAllow> out;
  // `all` is sorted by identity and direction first: each run of one (identity, direction) is
  // checked on its own, by comparing its few entries with each other; a long run asks the set.
  std::vector<const PolicyAllow*> run;
  auto flush = [&] {
    const bool small = run.size() <= 16;
    for (const PolicyAllow* a : run) {
      bool covered = false;
      if (small) {
        for (const PolicyAllow* b : run) {
          int bits = b->proto_port_bits;
          if (bits >= a->proto_port_bits || (bits > 0 && bits < 8)) continue;
          if (Shorter(*a, bits) == *b) {
            covered = true;
            break;
          }
        }
      } else {
        for (int bits = 0; bits < a->proto_port_bits && !covered; ++bits) {
          if (bits > 0 && bits < 8) continue;
          covered = all.contains(Shorter(*a, bits));
        }
      }
      if (!covered) out.push_back(*a);
    }
    run.clear();
  };
  for (const PolicyAllow& a : all) {
    if (!run.empty() && (run[0]->identity != a.identity || run[0]->direction != a.direction)) {
      flush();
    }
    run.push_back(&a);
  }
  flush();
  return out;
}

LabelSet PodLabelSet(const k8s::Pod& pod, const StringMap* ns_labels) {
  LabelSet out;
  const std::string& ns = pod.meta.namespace_;
  for (const auto& [k, v] : pod.meta.labels) {
    // Keys under the namespace prefix would read as the namespace: reserved.
    if (std::string_view(k).starts_with("io.kubernetes.pod.namespace")) continue;
    out.push_back(absl::StrCat(std::string(kPodLabelSource), k, "=", v));
  }
  out.push_back(absl::StrCat(std::string(kNamespaceNameLabel), ns));
  StringMap nsl = ns_labels ? *ns_labels : StringMap{};
  nsl.emplace(std::string(k8s::kLabelNamespaceName), ns);
  for (const auto& [k, v] : nsl) {
    out.push_back(absl::StrCat(std::string(kNamespaceLabelSource), k, "=", v));
  }
  return out;
}

bool PodHasAddresses(const k8s::Pod& pod) {
  return !pod.host_network && pod.phase != "Succeeded" && pod.phase != "Failed";
}

std::vector<IpPrefix> V4HostPrefixes(const k8s::Pod& pod) {
  std::vector<IpPrefix> out;
  for (const std::string& ip : pod.pod_ips) {
    absl::StatusOr<IpAddress> a = IpAddress::Parse(ip);
    if (a.ok() && a->is_v4()) out.push_back(Host32(*a));
  }
  return out;
}

}  // namespace

bool SameForPolicy(const k8s::Pod& a, const k8s::Pod& b) {
  auto terminal = [](const k8s::Pod& p) { return p.phase == "Succeeded" || p.phase == "Failed"; };
  return a.meta.namespace_ == b.meta.namespace_ && a.meta.name == b.meta.name &&
         a.meta.labels == b.meta.labels && a.meta.deleting == b.meta.deleting &&
         a.host_network == b.host_network && terminal(a) == terminal(b) &&
         a.pod_ips == b.pod_ips && a.container_ports == b.container_ports;
}

bool SameForPolicy(const k8s::Namespace& a, const k8s::Namespace& b) {
  return a.meta.name == b.meta.name && a.meta.labels == b.meta.labels;
}

bool SameForPolicy(const k8s::Node& a, const k8s::Node& b) {
  return a.meta.name == b.meta.name && a.internal_ips == b.internal_ips &&
         a.pod_cidrs == b.pod_cidrs;
}

std::vector<std::pair<uint16_t, int>> PortRangePrefixes(uint16_t first, uint16_t last) {
  std::vector<std::pair<uint16_t, int>> out;
  uint32_t lo = first;
  const uint32_t hi = last;
  while (lo <= hi) {
    int n = 16;
    while (n > 0) {
      uint32_t size = 1u << (16 - (n - 1));
      if ((lo & (size - 1)) != 0 || lo + size - 1 > hi) break;
      --n;
    }
    out.emplace_back(static_cast<uint16_t>(lo), n);
    lo += 1u << (16 - n);
  }
  return out;
}

namespace {

// An address and its label set, which lives in the TranslationCache or in `owned`.
struct AddressRef {
  IpPrefix prefix;
  const LabelSet* labels;
  CacheState::Handle interned = nullptr;  // with a cache: the entry of `labels`
};
struct Addresses {
  std::vector<AddressRef> refs;  // sorted by prefix
  std::deque<LabelSet> owned;
  const LabelSet* Own(LabelSet labels) {
    owned.push_back(std::move(labels));
    return &owned.back();
  }
};

Addresses ClassifyAddressesImpl(const PolicyInput& in, CacheState* cache) {
  std::vector<std::unique_ptr<CompiledPolicy>> storage;
  std::vector<const CompiledPolicy*> policies = CompileAll(in, nullptr, cache, &storage);
  std::set<IpPrefix> referenced;
  std::set<std::pair<uint8_t, std::string>> named;  // egress named ports
  for (const CompiledPolicy* pp : policies) {
    const CompiledPolicy& p = *pp;
    for (const auto* rules : {&p.ingress_rules, &p.egress_rules}) {
      for (const CompiledRule& r : *rules) {
        for (const CompiledPeer& peer : r.peers) {
          if (!peer.is_block || !peer.v4) continue;
          referenced.insert(peer.cidr);
          referenced.insert(peer.except.begin(), peer.except.end());
        }
        if (rules != &p.egress_rules) continue;
        for (const CompiledPort& port : r.ports) {
          if (!port.name.empty()) named.insert({port.proto, port.name});
        }
      }
    }
  }

  std::map<std::string, const std::shared_ptr<const k8s::Namespace>*> namespaces;
  for (const auto& ns : in.namespaces) {
    if (ns) namespaces[ns->meta.name] = &ns;
  }
  if (cache && (cache->named != named || cache->referenced != referenced)) {
    cache->pods.clear();
    cache->pod_by_key.clear();
    cache->named = named;
    cache->referenced = referenced;
  }
  Addresses result;
  // A pod's key and label set (sorted, unique), from the cache when it has the pod and the
  // namespace object its labels were read from.
  struct PodRef {
    const k8s::Pod* pod;
    const std::string* key;
    CacheState::Pod* entry;  // nullptr: no cache, the label set is computed when claimed
    std::string own_key;
  };
  auto pod_labels_of = [&](const k8s::Pod& pod) {
    auto it = namespaces.find(pod.meta.namespace_);
    LabelSet labels =
        PodLabelSet(pod, it == namespaces.end() ? nullptr : &(*it->second)->meta.labels);
    for (const auto& [proto, name] : named) {
      for (const k8s::ContainerPort& cp : pod.container_ports) {
        if (cp.name == name && IpProto(cp.protocol) == proto && cp.port > 0 && cp.port <= 65535) {
          labels.push_back(
              absl::StrCat(std::string(kNamedPortSource), NamedPortKey(proto, name), "=", cp.port));
          break;
        }
      }
    }
    std::sort(labels.begin(), labels.end());
    labels.erase(std::unique(labels.begin(), labels.end()), labels.end());
    return labels;
  };
  std::vector<PodRef> refs;
  refs.reserve(in.pods.size());
  for (const auto& p : in.pods) {
    if (!p) continue;
    if (!cache) {
      refs.push_back({p.get(), nullptr, nullptr, p->meta.Key()});
      refs.back().key = &refs.back().own_key;
      continue;
    }
    auto nit = namespaces.find(p->meta.namespace_);
    const std::shared_ptr<const k8s::Namespace> ns =
        nit == namespaces.end() ? nullptr : *nit->second;
    auto [it, inserted] = cache->pods.try_emplace(p.get());
    CacheState::Pod& e = it->second;
    bool current = !inserted && e.ns == ns;
    if (inserted) {
      std::string key = p->meta.Key();
      auto [kit, new_key] = cache->pod_by_key.try_emplace(key, p.get());
      if (!new_key && kit->second != p.get()) {
        auto prev = cache->pods.find(kit->second);
        if (prev != cache->pods.end() && prev->second.ns == ns &&
            SameForPolicy(*prev->second.pod, *p)) {
          e = prev->second;  // the previous entry stays until the batch's end drops it
          e.pod = p;
          current = true;
        }
      }
      kit->second = p.get();
    }
    if (!current) {
      e.pod = p;
      e.ns = ns;
      e.key = p->meta.Key();
      e.labels = cache->Intern(pod_labels_of(*p));
      e.v4 = V4HostPrefixes(*p);
      e.addressed.clear();
    }
    e.used = cache->batch;
    // What the entry holds stays interned as long as the entry stays.
    e.labels->second.used = cache->batch;
    for (const auto& a : e.addressed) {
      if (a.labels) a.labels->second.used = cache->batch;
    }
    refs.push_back({p.get(), &e.key, &e, {}});
  }
  // Only the local endpoints' pods are looked up by key.
  std::vector<std::string> endpoint_keys;
  endpoint_keys.reserve(in.endpoints.size());  // the views below point into it
  std::unordered_map<std::string_view, const PodRef*> endpoint_pods;
  for (const PolicyEndpoint& ep : in.endpoints) {
    endpoint_keys.push_back(absl::StrCat(ep.pod_namespace, "/", ep.pod_name));
    endpoint_pods.try_emplace(endpoint_keys.back(), nullptr);
  }
  for (const PodRef& r : refs) {
    auto it = endpoint_pods.find(*r.key);
    if (it != endpoint_pods.end()) it->second = &r;
  }

  struct Claim {
    const LabelSet* labels = nullptr;  // without cidr: labels
    CacheState::Pod* entry = nullptr;  // a cached pod's claim
    const PodRef* pod = nullptr;       // a pod's claim by its address (others are never taken over)
  };
  std::map<IpPrefix, Claim> out;
  // Two pods claiming one address (one is going away): the live one, then the first by key.
  auto before = [](const PodRef& a, const PodRef& b) {
    if (a.pod->meta.deleting != b.pod->meta.deleting) return !a.pod->meta.deleting;
    return *a.key < *b.key;
  };
  auto claim = [&](const IpPrefix& prefix, const PodRef& r, bool by_address) {
    auto [it, inserted] = out.try_emplace(prefix);
    if (!inserted && (it->second.pod == nullptr || !by_address || !before(r, *it->second.pod))) {
      return;
    }
    it->second.entry = r.entry;
    it->second.labels = r.entry ? &r.entry->labels->first : result.Own(pod_labels_of(*r.pod));
    it->second.pod = by_address ? &r : nullptr;
  };
  auto reserved = [](uint32_t id) { return Claim{&ReservedSet(id), nullptr, nullptr}; };
  // Local endpoints first: their address is known before the Pod's status says it.
  for (size_t i = 0; i < in.endpoints.size(); ++i) {
    const PolicyEndpoint& ep = in.endpoints[i];
    if (!ep.address.is_v4()) continue;
    const PodRef* r = endpoint_pods.at(endpoint_keys[i]);
    if (r == nullptr) {
      out.emplace(Host32(ep.address), reserved(SLUICE_IDENTITY_UNMANAGED));
    } else {
      claim(Host32(ep.address), *r, /*by_address=*/false);
    }
  }
  for (const PodRef& r : refs) {
    if (!PodHasAddresses(*r.pod)) continue;
    if (r.entry) {
      for (const IpPrefix& a : r.entry->v4) claim(a, r, /*by_address=*/true);
    } else {
      for (const IpPrefix& a : V4HostPrefixes(*r.pod)) claim(a, r, /*by_address=*/true);
    }
  }
  std::vector<IpPrefix> pod_cidrs;
  for (const auto& node : in.nodes) {
    if (!node) continue;
    uint32_t base = node->meta.name == in.node_name ? SLUICE_IDENTITY_HOST
                                                    : SLUICE_IDENTITY_REMOTE_NODE;
    for (const std::string& ip : node->internal_ips) {
      absl::StatusOr<IpAddress> a = IpAddress::Parse(ip);
      if (a.ok() && a->is_v4()) out.emplace(Host32(*a), reserved(base));
    }
    for (const std::string& c : node->pod_cidrs) {
      absl::StatusOr<IpPrefix> p = ParseMaskedPrefix(c);
      if (p.ok() && p->network().is_v4()) pod_cidrs.push_back(*p);
    }
  }
  for (const IpPrefix& p : pod_cidrs) out.emplace(p, reserved(SLUICE_IDENTITY_UNMANAGED));
  for (const IpPrefix& r : referenced) {
    bool in_pods = std::any_of(pod_cidrs.begin(), pod_cidrs.end(),
                               [&](const IpPrefix& c) { return Covers(c, r); });
    out.emplace(r, reserved(in_pods ? SLUICE_IDENTITY_UNMANAGED : SLUICE_IDENTITY_WORLD));
  }
  out.emplace(*IpPrefix::Make(IpAddress::V4(0), 0), reserved(SLUICE_IDENTITY_WORLD));

  // Every label set above is sorted and unique already; a cidr: label makes it unsorted.
  auto with_cidrs = [&](const IpPrefix& prefix, const LabelSet& labels) -> std::optional<LabelSet> {
    std::optional<LabelSet> l;
    for (const IpPrefix& r : referenced) {
      if (!Covers(r, prefix)) continue;
      if (!l) l = labels;
      l->push_back(absl::StrCat(std::string(kCidrSource), r.ToString()));
    }
    if (l) {
      std::sort(l->begin(), l->end());
      l->erase(std::unique(l->begin(), l->end()), l->end());
    }
    return l;
  };
  result.refs.reserve(out.size());
  for (const auto& [prefix, c] : out) {
    if (cache == nullptr) {
      std::optional<LabelSet> l = with_cidrs(prefix, *c.labels);
      result.refs.push_back({prefix, l ? result.Own(std::move(*l)) : c.labels});
      continue;
    }
    CacheState::Handle h = nullptr;
    if (c.entry == nullptr) {
      // Reserved and endpoint-only claims: few, interned again each batch.
      std::optional<LabelSet> l = with_cidrs(prefix, *c.labels);
      h = cache->Intern(l ? std::move(*l) : *c.labels);
    } else {
      // A cached pod: what its address was found to be, the first time.
      auto& seen = c.entry->addressed;
      const auto& want = prefix;  // a structured binding: clang 14 cannot capture one
      auto it = std::find_if(seen.begin(), seen.end(),
                             [&](const CacheState::Pod::Addressed& a) { return a.prefix == want; });
      if (it == seen.end()) {
        std::optional<LabelSet> l = with_cidrs(prefix, *c.labels);
        seen.push_back({prefix, l ? cache->Intern(std::move(*l)) : nullptr});
        it = std::prev(seen.end());
      }
      h = it->labels ? it->labels : c.entry->labels;
    }
    cache->MarkAddressed(h->second);
    result.refs.push_back({prefix, &h->first, h});
  }
  return result;
}

}  // namespace

std::vector<PolicyAddress> ClassifyAddresses(const PolicyInput& in) {
  Addresses a = ClassifyAddressesImpl(in, nullptr);
  std::vector<PolicyAddress> out;
  out.reserve(a.refs.size());
  for (const AddressRef& r : a.refs) out.push_back({r.prefix, *r.labels});
  return out;
}

namespace {

PolicyTranslation TranslateImpl(const PolicyInput& in, const std::vector<AddressRef>& addresses,
                                const IdentityAllocator& ids, CacheState* cache) {
  PolicyTranslation out;
  std::map<uint32_t, const LabelSet*> labels_of;
  std::map<uint32_t, uint64_t> serial_of;  // numbers whose label set is that interned entry's
  std::unordered_map<const LabelSet*, uint32_t, LabelSetPtrHash, LabelSetPtrEq> found;
  out.ipcache.reserve(addresses.size());
  for (const AddressRef& a : addresses) {
    if (a.interned) {
      // Once per label set and batch; a set that had a number in the batch before and is
      // still wanted kept it (Assign's promise).
      CacheState::Interned& e = a.interned->second;
      if (e.resolved != cache->batch) {
        if (!(e.numbered && e.resolved + 1 == cache->batch)) {
          std::optional<uint32_t> id = ids.Find(*a.labels);
          e.numbered = id.has_value();
          e.id = id.value_or(SLUICE_IDENTITY_UNMANAGED);
        }
        e.resolved = cache->batch;
        labels_of.try_emplace(e.id, ids.Labels(e.id));
        if (e.numbered) serial_of[e.id] = e.serial;
      }
      out.ipcache.push_back({a.prefix, e.id});
      continue;
    }
    auto [fit, inserted] = found.try_emplace(a.labels, SLUICE_IDENTITY_UNMANAGED);
    if (inserted) {
      fit->second = ids.Find(*a.labels).value_or(SLUICE_IDENTITY_UNMANAGED);
      labels_of.try_emplace(fit->second, ids.Labels(fit->second));
    }
    out.ipcache.push_back({a.prefix, fit->second});
  }
  std::sort(out.ipcache.begin(), out.ipcache.end());  // sorted already: one pass
  // ipcache prefixes are unique: the identity of one, by binary search.
  auto identity_of = [&](const IpPrefix& prefix) -> std::optional<uint32_t> {
    auto it = std::lower_bound(
        out.ipcache.begin(), out.ipcache.end(), prefix,
        [](const IpcacheEntry& e, const IpPrefix& p) { return e.prefix < p; });
    if (it == out.ipcache.end() || it->prefix != prefix) return std::nullopt;
    return it->identity;
  };
  static const LabelSet kNoLabels;
  std::map<uint32_t, IdentityView> own_views;
  if (cache) {
    // The identities that came, went or changed their labels since the last translation.
    // The same interned entry both times means the same labels, without comparing them.
    auto same = [&](uint32_t id, const LabelSet* now, const LabelSet& before) {
      auto s = serial_of.find(id);
      auto b = cache->view_serials.find(id);
      if (s != serial_of.end() && b != cache->view_serials.end() && s->second == b->second) {
        return true;
      }
      return *(now ? now : &kNoLabels) == before;
    };
    std::vector<uint32_t> removed, added;
    for (const auto& [id, labels] : cache->view_labels) {
      auto it = labels_of.find(id);
      if (it == labels_of.end() || !same(id, it->second, labels)) removed.push_back(id);
    }
    for (const auto& [id, labels] : labels_of) {
      auto it = cache->view_labels.find(id);
      if (it == cache->view_labels.end() || !same(id, labels, it->second)) added.push_back(id);
    }
    // Serials follow the entries whatever else changed.
    cache->view_serials = serial_of;
    if (!removed.empty() || !added.empty()) {
      for (uint32_t id : removed) {
        cache->view_labels.erase(id);
        cache->views.erase(id);
      }
      for (uint32_t id : added) {
        const LabelSet& l = labels_of[id] ? *labels_of[id] : kNoLabels;
        cache->view_labels[id] = l;
        cache->views[id] = ViewOf(id, l);
      }
      ++cache->views_gen;
      cache->removed = std::move(removed);
      cache->added = std::move(added);
    }
  } else {
    for (const auto& [id, labels] : labels_of) own_views[id] = ViewOf(id, labels ? *labels : kNoLabels);
  }
  const std::map<uint32_t, IdentityView>& views = cache ? cache->views : own_views;

  std::vector<std::unique_ptr<CompiledPolicy>> storage;
  std::vector<const CompiledPolicy*> policies = CompileAll(in, &out.problems, cache, &storage);
  // Only the local endpoints' pods are needed: (namespace, name) -> the Pod (nullptr: none).
  std::map<std::pair<std::string_view, std::string_view>, const std::shared_ptr<const k8s::Pod>*>
      pods_by_key;
  for (const PolicyEndpoint& ep : in.endpoints) {
    pods_by_key.try_emplace({ep.pod_namespace, ep.pod_name}, nullptr);
  }
  for (const auto& p : in.pods) {
    if (!p) continue;
    auto it = pods_by_key.find({p->meta.namespace_, p->meta.name});
    if (it != pods_by_key.end()) it->second = &p;
  }
  std::vector<uint32_t> host_ids;
  for (const auto& [id, view] : views) {
    if (view.is_host) host_ids.push_back(id);
  }

  // The peer identities of a rule depend on the rule alone, not on the endpoint it is applied
  // to: found once per translation (a scan of every identity), shared by every endpoint its
  // policy selects.
  std::map<const CompiledRule*, std::vector<uint32_t>> peers_of_rule;
  auto matches = [](const CompiledPolicy& policy, const CompiledRule& rule,
                    const IdentityView& view) {
    for (const CompiledPeer& peer : rule.peers) {
      if (PeerMatches(peer, policy.ns, view)) return true;
    }
    return false;
  };
  auto all_peers = [&](const CompiledPolicy& policy, const CompiledRule& rule,
                       std::vector<uint32_t>* targets) {
    targets->clear();
    if (rule.peers.empty()) {
      targets->push_back(SLUICE_IDENTITY_ANY);
      return;
    }
    for (const auto& [id, view] : views) {
      if (matches(policy, rule, view)) targets->push_back(id);
    }
  };
  auto peers_of = [&](const CompiledPolicy& policy,
                      const CompiledRule& rule) -> const std::vector<uint32_t>& {
    if (!cache) {
      auto [it, inserted] = peers_of_rule.try_emplace(&rule);
      if (inserted) all_peers(policy, rule, &it->second);
      return it->second;
    }
    auto [it, inserted] = cache->peers.try_emplace(&rule);
    CacheState::Peers& e = it->second;
    e.used = cache->batch;
    if (!inserted && e.gen == cache->views_gen) return e.targets;
    if (!inserted && e.gen + 1 == cache->views_gen && !rule.peers.empty()) {
      // Only the identities that changed since: the others match as they did.
      std::vector<uint32_t> kept;
      kept.reserve(e.targets.size() + cache->added.size());
      std::set_difference(e.targets.begin(), e.targets.end(), cache->removed.begin(),
                          cache->removed.end(), std::back_inserter(kept));
      std::vector<uint32_t> fresh;
      for (uint32_t id : cache->added) {
        if (matches(policy, rule, views.at(id))) fresh.push_back(id);
      }
      // An identity that stayed a target but changed its labels is in both lists: a change.
      if (kept.size() != e.targets.size() || !fresh.empty()) e.version = cache->next_version++;
      e.targets.clear();
      std::merge(kept.begin(), kept.end(), fresh.begin(), fresh.end(),
                 std::back_inserter(e.targets));
    } else {
      all_peers(policy, rule, &e.targets);
      e.version = cache->next_version++;
    }
    e.gen = cache->views_gen;
    return e.targets;
  };

  std::vector<PolicyEndpoint> endpoints = in.endpoints;
  std::sort(endpoints.begin(), endpoints.end(),
            [](const auto& a, const auto& b) { return a.endpoint_id < b.endpoint_id; });
  for (const PolicyEndpoint& ep : endpoints) {
    EndpointPolicy result;
    result.endpoint_id = ep.endpoint_id;
    result.pod = absl::StrCat(ep.pod_namespace, "/", ep.pod_name);
    if (ep.address.is_v4()) {
      if (auto id = identity_of(Host32(ep.address))) result.identity = *id;
    }
    const std::shared_ptr<const k8s::Pod>* found_pod =
        pods_by_key.at({ep.pod_namespace, ep.pod_name});
    const k8s::Pod* pod = found_pod ? found_pod->get() : nullptr;

    CacheState::Endpoint* entry = nullptr;
    if (cache) {
      // What the result depends on, walked as below; an entry made from the same is reused.
      CacheState::EndpointInputs inputs;
      inputs.identity = result.identity;
      inputs.pod_key = result.pod;
      if (pod != nullptr) inputs.pod = *found_pod;
      inputs.host_ids = host_ids;
      for (const CompiledPolicy* pp : policies) {
        const CompiledPolicy& policy = *pp;
        if (policy.ns != ep.pod_namespace) continue;
        if (pod != nullptr && !Selects(policy, *pod)) continue;
        inputs.policies.push_back(policy.source);
        if (pod == nullptr) continue;
        for (const auto& [on, rules, dir] :
             {std::tuple{policy.ingress, &policy.ingress_rules, kIngress},
              std::tuple{policy.egress, &policy.egress_rules, kEgress}}) {
          if (!on) continue;
          for (const CompiledRule& rule : *rules) {
            peers_of(policy, rule);
            inputs.peer_versions.push_back(cache->peers.at(&rule).version);
            if (dir != kEgress || !rule.peers.empty()) continue;
            for (const CompiledPort& port : rule.ports) {
              if (!port.name.empty()) inputs.views_gen = cache->views_gen;
            }
          }
        }
      }
      auto [it, inserted] = cache->endpoints.try_emplace(ep.endpoint_id);
      entry = &it->second;
      entry->used = cache->batch;
      if (!inserted && entry->inputs == inputs) {
        out.endpoints.push_back(entry->result);
        continue;
      }
      entry->inputs = std::move(inputs);
    }

    std::set<PolicyAllow> allows;
    auto add_rule = [&](const CompiledPolicy& policy, const CompiledRule& rule, uint8_t dir) {
      const std::vector<uint32_t>& targets = peers_of(policy, rule);
      if (rule.ports.empty()) {
        for (uint32_t t : targets) allows.insert({t, dir, 0, 0, 0});
        return;
      }
      for (const CompiledPort& port : rule.ports) {
        if (port.name.empty()) {
          for (uint32_t t : targets) {
            if (port.all_ports) {
              allows.insert({t, dir, port.proto, 0, 8});
            } else {
              AddPortRange(&allows, t, dir, port.proto, port.first, port.last);
            }
          }
          continue;
        }
        if (dir == kIngress) {
          // The destination is this endpoint: its own container port of that name.
          for (const k8s::ContainerPort& cp : pod->container_ports) {
            if (cp.name != port.name || IpProto(cp.protocol) != port.proto) continue;
            if (cp.port < 1 || cp.port > 65535) continue;
            for (uint32_t t : targets) {
              AddPortRange(&allows, t, dir, port.proto, cp.port, cp.port);
            }
          }
          continue;
        }
        // Egress: the destination is the peer, and each peer identity knows its named ports.
        const std::string key = NamedPortKey(port.proto, port.name);
        auto add_for = [&](const IdentityView& view) {
          auto np = view.named_ports.find(key);
          if (np == view.named_ports.end()) return;
          AddPortRange(&allows, view.id, dir, port.proto, np->second, np->second);
        };
        for (uint32_t t : targets) {
          if (t == SLUICE_IDENTITY_ANY) {
            for (const auto& [id, view] : views) add_for(view);
          } else {
            add_for(views.at(t));
          }
        }
      }
    };

    for (const CompiledPolicy* pp : policies) {
      const CompiledPolicy& policy = *pp;
      if (policy.ns != ep.pod_namespace) continue;
      // Without its Pod the endpoint's labels are unknown: any policy of its namespace may
      // select it, and none of their allows is trusted.
      if (pod != nullptr && !Selects(policy, *pod)) continue;
      if (policy.ingress) result.enforce_ingress = true;
      if (policy.egress) result.enforce_egress = true;
      result.policies.push_back(policy.key);
      if (pod == nullptr) continue;
      if (policy.ingress) {
        for (const CompiledRule& r : policy.ingress_rules) add_rule(policy, r, kIngress);
      }
      if (policy.egress) {
        for (const CompiledRule& r : policy.egress_rules) add_rule(policy, r, kEgress);
      }
    }
    // The node itself (kubelet probes) always reaches its pods.
    if (result.enforce_ingress) {
      for (uint32_t id : host_ids) allows.insert({id, kIngress, 0, 0, 0});
    }
    result.allows = Minimal(allows);
    if (entry) entry->result = result;
    out.endpoints.push_back(std::move(result));
  }
  return out;
}

}  // namespace

PolicyTranslation TranslatePolicy(const PolicyInput& in,
                                  const std::vector<PolicyAddress>& addresses,
                                  const IdentityAllocator& ids) {
  std::vector<AddressRef> refs;
  refs.reserve(addresses.size());
  for (const PolicyAddress& a : addresses) refs.push_back({a.prefix, &a.labels});
  return TranslateImpl(in, refs, ids, nullptr);
}

PolicyTranslation TranslatePolicy(const PolicyInput& in, IdentityAllocator* ids) {
  return TranslatePolicy(in, ids, nullptr);
}

PolicyTranslation TranslatePolicy(const PolicyInput& in, IdentityAllocator* ids,
                                  TranslationCache* cache) {
  CacheState* state = cache ? &cache->state() : nullptr;
  if (state) ++state->batch;
  Addresses addresses = ClassifyAddressesImpl(in, state);
  std::vector<const LabelSet*> wanted;  // the addresses' label sets, sorted, unique
  if (state) {
    for (const auto& [labels, e] : state->interned) {
      if (e.addressed == state->batch) wanted.push_back(&labels);
    }
  } else {
    std::unordered_set<const LabelSet*, LabelSetPtrHash, LabelSetPtrEq> unique;
    for (const AddressRef& a : addresses.refs) unique.insert(a.labels);
    wanted.assign(unique.begin(), unique.end());
    std::sort(wanted.begin(), wanted.end(),
              [](const LabelSet* a, const LabelSet* b) { return *a < *b; });
  }
  absl::Status st;
  if (state && state->assigned && state->AddressedUnchanged()) {
    st = state->last_assign;  // the same label sets: Assign would change nothing
  } else {
    st = ids->Assign(wanted);
    if (state) {
      state->last_assign = st;
      state->assigned = true;
    }
  }
  if (state) {
    state->addressed_before = state->addressed_now;
    state->addressed_now = state->addressed_kept = 0;
  }
  PolicyTranslation out = TranslateImpl(in, addresses.refs, *ids, state);
  if (!st.ok()) out.problems.insert(out.problems.begin(), {"", "identities", std::string(st.message())});
  if (state) {
    // What this batch did not use is gone from the cluster (or unused by policy): drop it.
    std::erase_if(state->peers, [&](const auto& e) { return e.second.used != state->batch; });
    std::erase_if(state->policies, [&](const auto& e) { return e.second.used != state->batch; });
    std::erase_if(state->pods, [&](const auto& e) { return e.second.used != state->batch; });
    std::erase_if(state->pod_by_key, [&](const auto& e) { return !state->pods.contains(e.second); });
    std::erase_if(state->endpoints, [&](const auto& e) { return e.second.used != state->batch; });
    // After the pods: what no entry holds any more.
    std::erase_if(state->interned, [&](const auto& e) { return e.second.used != state->batch; });
  }
  return out;
}

}  // namespace sluice::agent
