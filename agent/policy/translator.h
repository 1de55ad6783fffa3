// NetworkPolicy translation: Pods, Namespaces, Nodes and NetworkPolicies of the cluster, seen from
// one node, become the desired contents of sluice_ipcache4 (every address policy can tell apart
// -> its identity) and, for every local endpoint, of sluice_policy_ep and sluice_policy4
// (maps/policy.h). All networking.k8s.io/v1 semantics live here; see docs/policy.md.
//
// Three steps, so that the stateful part (numbering) stays out of the pure ones:
//   ClassifyAddresses(in)            pure: address -> label set
//   IdentityAllocator::Assign(sets)  numbers the label sets (stable)
//   TranslatePolicy(in, addrs, ids)  pure: the desired map contents
// TranslatePolicy(in, &ids) runs all three.
#pragma once

#include <compare>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "agent/base/net.h"
#include "agent/k8s/model.h"
#include "agent/policy/identity.h"

namespace sluice::agent {

// A pod interface on this node (from the endpoint store).
struct PolicyEndpoint {
  uint32_t endpoint_id = 0;
  std::string pod_namespace;
  std::string pod_name;
  IpAddress address;  // IPv4
};

struct PolicyInput {
  std::string node_name;  // Nodes with this name are "host", the others "remote-node"
  std::vector<std::shared_ptr<const k8s::Pod>> pods;  // of the whole cluster
  std::vector<std::shared_ptr<const k8s::Namespace>> namespaces;
  std::vector<std::shared_ptr<const k8s::NetworkPolicy>> policies;
  std::vector<std::shared_ptr<const k8s::Node>> nodes;
  std::vector<PolicyEndpoint> endpoints;  // this node's
};

// One entry the ipcache must hold, with what policy can tell about it.
struct PolicyAddress {
  IpPrefix prefix;
  LabelSet labels;
  friend bool operator==(const PolicyAddress&, const PolicyAddress&) = default;
};

struct IpcacheEntry {
  IpPrefix prefix;
  uint32_t identity = 0;
  friend auto operator<=>(const IpcacheEntry&, const IpcacheEntry&) = default;
};

// One allow entry of sluice_policy4 for an endpoint. proto_port_bits as in MakePolicy4Key: 0 =
// every protocol, 8 = every port of proto, 8 + n = ports sharing the top n bits of `port`; bits
// beyond the prefix are zero.
struct PolicyAllow {
  uint32_t identity = 0;  // SLUICE_IDENTITY_ANY: every peer
  uint8_t direction = 0;  // enum sluice_policy_direction
  uint8_t proto = 0;
  uint16_t port = 0;
  uint8_t proto_port_bits = 0;
  friend auto operator<=>(const PolicyAllow&, const PolicyAllow&) = default;
};

struct EndpointPolicy {
  uint32_t endpoint_id = 0;
  std::string pod;        // "namespace/name"
  uint32_t identity = 0;  // the endpoint's own
  bool enforce_ingress = false;  // selected by a policy of that type: sluice_policy_ep flags
  bool enforce_egress = false;
  std::vector<PolicyAllow> allows;  // sorted, unique, none covered by a shorter one of its
                                    // identity and direction
  std::vector<std::string> policies;  // the policies that select it ("namespace/name"), in
                                      // input order: named when its policy does not fit
  friend bool operator==(const EndpointPolicy&, const EndpointPolicy&) = default;
};

// A part of a policy that was rejected (bad input); it allows nothing, the rest still applies.
struct PolicyProblem {
  std::string policy;  // "namespace/name"
  std::string where;   // "ingress[1]", "egress[0]", "spec", "podSelector", "policyTypes"
  std::string reason;
  friend bool operator==(const PolicyProblem&, const PolicyProblem&) = default;
};

struct PolicyTranslation {
  std::vector<IpcacheEntry> ipcache;       // sorted by prefix
  std::vector<EndpointPolicy> endpoints;   // one per input endpoint, sorted by endpoint id
  std::vector<PolicyProblem> problems;     // in policy order
};

// Every address the ipcache must know (IPv4): 0.0.0.0/0 (world), each ipBlock cidr and except
// (world, or unmanaged inside a pod CIDR), each Node's pod CIDR (unmanaged) and InternalIPs (host
// or remote-node), each pod address (its labels; a local endpoint without a known Pod is
// unmanaged). Every label set also names the ipBlock prefixes that contain the address and the
// egress named ports the pod has. Sorted by prefix.
std::vector<PolicyAddress> ClassifyAddresses(const PolicyInput& in);

// The desired maps. `ids` must have numbered every label set of `addresses`; an address whose
// label set has no number is unmanaged.
PolicyTranslation TranslatePolicy(const PolicyInput& in,
                                  const std::vector<PolicyAddress>& addresses,
                                  const IdentityAllocator& ids);

// ClassifyAddresses, ids->Assign, TranslatePolicy. An Assign error is returned as a problem
// with policy "".
PolicyTranslation TranslatePolicy(const PolicyInput& in, IdentityAllocator* ids);

// What one translation can hand to the next so that a batch after a change costs what the change
// affects: each Pod's label set, each NetworkPolicy compiled, each identity read back from its
// labels and each rule's peer identities (updated by the identities that came and went), every
// label set once (interned: a batch compares pointers, and numbers a set again only when the sets
// changed). An entry is reused only for the very object it was made from (the cache holds the
// shared_ptr, so a pointer seen again is the same content), or a Pod's new object that is
// SameForPolicy as the old, and the same surroundings (the Pod's Namespace object, the named
// ports and ipBlock prefixes policies use); everything else is computed as without a cache. The result
// is the one TranslatePolicy(in, ids) gives (tests/agent/policy/translator_cache_test.cc checks
// random change sequences). Not thread-safe; one cache per allocator.
class TranslationCache {
 public:
  TranslationCache();
  ~TranslationCache();
  TranslationCache(const TranslationCache&) = delete;
  TranslationCache& operator=(const TranslationCache&) = delete;
  struct State;
  State& state() { return *state_; }

 private:
  std::unique_ptr<State> state_;
};

// TranslatePolicy(in, ids) with `cache` (nullptr: none): the same result.
PolicyTranslation TranslatePolicy(const PolicyInput& in, IdentityAllocator* ids,
                                  TranslationCache* cache);

// Whether two versions of an object read the same to the translator: the fields of a Pod
// (namespace, name, labels, deletion, hostNetwork, terminal phase, pod IPs, container ports), a
// Namespace (name, labels) and a Node (name, InternalIPs, pod CIDRs) it uses. Status churn is
// the same; PolicySync runs no batch for it and the TranslationCache keeps a pod's entry.
bool SameForPolicy(const k8s::Pod& a, const k8s::Pod& b);
bool SameForPolicy(const k8s::Namespace& a, const k8s::Namespace& b);
bool SameForPolicy(const k8s::Node& a, const k8s::Node& b);

// [first, last] (host order, first <= last) as the fewest port prefixes: (port, n) pairs.
std::vector<std::pair<uint16_t, int>> PortRangePrefixes(uint16_t first, uint16_t last);

}  // namespace sluice::agent
