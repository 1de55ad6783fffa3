/* TC ingress of the node's collect_md VXLAN device (sluice_from_overlay, docs/routing.md): what
 * other nodes sent through the tunnel, decapsulated. It takes the native device's ingress paths
 * (a NodePort reached through another node's pod, a remote backend's reply to a pod here, a
 * reply to a masqueraded flow), and a packet for a pod here is delivered through its ingress
 * policy with bpf_redirect_peer. The rest (the node's own traffic) enters the node's stack. The
 * VNI is not looked at: the source identity comes from the ipcache. */
#include "lib/ctx/skb.h"
#include "lib/netdev.h"
#include "lib/netdev_stages.h"

#define SLUICE_PACKET_HOST 0

SEC("tc")
int sluice_from_overlay(struct __sk_buff *skb)
{
	struct pkt4 pkt;
	__be16 h_proto;

	/* The inner frame is addressed to the sending pod's gateway MAC, not to this device, so
	 * the device took it for another host's; the stack (this node's or, after
	 * bpf_redirect_peer, the pod's) drops such frames. */
	bpf_skb_change_type(skb, SLUICE_PACKET_HOST);
	if (parse_eth_ip4(skb, &h_proto, &pkt) < 0)
		return forwarded(skb, SLUICE_FWD_NET_INGRESS, TC_ACT_OK);
	return verdict_or_drop(skb, netdev_from_net(skb, &pkt, &sluice_net_stages), SLUICE_FWD_NET_INGRESS);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
