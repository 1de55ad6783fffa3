/* The other nodes (sluice_tunnel4, docs/routing.md): which node a destination lives on, and
 * sending a packet there inside VXLAN through the node's collect_md device (tunnel mode). */
#ifndef SLUICE_BPF_TUNNEL_H
#define SLUICE_BPF_TUNNEL_H

#include "lib/drop.h"
#include "lib/maps.h"
#include "lib/reject.h"

/* TTL of the outer header. */
#define SLUICE_TUNNEL_TTL 64

/* The node daddr lives on (its pod CIDR or its own address), or NULL. */
static __always_inline const struct sluice_tunnel4_entry *tunnel4_lookup(__be32 daddr)
{
	struct sluice_lpm4_key key = { .prefixlen = 32, .addr = daddr };

	return bpf_map_lookup_elem(&sluice_tunnel4, &key);
}

/* Whether the node runs the overlay (else native routing). */
static __always_inline int tunnel_mode(const struct sluice_node_config *cfg)
{
	return cfg && cfg->tunnel_ifindex != 0;
}

#if defined(SLUICE_CTX_SKB)
#define ICMP_FRAG_NEEDED 4
#define SLUICE_IP_DF 0x4000

/* Whether the packet does not fit the tunnel unfragmented and must not be fragmented (DF). A GSO
 * packet is cut into segments of the sender's MSS later and always fits. */
static __always_inline int tunnel_too_big(struct sluice_ctx *ctx, const struct pkt4 *pkt,
					  const struct sluice_node_config *cfg)
{
	__be16 frag_off;

	if (!cfg->tunnel_mtu || pkt->tot_len <= cfg->tunnel_mtu || ctx->gso_size)
		return 0;
	if (ctx_load_bytes(ctx, pkt->l3_off + offsetof(struct iphdr, frag_off), &frag_off,
			   sizeof(frag_off)))
		return 0;
	return (frag_off & bpf_htons(SLUICE_IP_DF)) != 0;
}

/* Answers a packet tunnel_too_big refused with ICMP fragmentation needed (RFC 1191: the next-hop
 * MTU is the tunnel's) from the pod's gateway, sent back out of the interface it came in on, so
 * the sender's path MTU discovery works across the overlay. Counted under
 * SLUICE_DROP_FRAG_NEEDED: the packet goes no further. Returns a TC verdict or minus a drop
 * reason. */
static __always_inline int tunnel_frag_needed(struct sluice_ctx *ctx, const struct pkt4 *pkt,
					      const struct sluice_node_config *cfg)
{
	int ret;

	ret = icmp4_error(ctx, pkt, ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED,
			  bpf_htonl(cfg->tunnel_mtu), cfg->gateway_ip4, SLUICE_DROP_FRAG_NEEDED);
	if (!ret)
		ret = reject_swap_macs(ctx);
	if (ret < 0)
		return ret;
	/* Only what a pod sends (sluice_from_pod) is checked against the tunnel's MTU. */
	count_drop(SLUICE_DROP_FRAG_NEEDED, SLUICE_DROP_DIR_EGRESS, ctx_len(ctx));
	return ctx_redirect(ctx_ifindex(ctx));
}

/* Sends the packet to `peer` through the VXLAN device: the collect_md device encapsulates to the
 * remote address in the tunnel key and sends over the node's own routing. A caller forwarding
 * the packet has decremented its TTL. Returns a TC verdict or minus a drop reason. */
static __always_inline int tunnel_redirect(struct sluice_ctx *ctx,
					   const struct sluice_node_config *cfg,
					   const struct sluice_tunnel4_entry *peer)
{
	struct bpf_tunnel_key key = {};

	key.remote_ipv4 = bpf_ntohl(peer->node_ip4); /* the helper takes host order */
	key.tunnel_id = SLUICE_TUNNEL_VNI;
	key.tunnel_ttl = SLUICE_TUNNEL_TTL;
	/* Fails only for a bad size or flags, or without memory for the metadata: a write of the
	 * packet's metadata that did not happen. */
	if (bpf_skb_set_tunnel_key(ctx, &key, sizeof(key), 0) < 0)
		return -SLUICE_DROP_PACKET_WRITE;
	/* The encapsulated packet keeps the mark (same namespace): it leaves the native device
	 * without sluice_to_net's lookups. */
	ctx_set_mark(ctx, SLUICE_SKB_MARK_ROUTED);
	return ctx_redirect(cfg->tunnel_ifindex);
}
#else
/* XDP cannot attach tunnel metadata: the packet goes up to TC, which encapsulates it. */
static __always_inline int tunnel_redirect(struct sluice_ctx *ctx,
					   const struct sluice_node_config *cfg,
					   const struct sluice_tunnel4_entry *peer)
{
	(void)ctx;
	(void)cfg;
	(void)peer;
	return CTX_ACT_OK;
}
#endif

#endif
