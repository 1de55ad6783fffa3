/* Rejecting a connection attempt the way a host without a listener would: a TCP segment is
 * answered with a RST, anything else (UDP) with an ICMP port unreachable. The packet is turned
 * into its answer in place and sent back out of the interface it came in on, so a client sees
 * "connection refused" at once instead of waiting for a timeout. */
#ifndef SLUICE_BPF_REJECT_H
#define SLUICE_BPF_REJECT_H

#include "lib/csum.h"
#include "lib/drop.h"

#define ICMP_DEST_UNREACH 3
#define ICMP_PORT_UNREACH 3
#define SLUICE_REJECT_TTL 64

static __always_inline __u16 csum_fold32(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/* An IPv4 header of 20 bytes answering a packet from `client` to `server`, with its checksum. */
static __always_inline void reject_ip4_header(struct iphdr *out, __be32 client, __be32 server,
					      __u8 proto, __u16 tot_len)
{
	__builtin_memset(out, 0, sizeof(*out));
	out->version = 4;
	out->ihl = 5;
	out->tot_len = bpf_htons(tot_len);
	out->frag_off = bpf_htons(0x4000); /* DF */
	out->ttl = SLUICE_REJECT_TTL;
	out->protocol = proto;
	out->saddr = server;
	out->daddr = client;
	out->check = csum_fold32(bpf_csum_diff(NULL, 0, (__be32 *)out, sizeof(*out), 0));
}

/* Swaps the Ethernet addresses at the start of the packet. Returns 0 or minus a drop reason. */
static __always_inline int reject_swap_macs(struct sluice_ctx *ctx)
{
	__u8 macs[12], swapped[12];

	if (ctx_load_bytes(ctx, 0, macs, sizeof(macs)))
		return -SLUICE_DROP_SERVICE_REJECTED;
	__builtin_memcpy(swapped, macs + 6, 6);
	__builtin_memcpy(swapped + 6, macs, 6);
	if (ctx_store_bytes(ctx, 0, swapped, sizeof(swapped)))
		return -SLUICE_DROP_PACKET_WRITE;
	return 0;
}

struct reject_tcp_pseudo {
	__be32 saddr;
	__be32 daddr;
	__u8 zero;
	__u8 proto;
	__be16 len;
	struct tcphdr tcp;
};

/* RST for a TCP segment (RFC 9293 3.10.7.1): with ACK, seq = its ack; otherwise seq 0 and it
 * acknowledges everything the segment occupied. Returns 0, or minus a drop reason when no RST can
 * be made (a RST is never answered; IP options are not handled) or writing it failed. */
static __always_inline int reject_tcp(struct sluice_ctx *ctx, const struct pkt4 *pkt)
{
	struct reject_tcp_pseudo ph = {};
	__u32 l3_off = pkt->l3_off;
	__u16 tot_len = pkt->tot_len;
	struct tcphdr th;
	struct iphdr out;
	__u32 seg_len;

	if (pkt->ihl != 5)
		return -SLUICE_DROP_SERVICE_REJECTED;
	if (ctx_load_bytes(ctx, l3_off + sizeof(struct iphdr), &th, sizeof(th)))
		return -SLUICE_DROP_SERVICE_REJECTED;
	if (th.rst || th.doff < 5 || tot_len < sizeof(struct iphdr) + th.doff * 4)
		return -SLUICE_DROP_SERVICE_REJECTED;
	seg_len = tot_len - sizeof(struct iphdr) - th.doff * 4 + th.syn + th.fin;

	ph.tcp.source = th.dest;
	ph.tcp.dest = th.source;
	ph.tcp.doff = 5;
	ph.tcp.rst = 1;
	if (th.ack) {
		ph.tcp.seq = th.ack_seq;
	} else {
		ph.tcp.ack = 1;
		ph.tcp.ack_seq = bpf_htonl(bpf_ntohl(th.seq) + seg_len);
	}
	reject_ip4_header(&out, pkt->saddr, pkt->daddr, IPPROTO_TCP, sizeof(out) + sizeof(ph.tcp));
	ph.saddr = out.saddr;
	ph.daddr = out.daddr;
	ph.proto = IPPROTO_TCP;
	ph.len = bpf_htons(sizeof(ph.tcp));
	ph.tcp.check = csum_fold32(bpf_csum_diff(NULL, 0, (__be32 *)&ph, sizeof(ph), 0));

	if (ctx_change_tail(ctx, l3_off + sizeof(out) + sizeof(ph.tcp)))
		return -SLUICE_DROP_PACKET_WRITE;
	if (ctx_store_bytes(ctx, l3_off, &out, sizeof(out)) ||
	    ctx_store_bytes(ctx, l3_off + sizeof(out), &ph.tcp, sizeof(ph.tcp)))
		return -SLUICE_DROP_PACKET_WRITE;
	return 0;
}

/* What an ICMP error quotes: the offending IP header and the first 8 bytes after it. */
struct reject_icmp_body {
	struct icmphdr icmp;
	struct iphdr quoted_ip;
	__u8 quoted_l4[8];
};

/* An ICMP error about the packet, in place: room for a new IP + ICMP header (type, code, and
 * `rest`, the header's second word) is made in front of the original IP header, which is quoted
 * with 8 bytes of its payload; it comes from `from` and goes to the packet's source. `fail` is the
 * drop reason when the packet cannot be quoted. Returns 0 or minus a drop reason. */
static __always_inline int icmp4_error(struct sluice_ctx *ctx, const struct pkt4 *pkt, __u8 type,
				       __u8 code, __be32 rest, __be32 from, int fail)
{
	const __u32 room = sizeof(struct iphdr) + sizeof(struct icmphdr);
	struct reject_icmp_body body = {};
	__u32 l3_off = pkt->l3_off;
	struct iphdr out;

	if (pkt->ihl != 5)
		return -fail;
	if (ctx_load_bytes(ctx, l3_off, &body.quoted_ip, sizeof(body.quoted_ip) + 8))
		return -fail;
	body.icmp.type = type;
	body.icmp.code = code;
	body.icmp.un.gateway = rest;
	body.icmp.checksum = csum_fold32(bpf_csum_diff(NULL, 0, (__be32 *)&body, sizeof(body), 0));
	reject_ip4_header(&out, body.quoted_ip.saddr, from, IPPROTO_ICMP,
			  sizeof(out) + sizeof(body));

	if (ctx_adjust_room_mac(ctx, room))
		return -SLUICE_DROP_PACKET_WRITE;
	if (ctx_change_tail(ctx, l3_off + sizeof(out) + sizeof(body)))
		return -SLUICE_DROP_PACKET_WRITE;
	if (ctx_store_bytes(ctx, l3_off, &out, sizeof(out)) ||
	    ctx_store_bytes(ctx, l3_off + sizeof(out), &body, sizeof(body)))
		return -SLUICE_DROP_PACKET_WRITE;
	return 0;
}

/* ICMP port unreachable for a UDP datagram, from the address it was sent to. Returns 0 or minus a
 * drop reason. */
static __always_inline int reject_icmp(struct sluice_ctx *ctx, const struct pkt4 *pkt)
{
	return icmp4_error(ctx, pkt, ICMP_DEST_UNREACH, ICMP_PORT_UNREACH, 0, pkt->daddr,
			   SLUICE_DROP_SERVICE_REJECTED);
}

/* Answers the packet (IPv4 at pkt->l3_off, Ethernet before it) in place and sends the answer back
 * out of the interface it arrived on. Counted under SLUICE_DROP_SERVICE_REJECTED: the original
 * packet goes no further. Returns a TC verdict, or minus a drop reason when no answer could be made
 * (SLUICE_DROP_SERVICE_REJECTED; SLUICE_DROP_PACKET_WRITE when writing it failed). `dir` is the
 * calling program's drop direction. */
static __always_inline int reject(struct sluice_ctx *ctx, const struct pkt4 *pkt,
				  enum sluice_drop_dir dir)
{
	int ret;

	/* Only a datagram's first fragment is answered (RFC 1122: no ICMP error for the others). */
	if (pkt->flags & PKT4_F_NO_L4)
		return -SLUICE_DROP_SERVICE_REJECTED;
	if (pkt->proto == IPPROTO_TCP || pkt->proto == IPPROTO_UDP)
		event_drop(ctx, SLUICE_DROP_SERVICE_REJECTED); /* the packet before it is answered */
	if (pkt->proto == IPPROTO_TCP)
		ret = reject_tcp(ctx, pkt);
	else if (pkt->proto == IPPROTO_UDP)
		ret = reject_icmp(ctx, pkt);
	else
		ret = -SLUICE_DROP_SERVICE_REJECTED;
	if (!ret)
		ret = reject_swap_macs(ctx);
	if (ret < 0)
		return ret;
	count_drop(SLUICE_DROP_SERVICE_REJECTED, dir, ctx_len(ctx));
	return ctx_redirect(ctx_ifindex(ctx));
}

#endif
