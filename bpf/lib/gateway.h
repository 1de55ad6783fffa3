/* The pods' gateway address (the first address of the pod CIDR) lives on no device: ARP for it
 * is answered by lib/arp.h, an ICMP echo request to it is answered here, and nothing else a pod
 * sends to it may go further (the node would forward it upstream with the pod's source). */
#ifndef SLUICE_BPF_GATEWAY_H
#define SLUICE_BPF_GATEWAY_H

#include "lib/common.h"
#include "lib/drop.h"
#include "lib/parse.h"

/* Turns a pod's echo request to its gateway into the reply, in place, and sends it back into the
 * pod (src: the pod's endpoint, whose host MAC is the gateway's). Swapping the addresses keeps the
 * IPv4 checksum; only the ICMP type and checksum change. Returns a TC verdict or minus a drop
 * reason. */
static __always_inline int gateway_echo_reply(struct sluice_ctx *ctx, const struct pkt4 *pkt,
					      const struct sluice_endpoint *src)
{
	__be32 addrs[2] = { pkt->daddr, pkt->saddr };
	__u8 macs[12];
	__u8 type = ICMP_ECHOREPLY;

	__builtin_memcpy(macs, src->mac, 6);
	__builtin_memcpy(macs + 6, src->host_mac, 6);
	if (ctx_l4_csum_replace(ctx, pkt->l4_off + offsetof(struct icmphdr, checksum),
				bpf_htons(ICMP_ECHO << 8), bpf_htons(ICMP_ECHOREPLY << 8),
				2))
		return -SLUICE_DROP_PACKET_WRITE;
	if (ctx_store_bytes(ctx, pkt->l4_off, &type, 1) ||
	    ctx_store_bytes(ctx, pkt->l3_off + offsetof(struct iphdr, saddr), addrs, sizeof(addrs)) ||
	    ctx_store_bytes(ctx, 0, macs, sizeof(macs)))
		return -SLUICE_DROP_PACKET_WRITE;
	return ctx_redirect(ctx_ifindex(ctx));
}

/* Whether a pod's packet is an echo request a gateway answers (whole: a fragmented request is
 * not reassembled). Other packets to the gateway are the replies of hairpinned flows, which the
 * reverse NAT translates, or dropped (SLUICE_DROP_TO_GATEWAY). */
static __always_inline int gateway_is_echo_request(const struct pkt4 *pkt)
{
	return pkt->proto == IPPROTO_ICMP && (pkt->flags & PKT4_F_ICMP) &&
	       !(pkt->flags & PKT4_F_FRAGMENT) && pkt->icmp_type == ICMP_ECHO;
}

#endif
