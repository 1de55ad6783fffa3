/* Connection tracking of load-balanced flows: one flow entry keyed by the client's address and
 * port, which both directions find; or, where a flow cannot have one, a forward entry keyed by the
 * tuple the client sends and a reply entry keyed by the tuple the backend answers with
 * (maps/conntrack.h). TCP in sluice_ct4, the rest in sluice_ct4_any. Entries carry their state
 * (SYN only, established, closing) for the GC. */
#ifndef SLUICE_BPF_CONNTRACK_H
#define SLUICE_BPF_CONNTRACK_H

#include <linux/errno.h>

#include "lib/csum.h"
#include "lib/drop.h"
#include "lib/parse.h"

/* A TCP/UDP packet's tuple as it is on the wire, and where its ports are. */
struct ct4_pkt {
	struct sluice_ct4_key key; /* dir is left 0 (forward) */
	__u32 l4_off;
	struct l4_csum csum;
	__u8 tcp_flags; /* TCP: the flags byte (FIN 0x01, SYN 0x02, RST 0x04, ACK 0x10); else 0 */
};

#define CT4_TCP_FIN 0x01
#define CT4_TCP_SYN 0x02
#define CT4_TCP_RST 0x04
#define CT4_TCP_ACK 0x10

/* Outcomes of ct4_tuple. */
enum ct4_tuple_result {
	CT4_TUPLE = 0,    /* p holds the packet's TCP or UDP tuple */
	CT4_NO_TUPLE = 1, /* no ports: other protocols, truncated L4 headers, a later fragment
			     whose first fragment was not seen here; such packets are not
			     balanced */
};

/* The conntrack view of a parsed packet. Returns an enum ct4_tuple_result. */
static __always_inline int ct4_tuple(const struct pkt4 *pkt, struct ct4_pkt *p)
{
	if (pkt->proto != IPPROTO_TCP && pkt->proto != IPPROTO_UDP)
		return CT4_NO_TUPLE;
	if (!(pkt->flags & PKT4_F_PORTS))
		return CT4_NO_TUPLE;
	if (pkt->proto == IPPROTO_TCP && !(pkt->flags & PKT4_F_TCP_FLAGS))
		return CT4_NO_TUPLE;
	__builtin_memset(&p->key, 0, sizeof(p->key));
	p->key.saddr = pkt->saddr;
	p->key.daddr = pkt->daddr;
	p->key.sport = pkt->sport;
	p->key.dport = pkt->dport;
	p->key.proto = pkt->proto;
	p->l4_off = pkt->l4_off;
	p->tcp_flags = pkt->tcp_flags;
	l4_csum_init(&p->csum, pkt->proto, pkt->l4_off, pkt->flags);
	return CT4_TUPLE;
}

/* The map a tuple's entries live in: TCP in sluice_ct4 (never evicted), the rest in
 * sluice_ct4_any (LRU). Each access must name its map as a constant: with one map pointer for
 * both, the verifier can neither inline the lookup nor call the map's own update, and every
 * packet pays generic helper calls (measured: +20% on pod -> pod). clang merges the two calls of
 * an if/else into one with a selected map pointer; a register move, one in the TCP branch and
 * two in the other (asm that differs), keeps them apart (an empty asm would leave two line_info
 * records on one instruction, which the kernel refuses). */
#define CT4_KEEP_TCP(v) asm volatile("%0 = %0" : "+r"(v))
#define CT4_KEEP_ANY(v) asm volatile("%0 = %0\n\t%0 = %0" : "+r"(v))

static __always_inline struct sluice_ct4_entry *ct4_find(const struct sluice_ct4_key *key)
{
	struct sluice_ct4_entry *e;

	if (key->proto == IPPROTO_TCP) {
		e = bpf_map_lookup_elem(&sluice_ct4, key);
		CT4_KEEP_TCP(e);
	} else {
		e = bpf_map_lookup_elem(&sluice_ct4_any, key);
		CT4_KEEP_ANY(e);
	}
	return e;
}

