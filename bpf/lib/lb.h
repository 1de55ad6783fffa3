/* Service load balancing: DNAT of packets to a service frontend onto one of its backends
 * (sluice_lb4_svc / sluice_lb4_be), conntrack so a flow keeps its backend, reverse NAT of the
 * backends' replies, session affinity, source ranges, hairpin, and rejection of services
 * without endpoints. Shared by the pod program (ClusterIP and every other frontend a pod can
 * reach) and the native device's program (NodePort, ExternalIPs, LoadBalancer IPs).
 * Each translation is a choice that reads and writes maps only (lb4_frontend, lb4_select,
 * lb4_choose, lb4_rev_nat_lookup: the socket hooks, TC and XDP share them) and a rewrite of the
 * packet through the ctx layer (lb4_dnat_rewrite, lb4_rev_nat_rewrite). */
#ifndef SLUICE_BPF_LB_H
#define SLUICE_BPF_LB_H

#include "lib/conntrack.h"
#include "lib/nat.h"
#include "lib/reject.h"

#define NSEC_PER_SEC 1000000000ull

enum lb4_result {
	LB4_NONE = 0,   /* not a service packet: continue unchanged */
	LB4_DNAT = 1,   /* sent on to a backend (headers rewritten) */
	LB4_REVNAT = 2, /* a backend's reply, rewritten to come from the frontend */
	LB4_REJECT = 3, /* answer with a RST / ICMP port unreachable */
	/* negative: minus a drop reason */
};

/* Where a translated packet is sent: what lb4_choose or lb4_rev_nat_lookup decided, applied by
 * the matching rewrite. */
struct lb4_target {
	__be32 addr;        /* DNAT: the backend; reverse NAT: the frontend */
	__be16 port;
	__u8 flags;         /* enum sluice_ct_flags of the flow */
	__u8 pad;
	__be32 hairpin_src; /* DNAT of a hairpinned flow: its new source */
};

/* The backend of an id, or NULL. sluice_lb4_be is an array: a free slot reads as zeroes. */
static __always_inline const struct sluice_lb4_backend *lb4_backend(__u32 backend_id)
{
	const struct sluice_lb4_backend *be = bpf_map_lookup_elem(&sluice_lb4_be, &backend_id);

	return be && be->addr ? be : NULL;
}

/* Whether the agent vouched that no backend is on port (sluice_lb4_nbport, maps/lb.h). An array
 * lookup the verifier inlines: a few instructions, where the conntrack lookup it spares is a hash
 * lookup. */
static __always_inline int lb4_no_backend_on(__be16 port)
{
	__u32 p = bpf_ntohs(port), word = p >> 5;
	const __u32 *bits = bpf_map_lookup_elem(&sluice_lb4_nbport, &word);

	return bits && ((*bits >> (p & 31)) & 1);
}

/* Whether a packet to a local pod (never a frontend) is surely no Service's: a TCP segment that
 * opens nothing (no crossed flow to clear) from a port no backend is on (no reply). The common
 * case of pod -> pod traffic, decided with one array lookup and no conntrack tuple. */
static __always_inline int lb4_plain_to_endpoint(const struct pkt4 *pkt)
{
	return pkt->proto == IPPROTO_TCP && (pkt->flags & PKT4_F_TCP_FLAGS) &&
	       !(pkt->tcp_flags & CT4_TCP_SYN) && lb4_no_backend_on(pkt->sport);
}

/* The frontend a reply entry's replies come from: named in the entry (SLUICE_CT_F_FRONTEND), or,
 * in an entry of the programs before it (a hitless upgrade), through sluice_lb4_rnat. Returns 0,
 * or -1 when the frontend is gone from sluice_lb4_rnat. */
static __always_inline int lb4_reply_frontend(const struct sluice_ct4_entry *ct, __be32 *addr,
					      __be16 *port)
{
	const struct sluice_lb4_revnat *rnat;

	if (ct->flags & SLUICE_CT_F_FRONTEND) {
		*addr = ct->backend_addr;
		*port = ct->backend_port;
		return 0;
	}
	rnat = bpf_map_lookup_elem(&sluice_lb4_rnat, &ct->rev_nat_id);
	if (!rnat)
		return -1;
	*addr = rnat->addr;
	*port = rnat->port;
	return 0;
}

