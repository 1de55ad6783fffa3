/* XDP on the node's native device (--lb_acceleration=native): NodePort, ExternalIP and
 * LoadBalancer IP flows to backends on other nodes, and their replies, are translated and sent
 * on here (XDP_TX or a redirect); source-range refusals and unallocated service addresses are
 * dropped here. Every other packet passes, unchanged, to sluice_from_net (TC). The paths are in
 * lib/xdp_nodeport.h. Only what this program sends on is counted (SLUICE_FWD_NET_XDP): what it
 * passes is counted by TC. */
#include "lib/ctx/xdp.h"
#include "lib/xdp_nodeport.h"

SEC("xdp")
int sluice_xdp_net(struct xdp_md *ctx)
{
	struct pkt4 pkt;
	__be16 h_proto;
	int ret;

	if (parse_eth_ip4(ctx, &h_proto, &pkt) < 0)
		return XDP_PASS;
	ret = xdp_from_net(ctx, &pkt);
	if (ret < 0)
		return drop(ctx, -ret, SLUICE_DROP_DIR_INGRESS);
	if (ret == XDP_PASS)
		return XDP_PASS;
	return forwarded(ctx, SLUICE_FWD_NET_XDP, ret);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
