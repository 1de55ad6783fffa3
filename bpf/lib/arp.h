/* ARP for pods: the host side of each pod's veth answers every ARP request the pod makes
 * (its gateway and anything else) with the host-side MAC, so pods need no per-node L2 setup. */
#ifndef SLUICE_BPF_ARP_H
#define SLUICE_BPF_ARP_H

#include "lib/drop.h"

/* The IPv4-over-Ethernet ARP body; addresses are unaligned on the wire. */
struct arp_ip4 {
	__be16 htype;
	__be16 ptype;
	__u8 hlen;
	__u8 plen;
	__be16 op;
	__u8 sha[ETH_ALEN];
	__u8 sip[4];
	__u8 tha[ETH_ALEN];
	__u8 tip[4];
} __attribute__((packed));

/* Returns a TC verdict or minus a drop reason. */
static __always_inline int pod_arp(struct sluice_ctx *ctx)
{
	struct arp_ip4 *arp = CTX_HDR(ctx, ETH_HLEN_, struct arp_ip4);
	const struct sluice_endpoint *ep;
	struct ethhdr reply_eth;
	struct arp_ip4 reply;
	__be32 sip, tip;

	if (!arp)
		return -SLUICE_DROP_INVALID_PACKET;
	if (arp->htype != bpf_htons(ARPHRD_ETHER) || arp->ptype != bpf_htons(ETH_P_IP) ||
	    arp->hlen != ETH_ALEN || arp->plen != 4)
		return -SLUICE_DROP_ARP_UNSUPPORTED;
	/* Replies (to the node's own requests for the pod) and anything else go to the stack. */
	if (arp->op != bpf_htons(ARPOP_REQUEST))
		return CTX_ACT_OK;

	__builtin_memcpy(&sip, arp->sip, 4);
	__builtin_memcpy(&tip, arp->tip, 4);
	/* Gratuitous ARP and duplicate address detection: nothing to answer. */
	if (tip == sip || sip == 0)
		return CTX_ACT_OK;
	ep = lookup_ep4(sip);
	if (!ep || ep->ifindex != ctx_ifindex(ctx))
		return -SLUICE_DROP_SPOOFED_SOURCE;

	__builtin_memcpy(reply_eth.h_dest, arp->sha, ETH_ALEN);
	__builtin_memcpy(reply_eth.h_source, ep->host_mac, ETH_ALEN);
	reply_eth.h_proto = bpf_htons(ETH_P_ARP);
	reply.htype = arp->htype;
	reply.ptype = arp->ptype;
	reply.hlen = ETH_ALEN;
	reply.plen = 4;
	reply.op = bpf_htons(ARPOP_REPLY);
	__builtin_memcpy(reply.sha, ep->host_mac, ETH_ALEN);
	__builtin_memcpy(reply.sip, arp->tip, 4);
	__builtin_memcpy(reply.tha, arp->sha, ETH_ALEN);
	__builtin_memcpy(reply.tip, arp->sip, 4);

	if (ctx_store_bytes(ctx, 0, &reply_eth, sizeof(reply_eth)) ||
	    ctx_store_bytes(ctx, ETH_HLEN_, &reply, sizeof(reply)))
		return -SLUICE_DROP_PACKET_WRITE;
	/* Back out of the host side: the pod receives the reply. */
	return ctx_redirect(ctx_ifindex(ctx));
}

#endif