/* The close of a flow entry's flow, to the flow monitor, with the tuple its client sent. */
static __always_inline void lb4_flow_close_event(const struct sluice_ct4_entry *ct, __be32 client,
						 __be16 cport, __u8 proto)
{
	struct sluice_ct4_key fwd = {
		.saddr = client,
		.daddr = ct->frontend_addr,
		.sport = cport,
		.dport = ct->frontend_port,
		.proto = proto,
		.dir = SLUICE_CT_DIR_FORWARD,
	};

	event_ct_close(ct, &fwd);
}

/* A reply from a backend to a balanced flow leaves from the frontend; a hairpinned flow's reply
 * also goes back to the client's own address. Maps only. Returns LB4_REVNAT (t says where from),
 * or LB4_NONE when the packet is no such reply. */
static __always_inline int lb4_rev_nat_lookup(const struct ct4_pkt *p, struct lb4_target *t)
{
	struct sluice_ct4_key key;
	struct sluice_ct4_entry *ct;

	/* A reply comes from its backend's port. */
	if (lb4_no_backend_on(p->key.sport))
		return LB4_NONE;
	/* The flow entry of the client the packet is addressed to, when it is this backend's. */
	ct4_flow_key(&key, p->key.daddr, p->key.dport, p->key.proto);
	ct = ct4_find(&key);
	if (ct && ct->backend_addr == p->key.saddr && ct->backend_port == p->key.sport) {
		ct4_touch(ct);
		t->flags = ct->flags;
		t->addr = ct->frontend_addr;
		t->port = ct->frontend_port;
		if (p->key.proto == IPPROTO_TCP) {
			__u8 mark = 0;

			if (!(ct->flags & SLUICE_CT_F_ESTABLISHED))
				mark |= SLUICE_CT_F_ESTABLISHED;
			if (p->tcp_flags & (CT4_TCP_FIN | CT4_TCP_RST)) {
				mark |= SLUICE_CT_F_CLOSING;
				lb4_flow_close_event(ct, p->key.daddr, p->key.dport, p->key.proto);
			}
			if (mark)
				ct->flags |= mark;
		}
		return LB4_REVNAT;
	}
	if (!ct4_pairs_may_exist())
		return LB4_NONE;
	key = p->key;
	key.dir = SLUICE_CT_DIR_REPLY;
	ct = ct4_lookup(&key);
	if (!ct)
		return LB4_NONE;
	t->flags = ct->flags;
	if (lb4_reply_frontend(ct, &t->addr, &t->port))
		return LB4_NONE;
	/* TCP state for the GC's timeouts, written once per flow (the first reply) and on a close,
	 * in both directions' entries. */
	if (p->key.proto == IPPROTO_TCP) {
		__u8 mark = 0;

		if (!(ct->flags & SLUICE_CT_F_ESTABLISHED))
			mark |= SLUICE_CT_F_ESTABLISHED;
		if (p->tcp_flags & (CT4_TCP_FIN | CT4_TCP_RST))
			mark |= SLUICE_CT_F_CLOSING;
		if (mark) {
			ct->flags |= mark;
			ct4_mark_forward(t->flags & SLUICE_CT_F_HAIRPIN ? p->key.saddr : p->key.daddr,
					 t->addr, p->key.dport, t->port, p->key.proto, mark);
		}
	}
	return LB4_REVNAT;
}

/* Rewrites a backend's reply as lb4_rev_nat_lookup decided. Returns LB4_REVNAT or minus a drop
 * reason. */
static __always_inline int lb4_rev_nat_rewrite(struct sluice_ctx *ctx, struct pkt4 *pkt,
					       const struct ct4_pkt *p,
					       const struct lb4_target *t)
{
	int ret;

	ret = rewrite_ip4_addr_port(ctx, pkt->l3_off, offsetof(struct iphdr, saddr), p->key.saddr,
				    t->addr, p->l4_off, p->key.sport, t->port, &p->csum);
	/* Hairpin: the backend is the client; it answered the gateway the source was rewritten to. */
	if (!ret && (t->flags & SLUICE_CT_F_HAIRPIN))
		ret = rewrite_ip4_addr(ctx, pkt->l3_off, offsetof(struct iphdr, daddr), p->key.daddr,
				       p->key.saddr, &p->csum);
	if (ret < 0)
		return ret;
	pkt->saddr = t->addr;
	pkt->sport = t->port;
	if (t->flags & SLUICE_CT_F_HAIRPIN)
		pkt->daddr = p->key.saddr;
	return LB4_REVNAT;
}

