/* The XDP context behind the same ctx_* calls as ctx/skb.h, so lib/'s LB/NAT code builds for XDP.
 * XDP has no checksum helpers and no checksum state: headers are read and written in place and
 * the incremental updates computed inline (bpf_csum_diff and the byte helpers only for what is
 * not in the frame's linear part). */
#ifndef SLUICE_BPF_CTX_H
#define SLUICE_BPF_CTX_H

#include <linux/bpf.h>

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "lib/ctx/ones_complement.h"

#define SLUICE_CTX_XDP 1
#define sluice_ctx xdp_md

#define CTX_ACT_OK XDP_PASS
#define CTX_ACT_DROP XDP_DROP

static __always_inline void *ctx_data(const struct sluice_ctx *ctx)
{
	return (void *)(long)ctx->data;
}

static __always_inline void *ctx_data_end(const struct sluice_ctx *ctx)
{
	return (void *)(long)ctx->data_end;
}

/* All of the frame, fragments of a multi-buffer frame included. */
static __always_inline __u32 ctx_len(struct sluice_ctx *ctx)
{
	return bpf_xdp_get_buff_len(ctx);
}

static __always_inline __u32 ctx_ifindex(const struct sluice_ctx *ctx)
{
	return ctx->ingress_ifindex;
}

/* XDP only ever sees packets on their way in. */
static __always_inline int ctx_at_ingress(const struct sluice_ctx *ctx)
{
	(void)ctx;
	return 1;
}

/* Direct access reaches this far into the frame (headers only; bounded for the verifier). */
#define SLUICE_CTX_DIRECT_MAX 0x3ff

/* A pointer to len bytes of the frame's linear data at off, or NULL. */
static __always_inline void *ctx_direct(const struct sluice_ctx *ctx, __u32 off, __u32 len)
{
	void *p, *end = ctx_data_end(ctx);

	if (off > SLUICE_CTX_DIRECT_MAX)
		return NULL;
	p = ctx_data(ctx) + off;
	if (p + len > end)
		return NULL;
	return p;
}

/* Headers are read and written in place; bpf_xdp_load/store_bytes only for what is not in the
 * linear part (a multi-buffer frame's fragments). */
static __always_inline int ctx_load_bytes(struct sluice_ctx *ctx, __u32 off, void *to, __u32 len)
{
	void *p = ctx_direct(ctx, off, len);

	if (p) {
		__builtin_memcpy(to, p, len);
		return 0;
	}
	return bpf_xdp_load_bytes(ctx, off, to, len);
}

static __always_inline int ctx_store_bytes(struct sluice_ctx *ctx, __u32 off, const void *from,
					   __u32 len)
{
	void *p = ctx_direct(ctx, off, len);

	if (p) {
		__builtin_memcpy(p, from, len);
		return 0;
	}
	return bpf_xdp_store_bytes(ctx, off, (void *)from, len);
}

/* The checksum field at off, updated for a field changing from `from` to `to` (flags: its size,
 * BPF_F_MARK_MANGLED_0). A frame has no checksum state: the field always holds the full
 * checksum, so the update is the same for every field. A UDP checksum of 0 means "none"
 * (BPF_F_MARK_MANGLED_0): it stays 0, and a result of 0 is sent as 0xffff. */
static __always_inline int ctx_csum_replace(struct sluice_ctx *ctx, __u32 off, __u64 from,
					    __u64 to, __u64 flags)
{
	__u32 size = flags & BPF_F_HDR_FIELD_MASK;
	__u16 *field = ctx_direct(ctx, off, sizeof(__u16));
	__be32 f = (__be32)from, t = (__be32)to;
	__sum16 csum;
	__u32 sum;

	if (size != 2 && size != 4)
		return -1;
	if (field) {
		if ((flags & BPF_F_MARK_MANGLED_0) && *field == 0)
			return 0;
		csum = ctx_csum_update(*field, (__u32)from, (__u32)to, size);
		if ((flags & BPF_F_MARK_MANGLED_0) && csum == 0)
			csum = 0xffff;
		*field = csum;
		return 0;
	}
	if (ctx_load_bytes(ctx, off, &csum, sizeof(csum)))
		return -1;
	if ((flags & BPF_F_MARK_MANGLED_0) && csum == 0)
		return 0;
	/* A 16-bit value may sit in either half of the word: the folded sum is the same. */
	sum = bpf_csum_diff(&f, sizeof(f), &t, sizeof(t), (__u16)~csum);
	csum = ctx_csum_fold(sum);
	if ((flags & BPF_F_MARK_MANGLED_0) && csum == 0)
		csum = 0xffff;
	return ctx_store_bytes(ctx, off, &csum, sizeof(csum));
}

static __always_inline int ctx_l3_csum_replace(struct sluice_ctx *ctx, __u32 off, __u64 from,
					       __u64 to, __u64 flags)
{
	return ctx_csum_replace(ctx, off, from, to, flags & BPF_F_HDR_FIELD_MASK);
}

/* BPF_F_PSEUDO_HDR changes nothing here: only the skb's CHECKSUM_COMPLETE state cares. */
static __always_inline int ctx_l4_csum_replace(struct sluice_ctx *ctx, __u32 off, __u64 from,
					       __u64 to, __u64 flags)
{
	return ctx_csum_replace(ctx, off, from, to,
				flags & (BPF_F_HDR_FIELD_MASK | BPF_F_MARK_MANGLED_0));
}

/* XDP frames need no pull: what is not in the linear part goes through bpf_xdp_load_bytes. */
static __always_inline void ctx_pull(struct sluice_ctx *ctx, __u32 len)
{
	(void)ctx;
	(void)len;
}


static __always_inline int ctx_change_tail(struct sluice_ctx *ctx, __u32 len)
{
	return bpf_xdp_adjust_tail(ctx, (int)len - (int)ctx_len(ctx));
}

/* Grows the packet at its head and moves the Ethernet header to the new start. */
static __always_inline int ctx_adjust_room_mac(struct sluice_ctx *ctx, __u32 room)
{
	__u8 eth[14];

	if (ctx_load_bytes(ctx, 0, eth, sizeof(eth)))
		return -1;
	if (bpf_xdp_adjust_head(ctx, -(int)room))
		return -1;
	return ctx_store_bytes(ctx, 0, eth, sizeof(eth));
}

static __always_inline long ctx_fib_lookup(struct sluice_ctx *ctx, struct bpf_fib_lookup *fib)
{
	return bpf_fib_lookup(ctx, fib, sizeof(*fib), 0);
}

/* A frame XDP sends on never meets TC egress: there is no one to leave a note for. */
static __always_inline void ctx_set_mark(struct sluice_ctx *ctx, __u32 mark)
{
	(void)ctx;
	(void)mark;
}

static __always_inline int ctx_redirect(__u32 ifindex)
{
	return bpf_redirect(ifindex, 0);
}

/* XDP_REDIRECT to a veth transmits on it: the frame arrives at its peer. */
static __always_inline int ctx_redirect_peer(__u32 ifindex)
{
	return bpf_redirect(ifindex, 0);
}

/* XDP cannot resolve a neighbour: the stack does, and the packet continues there. */
static __always_inline int ctx_redirect_neigh(__u32 ifindex, struct bpf_redir_neigh *nh)
{
	(void)ifindex;
	(void)nh;
	return XDP_PASS;
}

#endif
