/* Masquerade (SNAT to the node address) of pod traffic leaving through the native device, with
 * source ports allocated in BPF, and the reverse translation of the replies. Each mapping keeps
 * its flow's TCP state and last packet, by which the agent's GC frees it (maps/nat.h). */
#ifndef SLUICE_BPF_NAT_H
#define SLUICE_BPF_NAT_H

#include "lib/conntrack.h"
#include "lib/csum.h"
#include "lib/drop.h"

/* Ports tried per new flow before the flow is dropped with SLUICE_DROP_NAT_NO_PORT. */
#define SLUICE_NAT_PORT_TRIES 32

/* Outcomes of nat4_unmasquerade (or minus a drop reason). */
enum nat4_result {
	NAT4_NONE = 0,    /* no masqueraded flow: the packet is unchanged */
	NAT4_XLATED = 1,  /* translated back to the pod */
};

/* A packet prepared for translation: its tuple as on the wire and where its "local" port is
 * (the source port leaving the node, the destination port of a reply). */
struct nat4_pkt {
	struct sluice_nat4_key key;
	__u32 port_off;
	struct l4_csum csum;
	__u8 tcp_flags; /* TCP: the flags byte (CT4_TCP_*); else 0 */
};

/* One more mapping in sluice_snat4 (SLUICE_CT_STAT_NAT_CREATED): the agent's GC compares it
 * with what it finds there to estimate the LRU's evictions. */
static __always_inline void nat4_count_created(void)
{
	__u32 stat = SLUICE_CT_STAT_NAT_CREATED;
	__u64 *c = bpf_map_lookup_elem(&sluice_ct_stats, &stat);

	if (c)
		*c += 1;
}

/* The masquerade view of a parsed packet. ICMP echo has no ports: the identifier stands in for
 * the node-side port, so it occupies sport when leaving and dport when a reply arrives, and the
 * reverse key is the swapped tuple. A later fragment has its first fragment's ports or id (lib/
 * parse.h). Returns 0, or -SLUICE_DROP_FRAGMENT (a later fragment whose first was not seen),
 * -SLUICE_DROP_NAT_UNSUPPORTED_L4 (no ports, not echo) or -SLUICE_DROP_INVALID_PACKET
 * (truncated). */
static __always_inline int nat4_tuple(const struct pkt4 *pkt, int leaving, struct nat4_pkt *p)
{
	if ((pkt->flags & PKT4_F_NO_L4) && !(pkt->flags & (PKT4_F_PORTS | PKT4_F_ICMP)))
		return -SLUICE_DROP_FRAGMENT;
	__builtin_memset(&p->key, 0, sizeof(p->key));
	p->key.saddr = pkt->saddr;
	p->key.daddr = pkt->daddr;
	p->key.proto = pkt->proto;

	switch (pkt->proto) {
	case IPPROTO_TCP:
	case IPPROTO_UDP:
		if (!(pkt->flags & PKT4_F_PORTS))
			return -SLUICE_DROP_INVALID_PACKET;
		p->key.sport = pkt->sport;
		p->key.dport = pkt->dport;
		p->port_off = pkt->l4_off + (leaving ? 0 : 2);
		break;
	case IPPROTO_ICMP:
		if (!(pkt->flags & PKT4_F_ICMP))
			return -SLUICE_DROP_INVALID_PACKET;
		if (pkt->icmp_type != (leaving ? ICMP_ECHO : ICMP_ECHOREPLY))
			return -SLUICE_DROP_NAT_UNSUPPORTED_L4;
		if (leaving)
			p->key.sport = pkt->icmp_id;
		else
			p->key.dport = pkt->icmp_id;
		p->port_off = pkt->l4_off + offsetof(struct icmphdr, un.echo.id);
		break;
	default:
		return -SLUICE_DROP_NAT_UNSUPPORTED_L4;
	}
	p->tcp_flags = pkt->tcp_flags; /* 0 but for TCP (parse_eth_ip4) */
	l4_csum_init(&p->csum, pkt->proto, pkt->l4_off, pkt->flags);
	return 0;
}

