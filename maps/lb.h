/* Service load balancing: services (one master entry plus one entry per backend slot), backends,
 * the frontends replies come from (sluice_lb4_rnat), source ranges and session affinity.
 * (Connection tracking has its own header.) Written by the agent in a hitless order: backends,
 * then slots, then the master entry last; stale slots and orphan backends are deleted only after
 * the master no longer points at them. */
#ifndef SLUICE_MAPS_LB_H
#define SLUICE_MAPS_LB_H

#include "types.h"

#define SLUICE_LB4_SVC_MAX_ENTRIES 1048576
#define SLUICE_LB4_BACKENDS_MAX_ENTRIES 1048576
#define SLUICE_LB4_REVNAT_MAX_ENTRIES 262144
#define SLUICE_LB4_SRC_RANGES_MAX_ENTRIES 65536
#define SLUICE_LB4_AFFINITY_MAX_ENTRIES 65536

/* sluice_lb4_nbport (BPF_MAP_TYPE_ARRAY of __u32 words): ports no backend is on. Bit (port & 31)
 * of word (port >> 5), the port in host order. A set bit vouches that no Service backend is on that
 * port and no translated flow has its backend there: a packet from it is no backend's reply (the
 * reverse NAT lookup is skipped) and a packet to it crosses no translated flow. A clear bit
 * decides nothing, so all zero (a fresh map) is always correct. The agent clears a port's bit
 * before it writes a backend on it and, once its first sync is written, sets the bits of every
 * port but those of the programmed backends and of the conntrack entries of translated flows. */
#define SLUICE_LB4_NBPORT_WORDS 2048

/* Where a service address is reached from: a ClusterIP is one frontend; a NodePort is one
 * frontend per node address; ExternalIPs and LoadBalancer ingress IPs are frontends too. */
enum sluice_lb_scope {
	SLUICE_LB_SCOPE_EXTERNAL = 0, /* traffic from outside the node (or any, for ClusterIP) */
	SLUICE_LB_SCOPE_INTERNAL = 1, /* traffic from inside the cluster (this node's pods and
					 sockets) to an externalTrafficPolicy: Local frontend:
					 every endpoint, as kube-proxy does */
};

/* Key of sluice_lb4_svc (BPF_MAP_TYPE_HASH). backend_slot 0 is the service's master entry;
 * slots 1..count name its backends. */
struct sluice_lb4_key {
	__be32 addr;         /* frontend address */
	__be16 dport;        /* frontend port */
	__u8 proto;          /* IPPROTO_TCP, IPPROTO_UDP, IPPROTO_SCTP */
	__u8 scope;          /* enum sluice_lb_scope */
	__u16 backend_slot;  /* 0: master entry */
	__u16 pad;
};
SLUICE_ASSERT_SIZE(struct sluice_lb4_key, 12);
SLUICE_ASSERT_OFFSET(struct sluice_lb4_key, dport, 4);
SLUICE_ASSERT_OFFSET(struct sluice_lb4_key, backend_slot, 8);

enum sluice_svc_flags {
	SLUICE_SVC_F_NODEPORT = 1 << 0,        /* frontend is a node address */
	SLUICE_SVC_F_EXTERNAL_IP = 1 << 1,     /* spec.externalIPs */
	SLUICE_SVC_F_LOADBALANCER = 1 << 2,    /* status.loadBalancer.ingress */
	SLUICE_SVC_F_AFFINITY = 1 << 3,        /* sessionAffinity: ClientIP */
	SLUICE_SVC_F_ETP_LOCAL = 1 << 4,       /* externalTrafficPolicy: Local */
	SLUICE_SVC_F_ITP_LOCAL = 1 << 5,       /* internalTrafficPolicy: Local */
	SLUICE_SVC_F_SOURCE_RANGES = 1 << 6,   /* loadBalancerSourceRanges apply */
	SLUICE_SVC_F_REJECT = 1 << 7,          /* no usable endpoint: reject (RST / ICMP unreach) */
	SLUICE_SVC_F_MAGLEV = 1 << 8,          /* new flows pick their backend from the frontend's
						  Maglev table (sluice_lb4_mag), not at random */
};

/* Value of sluice_lb4_svc. In the master entry: count, flags, rev_nat_id, affinity_timeout and
 * the slot record. In a slot entry: backend_id. */
struct sluice_lb4_service {
	__u32 backend_id;        /* slot entries: the backend; master: its slot record in
				    sluice_lb4_rec (0: none, the slots are read from this map) */
	__u16 count;             /* master: number of backend slots */
	__u16 flags;             /* master: enum sluice_svc_flags */
	__u32 rev_nat_id;        /* master: key of sluice_lb4_rnat for replies */
	__u32 affinity_timeout;  /* master: seconds, with SLUICE_SVC_F_AFFINITY */
};
SLUICE_ASSERT_SIZE(struct sluice_lb4_service, 16);
SLUICE_ASSERT_OFFSET(struct sluice_lb4_service, count, 4);
SLUICE_ASSERT_OFFSET(struct sluice_lb4_service, rev_nat_id, 8);

enum sluice_backend_flags {
	SLUICE_BE_F_TERMINATING = 1 << 0, /* serving but terminating: only for existing flows,
					     or when no backend is ready */
	SLUICE_BE_F_LOCAL = 1 << 1,       /* on this node */
};

/* sluice_lb4_be (BPF_MAP_TYPE_ARRAY, mmapable): backend_id -> backend. A slot array: the agent
 * writes its slots in place through a memory mapping, an all-zero slot (addr 0) is free, ids run
 * from 1 to max_entries - 1. Ids are stable for a backend's life and restored from this map after
 * an agent restart. */
