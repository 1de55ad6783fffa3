/* Forwarding to local endpoints: judge the packet at the pod's ingress policy point, rewrite L2
 * as the pod's gateway would and hand the packet straight to the pod's interface with
 * bpf_redirect_peer (no bridge, no second stack pass, and so no pass through sluice_to_pod). A pod
 * with an ingress bandwidth limit is reached with bpf_redirect through its host veth instead, so
 * the veth's tbf qdisc shapes what every sender on the node and beyond sends it.
 * Forwarding to other nodes: through the tunnel (lib/tunnel.h) or routed with the FIB. */
#ifndef SLUICE_BPF_FWD_H
#define SLUICE_BPF_FWD_H

#include "lib/csum.h"
#include "lib/drop.h"
#include "lib/policy.h"
#include "lib/tunnel.h"

/* flow is what ep's ingress policy judges (policy4_flow); known, what the sender's policy point
 * in this program found of it in conntrack (enum policy4_ct_known, policy4_check). Returns a TC
 * verdict or minus a drop reason. */
static __always_inline int redirect_to_endpoint(struct sluice_ctx *ctx,
						const struct sluice_endpoint *ep, struct pkt4 *pkt,
						const struct policy4_flow *flow, int known)
{
	__u8 macs[12];
	int ret;

	ret = policy4_check(ep->endpoint_id, SLUICE_POLICY_INGRESS, flow, known);
	if (ret < 0)
		return ret;
	ret = ip4_dec_ttl(ctx, pkt);
	if (ret < 0)
		return ret;

	/* The pod drops frames not addressed to its MAC; the source is its gateway's MAC. */
	__builtin_memcpy(macs, ep->mac, 6);
	__builtin_memcpy(macs + 6, ep->host_mac, 6);
	if (ctx_store_bytes(ctx, 0, macs, sizeof(macs)))
		return -SLUICE_DROP_PACKET_WRITE;
	if (ep->flags & SLUICE_EP_F_INGRESS_SHAPED) {
		/* Out of the host veth: its egress hook (sluice_to_pod, told by the mark that the
		 * packet is judged), then its root qdisc, then the pod. */
		ctx_set_mark(ctx, SLUICE_SKB_MARK_TO_SHAPED_POD);
		return ctx_redirect(ep->ifindex);
	}
	return ctx_redirect_peer(ep->ifindex);
}

#define SLUICE_AF_INET 2

/* Routes a packet with the kernel's FIB and sends it out of the device the route names, as a
 * router would. When the FIB has no answer the packet continues into the stack. Returns a TC
 * verdict or minus a drop reason. */
static __always_inline int fib_redirect(struct sluice_ctx *ctx, struct pkt4 *pkt)
{
	struct bpf_fib_lookup fib = {};
	struct bpf_redir_neigh nh = {};
	__u8 macs[12];
	int found, ret;

	fib.family = SLUICE_AF_INET;
	fib.tos = pkt->tos;
	fib.l4_protocol = pkt->proto;
	fib.tot_len = pkt->tot_len;
	fib.ipv4_src = pkt->saddr;
	fib.ipv4_dst = pkt->daddr;
	fib.ifindex = ctx_ifindex(ctx);

	found = ctx_fib_lookup(ctx, &fib);
	if (found != BPF_FIB_LKUP_RET_SUCCESS && found != BPF_FIB_LKUP_RET_NO_NEIGH)
		return CTX_ACT_OK;
	ret = ip4_dec_ttl(ctx, pkt);
	if (ret < 0)
		return ret;
	/* Decided: the device's sluice_to_net lets it out untouched. */
	ctx_set_mark(ctx, SLUICE_SKB_MARK_ROUTED);
	if (found == BPF_FIB_LKUP_RET_SUCCESS) {
		__builtin_memcpy(macs, fib.dmac, 6);
		__builtin_memcpy(macs + 6, fib.smac, 6);
		if (ctx_store_bytes(ctx, 0, macs, sizeof(macs)))
			return -SLUICE_DROP_PACKET_WRITE;
		return ctx_redirect(fib.ifindex);
	}
	/* The next hop (fib.ipv4_dst now names it) has no neighbour entry yet: let the kernel
	 * resolve it. */
	nh.nh_family = SLUICE_AF_INET;
	nh.ipv4_nh = fib.ipv4_dst;
	return ctx_redirect_neigh(fib.ifindex, &nh);
}

/* Forwards a packet to another node's pod or address (`peer`, from tunnel4_lookup): inside the
 * tunnel in tunnel mode, else routed with the FIB (native routing). Returns a TC verdict or minus
 * a drop reason. */
static __always_inline int redirect_to_node(struct sluice_ctx *ctx, struct pkt4 *pkt,
					    const struct sluice_node_config *cfg,
					    const struct sluice_tunnel4_entry *peer)
{
	int ret;

	if (!tunnel_mode(cfg))
		return fib_redirect(ctx, pkt);
	ret = ip4_dec_ttl(ctx, pkt);
	if (ret < 0)
		return ret;
	return tunnel_redirect(ctx, cfg, peer);
}

/* Routes a packet the node's stack must not see (its source is a node or service address, which
 * the stack would take for a martian): to another node as redirect_to_node does, anywhere else
 * with the FIB. Returns a TC verdict or minus a drop reason. */
static __always_inline int redirect_by_fib(struct sluice_ctx *ctx, struct pkt4 *pkt)
{
	const struct sluice_tunnel4_entry *peer = tunnel4_lookup(pkt->daddr);

	if (peer)
		return redirect_to_node(ctx, pkt, node_config(), peer);
	return fib_redirect(ctx, pkt);
}

#endif
