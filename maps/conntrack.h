/* Connection tracking of load-balanced flows. A service flow whose replies go to the client
 * itself (every flow but a hairpinned one) has one flow entry, keyed by the client's address and
 * port, naming both the frontend the client sent to and the backend it was given; both
 * directions find it (SLUICE_CT_DIR_FLOW). A flow that cannot have one (hairpinned, or its client
 * address and port already in another flow's entry) has a forward entry (client -> frontend)
 * naming the backend, and a reply entry (backend -> client) naming the frontend the replies must
 * appear from; so had every flow of the programs before flow entries. Written by the datapath;
 * the agent reads, expires (agent/conntrack/gc) and flushes.
 * Two maps, by protocol: TCP in sluice_ct4, a hash that never evicts (a flood of new flows fails
 * its inserts, counted, instead of pushing out established connections; the GC keeps headroom),
 * every other protocol in sluice_ct4_any, an LRU hash (eviction is the last resort, counted).
 * An entry's expiry is last_seen_ns plus the timeout of its state (enum sluice_ct_flags): the
 * agent's GC applies the configured timeouts, so they change without reloading programs. */
#ifndef SLUICE_MAPS_CONNTRACK_H
#define SLUICE_MAPS_CONNTRACK_H

#include "types.h"

#define SLUICE_CT4_MAX_ENTRIES 262144     /* TCP: one entry per flow, two for a few (default;
					     --ct_tcp_max) */
#define SLUICE_CT4_ANY_MAX_ENTRIES 262144 /* UDP and the rest (default; --ct_any_max) */

enum sluice_ct_dir {
	SLUICE_CT_DIR_FORWARD = 0, /* client -> frontend, as the client sends it */
	SLUICE_CT_DIR_REPLY = 1,   /* backend -> client, as the backend sends it */
	SLUICE_CT_DIR_POLICY = 2,  /* a flow a NetworkPolicy point let through, keyed by the tuple
				      its initiator sends after service translation (the real
				      addresses); its replies pass without a verdict. The value's
				      LB fields are 0. */
	SLUICE_CT_DIR_FLOW = 3,    /* a balanced flow, both directions: keyed by the client's
				      address and port (saddr, sport; daddr and dport 0), as the
				      client sends them and its replies are addressed; the value
				      names the frontend (frontend_addr, frontend_port) and the
				      backend */
};

/* Key of sluice_ct4 (BPF_MAP_TYPE_HASH, TCP) and sluice_ct4_any (BPF_MAP_TYPE_LRU_HASH): the
 * tuple as it is on the wire where the packet is looked up (before DNAT for forward entries,
 * before reverse NAT for reply entries). */
struct sluice_ct4_key {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 dir;   /* enum sluice_ct_dir */
	__u16 pad;
};
SLUICE_ASSERT_SIZE(struct sluice_ct4_key, 16);
SLUICE_ASSERT_OFFSET(struct sluice_ct4_key, sport, 8);
SLUICE_ASSERT_OFFSET(struct sluice_ct4_key, proto, 12);
SLUICE_ASSERT_OFFSET(struct sluice_ct4_key, dir, 13);

enum sluice_ct_flags {
	SLUICE_CT_F_HAIRPIN = 1 << 0, /* client is its own backend: source rewritten to the gateway */
	SLUICE_CT_F_SNAT = 1 << 1,    /* reserved (NodePort masquerade lives in sluice_snat4) */
	SLUICE_CT_F_CLOSING = 1 << 2, /* a FIN or RST was seen; on a forward entry a new SYN on the
					 tuple is a new connection and is balanced again */
	SLUICE_CT_F_ESTABLISHED = 1 << 3, /* TCP: the other side answered (a reply passed): the
					     established timeout applies instead of the SYN one */
	SLUICE_CT_F_FRONTEND = 1 << 4, /* a reply entry that names its frontend itself (in
					  backend_addr / backend_port): its replies need no
					  sluice_lb4_rnat lookup. Reply entries without it (written
					  by older programs) name it through rev_nat_id only */
};

/* Datapath conntrack counters (sluice_ct_stats, BPF_MAP_TYPE_PERCPU_ARRAY of __u64, one slot
 * per counter). Numbers are ABI: append before SLUICE_CT_STAT_MAX. */
