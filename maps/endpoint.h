/* Local endpoints: every pod interface on this node, keyed by its address.
 * Read by the pod egress program to deliver same-node traffic with bpf_redirect_peer (or, to a
 * pod with an ingress limit, bpf_redirect through its host veth's qdisc). */
#ifndef SLUICE_MAPS_ENDPOINT_H
#define SLUICE_MAPS_ENDPOINT_H

#include "types.h"

#define SLUICE_EP4_MAX_ENTRIES 65536

/* IPv4 key of sluice_ep4 (BPF_MAP_TYPE_HASH). An IPv6 family gets sluice_ep6 with a 16-byte key
 * and the same value. */
struct sluice_ep4_key {
	__be32 addr;
};
SLUICE_ASSERT_SIZE(struct sluice_ep4_key, 4);

enum sluice_endpoint_flags {
	SLUICE_EP_F_NONE = 0,
	/* The pod has an ingress bandwidth limit: a tbf qdisc on its host veth. The datapath
	 * delivers to it with bpf_redirect to that veth (through the qdisc), never with
	 * bpf_redirect_peer, which would pass the qdisc by. */
	SLUICE_EP_F_INGRESS_SHAPED = 1 << 0,
};

struct sluice_endpoint {
	__u32 ifindex;       /* host-side veth, target of bpf_redirect_peer */
	__u32 flags;         /* enum sluice_endpoint_flags */
	__u8 mac[6];         /* the pod interface's MAC */
	__u8 host_mac[6];    /* the host-side veth's MAC: the gateway MAC the pod sees */
	__u32 endpoint_id;   /* agent-assigned, stable for the endpoint's lifetime */
	__u32 identity;      /* security identity (0 until policy lands) */
};
SLUICE_ASSERT_SIZE(struct sluice_endpoint, 28);
SLUICE_ASSERT_OFFSET(struct sluice_endpoint, ifindex, 0);
SLUICE_ASSERT_OFFSET(struct sluice_endpoint, mac, 8);
SLUICE_ASSERT_OFFSET(struct sluice_endpoint, host_mac, 14);
SLUICE_ASSERT_OFFSET(struct sluice_endpoint, endpoint_id, 20);

/* The datapath's fast way to a local endpoint: a direct-mapped index of sluice_ep4 that it reads
 * with two array lookups (inlined by the verifier) before the hash lookup (a call). The loader
 * keeps it beside sluice_ep4 (loader/endpoint_table.h); sluice_ep4 stays the endpoints' only
 * record, which tools read.
 *
 * sluice_ep4_slot (an mmapable array, maps/slot_array.h): slot = host-order address modulo
 * SLUICE_EP4_SLOTS -> {addr, rec}; all zero is free. A slot names one of the endpoints whose
 * address maps to it (with a node's pod CIDR of /20 or narrower, every one); the others are
 * found in sluice_ep4.
 * sluice_ep4_rec (array): rec -> a copy of the endpoint's sluice_ep4 value. A record is written
 * before a slot names it and never changed while one does; a record a slot stopped naming is
 * written again only after SLUICE_EP4_REC_QUARANTINE_S, so that a program that read the slot
 * before never reads a record being rewritten. */
#define SLUICE_EP4_SLOTS 4096
#define SLUICE_EP4_RECS (2 * SLUICE_EP4_SLOTS)
#define SLUICE_EP4_REC_QUARANTINE_S 5

struct sluice_ep4_ref {
	__be32 addr; /* the endpoint's address; 0: a free slot */
	__u32 rec;   /* its record in sluice_ep4_rec */
};
SLUICE_ASSERT_SIZE(struct sluice_ep4_ref, 8);

#endif
