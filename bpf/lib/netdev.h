/* The native device's paths, one function each: pod traffic leaving the node is masqueraded
 * (netdev_masquerade), the node's traffic to other nodes' pods is encapsulated in tunnel mode
 * (netdev_to_net); arriving traffic is balanced when it is for a NodePort, ExternalIP or
 * LoadBalancer IP (netdev_to_service), delivered into the pod when it is for a pod here (a
 * remote backend's reply reverse-translated first: netdev_to_pod), un-masqueraded when it is a
 * reply to a masqueraded flow (netdev_unmasquerade), and passed to the stack otherwise (the
 * node's own traffic). */
#ifndef SLUICE_BPF_NETDEV_H
#define SLUICE_BPF_NETDEV_H

#include "lib/fwd.h"
#include "lib/lb.h"
#include "lib/stages.h"

/* Arriving overlay packets, VXLAN to this node's address on the tunnel port (the overlay's
 * socket owns it): nothing for the native device's paths, whose lookups would all miss (what
 * they carry is judged on the tunnel device). The port is outside the masquerade range, so no
 * reply of a masqueraded flow is taken for one. (Leaving ones carry SLUICE_SKB_MARK_ROUTED.) */
static __always_inline int netdev_tunnel_packet(const struct sluice_node_config *cfg,
						const struct pkt4 *pkt)
{
	return cfg && cfg->tunnel_port && pkt->proto == IPPROTO_UDP && (pkt->flags & PKT4_F_PORTS) &&
	       pkt->daddr == cfg->node_ip4 && pkt->dport == bpf_htons(cfg->tunnel_port) &&
	       (cfg->tunnel_port < cfg->nat_port_min || cfg->tunnel_port > cfg->nat_port_max);
}

/* Egress: a pod packet to a destination outside sluice_nomasq4 leaves with the node's address.
 * Returns a verdict or minus a drop reason. */
static __always_inline int netdev_masquerade(struct sluice_ctx *ctx, struct pkt4 *pkt)
{
	const struct sluice_node_config *cfg = node_config();
	struct sluice_lpm4_key dst;
	struct nat4_pkt p;
	int ret;

	if (!cfg || !(cfg->flags & SLUICE_NODE_F_MASQUERADE) ||
	    !ip4_in_prefix(pkt->saddr, cfg->pod_cidr4, cfg->pod_cidr4_len))
		return CTX_ACT_OK;
	dst.prefixlen = 32;
	dst.addr = pkt->daddr;
	if (bpf_map_lookup_elem(&sluice_nomasq4, &dst))
		return CTX_ACT_OK;

	ret = nat4_tuple(pkt, 1, &p);
	if (ret < 0)
		return ret;
	return nat4_masquerade(ctx, pkt, cfg, &p);
}

/* Egress: a reply of the node's own stack to a flow balanced onto it leaves from its frontend.
 * In tunnel mode, what the node's stack sends to another node's pod CIDR (the node's own
 * traffic, host-network pods) goes through the tunnel; no route to pod CIDRs is needed. Only
 * pod-CIDR entries count here: the encapsulated packet, addressed to a node, passes this hook
 * again and must leave. Everything else is masqueraded or passes. Returns a verdict or minus a
 * drop reason. */
static __always_inline int netdev_to_net(struct sluice_ctx *ctx, struct pkt4 *pkt)
{
	const struct sluice_node_config *cfg = node_config();
	const struct sluice_tunnel4_entry *peer;
	struct lb4_target t;
	struct ct4_pkt cp;
	int ret;

	/* A backend in the node's own stack (a hostNetwork pod) answering a client that reached it
	 * through a NodePort, ExternalIP or LoadBalancer IP here: the reply leaves from the
	 * frontend. */
	if (cfg && pkt->saddr == cfg->node_ip4 && ct4_tuple(pkt, &cp) == CT4_TUPLE &&
	    lb4_rev_nat_lookup(&cp, &t) == LB4_REVNAT) {
		ret = lb4_rev_nat_rewrite(ctx, pkt, &cp, &t);
		if (ret < 0)
			return ret;
	}
	if (tunnel_mode(cfg)) {
		peer = tunnel4_lookup(pkt->daddr);
		if (peer && (peer->flags & SLUICE_TUNNEL_F_POD_CIDR))
			return tunnel_redirect(ctx, cfg, peer);
	}
	return netdev_masquerade(ctx, pkt);
}

