/* NetworkPolicy: the ipcache (address -> security identity) and the policy maps (which peer
 * identities an endpoint may talk to, per direction, protocol and port). Written by the agent
 * (agent/policy/); read by the datapath, whose verdict costs a constant number of lookups
 * whatever the number of rules: see docs/policy.md. */
#ifndef SLUICE_MAPS_POLICY_H
#define SLUICE_MAPS_POLICY_H

#include "types.h"
#include "node.h" /* struct sluice_lpm4_key */

#define SLUICE_IPCACHE4_MAX_ENTRIES 524288
#define SLUICE_POLICY4_MAX_ENTRIES 1048576
#define SLUICE_POLICY_EP_MAX_ENTRIES 65536

/* Security identities. Numbers are node-local (the overlay does not carry them: a receiver derives
 * the source identity from its own ipcache) and stay below 2^24 so that a VNI could carry them
 * later. 1..255 are reserved with fixed meanings; label-set identities start at
 * SLUICE_IDENTITY_MIN_DYNAMIC. */
enum sluice_identity {
	SLUICE_IDENTITY_ANY = 0,         /* only in sluice_policy4 keys: a rule for every peer */
	SLUICE_IDENTITY_HOST = 1,        /* this node's own addresses (kubelet probes, hostNetwork) */
	SLUICE_IDENTITY_WORLD = 2,       /* outside the cluster, in no ipBlock of any policy */
	SLUICE_IDENTITY_UNMANAGED = 3,   /* a pod address whose Pod (labels) the agent does not know */
	SLUICE_IDENTITY_REMOTE_NODE = 4, /* another node's addresses */
	SLUICE_IDENTITY_MIN_DYNAMIC = 256,
	SLUICE_IDENTITY_MAX_DYNAMIC = 0xffffff,
};

/* sluice_ipcache4 (BPF_MAP_TYPE_LPM_TRIE, BPF_F_NO_PREALLOC): key struct sluice_lpm4_key
 * (prefixlen 0..32, address in network order) -> the identity of that address. Holds every pod
 * address of the cluster (/32), every node address (/32), every ipBlock prefix of every policy,
 * and 0.0.0.0/0 -> world, so a lookup never misses. */
enum sluice_ipcache_flags {
	SLUICE_IPCACHE_F_NONE = 0,
};

struct sluice_ipcache4_entry {
	__u32 identity;          /* enum sluice_identity or a dynamic identity */
	__be32 tunnel_endpoint;  /* node address hosting this pod (0: not tunnelled); phase 2 */
	__u8 flags;              /* enum sluice_ipcache_flags */
	__u8 pad[3];
};
SLUICE_ASSERT_SIZE(struct sluice_ipcache4_entry, 12);
SLUICE_ASSERT_OFFSET(struct sluice_ipcache4_entry, identity, 0);
SLUICE_ASSERT_OFFSET(struct sluice_ipcache4_entry, tunnel_endpoint, 4);
SLUICE_ASSERT_OFFSET(struct sluice_ipcache4_entry, flags, 8);

enum sluice_policy_direction {
	SLUICE_POLICY_INGRESS = 0, /* the endpoint receives from the peer */
	SLUICE_POLICY_EGRESS = 1,  /* the endpoint sends to the peer */
};

/* Key of sluice_policy4 (BPF_MAP_TYPE_LPM_TRIE, BPF_F_NO_PREALLOC), one trie for every endpoint.
 * The data is compared bit by bit from endpoint_id down to port, all in network order:
 *   endpoint_id(32) identity(32) direction(8) proto(8) port(16)
 * The first three are always exact; proto and port may be a prefix:
 *   prefixlen 72            every protocol and port (a rule without ports)
 *   prefixlen 80            every port of proto (a rule port without a port number)
 *   prefixlen 80 + n        the ports sharing the top n bits of port (a port is n = 16;
 *                           an endPort range is a set of such prefixes)
 * The datapath looks up the full key (prefixlen 96) with the peer's identity, then once more with
 * SLUICE_IDENTITY_ANY; a hit allows, two misses drop (policy_denied). The endpoint id comes first
 * (not the direction) so that every field sits at its natural alignment. */
#define SLUICE_POLICY4_PREFIX_EXACT 72 /* bits of endpoint_id, identity, direction */
#define SLUICE_POLICY4_PREFIX_FULL 96

