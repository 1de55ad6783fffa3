/* NodePort acceleration at XDP on the native device: flows from outside to a NodePort, ExternalIP
 * or LoadBalancer IP whose backend is on another node, and their replies, translated and sent on
 * without an skb; source-range refusals and unallocated service addresses dropped. Everything
 * else passes to the TC programs (lib/netdev.h) byte for byte: each path decides (maps and a FIB
 * lookup) before it writes the packet. Both paths share conntrack and NAT, so either translates
 * the other's flows. */
#ifndef SLUICE_BPF_XDP_NODEPORT_H
#define SLUICE_BPF_XDP_NODEPORT_H

#include "lib/netdev.h"

/* Where XDP sends a translated packet: the FIB's answer for it. */
struct xdp_hop {
	__u32 ifindex;
	__u8 macs[12]; /* destination, source */
};

/* Asks the FIB for the route from src to dst as the packet will carry them after translation.
 * Only a complete answer (route and neighbour) counts: anything else is left to the stack.
 * Returns 1 with hop filled, or 0. */
static __always_inline int xdp_fib_hop(struct sluice_ctx *ctx, const struct pkt4 *pkt, __be32 src,
				       __be32 dst, struct xdp_hop *hop)
{
	struct bpf_fib_lookup fib = {};

	fib.family = SLUICE_AF_INET;
	fib.tos = pkt->tos;
	fib.l4_protocol = pkt->proto;
	fib.tot_len = pkt->tot_len;
	fib.ipv4_src = src;
	fib.ipv4_dst = dst;
	fib.ifindex = ctx_ifindex(ctx);
	if (ctx_fib_lookup(ctx, &fib) != BPF_FIB_LKUP_RET_SUCCESS)
		return 0;
	hop->ifindex = fib.ifindex;
	__builtin_memcpy(hop->macs, fib.dmac, 6);
	__builtin_memcpy(hop->macs + 6, fib.smac, 6);
	return 1;
}

/* The last writes of a translated packet: TTL and MACs; then out of the ingress device again
 * (XDP_TX) or of the one the FIB named. Returns a verdict or minus a drop reason. */
static __always_inline int xdp_send(struct sluice_ctx *ctx, struct pkt4 *pkt,
				    const struct xdp_hop *hop)
{
	int ret = ip4_dec_ttl(ctx, pkt);

	if (ret < 0)
		return ret;
	if (ctx_store_bytes(ctx, 0, hop->macs, sizeof(hop->macs)))
		return -SLUICE_DROP_PACKET_WRITE;
	if (hop->ifindex == ctx_ifindex(ctx))
		return XDP_TX;
	return bpf_redirect(hop->ifindex, 0);
}

/* A packet to a frontend (lb4_frontend said LB4_DNAT for key/svc). Forwarded here when its
 * backend is on another node reached by routing; refused here when its source range does not
 * admit the client. Returns a verdict (XDP_PASS: the packet is unchanged) or minus a drop
 * reason. */
static __always_inline int xdp_to_service(struct sluice_ctx *ctx, struct pkt4 *pkt,
					  const struct ct4_pkt *cp,
					  const struct sluice_node_config *cfg,
					  const struct sluice_lb4_key *key,
					  const struct sluice_lb4_service *svc)
{
	struct sluice_nat4_entry snat;
	struct lb4_target t;
	struct xdp_hop hop;
	struct nat4_pkt np;
	struct pkt4 after;
	int ret;

	if (!lb4_source_allowed(svc, cp->key.saddr))
		return -SLUICE_DROP_SOURCE_RANGE;
	/* A backend choice is a map write TC would make the same way (it then finds the flow). */
	ret = lb4_choose(cp, key, svc, 0, &t);
	if (ret != LB4_DNAT)
		return XDP_PASS; /* a rejection or a drop: TC answers it, counted there */
	if (!cfg || t.addr == cfg->node_ip4 || lookup_ep4_exists(t.addr))
		return XDP_PASS; /* a backend on this node */
	if (tunnel_mode(cfg) && tunnel4_lookup(t.addr))
		return XDP_PASS; /* encapsulated by TC */
	if (pkt->ttl <= 1)
		return XDP_PASS;

	/* The packet as it will leave: to the backend, from the node. */
	after = *pkt;
	after.daddr = t.addr;
	after.dport = t.port;
	if (nat4_tuple(&after, 1, &np) < 0)
		return XDP_PASS;
	if (!xdp_fib_hop(ctx, pkt, cfg->node_ip4, t.addr, &hop))
		return XDP_PASS;
	if (nat4_snat_entry(cfg, &np, &snat) < 0)
		return XDP_PASS; /* TC tries again and drops it under the reason */

	ret = lb4_dnat_rewrite(ctx, pkt, cp, &t);
	if (ret < 0)
		return ret;
	ret = nat4_snat_rewrite(ctx, pkt, &np, &snat);
	if (ret < 0)
		return ret;
	return xdp_send(ctx, pkt, &hop);
}

