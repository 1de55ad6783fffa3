/* The TC context: lib/ reaches the packet only through the ctx_* calls below, so the same LB/NAT
 * code builds for TC (this file) and XDP (ctx/xdp.h). An entry file includes one of the two first. */
#ifndef SLUICE_BPF_CTX_H
#define SLUICE_BPF_CTX_H

#include <linux/bpf.h>
#include <linux/pkt_cls.h>

#include <bpf/bpf_helpers.h>

#define SLUICE_CTX_SKB 1
#define sluice_ctx __sk_buff

#define CTX_ACT_OK TC_ACT_OK
#define CTX_ACT_DROP TC_ACT_SHOT

static __always_inline void *ctx_data(const struct sluice_ctx *ctx)
{
	return (void *)(long)ctx->data;
}

static __always_inline void *ctx_data_end(const struct sluice_ctx *ctx)
{
	return (void *)(long)ctx->data_end;
}

static __always_inline __u32 ctx_len(struct sluice_ctx *ctx)
{
	return ctx->len;
}

/* The interface the packet arrived on (and is answered out of). */
static __always_inline __u32 ctx_ifindex(const struct sluice_ctx *ctx)
{
	return ctx->ifindex;
}

/* Whether the hook runs on the way in: at TC ingress the kernel has set the skb's input interface
 * to this device; at egress it is where the packet came from (another device, 0 if the node sent
 * it). A packet sent back out of the device it arrived on reads as ingress: for the flow monitor
 * only. */
static __always_inline int ctx_at_ingress(const struct sluice_ctx *ctx)
{
	return ctx->ingress_ifindex == ctx->ifindex;
}

static __always_inline int ctx_load_bytes(struct sluice_ctx *ctx, __u32 off, void *to, __u32 len)
{
	return bpf_skb_load_bytes(ctx, off, to, len);
}

static __always_inline int ctx_store_bytes(struct sluice_ctx *ctx, __u32 off, const void *from,
					   __u32 len)
{
	return bpf_skb_store_bytes(ctx, off, from, len, 0);
}

/* Incremental checksum updates (RFC 1624) of the 16-bit checksum at off; flags as for
 * bpf_l3_csum_replace / bpf_l4_csum_replace (the size of the field, BPF_F_PSEUDO_HDR,
 * BPF_F_MARK_MANGLED_0). */
static __always_inline int ctx_l3_csum_replace(struct sluice_ctx *ctx, __u32 off, __u64 from,
					       __u64 to, __u64 flags)
{
	return bpf_l3_csum_replace(ctx, off, from, to, flags);
}

static __always_inline int ctx_l4_csum_replace(struct sluice_ctx *ctx, __u32 off, __u64 from,
					       __u64 to, __u64 flags)
{
	return bpf_l4_csum_replace(ctx, off, from, to, flags);
}

/* Sets the packet's length to len (trims or pads at the tail). */
static __always_inline int ctx_change_tail(struct sluice_ctx *ctx, __u32 len)
{
	return bpf_skb_change_tail(ctx, len, 0);
}

/* Makes room bytes of room right behind the Ethernet header. */
static __always_inline int ctx_adjust_room_mac(struct sluice_ctx *ctx, __u32 room)
{
	return bpf_skb_adjust_room(ctx, room, BPF_ADJ_ROOM_MAC, 0);
}

static __always_inline long ctx_fib_lookup(struct sluice_ctx *ctx, struct bpf_fib_lookup *fib)
{
	return bpf_fib_lookup(ctx, fib, sizeof(*fib), 0);
}

/* Verdicts that send the packet on. */
static __always_inline int ctx_redirect(__u32 ifindex)
{
	return bpf_redirect(ifindex, 0);
}

/* Into the network namespace behind a veth, without a second pass through the host's stack. */
static __always_inline int ctx_redirect_peer(__u32 ifindex)
{
	return bpf_redirect_peer(ifindex, 0);
}

/* Out of ifindex to the next hop nh, letting the kernel resolve its neighbour entry. */
static __always_inline int ctx_redirect_neigh(__u32 ifindex, struct bpf_redir_neigh *nh)
{
	return bpf_redirect_neigh(ifindex, nh, sizeof(*nh), 0);
}

#endif
