/* The TC context: lib/ reaches the packet only through the ctx_* calls below, so the same LB/NAT
 * code builds for TC (this file) and XDP (ctx/xdp.h). An entry file includes one of the two first. */
#ifndef SLUICE_BPF_CTX_H
#define SLUICE_BPF_CTX_H

#include <linux/bpf.h>
#include <linux/pkt_cls.h>

#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>

#include "lib/ctx/ones_complement.h"

#define SLUICE_CTX_SKB 1
#define sluice_ctx __sk_buff

#define CTX_ACT_OK TC_ACT_OK
#define CTX_ACT_DROP TC_ACT_SHOT

/* ctx->data and ctx->data_end are read with one load from ctx each: left to itself clang may
 * keep &ctx->data in a register (or spill it) and load through that, which the verifier rejects
 * ("dereference of modified ctx ptr"). */
#define SLUICE_CTX_LOAD_U32(ctx, field)                                                   \
	({                                                                                 \
		__u64 __v;                                                                 \
		asm volatile("%0 = *(u32 *)(%1 + %2)"                                      \
			     : "=r"(__v)                                                   \
			     : "r"(ctx), "i"(__builtin_offsetof(struct __sk_buff, field))); \
		__v;                                                                       \
	})

static __always_inline void *ctx_data(const struct sluice_ctx *ctx)
{
	return (void *)(long)SLUICE_CTX_LOAD_U32(ctx, data);
}