/* A packet to the node's address: a remote backend's reply to a flow xdp_to_service (or
 * netdev_to_service) balanced and masqueraded goes back from the frontend, out to the client.
 * Replies of pods' masqueraded flows and the node's own traffic pass. Returns a verdict or minus
 * a drop reason. */
static __always_inline int xdp_reply_to_client(struct sluice_ctx *ctx, struct pkt4 *pkt)
{
	struct sluice_nat4_entry *found;
	struct sluice_nat4_entry orig;
	struct lb4_target t;
	struct xdp_hop hop;
	struct nat4_pkt np;
	struct ct4_pkt cp;
	struct pkt4 after;
	int ret;

	if (nat4_tuple(pkt, 0, &np) < 0)
		return XDP_PASS;
	found = bpf_map_lookup_elem(&sluice_rnat4, &np.key);
	if (!found)
		return XDP_PASS;
	orig = *found;

	/* The reply as the backend addressed it to the client. */
	after = *pkt;
	after.daddr = orig.addr;
	after.dport = orig.port;
	if (ct4_tuple(&after, &cp) != CT4_TUPLE || lb4_rev_nat_lookup(&cp, &t) != LB4_REVNAT)
		return XDP_PASS;
	if (t.flags & SLUICE_CT_F_HAIRPIN || pkt->ttl <= 1)
		return XDP_PASS;
	if (!xdp_fib_hop(ctx, pkt, t.addr, orig.addr, &hop))
		return XDP_PASS;

	sluice_nat_seen(found, np.tcp_flags, 1, &np.key);
	ret = nat4_unmasquerade_rewrite(ctx, pkt, &np, &orig);
	if (ret < 0)
		return ret;
	ret = lb4_rev_nat_rewrite(ctx, pkt, &cp, &t);
	if (ret < 0)
		return ret;
	return xdp_send(ctx, pkt, &hop);
}

/* The native device's XDP path, in the order netdev_from_net decides. Returns a verdict or minus
 * a drop reason. */
static __always_inline int xdp_from_net(struct sluice_ctx *ctx, struct pkt4 *pkt)
{
	const struct sluice_node_config *cfg = node_config();
	const struct sluice_lb4_service *svc;
	struct sluice_lb4_key key;
	struct ct4_pkt cp;
	int frontend;

	/* Fragments are reassembled, tracked and counted by the TC path alone. */
	if (pkt->flags & PKT4_F_FRAGMENT)
		return XDP_PASS;
	if (ct4_tuple(pkt, &cp) == CT4_TUPLE) {
		frontend = lb4_frontend(&cp, cfg, &key, &svc);
		if (frontend < 0)
			return frontend; /* an address in the service range no Service has */
		if (frontend == LB4_DNAT)
			return xdp_to_service(ctx, pkt, &cp, cfg, &key, svc);
		if (frontend != LB4_NONE)
			return XDP_PASS;
	}
	if (!cfg || pkt->daddr != cfg->node_ip4)
		return XDP_PASS;
	return xdp_reply_to_client(ctx, pkt);
}

#endif
