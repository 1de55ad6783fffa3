/* Parsing: a packet's Ethernet, IPv4 and L4 headers are read once into a struct pkt4, which the
 * rest of lib/ works from; the helpers that rewrite the packet keep it true to the packet. A
 * fragmented datagram's later fragments get the L4 fields of its first fragment from sluice_frag4
 * (maps/frag.h), so that every path treats them as the first one (rewriting only their IPv4
 * header). */
#ifndef SLUICE_BPF_PARSE_H
#define SLUICE_BPF_PARSE_H

#include "lib/maps.h"

enum pkt4_flags {
	PKT4_F_FRAGMENT = 1 << 0,  /* a fragment (MF or an offset): only the first has L4 headers */
	PKT4_F_PORTS = 1 << 1,     /* TCP/UDP/SCTP: sport and dport were read (SCTP's common header
				      starts with them too; only policy reads SCTP ports) */
	PKT4_F_TCP_FLAGS = 1 << 2, /* TCP: tcp_flags was read too */
	PKT4_F_ICMP = 1 << 3,      /* ICMP: icmp_type and icmp_id were read */
	PKT4_F_NO_L4 = 1 << 4,     /* a later fragment: no L4 header in this packet; the L4 fields
				      (PKT4_F_PORTS / PKT4_F_ICMP) are its first fragment's, from
				      sluice_frag4, when that was seen here; never rewrite L4 */
};

/* The header fields Sluice decides on. Addresses and ports in network order. */
struct pkt4 {
	__u32 l3_off;
	__u32 l4_off;
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__be16 icmp_id;   /* ICMP echo: the identifier */
	__u16 tot_len;    /* host order */
	__u8 proto;
	__u8 ttl;
	__u8 tos;
	__u8 ihl;
	__u8 tcp_flags;   /* TCP: the flags byte (FIN 0x01, SYN 0x02, RST 0x04, ACK 0x10) */
	__u8 icmp_type;
	__u8 flags;       /* enum pkt4_flags */
};

/* A first fragment: its L4 fields, for the datagram's later fragments (an LRU map: a failed
 * write only leaves those to be dropped where they need ports). */
static __always_inline void frag4_remember(const struct sluice_frag4_key *key,
					   const struct pkt4 *pkt)
{
	struct sluice_frag4_entry e = {
		.sport = pkt->sport,
		.dport = pkt->dport,
		.icmp_id = pkt->icmp_id,
		.icmp_type = pkt->icmp_type,
		.flags = (pkt->flags & PKT4_F_PORTS ? SLUICE_FRAG4_F_PORTS : 0) |
			 (pkt->flags & PKT4_F_ICMP ? SLUICE_FRAG4_F_ICMP : 0),
	};

	if (e.flags)
		bpf_map_update_elem(&sluice_frag4, key, &e, BPF_ANY);
}

/* A later fragment: PKT4_F_NO_L4, and its first fragment's L4 fields when that passed here (TCP
 * with no flags: a later fragment opens or closes nothing). Returns 0. */
static __always_inline int frag4_recall(const struct sluice_frag4_key *key, struct pkt4 *pkt)
{
	const struct sluice_frag4_entry *e = bpf_map_lookup_elem(&sluice_frag4, key);

	pkt->flags |= PKT4_F_NO_L4;
	if (!e)
		return 0;
	if (e->flags & SLUICE_FRAG4_F_PORTS) {
		pkt->sport = e->sport;
		pkt->dport = e->dport;
		pkt->flags |= PKT4_F_PORTS;
		if (pkt->proto == IPPROTO_TCP)
			pkt->flags |= PKT4_F_TCP_FLAGS;
	}
	if (e->flags & SLUICE_FRAG4_F_ICMP) {
		pkt->icmp_id = e->icmp_id;
		pkt->icmp_type = e->icmp_type;
		pkt->flags |= PKT4_F_ICMP;
	}
	return 0;
}

/* Reads the IPv4 header at l3_off and what Sluice needs of the L4 header. Returns 0, or
 * -SLUICE_DROP_INVALID_PACKET when the IPv4 header is not all there or not IPv4. A truncated L4
 * header is no error: its flag stays clear. */
