/* Header rewrites that keep checksums right: IPv4 addresses (IP header and the L4 pseudo
 * header), L4 ports / ICMP echo ids, and TTL. Each returns 0 or -SLUICE_DROP_PACKET_WRITE.
 * Writes and checksums go straight to the linear packet where they can (ctx layer); the L4
 * checksum of a pseudo header change takes a helper call where the skb's checksum state is
 * CHECKSUM_COMPLETE or unknown (ctx/skb.h). Callers re-derive packet pointers afterwards: the
 * helpers invalidate them. */
#ifndef SLUICE_BPF_CSUM_H
#define SLUICE_BPF_CSUM_H

#include "lib/parse.h"

/* Where an L4 header keeps its checksum and how it must be updated. */
struct l4_csum {
	__u32 off;         /* packet offset of the checksum field */
	__u64 flags;       /* BPF_F_MARK_MANGLED_0 for UDP: a zero checksum means "none" */
	__u8 pseudo;       /* covers the IPv4 pseudo header (TCP, UDP; not ICMP) */
	__u8 absent;       /* a later fragment: no L4 header, only the IPv4 header is rewritten */
};

/* Returns 0, or -SLUICE_DROP_INVALID_PACKET for a protocol whose checksum Sluice never rewrites.
 * pkt_flags: the packet's enum pkt4_flags (PKT4_F_NO_L4: there is no L4 header to rewrite; the
 * first fragment's checksum covers the whole datagram and was updated there). */
static __always_inline int l4_csum_init(struct l4_csum *c, __u8 proto, __u32 l4_off, __u8 pkt_flags)
{
	c->absent = 0;
	if (pkt_flags & PKT4_F_NO_L4) {
		c->off = 0;
		c->flags = 0;
		c->pseudo = 0;
		c->absent = 1;
		return 0;
	}
	switch (proto) {
	case IPPROTO_TCP:
		c->off = l4_off + offsetof(struct tcphdr, check);
		c->flags = 0;
		c->pseudo = 1;
		return 0;
	case IPPROTO_UDP:
		c->off = l4_off + offsetof(struct udphdr, check);
		c->flags = BPF_F_MARK_MANGLED_0;
		c->pseudo = 1;
		return 0;
	case IPPROTO_ICMP:
		c->off = l4_off + offsetof(struct icmphdr, checksum);
		c->flags = 0;
		c->pseudo = 0;
		return 0;
	}
	return -SLUICE_DROP_INVALID_PACKET;
}

/* Rewrites the IPv4 source (field = offsetof(struct iphdr, saddr)) or destination address. */
static __always_inline int rewrite_ip4_addr(struct sluice_ctx *ctx, __u32 l3_off, __u32 field,
					    __be32 old_addr, __be32 new_addr,
					    const struct l4_csum *l4)
{
	if (l4->pseudo &&
	    ctx_l4_csum_replace(ctx, l4->off, old_addr, new_addr,
				BPF_F_PSEUDO_HDR | sizeof(new_addr) | l4->flags))
		return -SLUICE_DROP_PACKET_WRITE;
	if (ctx_l3_csum_replace(ctx, l3_off + offsetof(struct iphdr, check), old_addr, new_addr,
				sizeof(new_addr)))
		return -SLUICE_DROP_PACKET_WRITE;
	if (ctx_store_bytes(ctx, l3_off + field, &new_addr, sizeof(new_addr)))
		return -SLUICE_DROP_PACKET_WRITE;
	return 0;
}

/* Rewrites a 16-bit L4 field that the L4 checksum covers: a TCP/UDP port or an ICMP echo id. */
static __always_inline int rewrite_l4_port(struct sluice_ctx *ctx, __u32 field_off,
					   __be16 old_port, __be16 new_port,
					   const struct l4_csum *l4)
{
	if (l4->absent)
		return 0;
	if (ctx_l4_csum_replace(ctx, l4->off, old_port, new_port, sizeof(new_port) | l4->flags))
		return -SLUICE_DROP_PACKET_WRITE;
	if (ctx_store_bytes(ctx, field_off, &new_port, sizeof(new_port)))
		return -SLUICE_DROP_PACKET_WRITE;
	return 0;
}