struct sluice_lb4_backend {
	__be32 addr;
	__be16 port;
	__u8 proto;
	__u8 flags; /* enum sluice_backend_flags */
};
SLUICE_ASSERT_SIZE(struct sluice_lb4_backend, 8);

/* sluice_lb4_rec (BPF_MAP_TYPE_ARRAY): slot records. A record holds a frontend's backend ids,
 * slot 1 in backend_id[0], as they were when the agent wrote the master entry that names it
 * (master backend_id): a new flow then reads its backend with one array lookup, which the
 * verifier inlines, instead of a second sluice_lb4_svc lookup. Only frontends with 1 to
 * SLUICE_LB4_RECORD_SLOTS backends get one; the slot entries in sluice_lb4_svc stay the record
 * every tool reads. A record is written before the master that names it and never changed
 * while named; one no master names any more is written again only after
 * SLUICE_LB4_REC_QUARANTINE_S, so a program that read the old master reads it unchanged.
 * Record 0 is never used. */
#define SLUICE_LB4_REC_MAX_ENTRIES 65536
#define SLUICE_LB4_RECORD_SLOTS 16
#define SLUICE_LB4_REC_QUARANTINE_S 5
struct sluice_lb4_slot_record {
	__u32 backend_id[SLUICE_LB4_RECORD_SLOTS];
};
SLUICE_ASSERT_SIZE(struct sluice_lb4_slot_record, 64);

/* sluice_lb4_mag (BPF_MAP_TYPE_HASH_OF_MAPS): a frontend's master key (backend_slot 0) -> its
 * Maglev table, for a master with SLUICE_SVC_F_MAGLEV. A table is an array of M + 1 __u32
 * (BPF_F_INNER_MAP: tables of any size share the outer map): entry 0 holds M (a prime), entry
 * 1 + s the backend id of slot s, s = sluice_maglev_flow_hash(...) % M. The agent computes it
 * from the backends' identities (agent/service/maglev.h), so every node holds the same table up to
 * its local backend ids. A table is never written in place: the agent fills a new array, then
 * swaps it in with one update of the outer map, so a packet reads the old table or the new one,
 * whole. It is swapped in after the backends it names are written and before the master that
 * sets SLUICE_SVC_F_MAGLEV, and deleted after the master no longer has the flag. A frontend with
 * the flag and no table (or a slot naming no backend) falls back to a random slot. */
#define SLUICE_LB4_MAGLEV_MAX_ENTRIES 65536
#define SLUICE_LB4_MAGLEV_SIZE_INDEX 0

/* sluice_lb4_rnat (BPF_MAP_TYPE_HASH): rev_nat_id -> the frontend a reply must appear from. */
struct sluice_lb4_revnat {
	__be32 addr;
	__be16 port;
	__u16 pad;
};
SLUICE_ASSERT_SIZE(struct sluice_lb4_revnat, 8);

/* Key of sluice_lb4_srcr (BPF_MAP_TYPE_LPM_TRIE, value __u8 1): loadBalancerSourceRanges of a
 * frontend with SLUICE_SVC_F_SOURCE_RANGES, named by the frontend's rev_nat_id. prefixlen counts
 * the 32 bits of rev_nat_id plus the range's prefix length. */
struct sluice_lb4_srcrange_key {
	__u32 prefixlen;
	__u32 rev_nat_id;  /* big-endian in the trie: stored with bpf_htonl */
	__be32 addr;
};
SLUICE_ASSERT_SIZE(struct sluice_lb4_srcrange_key, 12);

/* sluice_lb4_aff (BPF_MAP_TYPE_LRU_HASH): sessionAffinity ClientIP, per client and frontend. */
struct sluice_lb4_affinity_key {
	__be32 client_addr;
	__u32 rev_nat_id;
};
SLUICE_ASSERT_SIZE(struct sluice_lb4_affinity_key, 8);

struct sluice_lb4_affinity {
	__u64 last_used_ns; /* bpf_ktime_get_ns() of the last new flow that used it */
	__u32 backend_id;
	__u32 pad;
};
SLUICE_ASSERT_SIZE(struct sluice_lb4_affinity, 16);

/* Maglev (maps/lb.h, SLUICE_SVC_F_MAGLEV): the hash a new flow's slot in its frontend's Maglev
 * table is taken from, slot = hash % M. The same function in BPF and in the agent's tests and
 * benchmarks, and the same on every node: the client's address and port, the frontend's port and
 * the protocol, in the packet's byte order. The frontend's address is left out on purpose: a
 * NodePort has one frontend per node address, and the same client flow must land on the same
 * backend whichever node it enters (the table, not the hash, tells the Services apart). A
 * murmur3-style mix: 32-bit multiplies and shifts only, cheap for the verifier. */
#define SLUICE_MAGLEV_HASH_SEED 0x5c1ce5edu

static inline __u32 sluice_maglev_mix(__u32 h, __u32 k)
{
	k *= 0xcc9e2d51u;
	k = (k << 15) | (k >> 17);
	k *= 0x1b873593u;
	h ^= k;
	h = (h << 13) | (h >> 19);
	return h * 5 + 0xe6546b64u;
}

static inline __u32 sluice_maglev_flow_hash(__be32 saddr, __be16 sport, __be16 dport, __u8 proto)
{
	__u32 h = SLUICE_MAGLEV_HASH_SEED;

	h = sluice_maglev_mix(h, (__u32)saddr);
	h = sluice_maglev_mix(h, ((__u32)sport << 16) | (__u32)dport);
	h = sluice_maglev_mix(h, proto);
	h ^= 12;
	h ^= h >> 16;
	h *= 0x85ebca6bu;
	h ^= h >> 13;
	h *= 0xc2b2ae35u;
	h ^= h >> 16;
	return h;
}

#endif