/* Records in pkt the node-side port a translation wrote: a TCP/UDP port or the echo id. */
static __always_inline void nat4_set_port(struct pkt4 *pkt, int leaving, __be16 port)
{
	if (pkt->proto == IPPROTO_ICMP)
		pkt->icmp_id = port;
	else if (leaving)
		pkt->sport = port;
	else
		pkt->dport = port;
}

static __always_inline int ip4_in_prefix(__be32 addr, __be32 net, __u8 len)
{
	__u32 mask;

	if (len == 0)
		return 1;
	if (len > 32)
		return 0;
	mask = ~0u << (32 - len);
	return (bpf_ntohl(addr) & mask) == (bpf_ntohl(net) & mask);
}

/* A packet of a mapping's flow passed through e, the entry of its direction (sluice_snat4 leaving,
 * sluice_rnat4 coming back); key: the packet's tuple as nat4_tuple made it. Records the time
 * (written only when it moved) and moves the flow's TCP state: closing on a FIN or RST,
 * established on a reply; a SYN without ACK leaving on a closed mapping is the pod opening a new
 * connection from the same port (TIME-WAIT reuse, as the kernel's conntrack reopens such a
 * tuple), and both directions' entries start again as a fresh mapping, the port kept. Entries of
 * older programs (no SLUICE_NAT_F_STATEFUL) get the time only. A global function: verified once,
 * not at each of the native device's paths (inline, they verified ~60k more instructions). */
__attribute__((noinline)) int sluice_nat_seen(struct sluice_nat4_entry *e, __u8 tcp_flags,
					      int reply, const struct sluice_nat4_key *key)
{
	struct sluice_nat4_key rkey;
	struct sluice_nat4_entry *r;
	__u64 now = sluice_ct_now();
	__u8 flags;

	if (!e || !key)
		return 0; /* never: callers pass what they found; a global function's verifier asks */
	if (e->last_seen_ns != now)
		e->last_seen_ns = now;
	if (!tcp_flags || !(e->flags & SLUICE_NAT_F_STATEFUL))
		return 0;
	if (!reply && (e->flags & SLUICE_CT_F_CLOSING) &&
	    (tcp_flags & (CT4_TCP_SYN | CT4_TCP_ACK)) == CT4_TCP_SYN) {
		e->flags = SLUICE_NAT_F_STATEFUL;
		sluice_nat4_reply_key(&rkey, key, e->addr, e->port);
		r = bpf_map_lookup_elem(&sluice_rnat4, &rkey);
		if (r)
			r->flags = SLUICE_NAT_F_STATEFUL;
		return 0;
	}
	flags = e->flags | ct4_closing_flag(tcp_flags);
	if (reply)
		flags |= SLUICE_CT_F_ESTABLISHED;
	if (flags != e->flags)
		e->flags = flags;
	return 0;
}

/* Finds a free node port for p's flow and records both directions. Returns 0 or minus a drop
 * reason. */
static __always_inline int nat4_allocate(const struct sluice_node_config *cfg,
					 const struct nat4_pkt *p, struct sluice_nat4_entry *out)
{
	struct sluice_nat4_entry orig = {
		.addr = p->key.saddr,
		.port = p->key.sport,
		.flags = SLUICE_NAT_F_STATEFUL | ct4_closing_flag(p->tcp_flags),
		.last_seen_ns = sluice_ct_now(),
	};
	struct sluice_nat4_key rkey;
	__u32 min = cfg->nat_port_min, max = cfg->nat_port_max;
	__u32 range, start;
	int i;

	sluice_nat4_reply_key(&rkey, &p->key, cfg->node_ip4, 0); /* the port is the one tried */

	if (min == 0 || max < min)
		return -SLUICE_DROP_NO_NODE_CONFIG;
	range = max - min + 1;
	start = bpf_get_prandom_u32();
	for (i = 0; i < SLUICE_NAT_PORT_TRIES; i++) {
		__u16 port = min + (start + i) % range;

		rkey.dport = bpf_htons(port);
		if (bpf_map_update_elem(&sluice_rnat4, &rkey, &orig, BPF_NOEXIST))
			continue;
		out->addr = cfg->node_ip4;
		out->port = rkey.dport;
		out->flags = orig.flags;
		out->pad = 0;
		out->last_seen_ns = orig.last_seen_ns;
		if (bpf_map_update_elem(&sluice_snat4, &p->key, out, BPF_ANY)) {
			bpf_map_delete_elem(&sluice_rnat4, &rkey);
			return -SLUICE_DROP_NAT_MAP_FULL;
		}
		nat4_count_created();
		return 0;
	}
	return -SLUICE_DROP_NAT_NO_PORT;
}