/* flags: BPF_ANY or BPF_NOEXIST. */
static __always_inline long ct4_store(const struct sluice_ct4_key *key,
				      const struct sluice_ct4_entry *e, __u64 flags)
{
	long ret;

	if (key->proto == IPPROTO_TCP) {
		ret = bpf_map_update_elem(&sluice_ct4, key, e, flags);
		CT4_KEEP_TCP(ret);
	} else {
		ret = bpf_map_update_elem(&sluice_ct4_any, key, e, flags);
		CT4_KEEP_ANY(ret);
	}
	return ret;
}

/* The key of the flow entry of a client's address and port (SLUICE_CT_DIR_FLOW). */
static __always_inline void ct4_flow_key(struct sluice_ct4_key *key, __be32 client, __be16 cport,
					 __u8 proto)
{
	__builtin_memset(key, 0, sizeof(*key));
	key->saddr = client;
	key->sport = cport;
	key->proto = proto;
	key->dir = SLUICE_CT_DIR_FLOW;
}

static __always_inline void ct4_remove(const struct sluice_ct4_key *key)
{
	long ret;

	if (key->proto == IPPROTO_TCP) {
		ret = bpf_map_delete_elem(&sluice_ct4, key);
		CT4_KEEP_TCP(ret);
	} else {
		ret = bpf_map_delete_elem(&sluice_ct4_any, key);
		CT4_KEEP_ANY(ret);
	}
}

/* Whether flows recorded in a forward and a reply entry may exist (sluice_ct_pairs). */
static __always_inline int ct4_pairs_may_exist(void)
{
	__u32 created_slot = SLUICE_CT_PAIRS_CREATED, clear_slot = SLUICE_CT_PAIRS_CLEAR;
	const __u64 *created = bpf_map_lookup_elem(&sluice_ct_pairs, &created_slot);
	const __u64 *clear = bpf_map_lookup_elem(&sluice_ct_pairs, &clear_slot);

	return !created || !clear || *clear != *created + 1;
}

/* Counts a flow written in a forward and a reply entry, after its entries: a GC pass that reads
 * the count before it and finds neither entry began after they were written, or sees the count
 * move (maps/conntrack.h). */
static __always_inline void ct4_pairs_count_one(void)
{
	__u32 slot = SLUICE_CT_PAIRS_CREATED;
	__u64 *created = bpf_map_lookup_elem(&sluice_ct_pairs, &slot);

	if (created)
		__sync_fetch_and_add(created, 1);
}

static __always_inline void ct4_add(__u32 stat, __u64 n)
{
	__u64 *c = bpf_map_lookup_elem(&sluice_ct_stats, &stat);

	if (c)
		*c += n;
}


/* Conntrack's time: the coarse clock (CLOCK_MONOTONIC_COARSE, a tick behind at most), which is
 * all expiry needs. That clock moves once per tick, when jiffies does, so it is read through its
 * helper once per tick and CPU and cached with the jiffy it was read in (sluice_ct_clock); any
 * other call pays two loads (the verifier inlines bpf_jiffies64 and the per-CPU array lookup)
 * where the helper call cost ~35 ns per packet on the test machine. The cache may lag the clock by
 * a tick (read right after jiffies moved and before the clock did); it never runs ahead.
 * A global function: the branch on the cache, which the verifier cannot know, is verified once
 * instead of at every caller (inline, the programs took 60k more verified instructions, for ~5 ns
 * per packet less). */
__attribute__((noinline)) __u64 sluice_ct_now(void)
{
	__u32 zero = 0;
	struct sluice_ct_clock *c = bpf_map_lookup_elem(&sluice_ct_clock, &zero);
	__u64 jiffies = bpf_jiffies64();

	if (!c)
		return bpf_ktime_get_coarse_ns();
	/* coarse_ns is 0 only before this CPU's first read (jiffies itself may be 0). */
	if (c->jiffies != jiffies || !c->coarse_ns) {
		c->coarse_ns = bpf_ktime_get_coarse_ns();
		c->jiffies = jiffies;
	}
	return c->coarse_ns;
}

/* SLUICE_CT_F_CLOSING for a TCP packet that closes its flow (FIN or RST), else 0; without a
 * branch, which would split the verifier's states at every caller: FIN (bit 0) shifted by two
 * and RST (bit 2) both land on SLUICE_CT_F_CLOSING (bit 2). */