/* Whether the translated flow `ct` a direct packet crosses is a TCP connection that has not
 * closed (lb4_forget_crossed_flow leaves those). */
static __always_inline int lb4_crossed_still_open(const struct ct4_pkt *p,
						  const struct sluice_ct4_entry *ct)
{
	return p->key.proto == IPPROTO_TCP && !(ct->flags & SLUICE_CT_F_CLOSING);
}

/* A packet that is no backend's reply and no frontend's, sent from a client address and port
 * straight to a backend address and port that a translated flow used: its reply entry (keyed by
 * the tuple the backend answers with) would capture this direct flow's replies and rewrite them
 * to come from the frontend. A client that opens a flow to the backend itself (a TCP SYN; any
 * UDP datagram, UDP has no opening) is done with the translated one, whose entries are stale
 * (closed, or idle until the GC): the reply entry is deleted, and the forward entry too when it
 * still names this backend (a later flow to the frontend is balanced afresh). A translated TCP
 * connection that has not closed is left alone: the client's socket to the frontend is another
 * socket than its new one to the backend, and may still be open (the two share a tuple only on
 * the backend's side, where the SYN meets the open connection and is answered with an ACK the
 * open connection takes as a duplicate); the new connection's SYN is retransmitted, and gets
 * through once the other one closes. Costs one lookup for such a packet, none for a reply, a
 * TCP segment of an open connection or a port no backend is on. */
static __always_inline void lb4_forget_crossed_flow(const struct ct4_pkt *p)
{
	struct sluice_ct4_key rev = {
		.saddr = p->key.daddr,
		.daddr = p->key.saddr,
		.sport = p->key.dport,
		.dport = p->key.sport,
		.proto = p->key.proto,
		.dir = SLUICE_CT_DIR_REPLY,
	};
	struct sluice_ct4_entry *ct, *fct;
	struct sluice_ct4_key fwd;
	__be32 fe_addr;
	__be16 fe_port;
	int deleted = 1;

	if (p->key.proto == IPPROTO_TCP &&
	    (p->tcp_flags & (CT4_TCP_SYN | CT4_TCP_ACK)) != CT4_TCP_SYN)
		return;
	if (lb4_no_backend_on(p->key.dport))
		return;
	/* The translated flow's entry, when it is a flow entry of this client and backend. */
	ct4_flow_key(&fwd, p->key.saddr, p->key.sport, p->key.proto);
	ct = ct4_find(&fwd);
	if (ct && ct->backend_addr == p->key.daddr && ct->backend_port == p->key.dport) {
		if (lb4_crossed_still_open(p, ct))
			return;
		ct4_remove(&fwd);
		ct4_add(p->key.proto == IPPROTO_TCP ? SLUICE_CT_STAT_TCP_CROSSED
						    : SLUICE_CT_STAT_ANY_CROSSED,
			1);
		return;
	}
	if (!ct4_pairs_may_exist())
		return;
	ct = ct4_find(&rev);
	/* A hairpinned flow's reply entry is addressed to the gateway, never a client's own. */
	if (!ct || (ct->flags & SLUICE_CT_F_HAIRPIN) || lb4_crossed_still_open(p, ct))
		return;
	if (!lb4_reply_frontend(ct, &fe_addr, &fe_port)) {
		__builtin_memset(&fwd, 0, sizeof(fwd));
		fwd.saddr = p->key.saddr;
		fwd.daddr = fe_addr;
		fwd.sport = p->key.sport;
		fwd.dport = fe_port;
		fwd.proto = p->key.proto;
		fwd.dir = SLUICE_CT_DIR_FORWARD;
		fct = ct4_find(&fwd);
		if (fct && fct->backend_addr == p->key.daddr && fct->backend_port == p->key.dport) {
			ct4_remove(&fwd);
			deleted = 2;
		}
	}
	ct4_remove(&rev);
	ct4_add(p->key.proto == IPPROTO_TCP ? SLUICE_CT_STAT_TCP_CROSSED
					    : SLUICE_CT_STAT_ANY_CROSSED,
		deleted);
}