enum sluice_ct_stat {
	SLUICE_CT_STAT_TCP_CREATED = 0,       /* entries written into sluice_ct4 */
	SLUICE_CT_STAT_TCP_INSERT_FAILED = 1, /* entries sluice_ct4 refused (full): flow dropped */
	SLUICE_CT_STAT_ANY_CREATED = 2,       /* entries written into sluice_ct4_any */
	SLUICE_CT_STAT_ANY_INSERT_FAILED = 3, /* entries sluice_ct4_any refused */
	SLUICE_CT_STAT_TCP_CROSSED = 4,       /* sluice_ct4 entries of a translated flow deleted by
						 a direct flow crossing it (lib/lb.h) */
	SLUICE_CT_STAT_ANY_CROSSED = 5,       /* the same in sluice_ct4_any */
	SLUICE_CT_STAT_NAT_CREATED = 6,       /* masquerade mappings written into sluice_snat4
						 (the GC's estimate of its LRU evictions) */
	SLUICE_CT_STAT_MAX = 8,               /* size of sluice_ct_stats; keep last */
};

/* Slots of sluice_ct_pairs (BPF_MAP_TYPE_ARRAY of __u64): whether flows recorded in a forward
 * and a reply entry may exist, so that a packet whose client has no flow entry (of its frontend,
 * or of its backend) needs those lookups too. The datapath adds 1 to CREATED after it writes such
 * a flow's entries; the agent's GC, after a pass that left no forward or reply entry, writes CLEAR
 * with what CREATED was before that pass, plus 1. The lookups are skipped while
 * CLEAR == CREATED + 1, so a fresh map (both 0: a node upgraded from programs that wrote two
 * entries for every flow) does them until the GC has seen none left. The agent, when it writes a
 * reply entry itself (a removed backend's UDP flow entry split), writes CLEAR 0 between two GC
 * passes. */
enum sluice_ct_pairs_slot {
	SLUICE_CT_PAIRS_CREATED = 0,
	SLUICE_CT_PAIRS_CLEAR = 1,
	SLUICE_CT_PAIRS_SLOTS = 2,
};

/* Value of sluice_ct_clock (per-CPU array of one): the coarse clock as this CPU last read it, and
 * the jiffy it read it in. The datapath's own cache (sluice_ct_now in bpf/lib/conntrack.h);
 * nobody else reads or writes it. */
struct sluice_ct_clock {
	__u64 jiffies;  /* bpf_jiffies64() when coarse_ns was read */
	__u64 coarse_ns; /* bpf_ktime_get_coarse_ns() then */
};
SLUICE_ASSERT_SIZE(struct sluice_ct_clock, 16);

/* Value of sluice_ct4 and sluice_ct4_any. The same in both directions but for backend_addr and
 * backend_port, which a reply entry with SLUICE_CT_F_FRONTEND uses for the frontend (its key
 * already has the backend: the reply's source); a flow entry names both. */
struct sluice_ct4_entry {
	__u32 backend_id;     /* key of sluice_lb4_be the flow was given */
	__u32 rev_nat_id;     /* key of sluice_lb4_rnat for its replies */
	union {
		__u64 created_ns; /* CLOCK_MONOTONIC_COARSE ns at creation (sluice_ct_now); not in
				     a flow entry, which has instead: */
		struct {
			__be32 frontend_addr; /* SLUICE_CT_DIR_FLOW: the frontend the client */
			__be16 frontend_port; /* sent to, its replies' source */
			__u16 frontend_pad;
		};
	};
	__u64 last_seen_ns;   /* CLOCK_MONOTONIC_COARSE ns of the last packet in this direction
				 (either, in a flow entry; a tick behind CLOCK_MONOTONIC at
				 most) */
	__be32 backend_addr;  /* the backend itself: a flow keeps it even after the backend is */
	__be16 backend_port;  /* removed from the service (terminating endpoints, TCP); in a reply
				 entry with SLUICE_CT_F_FRONTEND, the frontend its replies come
				 from */
	__u8 flags;           /* enum sluice_ct_flags */
	__u8 pad;
};
SLUICE_ASSERT_SIZE(struct sluice_ct4_entry, 32);
SLUICE_ASSERT_OFFSET(struct sluice_ct4_entry, rev_nat_id, 4);
SLUICE_ASSERT_OFFSET(struct sluice_ct4_entry, created_ns, 8);
SLUICE_ASSERT_OFFSET(struct sluice_ct4_entry, frontend_addr, 8);
SLUICE_ASSERT_OFFSET(struct sluice_ct4_entry, frontend_port, 12);
SLUICE_ASSERT_OFFSET(struct sluice_ct4_entry, last_seen_ns, 16);
SLUICE_ASSERT_OFFSET(struct sluice_ct4_entry, backend_addr, 24);
SLUICE_ASSERT_OFFSET(struct sluice_ct4_entry, flags, 30);

#endif
