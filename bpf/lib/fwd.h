/* Forwarding to local endpoints: rewrite L2 as the pod's gateway would and hand the packet
 * straight to the pod's interface with bpf_redirect_peer (no bridge, no second stack pass). */
#ifndef SLUICE_BPF_FWD_H
#define SLUICE_BPF_FWD_H

#include "lib/csum.h"
#include "lib/drop.h"

/* l3_off is the IPv4 header offset; ttl and proto are that header's values. */
static __always_inline int redirect_to_endpoint(struct __sk_buff *skb,
						const struct sluice_endpoint *ep, __u32 l3_off,
						__u8 ttl, __u8 proto)
{
	__u8 macs[12];
	int ret;

	ret = ip4_dec_ttl(skb, l3_off, ttl, proto);
	if (ret > 0)
		return drop(skb, SLUICE_DROP_TTL_EXCEEDED);
	if (ret < 0)
		return drop(skb, SLUICE_DROP_CSUM_ERROR);

	/* The pod drops frames not addressed to its MAC; the source is its gateway's MAC. */
	__builtin_memcpy(macs, ep->mac, 6);
	__builtin_memcpy(macs + 6, ep->host_mac, 6);
	if (bpf_skb_store_bytes(skb, 0, macs, sizeof(macs), 0))
		return drop(skb, SLUICE_DROP_CSUM_ERROR);
	return bpf_redirect_peer(ep->ifindex, 0);
}

#endif