/* Reverse NAT of a backend's reply. Returns LB4_REVNAT, LB4_NONE when the packet is no such
 * reply (a direct flow then clears a stale translated flow it crosses), or minus a drop
 * reason. */
static __always_inline int lb4_rev_nat(struct sluice_ctx *ctx, struct pkt4 *pkt,
				       const struct ct4_pkt *p)
{
	struct lb4_target t;

	if (lb4_rev_nat_lookup(p, &t) != LB4_REVNAT) {
		lb4_forget_crossed_flow(p);
		return LB4_NONE;
	}
	return lb4_rev_nat_rewrite(ctx, pkt, p, &t);
}

/* A forward entry a new SYN must not follow: its connection ended (FIN/RST seen), or its
 * backend is gone from the service's backends. (Other packets of a flow whose backend is gone keep
 * going there: that is how a terminating endpoint finishes its connections.) */
static __always_inline int lb4_ct_stale(const struct sluice_ct4_entry *ct)
{
	const struct sluice_lb4_backend *be;

	if (ct->flags & SLUICE_CT_F_CLOSING)
		return 1;
	be = lb4_backend(ct->backend_id);
	return !be || be->addr != ct->backend_addr || be->port != ct->backend_port;
}

/* Whether addr is in the ClusterIP range (when the agent configured one). Such an address is
 * never an endpoint, so the caller skips the endpoint lookup that would miss. */
static __always_inline int lb4_in_service_cidr(const struct sluice_node_config *cfg, __be32 addr)
{
	return cfg && cfg->service_cidr4_len &&
	       ip4_in_prefix(addr, cfg->service_cidr4, cfg->service_cidr4_len);
}

/* The frontend a packet is addressed to. A miss on an address inside the service range is
 * decided here too: a ClusterIP in use but not on this port/protocol (its wildcard entry
 * {addr, 0, 0}) is rejected, an address no Service has is dropped. */
static __always_inline int lb4_frontend(const struct ct4_pkt *p,
					const struct sluice_node_config *cfg,
					struct sluice_lb4_key *key,
					const struct sluice_lb4_service **svc)
{
	__builtin_memset(key, 0, sizeof(*key));
	key->addr = p->key.daddr;
	key->dport = p->key.dport;
	key->proto = p->key.proto;
	key->scope = SLUICE_LB_SCOPE_EXTERNAL;
	*svc = bpf_map_lookup_elem(&sluice_lb4_svc, key);
	if (*svc)
		return LB4_DNAT;
	if (!lb4_in_service_cidr(cfg, p->key.daddr))
		return LB4_NONE;
	key->dport = 0;
	key->proto = 0;
	if (bpf_map_lookup_elem(&sluice_lb4_svc, key))
		return LB4_REJECT;
	return -SLUICE_DROP_SERVICE_UNKNOWN_IP;
}

/* A client inside the cluster (a pod here, the node's own sockets) reaching an external frontend
 * with externalTrafficPolicy: Local is balanced over every endpoint, as kube-proxy balances it:
 * the agent writes the same frontend in scope SLUICE_LB_SCOPE_INTERNAL for that (only the local
 * policy's frontends pay the second lookup). key and svc are lb4_frontend's answer (LB4_DNAT);
 * they are switched to the internal frontend when it exists. */
static __always_inline void lb4_in_cluster(struct sluice_lb4_key *key,
					   const struct sluice_lb4_service **svc)
{
	const struct sluice_lb4_service *internal;

	if (!((*svc)->flags & SLUICE_SVC_F_ETP_LOCAL))
		return;
	key->scope = SLUICE_LB_SCOPE_INTERNAL;
	internal = bpf_map_lookup_elem(&sluice_lb4_svc, key);
	if (internal)
		*svc = internal;
	else
		key->scope = SLUICE_LB_SCOPE_EXTERNAL;
}