#ifndef SLUICE_CTX_L4_CSUM_ADDR_PORT
/* The L4 checksum update for a pseudo header address and a port that change together (DNAT,
 * reverse NAT, masquerade): two updates, each inline where the ctx layer can (XDP, TC reading the
 * skb's checksum state). The TC build without the kernel's skb has its own, which tells the
 * checksum state from one helper call (ctx/skb.h). flags: the address's flags for
 * bpf_l4_csum_replace (BPF_F_PSEUDO_HDR | 4, BPF_F_MARK_MANGLED_0). */
static __always_inline int ctx_l4_csum_replace_addr_port(struct sluice_ctx *ctx, __u32 off,
							 __be32 from_addr, __be32 to_addr,
							 __be16 from_port, __be16 to_port,
							 __u64 flags)
{
	if (ctx_l4_csum_replace(ctx, off, from_addr, to_addr, flags))
		return -1;
	if (from_port == to_port)
		return 0;
	return ctx_l4_csum_replace(ctx, off, from_port, to_port,
				   sizeof(__be16) | (flags & BPF_F_MARK_MANGLED_0));
}
#endif

/* Rewrites an IPv4 address (field as for rewrite_ip4_addr) and the L4 port at port_off that
 * changes with it (DNAT: daddr and dport; reverse NAT, masquerade: saddr and sport), with one
 * L4 checksum helper call where rewrite_ip4_addr + rewrite_l4_port take two. */
static __always_inline int rewrite_ip4_addr_port(struct sluice_ctx *ctx, __u32 l3_off, __u32 field,
						 __be32 old_addr, __be32 new_addr, __u32 port_off,
						 __be16 old_port, __be16 new_port,
						 const struct l4_csum *l4)
{
	if (!l4->pseudo)
		return rewrite_ip4_addr(ctx, l3_off, field, old_addr, new_addr, l4) ?:
		       rewrite_l4_port(ctx, port_off, old_port, new_port, l4);
	if (ctx_l4_csum_replace_addr_port(ctx, l4->off, old_addr, new_addr, old_port, new_port,
					  BPF_F_PSEUDO_HDR | sizeof(new_addr) | l4->flags))
		return -SLUICE_DROP_PACKET_WRITE;
	if (ctx_l3_csum_replace(ctx, l3_off + offsetof(struct iphdr, check), old_addr, new_addr,
				sizeof(new_addr)))
		return -SLUICE_DROP_PACKET_WRITE;
	if (ctx_store_bytes(ctx, l3_off + field, &new_addr, sizeof(new_addr)))
		return -SLUICE_DROP_PACKET_WRITE;
	if (old_port != new_port && ctx_store_bytes(ctx, port_off, &new_port, sizeof(new_port)))
		return -SLUICE_DROP_PACKET_WRITE;
	return 0;
}

/* Decrements TTL as a router does (and in pkt). Returns 0, -SLUICE_DROP_TTL_EXCEEDED when the
 * TTL ran out, or -SLUICE_DROP_PACKET_WRITE. */
static __always_inline int ip4_dec_ttl(struct sluice_ctx *ctx, struct pkt4 *pkt)
{
	struct {
		__u8 ttl;
		__u8 proto;
		__u16 check;
	} *h;

	if (pkt->ttl <= 1)
		return -SLUICE_DROP_TTL_EXCEEDED;
	/* TTL, protocol and checksum are adjacent, and linear: parse_ip4 read the whole IPv4 header
	 * in place, and nothing since made it otherwise. Written through one pointer: the TTL and
	 * protocol word moves by -0x0100, so ~m + m' of RFC 1624 is the constant 0xfeff (m is at
	 * least 0x0200 with a TTL of 2 or more), the checksum ctx_csum_update would compute, bit for
	 * bit. (Through the ctx layer's checksum replace and store, which take a helper where the
	 * bytes are not linear, it cost ~4 ns more per forwarded packet.) */
	h = ctx_direct(ctx, pkt->l3_off + offsetof(struct iphdr, ttl), sizeof(*h));
	if (!h)
		return -SLUICE_DROP_PACKET_WRITE;
	h->check = ctx_csum_fold((__u16)~h->check + bpf_htons(0xfeff));
	h->ttl = pkt->ttl - 1;
	pkt->ttl = h->ttl;
	return 0;
}

#endif