/* The node address and port p's flow leaves with: its recorded translation, or a new one. Maps
 * only. Returns 0 or minus a drop reason. */
static __always_inline int nat4_snat_entry(const struct sluice_node_config *cfg,
					   const struct nat4_pkt *p,
					   struct sluice_nat4_entry *entry)
{
	struct sluice_nat4_entry *found = bpf_map_lookup_elem(&sluice_snat4, &p->key);

	if (found) {
		sluice_nat_seen(found, p->tcp_flags, 0, &p->key);
		*entry = *found;
		return 0;
	}
	if (p->csum.absent)
		return -SLUICE_DROP_FRAGMENT; /* a later fragment opens no flow of its own */
	return nat4_allocate(cfg, p, entry);
}

/* Rewrites the source of a packet leaving the node as nat4_snat_entry decided. Returns
 * CTX_ACT_OK or minus a drop reason. */
static __always_inline int nat4_snat_rewrite(struct sluice_ctx *ctx, struct pkt4 *pkt,
					     const struct nat4_pkt *p,
					     const struct sluice_nat4_entry *entry)
{
	int ret;

	ret = rewrite_ip4_addr_port(ctx, pkt->l3_off, offsetof(struct iphdr, saddr), p->key.saddr,
				    entry->addr, p->port_off, p->key.sport, entry->port, &p->csum);
	if (ret < 0)
		return ret;
	pkt->saddr = entry->addr;
	nat4_set_port(pkt, 1, entry->port);
	return CTX_ACT_OK;
}

/* Source-NATs a pod packet leaving the node. Returns CTX_ACT_OK or minus a drop reason. */
static __always_inline int nat4_masquerade(struct sluice_ctx *ctx, struct pkt4 *pkt,
					   const struct sluice_node_config *cfg,
					   const struct nat4_pkt *p)
{
	struct sluice_nat4_entry entry;
	int ret;

	ret = nat4_snat_entry(cfg, p, &entry);
	if (ret < 0)
		return ret;
	return nat4_snat_rewrite(ctx, pkt, p, &entry);
}

/* Rewrites the destination of a reply to a masqueraded flow back to the pod or client the flow
 * left from (entry, from sluice_rnat4). Returns 0 or minus a drop reason. */
static __always_inline int nat4_unmasquerade_rewrite(struct sluice_ctx *ctx, struct pkt4 *pkt,
						     const struct nat4_pkt *p,
						     const struct sluice_nat4_entry *entry)
{
	int ret;

	ret = rewrite_ip4_addr_port(ctx, pkt->l3_off, offsetof(struct iphdr, daddr), p->key.daddr,
				    entry->addr, p->port_off, p->key.dport, entry->port, &p->csum);
	if (ret < 0)
		return ret;
	pkt->daddr = entry->addr;
	nat4_set_port(pkt, 0, entry->port);
	return 0;
}

/* Translates a reply to a masqueraded flow back to the pod. Returns NAT4_XLATED, NAT4_NONE when
 * the packet belongs to no masqueraded flow, or minus a drop reason. */
static __always_inline int nat4_unmasquerade(struct sluice_ctx *ctx, struct pkt4 *pkt,
					     const struct nat4_pkt *p)
{
	struct sluice_nat4_entry *found = bpf_map_lookup_elem(&sluice_rnat4, &p->key);
	struct sluice_nat4_entry entry;
	int ret;

	if (!found)
		return NAT4_NONE;
	sluice_nat_seen(found, p->tcp_flags, 1, &p->key);
	entry = *found;
	ret = nat4_unmasquerade_rewrite(ctx, pkt, p, &entry);
	if (ret < 0)
		return ret;
	return NAT4_XLATED;
}

#endif