/* loadBalancerSourceRanges: admitted when the frontend has none or one contains the client. */
static __always_inline int lb4_source_allowed(const struct sluice_lb4_service *svc,
					      __be32 client)
{
	struct sluice_lb4_srcrange_key key = {
		.prefixlen = 64,
		.rev_nat_id = bpf_htonl(svc->rev_nat_id),
		.addr = client,
	};

	if (!(svc->flags & SLUICE_SVC_F_SOURCE_RANGES))
		return 1;
	return bpf_map_lookup_elem(&sluice_lb4_srcr, &key) != NULL;
}

/* The backend id in slot key->backend_slot (1..count) of the frontend whose master is svc: from
 * the slot record the master names (sluice_lb4_rec, maps/lb.h: an array lookup the verifier
 * inlines), else from the slot's own entry in sluice_lb4_svc. Returns 0, or -1 when the slot has
 * no backend. */
static __always_inline int lb4_slot_backend(const struct sluice_lb4_key *key,
					    const struct sluice_lb4_service *svc, __u32 *backend_id)
{
	const struct sluice_lb4_slot_record *rec;
	const struct sluice_lb4_service *entry;
	__u32 rec_id = svc->backend_id;
	__u32 i = key->backend_slot - 1;

	if (rec_id && i < SLUICE_LB4_RECORD_SLOTS) {
		rec = bpf_map_lookup_elem(&sluice_lb4_rec, &rec_id);
		if (!rec)
			return -1;
		*backend_id = rec->backend_id[i];
		return 0;
	}
	entry = bpf_map_lookup_elem(&sluice_lb4_svc, key);
	if (!entry)
		return -1;
	*backend_id = entry->backend_id;
	return 0;
}

/* The backend id of a new flow's slot in the Maglev table of the frontend `key` (its master
 * key; maps/lb.h, sluice_lb4_mag): the slot is the flow hash of the client's address and port and
 * the frontend's port and protocol, modulo the table's size, so every node that holds the same
 * table sends the flow to the same backend. Returns 0, or -1 when the frontend has no table or
 * the slot names no backend. */
static __always_inline int lb4_maglev_backend(const struct sluice_lb4_key *key, __be32 client,
					      __be16 client_port, __u32 *backend_id)
{
	__u32 index = SLUICE_LB4_MAGLEV_SIZE_INDEX;
	const __u32 *entry;
	__u32 m;
	void *table;

	table = bpf_map_lookup_elem(&sluice_lb4_mag, key);
	if (!table)
		return -1;
	entry = bpf_map_lookup_elem(table, &index);
	if (!entry || !*entry)
		return -1;
	m = *entry;
	index = 1 + sluice_maglev_flow_hash(client, client_port, key->dport, key->proto) % m;
	entry = bpf_map_lookup_elem(table, &index);
	if (!entry || !*entry)
		return -1;
	*backend_id = *entry;
	return 0;
}

/* Picks the backend of a new flow from `client` to the frontend whose master is svc: the
 * client's affinity when it has a live one, else the slot of the frontend's Maglev table
 * (SLUICE_SVC_F_MAGLEV, when `hashed`: the caller knows the client's port), else a random slot.
 * Returns 0 or minus a drop reason. */
static __always_inline int lb4_select(const struct sluice_lb4_key *master_key,
				      const struct sluice_lb4_service *svc, __be32 client,
				      __be16 client_port, int hashed, __u32 *backend_id,
				      const struct sluice_lb4_backend **be)
{
	struct sluice_lb4_affinity_key akey = { .client_addr = client, .rev_nat_id = svc->rev_nat_id };
	struct sluice_lb4_affinity aff = {};
	struct sluice_lb4_key key = *master_key;
	struct sluice_lb4_affinity *found;
	__u16 count = svc->count;
	__u64 now = 0;

	if (count == 0)
		return -SLUICE_DROP_SERVICE_NO_BACKEND;
	if (svc->flags & SLUICE_SVC_F_AFFINITY) {
		now = bpf_ktime_get_ns();
		found = bpf_map_lookup_elem(&sluice_lb4_aff, &akey);
		if (found && now - found->last_used_ns < svc->affinity_timeout * NSEC_PER_SEC) {
			*backend_id = found->backend_id;
			*be = lb4_backend(*backend_id);
			if (*be) {
				found->last_used_ns = now;
				return 0;
			}
		}
	}
	if (!hashed || !(svc->flags & SLUICE_SVC_F_MAGLEV) ||
	    lb4_maglev_backend(master_key, client, client_port, backend_id) < 0) {
		key.backend_slot = 1 + bpf_get_prandom_u32() % count;
		if (lb4_slot_backend(&key, svc, backend_id) < 0)
			return -SLUICE_DROP_SERVICE_NO_BACKEND;
	}
	*be = lb4_backend(*backend_id);
	if (!*be)
		return -SLUICE_DROP_SERVICE_NO_BACKEND;
	if (svc->flags & SLUICE_SVC_F_AFFINITY) {
		aff.last_used_ns = now;
		aff.backend_id = *backend_id;
		bpf_map_update_elem(&sluice_lb4_aff, &akey, &aff, BPF_ANY);
	}
	return 0;
}