static __always_inline void *ctx_data_end(const struct sluice_ctx *ctx)
{
	return (void *)(long)SLUICE_CTX_LOAD_U32(ctx, data_end);
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

/* Packet access goes straight to the linear data when [off, off + len) lies inside it (one
 * bounds check, no helper call: helper calls are the dominant per-packet cost), and through the
 * skb helpers otherwise. Offsets past SLUICE_CTX_DIRECT_MAX always take the helper, which keeps
 * the variable offset bounded for the verifier. */
#define SLUICE_CTX_DIRECT_MAX 0x3ff

/* A pointer to len bytes of linear packet data at off, or NULL. */
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

/* Makes the first len bytes linear (when the packet has that many) so that headers are read and
 * written directly; a no-op, without a helper call, when they already are. Best effort: what
 * stays non-linear goes through the helpers. Invalidates packet pointers. */
static __always_inline void ctx_pull(struct sluice_ctx *ctx, __u32 len)
{
	if (len <= ctx->len && ctx_data(ctx) + len > ctx_data_end(ctx))
		bpf_skb_pull_data(ctx, len);
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
	void *p = ctx_direct(ctx, off, len);

	if (p) {
		__builtin_memcpy(to, p, len);
		return 0;
	}
	return bpf_skb_load_bytes(ctx, off, to, len);
}

/* Like bpf_skb_store_bytes with flags 0: skb->csum (CHECKSUM_COMPLETE) is not updated, which is
 * right for fields whose checksum is rewritten with them. */
static __always_inline int ctx_store_bytes(struct sluice_ctx *ctx, __u32 off, const void *from,
					   __u32 len)
{
	void *p = ctx_direct(ctx, off, len);

	if (p) {
		__builtin_memcpy(p, from, len);
		return 0;
	}
	return bpf_skb_store_bytes(ctx, off, from, len, 0);
}

/* Incremental checksum updates (RFC 1624) of the 16-bit checksum at off; flags as for
 * bpf_l3_csum_replace / bpf_l4_csum_replace (the size of the field, BPF_F_PSEUDO_HDR,
 * BPF_F_MARK_MANGLED_0).
 * The IPv4 header checksum does not depend on the skb's checksum state (the kernel helper only
 * rewrites the field), so it is updated inline when the field is linear. */
static __always_inline int ctx_l3_csum_replace(struct sluice_ctx *ctx, __u32 off, __u64 from,
					       __u64 to, __u64 flags)
{
	__u32 size = flags & BPF_F_HDR_FIELD_MASK;
	__u16 *field = ctx_direct(ctx, off, sizeof(__u16));

	if (field && (size == 2 || size == 4)) {
		*field = ctx_csum_update(*field, (__u32)from, (__u32)to, size);
		return 0;
	}
	return bpf_l3_csum_replace(ctx, off, from, to, flags);
}

/* Both TC builds have their own ctx_l4_csum_replace_addr_port (lib/csum.h has the plain one). */
#define SLUICE_CTX_L4_CSUM_ADDR_PORT 1

#ifndef SLUICE_NO_KERN_CTX
/* L4 checksums: the kernel's skb is read (bpf_cast_to_kern_ctx, Linux 6.2 with BTF) for its
 * checksum state, and updates are computed inline. The loader loads the same programs built
 * with SLUICE_NO_KERN_CTX where the kernel lacks that kfunc: they update L4 checksums through
 * bpf_l4_csum_replace (below the #else). */

/* The kernel's struct sk_buff, as far as Sluice reads it: the field is found by name in the
 * running kernel's BTF (CO-RE), so its place in the struct does not matter here. */
struct sk_buff___sluice {
	__u8 ip_summed : 2;
} __attribute__((preserve_access_index));

/* The kernel's skb behind a program's context: a register move once verified. */
extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

/* skb->ip_summed (include/linux/skbuff.h). */
#define SLUICE_CHECKSUM_NONE 0
#define SLUICE_CHECKSUM_UNNECESSARY 1
#define SLUICE_CHECKSUM_COMPLETE 2
#define SLUICE_CHECKSUM_PARTIAL 3

static __always_inline __u32 ctx_ip_summed(struct sluice_ctx *ctx)
{
	struct sk_buff___sluice *skb = bpf_cast_to_kern_ctx(ctx);

	return BPF_CORE_READ_BITFIELD(skb, ip_summed);
}

/* The L4 checksum through bpf_l4_csum_replace, for ctx_l4_csum_nat: a pseudo header address
 * changing from `addrs >> 32` to `(__u32)addrs` and a covered 16-bit field from
 * `ports & 0xffff` to `ports >> 16`, each skipped when unchanged. mangled: BPF_F_MARK_MANGLED_0
 * or 0. A global function, verified once per program (with its arguments unknown) and not at
 * every call site. Returns 0 or -1. */
__attribute__((noinline)) int sluice_skb_l4_csum_helper(struct __sk_buff *ctx, __u32 off,
							 __u64 addrs, __u32 ports, __u32 mangled)
{
	__u32 from_addr = addrs >> 32, to_addr = (__u32)addrs;
	__u32 from_port = ports & 0xffff, to_port = ports >> 16;

	mangled &= BPF_F_MARK_MANGLED_0;
	if (from_addr != to_addr &&
	    bpf_l4_csum_replace(ctx, off, from_addr, to_addr,
				BPF_F_PSEUDO_HDR | sizeof(__be32) | mangled))
		return -1;
	if (from_port != to_port &&
	    bpf_l4_csum_replace(ctx, off, from_port, to_port, sizeof(__be16) | mangled))
		return -1;
	return 0;
}

/* The L4 checksum update of a NAT rewrite: a pseudo header address changing from `from_addr` to
 * `to_addr` and a 16-bit field the checksum covers (a port, an ICMP echo id or type) from
 * `from_port` to `to_port`; with_addr / with_port (constants at each call site) say which of them
 * change. It depends on the skb's checksum state, read from the kernel's skb:
 * - CHECKSUM_PARTIAL: the field holds the pseudo header sum, which the device completes; the
 *   address change moves it the other way round (+d), the covered field's change does not move it;
 * - CHECKSUM_NONE and CHECKSUM_UNNECESSARY: the field is the checksum, updated by RFC 1624 for
 *   both changes at once;
 * - CHECKSUM_COMPLETE: skb->csum must move with the address change, which only
 *   bpf_l4_csum_replace can write (sluice_skb_l4_csum_helper); so does a field outside the
 *   linear data.
 * The first two are one computation without branches: the verifier, which cannot know the state,
 * follows one path through it instead of one per state at every call site (with branches, the
 * programs took ~120k more verified instructions than their SLUICE_NO_KERN_CTX build). It stays
 * inline: a call costs a `ret`, ~12 ns per packet where the CPU needs Safe RET (AMD, SRSO).
 * UDP (BPF_F_MARK_MANGLED_0): a zero field means "no checksum" and stays 0, a checksum computed
 * as 0 is sent as 0xffff. Packet pointers are invalid afterwards. Returns 0 or -1. */
static __always_inline int ctx_l4_csum_nat(struct sluice_ctx *ctx, __u32 off, __u32 from_addr,
					   __u32 to_addr, __u32 from_port, __u32 to_port,
					   __u32 mangled, int with_addr, int with_port)
{
	__u16 *field = ctx_direct(ctx, off, sizeof(__u16));
	__u32 summed = ctx_ip_summed(ctx);
	__u32 partial, sum, out, in, keep;

	if (!field || summed == SLUICE_CHECKSUM_COMPLETE)
		return sluice_skb_l4_csum_helper(
			ctx, off, with_addr ? ((__u64)from_addr << 32) | to_addr : 0,
			with_port ? (from_port & 0xffff) | (to_port << 16) : 0, mangled);
	/* summed is NONE (0), UNNECESSARY (1) or PARTIAL (3): all ones under PARTIAL, else 0. */
	partial = -(summed >> 1);
	barrier_var(partial); /* else clang turns the masks below back into branches */
	in = *field;
	/* NONE: ~(~field + d_addr + d_port). PARTIAL: field + d_addr (the pseudo header sum). */
	sum = in ^ (~partial & 0xffff);
	if (with_addr)
		sum += ctx_csum_words(from_addr, to_addr, sizeof(__be32));
	if (with_port)
		sum += ctx_csum_words(from_port, to_port, sizeof(__be16)) & ~partial;
	out = ctx_csum_fold(sum) ^ (partial & 0xffff);
	/* BPF_F_MARK_MANGLED_0 (UDP): a field of 0 (no checksum) stays 0, a computed 0 is 0xffff. */
	mangled = -((mangled / BPF_F_MARK_MANGLED_0) & 1);
	keep = -((in - 1) >> 31) & mangled; /* all ones when the field was 0 */
	barrier_var(keep);
	out |= -((out - 1) >> 31) & mangled & 0xffff;
	*field = out & ~keep;
	return 0;
}

/* As bpf_l4_csum_replace, for the fields Sluice rewrites: a pseudo header address
 * (BPF_F_PSEUDO_HDR | 4) or a 16-bit field the checksum covers (2, without BPF_F_PSEUDO_HDR). */
static __always_inline int ctx_l4_csum_replace(struct sluice_ctx *ctx, __u32 off, __u64 from,
					       __u64 to, __u64 flags)
{
	__u32 size = flags & BPF_F_HDR_FIELD_MASK;
	__u32 mangled = flags & BPF_F_MARK_MANGLED_0;

	if (size == 4 && (flags & BPF_F_PSEUDO_HDR))
		return ctx_l4_csum_nat(ctx, off, from, to, 0, 0, mangled, 1, 0);
	if (size == 2 && !(flags & BPF_F_PSEUDO_HDR))
		return ctx_l4_csum_nat(ctx, off, 0, 0, from, to, mangled, 0, 1);
	return bpf_l4_csum_replace(ctx, off, from, to, flags);
}

/* One update for both changes. */
static __always_inline int ctx_l4_csum_replace_addr_port(struct sluice_ctx *ctx, __u32 off,
							 __be32 from_addr, __be32 to_addr,
							 __be16 from_port, __be16 to_port,
							 __u64 flags)
{
	return ctx_l4_csum_nat(ctx, off, from_addr, to_addr, from_port, to_port,
			       flags & BPF_F_MARK_MANGLED_0, 1, 1);
}

#else /* SLUICE_NO_KERN_CTX */

/* The L4 checksum does depend on it (CHECKSUM_PARTIAL holds only the pseudo header sum and takes
 * pseudo header changes the other way round, CHECKSUM_COMPLETE needs skb->csum kept right for
 * pseudo header changes), which a program cannot read: the helper decides. */
static __always_inline int ctx_l4_csum_replace(struct sluice_ctx *ctx, __u32 off, __u64 from,
					       __u64 to, __u64 flags)
{
	return bpf_l4_csum_replace(ctx, off, from, to, flags);
}

/* The L4 checksum update for a pseudo header address and a port that change together (DNAT,
 * reverse NAT, masquerade) in one helper call instead of two. The helper is told the address
 * change, and how it moved the field tells the skb's checksum state: CHECKSUM_PARTIAL moves the
 * pseudo header sum by +d, every other state moves the checksum by -d. The port is then applied
 * as that state needs: not at all under CHECKSUM_PARTIAL (the device sums the data itself), by
 * RFC 1624 otherwise (the port and the checksum change together, so skb->csum stays right).
 * When the outcomes cannot be told apart (d is 0 in one's complement, UDP's "no checksum", a
 * field outside the linear data) the port goes through the helper too. flags: the address's
 * flags for bpf_l4_csum_replace (BPF_F_PSEUDO_HDR | 4, BPF_F_MARK_MANGLED_0). */
static __always_inline int ctx_l4_csum_replace_addr_port(struct sluice_ctx *ctx, __u32 off,
							 __be32 from_addr, __be32 to_addr,
							 __be16 from_port, __be16 to_port,
							 __u64 flags)
{
	__u64 port_flags = sizeof(__be16) | (flags & BPF_F_MARK_MANGLED_0);
	__u16 *field = ctx_direct(ctx, off, sizeof(__u16));
	__u16 before, after, full, partial;
	__u32 words;

	if (!field) {
		if (bpf_l4_csum_replace(ctx, off, from_addr, to_addr, flags))
			return -1;
		return from_port == to_port ? 0 :
					      bpf_l4_csum_replace(ctx, off, from_port, to_port,
								  port_flags);
	}
	before = *field;
	if (bpf_l4_csum_replace(ctx, off, from_addr, to_addr, flags))
		return -1;
	if (from_port == to_port)
		return 0;
	field = ctx_direct(ctx, off, sizeof(__u16)); /* the helper invalidated packet pointers */
	if (!field)
		return bpf_l4_csum_replace(ctx, off, from_port, to_port, port_flags);
	after = *field;
	words = ctx_csum_words(from_addr, to_addr, sizeof(__be32));
	full = ctx_csum_fold((__u16)~before + words); /* csum_replace4 */
	partial = (__u16)~ctx_csum_fold(before + words); /* the pseudo header sum moved */
	if (full == partial || ((flags & BPF_F_MARK_MANGLED_0) && (before == 0 || full == 0)))
		return bpf_l4_csum_replace(ctx, off, from_port, to_port, port_flags);
	if (after == partial)
		return 0;
	if (after != full)
		return bpf_l4_csum_replace(ctx, off, from_port, to_port, port_flags);
	after = ctx_csum_update(after, from_port, to_port, sizeof(__be16));
	if ((flags & BPF_F_MARK_MANGLED_0) && after == 0)
		after = 0xffff;
	*field = after;
	return 0;
}

#endif /* SLUICE_NO_KERN_CTX */

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

/* skb->mark, for a note from one of Sluice's TC programs to another (maps/node.h). */
static __always_inline void ctx_set_mark(struct sluice_ctx *ctx, __u32 mark)
{
	ctx->mark = mark;
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
