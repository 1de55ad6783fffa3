/* TC hooks of the node's native device: masquerade of pod traffic leaving the node (egress) and
 * the reverse translation of its replies, delivered straight to the pod (ingress). Traffic that
 * is not the pods' passes untouched. */
#include "lib/ctx/skb.h"
#include "lib/fwd.h"
#include "lib/lb.h"

/* Returns a TC verdict or minus a drop reason. */
static __always_inline int to_net(struct __sk_buff *skb)
{
	const struct sluice_node_config *cfg;
	struct sluice_lpm4_key dst;
	struct nat4_pkt p;
	struct pkt4 pkt;
	__be16 h_proto;
	int ret;

	if (parse_eth_ip4(skb, &h_proto, &pkt) < 0)
		return TC_ACT_OK;
	cfg = node_config();
	if (!cfg || !(cfg->flags & SLUICE_NODE_F_MASQUERADE) ||
	    !ip4_in_prefix(pkt.saddr, cfg->pod_cidr4, cfg->pod_cidr4_len))
		return TC_ACT_OK;
	dst.prefixlen = 32;
	dst.addr = pkt.daddr;
	if (bpf_map_lookup_elem(&sluice_nomasq4, &dst))
		return TC_ACT_OK;

	ret = nat4_tuple(&pkt, 1, &p);
	if (ret < 0)
		return ret;
	return nat4_masquerade(skb, &pkt, cfg, &p);
}

SEC("tc")
int sluice_to_net(struct __sk_buff *skb)
{
	return verdict_or_drop(skb, to_net(skb));
}

/* A packet DNATed onto a backend arrived from the network: a backend on this node gets it
 * directly; one on another node gets it masqueraded to this node's address (so the reply comes
 * back here to be translated) and routed there. Returns a TC verdict or minus a drop reason. */
static __always_inline int lb4_forward_from_net(struct __sk_buff *skb, struct pkt4 *pkt,
						const struct sluice_node_config *cfg)
{
	const struct sluice_endpoint *ep;
	struct nat4_pkt np;
	int verdict;

	ep = lookup_ep4(pkt->daddr);
	if (ep)
		return redirect_to_endpoint(skb, ep, pkt);
	if (!cfg)
		return -SLUICE_DROP_NO_NODE_CONFIG;
	if (nat4_tuple(pkt, 1, &np) < 0)
		return -SLUICE_DROP_INVALID_PACKET;
	verdict = nat4_masquerade(skb, pkt, cfg, &np);
	if (verdict != TC_ACT_OK)
		return verdict;
	return redirect_by_fib(skb, pkt);
}

/* Returns a TC verdict or minus a drop reason. */
static __always_inline int from_net(struct __sk_buff *skb)
{
	const struct sluice_node_config *cfg;
	const struct sluice_lb4_service *svc;
	const struct sluice_endpoint *ep;
	struct sluice_lb4_key key;
	struct ct4_pkt cp;
	struct nat4_pkt p;
	struct pkt4 pkt;
	__be16 h_proto;
	int ret;

	if (parse_eth_ip4(skb, &h_proto, &pkt) < 0)
		return TC_ACT_OK;
	cfg = node_config();

	/* NodePorts, ExternalIPs and LoadBalancer IPs: balanced here, before the stack. */
	if (ct4_tuple(&pkt, &cp) == CT4_TUPLE) {
		ret = lb4_frontend(&cp, cfg, &key, &svc);
		if (ret == LB4_DNAT)
			ret = lb4_dnat(skb, &pkt, &cp, &key, svc, 0);
		if (ret < 0)
			return ret;
		if (ret == LB4_REJECT)
			return reject(skb, &pkt);
		if (ret == LB4_DNAT)
			return lb4_forward_from_net(skb, &pkt, cfg);
	}

	if (!cfg || pkt.daddr != cfg->node_ip4) {
		/* A reply of a backend elsewhere to a client pod here, which reached a service
		 * through this node: it must come from the frontend the client used. */
		ep = lookup_ep4(pkt.daddr);
		if (!ep || ct4_tuple(&pkt, &cp) != CT4_TUPLE)
			return TC_ACT_OK;
		ret = lb4_rev_nat(skb, &pkt, &cp);
		if (ret < 0)
			return ret;
		if (ret == LB4_NONE)
			return TC_ACT_OK;
		return redirect_to_endpoint(skb, ep, &pkt);
	}

	/* Whatever cannot be a reply to a masqueraded flow is the node's own traffic. */
	if (nat4_tuple(&pkt, 0, &p) < 0)
		return TC_ACT_OK;
	ret = nat4_unmasquerade(skb, &pkt, &p);
	if (ret < 0)
		return ret;
	if (ret == NAT4_NONE)
		return TC_ACT_OK;

	/* The reply of a remote backend to a NodePort client masqueraded on its way there: back
	 * from the frontend, and out to the client. */
	if (ct4_tuple(&pkt, &cp) == CT4_TUPLE) {
		ret = lb4_rev_nat(skb, &pkt, &cp);
		if (ret < 0)
			return ret;
		if (ret == LB4_REVNAT)
			return redirect_by_fib(skb, &pkt);
	}
	ep = lookup_ep4(pkt.daddr);
	if (ep)
		return redirect_to_endpoint(skb, ep, &pkt);
	return TC_ACT_OK;
}

SEC("tc")
int sluice_from_net(struct __sk_buff *skb)
{
	return verdict_or_drop(skb, from_net(skb));
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