/* The backend conntrack gives a packet of a flow it follows (client -> frontend), as it was
 * given, whatever happened to the service since; closing packets mark the flow. hairpin_src as
 * for lb4_choose. Returns LB4_DNAT (t says where to), or LB4_NONE when the flow is new: not
 * tracked, or a new connection (a SYN) on the tuple of one that ended or whose backend is gone. */
static __always_inline int lb4_tracked(const struct ct4_pkt *p, __be32 hairpin_src,
				       struct lb4_target *t)
{
	struct sluice_ct4_key key;
	struct sluice_ct4_entry *ct;
	int flow; /* ct is a flow entry: both directions' */

	/* The client's flow entry, when it is this frontend's; else the forward entry. */
	ct4_flow_key(&key, p->key.saddr, p->key.sport, p->key.proto);
	ct = ct4_find(&key);
	flow = ct && ct->frontend_addr == p->key.daddr && ct->frontend_port == p->key.dport;
	if (!flow)
		ct = ct4_pairs_may_exist() ? ct4_find(&p->key) : NULL;
	if (!ct)
		return LB4_NONE;
	ct4_touch(ct);
	if (p->key.proto == IPPROTO_TCP) {
		if ((p->tcp_flags & (CT4_TCP_SYN | CT4_TCP_ACK)) == CT4_TCP_SYN && lb4_ct_stale(ct))
			return LB4_NONE;
		if (p->tcp_flags & (CT4_TCP_FIN | CT4_TCP_RST)) {
			event_ct_close(ct, &p->key);
			ct->flags |= SLUICE_CT_F_CLOSING;
			if (!flow)
				ct4_mark_reply_closing(&p->key, ct,
						       ct->flags & SLUICE_CT_F_HAIRPIN ?
							       hairpin_src :
							       p->key.saddr);
		}
	}
	t->hairpin_src = hairpin_src;
	t->addr = ct->backend_addr;
	t->port = ct->backend_port;
	t->flags = ct->flags;
	return LB4_DNAT;
}

/* Gives a new flow to the frontend `key` (master `svc`) a backend and records it in conntrack.
 * hairpin_src as for lb4_choose. Returns LB4_DNAT (t says where to), LB4_REJECT or minus a drop
 * reason. */
static __always_inline int lb4_new_flow(const struct ct4_pkt *p, const struct sluice_lb4_key *key,
					const struct sluice_lb4_service *svc, __be32 hairpin_src,
					struct lb4_target *t)
{
	const struct sluice_lb4_backend *be = NULL;
	__u32 backend_id = 0;
	int ret;

	/* A later fragment follows the flow its first fragment made; it opens none. */
	if (p->csum.absent)
		return -SLUICE_DROP_FRAGMENT;
	if (svc->flags & SLUICE_SVC_F_REJECT)
		return LB4_REJECT;
	ret = lb4_select(key, svc, p->key.saddr, p->key.sport, 1, &backend_id, &be);
	if (ret < 0)
		return ret;
	t->hairpin_src = hairpin_src;
	t->addr = be->addr;
	t->port = be->port;
	t->flags = hairpin_src && t->addr == p->key.saddr ? SLUICE_CT_F_HAIRPIN : 0;
	ret = ct4_create(&p->key, t->addr, t->port,
			 t->flags & SLUICE_CT_F_HAIRPIN ? hairpin_src : p->key.saddr, backend_id,
			 svc->rev_nat_id, t->flags);
	if (ret < 0)
		return ret;
	event_translate(&p->key, t->addr, t->port, svc->rev_nat_id, p->tcp_flags);
	return LB4_DNAT;
}