static __always_inline int parse_ip4(struct sluice_ctx *ctx, __u32 l3_off, struct pkt4 *pkt)
{
	struct iphdr *ip;
	__be16 ports[2];
	struct sluice_frag4_key frag;
	struct icmphdr icmp;

	ctx_pull(ctx, l3_off + sizeof(struct iphdr));
	ip = CTX_HDR(ctx, l3_off, struct iphdr);
	if (!ip || ip->version != 4 || ip->ihl < 5)
		return -SLUICE_DROP_INVALID_PACKET;
	pkt->l3_off = l3_off;
	pkt->l4_off = l3_off + ((__u32)ip->ihl << 2);
	pkt->saddr = ip->saddr;
	pkt->daddr = ip->daddr;
	pkt->sport = 0;
	pkt->dport = 0;
	pkt->icmp_id = 0;
	pkt->tot_len = bpf_ntohs(ip->tot_len);
	pkt->proto = ip->protocol;
	pkt->ttl = ip->ttl;
	pkt->tos = ip->tos;
	pkt->ihl = ip->ihl;
	pkt->tcp_flags = 0;
	pkt->icmp_type = 0;
	pkt->flags = 0;
	if (ip->frag_off & bpf_htons(IP_MF | IP_OFFSET)) {
		frag.saddr = ip->saddr;
		frag.daddr = ip->daddr;
		frag.id = ip->id;
		frag.proto = ip->protocol;
		frag.pad = 0;
		pkt->flags = PKT4_F_FRAGMENT;
		if (ip->frag_off & bpf_htons(IP_OFFSET))
			return frag4_recall(&frag, pkt);
	}

	/* The L4 header linear too, so that it is read and rewritten without helper calls (the IPv4
	 * header above was read in place: ip is not used past this point). */
	switch (pkt->proto) {
	case IPPROTO_TCP:
		ctx_pull(ctx, pkt->l4_off + sizeof(struct tcphdr));
		break;
	case IPPROTO_UDP:
	case IPPROTO_ICMP:
		ctx_pull(ctx, pkt->l4_off + sizeof(struct udphdr));
		break;
	}

	switch (pkt->proto) {
	case IPPROTO_TCP:
	case IPPROTO_UDP:
	case IPPROTO_SCTP:
		if (ctx_load_bytes(ctx, pkt->l4_off, ports, sizeof(ports)))
			break;
		pkt->sport = ports[0];
		pkt->dport = ports[1];
		pkt->flags |= PKT4_F_PORTS;
		if (pkt->proto == IPPROTO_TCP &&
		    !ctx_load_bytes(ctx, pkt->l4_off + 13, &pkt->tcp_flags, sizeof(pkt->tcp_flags)))
			pkt->flags |= PKT4_F_TCP_FLAGS;
		break;
	case IPPROTO_ICMP:
		if (ctx_load_bytes(ctx, pkt->l4_off, &icmp, sizeof(icmp)))
			break;
		pkt->icmp_type = icmp.type;
		pkt->icmp_id = icmp.un.echo.id;
		pkt->flags |= PKT4_F_ICMP;
		break;
	}
	if (pkt->flags & PKT4_F_FRAGMENT)
		frag4_remember(&frag, pkt);
	return 0;
}

/* The Ethernet header at the start of the packet and, for IPv4, parse_ip4 behind it. Returns 0,
 * -SLUICE_DROP_UNSUPPORTED_L3 for another EtherType (h_proto tells which), or
 * -SLUICE_DROP_INVALID_PACKET. */
static __always_inline int parse_eth_ip4(struct sluice_ctx *ctx, __be16 *h_proto, struct pkt4 *pkt)
{
	struct ethhdr *eth = CTX_HDR(ctx, 0, struct ethhdr);

	if (!eth)
		return -SLUICE_DROP_INVALID_PACKET;
	*h_proto = eth->h_proto;
	if (eth->h_proto != bpf_htons(ETH_P_IP))
		return -SLUICE_DROP_UNSUPPORTED_L3;
	return parse_ip4(ctx, ETH_HLEN_, pkt);
}

#endif
