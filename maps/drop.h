/* Drop reasons: one stable number per reason, counted per CPU and direction in sluice_drops.
 * Numbers are ABI: never renumber or reuse; append new reasons before SLUICE_DROP_MAX. */
#ifndef SLUICE_MAPS_DROP_H
#define SLUICE_MAPS_DROP_H

#include "types.h"

enum sluice_drop_reason {
	SLUICE_DROP_UNSPEC = 0,
	SLUICE_DROP_INVALID_PACKET = 1,   /* truncated or malformed headers */
	SLUICE_DROP_UNSUPPORTED_L3 = 2,   /* neither IPv4 nor ARP from a pod */
	SLUICE_DROP_SPOOFED_SOURCE = 3,   /* pod sent with an address it does not own */
	SLUICE_DROP_ARP_UNSUPPORTED = 4,  /* ARP that is not an IPv4-over-Ethernet request */
	SLUICE_DROP_NAT_NO_PORT = 5,      /* every source port tried for masquerade was taken */
	SLUICE_DROP_NAT_MAP_FULL = 6,     /* masquerade state could not be stored */
	SLUICE_DROP_CSUM_ERROR = 7,       /* retired: rewrite failures count as PACKET_WRITE */
	SLUICE_DROP_NAT_UNSUPPORTED_L4 = 8, /* masquerade needed but the protocol has no ports */
	SLUICE_DROP_FRAGMENT = 9,         /* IPv4 fragment that needs masquerade */
	SLUICE_DROP_NO_NODE_CONFIG = 10,  /* sluice_node not yet written by the agent */
	SLUICE_DROP_TTL_EXCEEDED = 11,    /* forwarded packet whose TTL ran out */
	SLUICE_DROP_SERVICE_NO_BACKEND = 12, /* service frontend with no usable backend */
	SLUICE_DROP_CT_MAP_FULL = 13,     /* a load-balanced flow's state could not be stored */
	SLUICE_DROP_SERVICE_REJECTED = 14, /* no usable endpoint or undefined port: answered with a
					      TCP RST / ICMP port unreachable instead */
	SLUICE_DROP_SERVICE_UNKNOWN_IP = 15, /* service-range address that is no Service's */
	SLUICE_DROP_SOURCE_RANGE = 16,    /* client outside the loadBalancerSourceRanges */
	SLUICE_DROP_PACKET_WRITE = 17,    /* a packet write failed: store_bytes, a checksum update,
					     change_tail / adjust_room */
	SLUICE_DROP_POLICY_DENIED = 18,   /* NetworkPolicy allows the flow in neither the source's
					     egress nor the destination's ingress (see docs/policy.md);
					     also counted per endpoint in sluice_pol_drops */
	SLUICE_DROP_FRAG_NEEDED = 19,     /* a DF packet larger than the tunnel's MTU: answered with
					     ICMP fragmentation needed instead (docs/routing.md) */
	SLUICE_DROP_TO_GATEWAY = 20,      /* a pod's packet to its gateway address that is no echo
					     request (answered in BPF) and no reply of a hairpinned
					     flow: the gateway is no host, nothing may leave for it */
	SLUICE_DROP_MISSING_STAGE = 21,   /* a tail call into the next stage of a program failed:
					     the program array's slot is empty (bpf/lib/stages.h) */
	SLUICE_DROP_MAX = 32,             /* size of sluice_drops; keep last */
};

/* The direction of a drop, as Cilium labels it (cilium_drop_count_total{direction}): ingress is
 * what arrives at a pod or at the node (sluice_to_pod, sluice_from_net, sluice_from_overlay, XDP),
 * egress what a pod sends or the node sends out (sluice_from_pod, sluice_to_net, a refused socket
 * call). The program decides, not the policy point: a pod -> pod packet that the destination's
 * ingress policy denies in sluice_from_pod is an egress drop (sluice_pol_drops has the policy
 * point's direction). */
enum sluice_drop_dir {
	SLUICE_DROP_DIR_INGRESS = 0,
	SLUICE_DROP_DIR_EGRESS = 1,
	SLUICE_DROP_DIR_MAX = 2,
};

/* sluice_drops is indexed by reason x direction: key = direction * SLUICE_DROP_MAX + reason. */
#define SLUICE_DROP_KEY(reason, dir) ((__u32)(dir) * SLUICE_DROP_MAX + (__u32)(reason))
#define SLUICE_DROP_KEYS ((__u32)SLUICE_DROP_MAX * (__u32)SLUICE_DROP_DIR_MAX)

/* Value of sluice_drops (BPF_MAP_TYPE_PERCPU_ARRAY, key = SLUICE_DROP_KEY(reason, direction)). */
struct sluice_drop_count {
	__u64 packets;
	__u64 bytes;
};
SLUICE_ASSERT_SIZE(struct sluice_drop_count, 16);


#if !defined(__bpf__)
/* Stable, machine-friendly names: used as metric labels and in sluicectl output. */
static inline const char *sluice_drop_reason_name(unsigned int reason)
{
	switch (reason) {
	case SLUICE_DROP_UNSPEC: return "unspecified";
	case SLUICE_DROP_INVALID_PACKET: return "invalid_packet";
	case SLUICE_DROP_UNSUPPORTED_L3: return "unsupported_l3";
	case SLUICE_DROP_SPOOFED_SOURCE: return "spoofed_source";
	case SLUICE_DROP_ARP_UNSUPPORTED: return "arp_unsupported";
	case SLUICE_DROP_NAT_NO_PORT: return "nat_no_port";
	case SLUICE_DROP_NAT_MAP_FULL: return "nat_map_full";
	case SLUICE_DROP_CSUM_ERROR: return "csum_error";
	case SLUICE_DROP_NAT_UNSUPPORTED_L4: return "nat_unsupported_l4";
	case SLUICE_DROP_FRAGMENT: return "fragment";
	case SLUICE_DROP_NO_NODE_CONFIG: return "no_node_config";
	case SLUICE_DROP_TTL_EXCEEDED: return "ttl_exceeded";
	case SLUICE_DROP_SERVICE_NO_BACKEND: return "service_no_backend";
	case SLUICE_DROP_CT_MAP_FULL: return "ct_map_full";
	case SLUICE_DROP_SERVICE_REJECTED: return "service_rejected";
	case SLUICE_DROP_SERVICE_UNKNOWN_IP: return "service_unknown_ip";
	case SLUICE_DROP_SOURCE_RANGE: return "source_range";
	case SLUICE_DROP_PACKET_WRITE: return "packet_write_failed";
	case SLUICE_DROP_POLICY_DENIED: return "policy_denied";
	case SLUICE_DROP_FRAG_NEEDED: return "frag_needed";
	case SLUICE_DROP_TO_GATEWAY: return "to_gateway";
	case SLUICE_DROP_MISSING_STAGE: return "missing_stage";
	default: return (const char *)0;
	}
}

/* Metric label and sluicectl column of a drop direction. */
static inline const char *sluice_drop_dir_name(unsigned int dir)
{
	return dir == SLUICE_DROP_DIR_INGRESS ? "ingress" :
	       dir == SLUICE_DROP_DIR_EGRESS  ? "egress" :
						(const char *)0;
}
#endif

#endif