/* A packet DNATed onto a backend arrived from the network: a backend on this node gets it
 * directly (a pod by redirect, the node's own address through its stack); one on another node
 * gets it masqueraded to this node's address (so the reply comes back here to be translated) and
 * routed there. Returns a verdict or minus a drop reason. */
static __always_inline int netdev_forward_to_backend(struct sluice_ctx *ctx, struct pkt4 *pkt,
						     const struct sluice_node_config *cfg)
{
	const struct sluice_endpoint *ep;
	struct policy4_flow flow;
	struct nat4_pkt np;
	int verdict;

	ep = lookup_ep4(pkt->daddr);
	if (ep) {
		policy4_flow_of(pkt, &flow);
		return redirect_to_endpoint(ctx, ep, pkt, &flow, POLICY4_CT_UNKNOWN);
	}
	if (!cfg)
		return -SLUICE_DROP_NO_NODE_CONFIG;
	/* The node itself (a hostNetwork backend): its stack takes the packet with the client's
	 * address; sluice_to_net gives the reply its frontend back. */
	if (pkt->daddr == cfg->node_ip4)
		return CTX_ACT_OK;
	if (nat4_tuple(pkt, 1, &np) < 0)
		return -SLUICE_DROP_INVALID_PACKET;
	verdict = nat4_masquerade(ctx, pkt, cfg, &np);
	if (verdict != CTX_ACT_OK)
		return verdict;
	return redirect_by_fib(ctx, pkt);
}

/* NodePorts, ExternalIPs and LoadBalancer IPs, balanced before the stack sees the packet.
 * frontend is lb4_frontend's answer for the packet (not LB4_NONE). Returns a verdict or minus a
 * drop reason. */
static __always_inline int netdev_to_service(struct sluice_ctx *ctx, struct pkt4 *pkt,
					     const struct ct4_pkt *cp,
					     const struct sluice_node_config *cfg, int frontend,
					     const struct sluice_lb4_key *key,
					     const struct sluice_lb4_service *svc)
{
	struct lb4_target t;
	int ret = frontend;

	if (ret == LB4_DNAT)
		ret = lb4_choose(cp, key, svc, 0, &t);
	if (ret < 0)
		return ret;
	if (ret == LB4_REJECT)
		return reject(ctx, pkt, SLUICE_DROP_DIR_INGRESS);
	ret = lb4_dnat_rewrite(ctx, pkt, cp, &t);
	if (ret < 0)
		return ret;
	return netdev_forward_to_backend(ctx, pkt, cfg);
}

/* Traffic for a pod here from the network (another node's pod or the node itself, natively or
 * decapsulated from the overlay; a client routed to pod addresses) is delivered straight into
 * the pod through its ingress policy, without a pass through the node's stack. A reply of a
 * backend elsewhere to a client pod here, which reached a service through this node, first
 * gets the frontend the client used back. What is no pod's passes. Returns a verdict or minus a
 * drop reason. */
static __always_inline int netdev_to_pod(struct sluice_ctx *ctx, struct pkt4 *pkt)
{
	const struct sluice_endpoint *ep;
	struct policy4_flow flow;
	struct lb4_target t;
	struct ct4_pkt cp;
	int ret;

	/* The endpoint is read after the reverse NAT, which keeps the destination (lookup_ep4). */
	if (!lookup_ep4_exists(pkt->daddr))
		return CTX_ACT_OK;
	/* The pod's policy judges the packet as it arrived (a reply as its backend sent it). */
	policy4_flow_of(pkt, &flow);
	if (ct4_tuple(pkt, &cp) == CT4_TUPLE) {
		if (lb4_rev_nat_lookup(&cp, &t) == LB4_REVNAT) {
			ret = lb4_rev_nat_rewrite(ctx, pkt, &cp, &t);
			if (ret < 0)
				return ret;
		} else {
			/* A flow to the pod itself. */
			lb4_forget_crossed_flow(&cp);
		}
	}
	ep = lookup_ep4(pkt->daddr);
	if (!ep)
		return CTX_ACT_OK;
	return redirect_to_endpoint(ctx, ep, pkt, &flow, POLICY4_CT_UNKNOWN);
}

/* A packet to the node's address: a reply to a masqueraded flow goes back to the pod (or, for a
 * NodePort flow to a remote backend, back from the frontend and out to the client); whatever is
 * no such reply is the node's own traffic and passes. Returns a verdict or minus a drop reason. */