/* The backend of a packet to the frontend `key` (master `svc`). Existing flows keep their
 * backend, whatever happened to the service since; a new flow is given one and recorded in
 * conntrack. A client that is its own backend (hairpin, only from pods: hairpin_src is the pods'
 * gateway, else 0) is to get its source rewritten to hairpin_src, which the pod answers through
 * Sluice again. Maps only. Returns LB4_DNAT (t says where to), LB4_REJECT or minus a drop
 * reason. */
static __always_inline int lb4_choose(const struct ct4_pkt *p, const struct sluice_lb4_key *key,
				      const struct sluice_lb4_service *svc, __be32 hairpin_src,
				      struct lb4_target *t)
{
	if (!lb4_source_allowed(svc, p->key.saddr))
		return -SLUICE_DROP_SOURCE_RANGE;
	if (lb4_tracked(p, hairpin_src, t) == LB4_DNAT)
		return LB4_DNAT;
	return lb4_new_flow(p, key, svc, hairpin_src, t);
}

/* Rewrites a packet to a frontend as lb4_choose decided. Returns LB4_DNAT or minus a drop
 * reason. */
static __always_inline int lb4_dnat_rewrite(struct sluice_ctx *ctx, struct pkt4 *pkt,
					    const struct ct4_pkt *p, const struct lb4_target *t)
{
	int ret;

	ret = rewrite_ip4_addr_port(ctx, pkt->l3_off, offsetof(struct iphdr, daddr), p->key.daddr,
				    t->addr, p->l4_off + 2, p->key.dport, t->port, &p->csum);
	if (!ret && (t->flags & SLUICE_CT_F_HAIRPIN))
		ret = rewrite_ip4_addr(ctx, pkt->l3_off, offsetof(struct iphdr, saddr), p->key.saddr,
				       t->hairpin_src, &p->csum);
	if (ret < 0)
		return ret;
	pkt->daddr = t->addr;
	pkt->dport = t->port;
	if (t->flags & SLUICE_CT_F_HAIRPIN)
		pkt->saddr = t->hairpin_src;
	return LB4_DNAT;
}

/* Service translation of a TCP/UDP packet a pod sends: DNAT when it goes to a frontend, reverse
 * NAT when it is a backend's reply.
 * A TCP segment to a ClusterIP (an address of the service range: no source ranges, no reverse
 * NAT) of a connection conntrack follows is sent on without the frontend lookup, the common
 * case of Service traffic; so such a connection outlives its Service, as it does with
 * kube-proxy's conntrack (a UDP flow does not: its Service is looked up on every datagram). */
static __always_inline int lb4_from_pod(struct sluice_ctx *ctx, struct pkt4 *pkt,
					const struct ct4_pkt *p,
					const struct sluice_node_config *cfg)
{
	__be32 hairpin_src = cfg ? cfg->gateway_ip4 : 0;
	const struct sluice_lb4_service *svc;
	struct sluice_lb4_key key;
	struct lb4_target t;
	int looked_up = 0; /* conntrack has no flow for the packet */
	int ret;

	if (p->key.proto == IPPROTO_TCP && lb4_in_service_cidr(cfg, p->key.daddr)) {
		if (lb4_tracked(p, hairpin_src, &t) == LB4_DNAT)
			return lb4_dnat_rewrite(ctx, pkt, p, &t);
		looked_up = 1;
	}
	ret = lb4_frontend(p, cfg, &key, &svc);
	if (ret == LB4_NONE)
		return lb4_rev_nat(ctx, pkt, p);
	if (ret != LB4_DNAT)
		return ret;
	lb4_in_cluster(&key, &svc);
	if (!looked_up)
		ret = lb4_choose(p, &key, svc, hairpin_src, &t);
	else if (lb4_source_allowed(svc, p->key.saddr))
		ret = lb4_new_flow(p, &key, svc, hairpin_src, &t);
	else
		ret = -SLUICE_DROP_SOURCE_RANGE;
	if (ret != LB4_DNAT)
		return ret;
	return lb4_dnat_rewrite(ctx, pkt, p, &t);
}

#endif
