/* TC ingress of a pod's host-side veth: everything a pod sends enters Sluice here.
 * ARP is answered for the gateway, services are load balanced (and their replies reverse
 * translated), same-node pods are reached with bpf_redirect_peer, and the
 * rest (the node itself, other nodes, the outside) continues into the node's stack. */
#include "lib/arp.h"
#include "lib/fwd.h"
#include "lib/lb.h"

/* Returns a TC verdict or minus a drop reason. */
static __always_inline int from_pod(struct __sk_buff *skb)
{
	const struct sluice_endpoint *src, *dst;
	const struct sluice_node_config *cfg;
	struct ethhdr *eth;
	struct ct4_pkt p;
	struct iphdr *ip;
	__u8 ttl, proto;
	int lb;

	eth = SKB_HDR(skb, 0, struct ethhdr);
	if (!eth)
		return -SLUICE_DROP_INVALID_PACKET;
	if (eth->h_proto == bpf_htons(ETH_P_ARP))
		return pod_arp(skb);
	if (eth->h_proto != bpf_htons(ETH_P_IP))
		return -SLUICE_DROP_UNSUPPORTED_L3;

	ip = SKB_HDR(skb, ETH_HLEN_, struct iphdr);
	if (!ip || ip->version != 4 || ip->ihl < 5)
		return -SLUICE_DROP_INVALID_PACKET;

	/* A pod may only send from the address Sluice gave it, on the interface it was given. */
	src = lookup_ep4(ip->saddr);
	if (!src || src->ifindex != skb->ifindex)
		return -SLUICE_DROP_SPOOFED_SOURCE;

	/* Services: DNAT to a backend, or a backend's reply back from its frontend. A local pod
	 * is never a frontend, so traffic to one only needs the reply check. The translation
	 * rewrites the packet, so the header is read again afterwards. */
	dst = lookup_ep4(ip->daddr);
	cfg = node_config();
	lb = LB4_NONE;
	if (ct4_load(skb, ETH_HLEN_, ip, &p) == CT4_TUPLE) {
		lb = dst ? lb4_rev_nat(skb, ETH_HLEN_, &p) : lb4_from_pod(skb, ETH_HLEN_, &p, cfg);
		if (lb < 0)
			return lb;
		if (lb == LB4_REJECT)
			return reject(skb, ETH_HLEN_, ip);
	}
	ip = SKB_HDR(skb, ETH_HLEN_, struct iphdr);
	if (!ip)
		return -SLUICE_DROP_INVALID_PACKET;
	ttl = ip->ttl;
	proto = ip->protocol;

	if (lb != LB4_NONE)
		dst = lookup_ep4(ip->daddr);
	if (dst)
		return redirect_to_endpoint(skb, dst, ETH_HLEN_, ttl, proto);
	/* A reply now comes from a frontend, possibly this node's own address (NodePort), which
	 * the stack would refuse as a martian source: route it here. */
	if (lb == LB4_REVNAT)
		return redirect_by_fib(skb, ETH_HLEN_);
	return TC_ACT_OK;
}

SEC("tc")
int sluice_from_pod(struct __sk_buff *skb)
{
	return verdict_or_drop(skb, from_pod(skb));
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