static __always_inline __u8 ct4_closing_flag(__u8 tcp_flags)
{
	_Static_assert(CT4_TCP_FIN << 2 == SLUICE_CT_F_CLOSING && CT4_TCP_RST == SLUICE_CT_F_CLOSING,
		       "FIN and RST map onto the closing flag");
	return (tcp_flags | tcp_flags << 2) & SLUICE_CT_F_CLOSING;
}

/* Moves a tracked TCP flow's entry by a packet's flags: closing on a FIN or RST; from its
 * initiator (own), a SYN without ACK on a closing entry opens a new connection on the same tuple
 * (TIME-WAIT reuse), which starts unanswered again. A global function: verified once, where
 * inlined at each policy point it cost the pod program ~100k more verified instructions. */
__attribute__((noinline)) int sluice_ct_tcp_state(struct sluice_ct4_entry *ct, __u8 tcp_flags,
						  int own)
{
	if (!ct)
		return 0; /* never: callers pass an entry found; a global function's verifier asks */
	if (tcp_flags & (CT4_TCP_FIN | CT4_TCP_RST)) {
		if (!(ct->flags & SLUICE_CT_F_CLOSING))
			ct->flags |= SLUICE_CT_F_CLOSING;
	} else if (own && (ct->flags & SLUICE_CT_F_CLOSING) &&
		   (tcp_flags & (CT4_TCP_SYN | CT4_TCP_ACK)) == CT4_TCP_SYN) {
		ct->flags &= ~(SLUICE_CT_F_CLOSING | SLUICE_CT_F_ESTABLISHED);
	}
	return 0;
}

/* Marks an entry seen now (sluice_ct_now); it is written only when the time moved, so a busy
 * flow does not dirty its cache line every packet. */
static __always_inline void ct4_touch(struct sluice_ct4_entry *e)
{
	__u64 now = sluice_ct_now();

	if (e->last_seen_ns != now)
		e->last_seen_ns = now;
}

/* Finds the entry for key and marks it seen now (ct4_touch). */
static __always_inline struct sluice_ct4_entry *ct4_lookup(const struct sluice_ct4_key *key)
{
	struct sluice_ct4_entry *e = ct4_find(key);

	if (e)
		ct4_touch(e);
	return e;
}

/* Sets `flag` (enum sluice_ct_flags) on the forward entry of client:cport -> frontend:fport, seen
 * from its reply path; a close is also reported to the flow monitor. */
static __always_inline void ct4_mark_forward(__be32 client, __be32 frontend, __be16 cport,
					     __be16 fport, __u8 proto, __u8 flag)
{
	struct sluice_ct4_key fwd = {
		.saddr = client,
		.daddr = frontend,
		.sport = cport,
		.dport = fport,
		.proto = proto,
		.dir = SLUICE_CT_DIR_FORWARD,
	};
	struct sluice_ct4_entry *e = ct4_find(&fwd);

	if (e) {
		if (flag & SLUICE_CT_F_CLOSING)
			event_ct_close(e, &fwd);
		e->flags |= flag;
	}
}

/* Marks the reply entry of a forward entry's flow closing (seen from its forward path): both
 * directions then expire on the short closing timeout. reply_daddr as in ct4_create. */
static __always_inline void ct4_mark_reply_closing(const struct sluice_ct4_key *fwd,
						   const struct sluice_ct4_entry *ct,
						   __be32 reply_daddr)
{
	struct sluice_ct4_key rev = {
		.saddr = ct->backend_addr,
		.daddr = reply_daddr,
		.sport = ct->backend_port,
		.dport = fwd->sport,
		.proto = fwd->proto,
		.dir = SLUICE_CT_DIR_REPLY,
	};
	struct sluice_ct4_entry *e = ct4_find(&rev);

	if (e)
		e->flags |= SLUICE_CT_F_CLOSING;
}

static __always_inline int ct4_insert_failed(int tcp)
{
	ct4_add(tcp ? SLUICE_CT_STAT_TCP_INSERT_FAILED : SLUICE_CT_STAT_ANY_INSERT_FAILED, 1);
	return -SLUICE_DROP_CT_MAP_FULL;
}

