/* Not attached anywhere: builds lib/'s parsing, service LB, NAT, reject and forwarding code
 * against the XDP context (lib/ctx/xdp.h) on every build, so the code the XDP program
 * (bpf/xdp.bpf.c, which runs only lib/xdp_nodeport.h's paths) does not use keeps building for
 * XDP too. One program runs the pod path's service translation, the other the native device's
 * ingress paths (lib/netdev.h). */
#include "lib/ctx/xdp.h"
#include "lib/arp.h"
#include "lib/netdev.h"

static __always_inline int xdp_check(struct xdp_md *ctx)
{
	const struct sluice_node_config *cfg = node_config();
	const struct sluice_endpoint *dst;
	struct policy4_flow flow;
	struct nat4_pkt np;
	struct ct4_pkt p;
	struct pkt4 pkt;
	__be16 h_proto;
	int ret;

	ret = parse_eth_ip4(ctx, &h_proto, &pkt);
	if (ret == -SLUICE_DROP_UNSUPPORTED_L3 && h_proto == bpf_htons(ETH_P_ARP))
		return pod_arp(ctx);
	if (ret < 0)
		return ret;
	if (ct4_tuple(&pkt, &p) == CT4_TUPLE) {
		ret = lb4_from_pod(ctx, &pkt, &p, cfg);
		if (ret < 0)
			return ret;
		if (ret == LB4_REJECT)
			return reject(ctx, &pkt, SLUICE_DROP_DIR_INGRESS);
	}
	dst = lookup_ep4(pkt.daddr);
	policy4_flow_of(&pkt, &flow);
	if (dst)
		return redirect_to_endpoint(ctx, dst, &pkt, &flow, POLICY4_CT_UNKNOWN);
	if (cfg && nat4_tuple(&pkt, 0, &np) == 0) {
		ret = nat4_unmasquerade(ctx, &pkt, &np);
		if (ret < 0)
			return ret;
		if (ret == NAT4_XLATED)
			return redirect_by_fib(ctx, &pkt);
		if (nat4_tuple(&pkt, 1, &np) == 0)
			return nat4_masquerade(ctx, &pkt, cfg, &np);
	}
	return CTX_ACT_OK;
}

SEC("xdp")
int sluice_xdp_check(struct xdp_md *ctx)
{
	return verdict_or_drop(ctx, xdp_check(ctx), SLUICE_FWD_NET_INGRESS);
}

int sluice_xdp_check_lb4(struct xdp_md *ctx);
int sluice_xdp_check_nat4(struct xdp_md *ctx);

/* The native device's stages (lib/netdev.h), through the XDP context too. */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, SLUICE_NET_STAGES);
	__uint(key_size, sizeof(__u32));
	__array(values, int(struct xdp_md *));
} sluice_xdp_check_stages SEC(".maps") = {
	.values = {
		[SLUICE_NET_STAGE_LB4] = (void *)&sluice_xdp_check_lb4,
		[SLUICE_NET_STAGE_NAT4] = (void *)&sluice_xdp_check_nat4,
	},
};

SEC("xdp")
int sluice_xdp_check_lb4(struct xdp_md *ctx)
{
	struct stage4_state *st = stage4_state();

	return verdict_or_drop(ctx,
			       st ? netdev_from_net_lb4(ctx, st, &sluice_xdp_check_stages)
				  : -SLUICE_DROP_MISSING_STAGE,
			       SLUICE_FWD_NET_INGRESS);
}

SEC("xdp")
int sluice_xdp_check_nat4(struct xdp_md *ctx)
{
	struct stage4_state *st = stage4_state();

	return verdict_or_drop(ctx, st ? netdev_from_net_nat4(ctx, st) : -SLUICE_DROP_MISSING_STAGE,
			       SLUICE_FWD_NET_INGRESS);
}

SEC("xdp")
int sluice_xdp_check_net(struct xdp_md *ctx)
{
	struct pkt4 pkt;
	__be16 h_proto;

	if (parse_eth_ip4(ctx, &h_proto, &pkt) < 0)
		return forwarded(ctx, SLUICE_FWD_NET_INGRESS, XDP_PASS);
	return verdict_or_drop(ctx, netdev_from_net(ctx, &pkt, &sluice_xdp_check_stages),
			       SLUICE_FWD_NET_INGRESS);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
