/* TC hooks of the node's native device. Egress (sluice_to_net): pod traffic leaving the node is
 * masqueraded to the node's address; in tunnel mode, the node's own traffic to other nodes' pods
 * is sent through the tunnel. Ingress (sluice_from_net): NodePorts, ExternalIPs and
 * LoadBalancer IPs are balanced (a remote backend gets the packet masqueraded and routed by the
 * FIB), traffic for a pod here is delivered into it (a remote backend's reply gets its frontend
 * back first), replies to masqueraded flows are translated back (for a NodePort flow also back
 * from the frontend, out to the client); all of them are delivered to the pod with
 * bpf_redirect_peer or routed. The node's own traffic passes untouched. The paths are in
 * lib/netdev.h. */
#include "lib/ctx/skb.h"
#include "lib/netdev.h"
#include "lib/netdev_stages.h"

SEC("tc")
int sluice_to_net(struct __sk_buff *skb)
{
	struct pkt4 pkt;
	__be16 h_proto;

	/* Routed out here by Sluice's own programs (maps/node.h): decided already. */
	if (skb->mark == SLUICE_SKB_MARK_ROUTED) {
		skb->mark = 0;
		return forwarded(skb, SLUICE_FWD_NET_EGRESS, TC_ACT_OK);
	}
	if (parse_eth_ip4(skb, &h_proto, &pkt) < 0)
		return forwarded(skb, SLUICE_FWD_NET_EGRESS, TC_ACT_OK);
	return verdict_or_drop(skb, netdev_to_net(skb, &pkt), SLUICE_FWD_NET_EGRESS);
}

SEC("tc")
int sluice_from_net(struct __sk_buff *skb)
{
	struct pkt4 pkt;
	__be16 h_proto;

	if (parse_eth_ip4(skb, &h_proto, &pkt) < 0)
		return forwarded(skb, SLUICE_FWD_NET_INGRESS, TC_ACT_OK);
	return verdict_or_drop(skb, netdev_from_net(skb, &pkt, &sluice_net_stages), SLUICE_FWD_NET_INGRESS);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