static __always_inline int netdev_unmasquerade(struct sluice_ctx *ctx, struct pkt4 *pkt)
{
	const struct sluice_endpoint *ep;
	struct policy4_flow flow;
	struct lb4_target t;
	struct ct4_pkt cp;
	struct nat4_pkt p;
	int ret;

	if (nat4_tuple(pkt, 0, &p) < 0)
		return CTX_ACT_OK;
	ret = nat4_unmasquerade(ctx, pkt, &p);
	if (ret < 0)
		return ret;
	if (ret == NAT4_NONE)
		return CTX_ACT_OK;

	if (ct4_tuple(pkt, &cp) == CT4_TUPLE && lb4_rev_nat_lookup(&cp, &t) == LB4_REVNAT) {
		ret = lb4_rev_nat_rewrite(ctx, pkt, &cp, &t);
		if (ret < 0)
			return ret;
		return redirect_by_fib(ctx, pkt);
	}
	ep = lookup_ep4(pkt->daddr);
	if (ep) {
		policy4_flow_of(pkt, &flow);
		return redirect_to_endpoint(ctx, ep, pkt, &flow, POLICY4_CT_UNKNOWN);
	}
	return CTX_ACT_OK;
}

/* Ingress of the native device (and of the overlay device), its entry stage: traffic for this
 * node's pod range is delivered here; a TCP/UDP packet for anything else may be a frontend's and
 * moves to the Service stage (netdev_from_net_lb4), any other packet to the node's address to
 * the masquerade stage (netdev_from_net_nat4), through `stages` (enum sluice_net_stage); the rest
 * goes to a pod here or passes. Returns a verdict or minus a drop reason. */
static __always_inline int netdev_from_net(struct sluice_ctx *ctx, struct pkt4 *pkt, void *stages)
{
	const struct sluice_node_config *cfg = node_config();
	struct stage4_state *st;
	struct ct4_pkt cp;
	int tuple;

	if (netdev_tunnel_packet(cfg, pkt))
		return CTX_ACT_OK;
	/* This node's pod range holds no frontend (ClusterIPs are in the service range, NodePorts
	 * on the node's address; an ExternalIP or LoadBalancer IP there would be a pod's address):
	 * its traffic needs no service lookup. One call of netdev_to_pod, so that the verifier
	 * walks it once. */
	if (!cfg || !cfg->pod_cidr4_len ||
	    !ip4_in_prefix(pkt->daddr, cfg->pod_cidr4, cfg->pod_cidr4_len)) {
		tuple = ct4_tuple(pkt, &cp) == CT4_TUPLE;
		if (tuple || (cfg && pkt->daddr == cfg->node_ip4)) {
			st = stage4_state();
			if (!st)
				return -SLUICE_DROP_MISSING_STAGE; /* a per-CPU array's only entry */
			st->pkt = *pkt;
			if (tuple)
				return stage_call(ctx, stages, SLUICE_NET_STAGE_LB4);
			return stage_call(ctx, stages, SLUICE_NET_STAGE_NAT4);
		}
	}
	return netdev_to_pod(ctx, pkt);
}

/* The Service stage of the native device's ingress: a frontend's packet is balanced; what is no
 * frontend's goes to a pod here, or, for the node's address, to the masquerade stage. Returns a
 * verdict or minus a drop reason. */
static __always_inline int netdev_from_net_lb4(struct sluice_ctx *ctx, struct stage4_state *st,
					       void *stages)
{
	const struct sluice_node_config *cfg = node_config();
	const struct sluice_lb4_service *svc;
	struct sluice_lb4_key key;
	struct pkt4 *pkt = &st->pkt;
	struct ct4_pkt cp;
	int frontend;

	if (ct4_tuple(pkt, &cp) != CT4_TUPLE)
		return -SLUICE_DROP_INVALID_PACKET; /* the entry calls this stage for tuples only */
	frontend = lb4_frontend(&cp, cfg, &key, &svc);
	if (frontend != LB4_NONE)
		return netdev_to_service(ctx, pkt, &cp, cfg, frontend, &key, svc);
	if (!cfg || pkt->daddr != cfg->node_ip4)
		return netdev_to_pod(ctx, pkt);
	return stage_call(ctx, stages, SLUICE_NET_STAGE_NAT4);
}

/* The masquerade stage of the native device's ingress: a packet to the node's address. Returns a
 * verdict or minus a drop reason. */
static __always_inline int netdev_from_net_nat4(struct sluice_ctx *ctx, struct stage4_state *st)
{
	return netdev_unmasquerade(ctx, &st->pkt);
}

#endif
