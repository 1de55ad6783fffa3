/* Connection tracking of load-balanced flows in sluice_ct4: a forward entry keyed by the tuple the
 * client sends and a reply entry keyed by the tuple the backend answers with. */
#ifndef SLUICE_BPF_CONNTRACK_H
#define SLUICE_BPF_CONNTRACK_H

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
	CT4_NO_TUPLE = 1, /* no ports: other protocols, truncated L4 headers, fragments (only the
			     first fragment carries the ports); such packets are not balanced */
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
	l4_csum_init(&p->csum, pkt->proto, pkt->l4_off);
	return CT4_TUPLE;
}

/* Finds the entry for key and marks it seen now. Coarse time (CLOCK_MONOTONIC_COARSE, a tick
 * behind at most) is all expiry needs, at a fraction of bpf_ktime_get_ns's cost; the entry is
 * written only when the time moved, so a busy flow does not dirty its cache line every packet. */
static __always_inline struct sluice_ct4_entry *ct4_lookup(const struct sluice_ct4_key *key)
{
	struct sluice_ct4_entry *e = bpf_map_lookup_elem(&sluice_ct4, key);
	__u64 now;

	if (e) {
		now = bpf_ktime_get_coarse_ns();
		if (e->last_seen_ns != now)
			e->last_seen_ns = now;
	}
	return e;
}

/* Marks the forward entry of client:cport -> frontend:fport closing (seen from its reply path). */
static __always_inline void ct4_mark_closing(__be32 client, __be32 frontend, __be16 cport,
					     __be16 fport, __u8 proto)
{
	struct sluice_ct4_key fwd = {
		.saddr = client,
		.daddr = frontend,
		.sport = cport,
		.dport = fport,
		.proto = proto,
		.dir = SLUICE_CT_DIR_FORWARD,
	};
	struct sluice_ct4_entry *e = bpf_map_lookup_elem(&sluice_ct4, &fwd);

	if (e) {
		event_ct_close(e, &fwd);
		e->flags |= SLUICE_CT_F_CLOSING;
	}
}

/* Records a new flow in both directions: fwd as the client sent it, and the reply tuple the
 * backend (be_addr:be_port) will answer with, to reply_daddr (the client, or the address its
 * source was rewritten to). The reply entry goes first so that a forward entry never exists
 * without it. Returns 0 or minus a drop reason. */
static __always_inline int ct4_create(const struct sluice_ct4_key *fwd, __be32 be_addr,
				      __be16 be_port, __be32 reply_daddr, __u32 backend_id,
				      __u32 rev_nat_id, __u8 flags)
{
	__u64 now = bpf_ktime_get_coarse_ns();
	struct sluice_ct4_entry e = {
		.backend_id = backend_id,
		.rev_nat_id = rev_nat_id,
		.created_ns = now,
		.last_seen_ns = now,
		.backend_addr = be_addr,
		.backend_port = be_port,
		.flags = flags,
	};
	struct sluice_ct4_key rev = {
		.saddr = be_addr,
		.daddr = reply_daddr,
		.sport = be_port,
		.dport = fwd->sport,
		.proto = fwd->proto,
		.dir = SLUICE_CT_DIR_REPLY,
	};

	if (bpf_map_update_elem(&sluice_ct4, &rev, &e, BPF_ANY))
		return -SLUICE_DROP_CT_MAP_FULL;
	if (bpf_map_update_elem(&sluice_ct4, fwd, &e, BPF_ANY)) {
		bpf_map_delete_elem(&sluice_ct4, &rev);
		return -SLUICE_DROP_CT_MAP_FULL;
	}
	return 0;
}

#endif