struct sluice_policy4_key {
	__u32 prefixlen;
	__be32 endpoint_id;  /* the local endpoint (sluice_endpoint.endpoint_id), bpf_htonl */
	__be32 identity;     /* the peer's identity, bpf_htonl; SLUICE_IDENTITY_ANY for any peer */
	__u8 direction;      /* enum sluice_policy_direction */
	__u8 proto;          /* IPPROTO_TCP / IPPROTO_UDP / IPPROTO_SCTP; other protocols only
				under prefixlen 72 */
	__be16 port;         /* the endpoint's port (ingress) or the peer's port (egress) */
};
SLUICE_ASSERT_SIZE(struct sluice_policy4_key, 16);
SLUICE_ASSERT_OFFSET(struct sluice_policy4_key, endpoint_id, 4);
SLUICE_ASSERT_OFFSET(struct sluice_policy4_key, identity, 8);
SLUICE_ASSERT_OFFSET(struct sluice_policy4_key, direction, 12);
SLUICE_ASSERT_OFFSET(struct sluice_policy4_key, proto, 13);
SLUICE_ASSERT_OFFSET(struct sluice_policy4_key, port, 14);

enum sluice_policy_verdict {
	SLUICE_POLICY_ALLOW = 1, /* NetworkPolicy v1 only allows; other values are reserved */
};

struct sluice_policy4_entry {
	__u8 verdict; /* enum sluice_policy_verdict */
	__u8 pad[3];
};
SLUICE_ASSERT_SIZE(struct sluice_policy4_entry, 4);

/* sluice_policy_ep, a slot array (maps/slot_array.h: an mmapable BPF_MAP_TYPE_ARRAY whose all-zero
 * slots are free): endpoint_id (host order, the index) -> which directions are enforced. An array
 * because every packet a pod sends or receives reads it: the verifier inlines an array lookup,
 * where a hash lookup is a call (~30 ns on the test machine). An endpoint selected by no policy
 * of a direction is open in it: without an entry (a free slot, or an id beyond the array), or
 * without the flag, the datapath allows without looking at sluice_policy4. */
enum sluice_policy_ep_flags {
	SLUICE_POLICY_EP_F_INGRESS = 1 << 0, /* selected by a policy with policyType Ingress */
	SLUICE_POLICY_EP_F_EGRESS = 1 << 1,  /* selected by a policy with policyType Egress */
};

struct sluice_policy_ep_entry {
	__u32 identity; /* the endpoint's own identity (for events and sluicectl) */
	__u8 flags;     /* enum sluice_policy_ep_flags */
	__u8 pad[3];
};
SLUICE_ASSERT_SIZE(struct sluice_policy_ep_entry, 8);
SLUICE_ASSERT_OFFSET(struct sluice_policy_ep_entry, flags, 4);

/* Key of sluice_pol_drops (BPF_MAP_TYPE_LRU_PERCPU_HASH, value struct sluice_drop_count): the
 * policy_denied drops of one endpoint in one direction. */
#define SLUICE_POL_DROPS_MAX_ENTRIES 16384
struct sluice_policy_drop_key {
	__u32 endpoint_id; /* host order */
	__u8 direction;    /* enum sluice_policy_direction */
	__u8 pad[3];
};
SLUICE_ASSERT_SIZE(struct sluice_policy_drop_key, 8);

#if defined(__cplusplus)
#include <arpa/inet.h>

#include "maps/map.h"
#include "maps/slot_array.h"

namespace sluice::maps {

using Ipcache4Map = Map<sluice_lpm4_key, sluice_ipcache4_entry>;
using Policy4Map = Map<sluice_policy4_key, sluice_policy4_entry>;
using PolicyEndpointMap = SlotArray<sluice_policy_ep_entry>;

// A sluice_policy4 key. `proto_port_bits` is how many bits of (proto, port) are significant:
// 0 (every protocol), 8 (every port of proto) or 8 + n (the top n bits of port). Bits beyond the
// prefix are zeroed, so equal prefixes give byte-identical keys.
inline sluice_policy4_key MakePolicy4Key(uint32_t endpoint_id, uint32_t identity,
                                         uint8_t direction, uint8_t proto, uint16_t port,
                                         int proto_port_bits) {
  sluice_policy4_key k{};
  k.prefixlen = SLUICE_POLICY4_PREFIX_EXACT + proto_port_bits;
  k.endpoint_id = htonl(endpoint_id);
  k.identity = htonl(identity);
  k.direction = direction;
  if (proto_port_bits >= 8) k.proto = proto;
  int port_bits = proto_port_bits - 8;
  if (port_bits > 0) {
    uint16_t mask = static_cast<uint16_t>(0xffffu << (16 - port_bits));
    k.port = htons(static_cast<uint16_t>(port & mask));
  }
  return k;
}

// The key the datapath looks up for one packet (every bit significant).
inline sluice_policy4_key Policy4LookupKey(uint32_t endpoint_id, uint32_t identity,
                                           uint8_t direction, uint8_t proto, uint16_t port) {
  return MakePolicy4Key(endpoint_id, identity, direction, proto, port, 24);
}

}  // namespace sluice::maps
#endif

#endif