/* Records a new flow of client fwd->saddr:fwd->sport to the frontend fwd->daddr:fwd->dport, given
 * the backend be_addr:be_port, whose replies go to reply_daddr (the client, or the address its
 * source was rewritten to). Where the replies go to the client itself, in one flow entry under the
 * client's address and port, unless that is another flow's (the client's port in use towards
 * another frontend: a socket may share its local port with sockets connected elsewhere); such a
 * flow, and a hairpinned one, gets two entries: fwd as the client sent it, and the reply tuple,
 * whose entry names the frontend (SLUICE_CT_F_FRONTEND). The reply entry goes first so that a
 * forward entry never exists without it. Returns 0 or minus a drop reason. */
static __always_inline int ct4_create(const struct sluice_ct4_key *fwd, __be32 be_addr,
				      __be16 be_port, __be32 reply_daddr, __u32 backend_id,
				      __u32 rev_nat_id, __u8 flags)
{
	__u64 now = sluice_ct_now();
	struct sluice_ct4_entry e = {
		.backend_id = backend_id,
		.rev_nat_id = rev_nat_id,
		.last_seen_ns = now,
		.backend_addr = be_addr,
		.backend_port = be_port,
		.flags = flags,
	};
	struct sluice_ct4_key key;
	struct sluice_ct4_entry *old;
	int tcp = fwd->proto == IPPROTO_TCP;
	long ret;

	if (reply_daddr == fwd->saddr && !(flags & SLUICE_CT_F_HAIRPIN)) {
		ct4_flow_key(&key, fwd->saddr, fwd->sport, fwd->proto);
		e.frontend_addr = fwd->daddr;
		e.frontend_port = fwd->dport;
		ret = ct4_store(&key, &e, BPF_NOEXIST);
		if (ret == -EEXIST) {
			/* Replaced: the entry of a flow to this frontend that ended, or whose backend
			 * is gone (lb4_tracked gave this packet no backend); or of a flow to this
			 * backend, which has ended: on the wire at the backend the two are one
			 * tuple, and the replies are this flow's. */
			old = ct4_find(&key);
			if (old && ((old->frontend_addr == fwd->daddr &&
				     old->frontend_port == fwd->dport) ||
				    (old->backend_addr == be_addr && old->backend_port == be_port)))
				ret = ct4_store(&key, &e, BPF_ANY);
		}
		if (ret == 0) {
			ct4_add(tcp ? SLUICE_CT_STAT_TCP_CREATED : SLUICE_CT_STAT_ANY_CREATED, 1);
			return 0;
		}
		if (ret != -EEXIST)
			return ct4_insert_failed(tcp);
		/* Another flow's: this one is recorded by its whole tuple. */
	}

	struct sluice_ct4_entry reply = e;

	e.created_ns = now;
	reply.created_ns = now;
	reply.backend_addr = fwd->daddr;
	reply.backend_port = fwd->dport;
	reply.flags |= SLUICE_CT_F_FRONTEND;
	key.saddr = be_addr;
	key.daddr = reply_daddr;
	key.sport = be_port;
	key.dport = fwd->sport;
	key.proto = fwd->proto;
	key.dir = SLUICE_CT_DIR_REPLY;
	key.pad = 0;
	/* Inserts fail only when the map is full: the TCP hash never evicts, so a flood of new flows
	 * fails here (counted) instead of pushing out established connections. */
	if (ct4_store(&key, &reply, BPF_ANY))
		return ct4_insert_failed(tcp);
	if (ct4_store(fwd, &e, BPF_ANY)) {
		ct4_remove(&key);
		return ct4_insert_failed(tcp);
	}
	ct4_add(tcp ? SLUICE_CT_STAT_TCP_CREATED : SLUICE_CT_STAT_ANY_CREATED, 2);
	ct4_pairs_count_one();
	return 0;
}

/* Records an entry of its own (a policy-tracked flow). Returns 0 or minus a drop reason. */
static __always_inline int ct4_create_one(const struct sluice_ct4_key *key,
					  const struct sluice_ct4_entry *e)
{
	int tcp = key->proto == IPPROTO_TCP;

	if (ct4_store(key, e, BPF_ANY))
		return ct4_insert_failed(tcp);
	ct4_add(tcp ? SLUICE_CT_STAT_TCP_CREATED : SLUICE_CT_STAT_ANY_CREATED, 1);
	return 0;
}

#endif
