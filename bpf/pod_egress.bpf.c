/* TC hooks of a pod's host-side veth. Ingress (sluice_from_pod): everything a pod sends enters
 * Sluice here. ARP is answered for the gateway, services are load balanced (and their replies
 * reverse translated), the pod's egress policy judges the result, same-node pods are reached with
 * bpf_redirect_peer (through their ingress policy), other nodes' pods and addresses are reached
 * through the tunnel (or, in native routing, the FIB), and the rest (the node itself, the
 * outside) continues into the node's stack; an echo request to the gateway address is answered,
 * anything else for it dropped. Egress (sluice_to_pod): what the node's stack delivers to the pod
 * (the node itself, other nodes through routing or the overlay) passes the pod's ingress policy,
 * and a reply of a backend in the node's stack gets its frontend back; traffic redirected to the
 * pod with bpf_redirect_peer never comes here, and traffic redirected through the veth to a pod
 * with an ingress limit (lib/fwd.h) passes judged already. */
#include "lib/ctx/skb.h"
#include "lib/arp.h"
#include "lib/fwd.h"
#include "lib/gateway.h"
#include "lib/lb.h"
#include "lib/policy.h"
#include "lib/stages.h"

/* What each program of the chain returns, its verdict; tests/bpf/tunnel_probe.bpf.c records it
 * (with the tunnel metadata the packet carries) wherever the chain ends. */
#ifndef SLUICE_STAGE_VERDICT
#define SLUICE_STAGE_VERDICT(skb, verdict) (verdict)
#endif

/* Set by the loader before load (skel->rodata): IPv6 from pods goes to its stage. No IPv6
 * datapath exists yet, so it is 0 and the verifier drops that branch. */
const volatile __u32 enable_ipv6 = 0;

int sluice_pod_lb4(struct __sk_buff *skb);

/* sluice_from_pod's stages, filled by libbpf at each load of this object; not pinned, so each
 * load's entry program calls the stages of its own build (lib/stages.h). */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, SLUICE_POD_STAGES);
	__uint(key_size, sizeof(__u32)); /* a program array takes no BTF key type */
	__array(values, int(struct __sk_buff *));
} sluice_pod_stages SEC(".maps") = {
	.values = {
		[SLUICE_POD_STAGE_LB4] = (void *)&sluice_pod_lb4,
	},
};

/* sluice_from_pod is two stages joined by a tail call through sluice_pod_stages (lib/stages.h),
 * each verified on its own: parse and dispatch by family (the entry: ARP, the source check, the
 * gateway's echo; IPv4 traffic that is surely no Service's is judged and forwarded here, without
 * a tail call), and IPv4 Service translation (for packets that may be a Service's or a backend's
 * reply), which judges and forwards its result itself. Policy and forward (from_pod_fwd4) is
 * inline in both: as a third stage it cost Service traffic a second tail call, measured 4-5 ns
 * per packet (docs/architecture.md, "Stages"). */

/* IPv4 policy and forward, inline in the Service stage and in the entry (for traffic that skips
 * the Service stage). Returns a TC verdict or minus a drop reason. */
static __always_inline int from_pod_fwd4(struct __sk_buff *skb, struct stage4_state *st)
{
	const struct sluice_tunnel4_entry *peer;
	const struct sluice_node_config *cfg = node_config();
	const struct sluice_endpoint *dst;
	struct policy4_flow flow;
	struct pkt4 pkt = st->pkt;
	__u32 src_id = st->src_id;
	int lb = st->lb, ret;

	/* Still for the gateway (no hairpinned flow's reply): the node would route it upstream. */
	if (lb != LB4_REVNAT && cfg && pkt.daddr == cfg->gateway_ip4)
		return -SLUICE_DROP_TO_GATEWAY;

	/* Policy judges real addresses: a DNATed packet with its backend, a backend's reply as
	 * the backend sent it. */
	if (lb == LB4_REVNAT)
		flow = st->sent;
	else
		policy4_flow_of(&pkt, &flow);
	/* DNAT changed the destination; reverse NAT only for a hairpinned flow, whose original
	 * destination (the gateway) was no endpoint. To a pod of this node, the receiver's ingress
	 * point takes what the sender's egress point found in conntrack (policy4_check); the path
	 * out of the node keeps a check of its own (one shared, its code measured ~10 ns slower
	 * per packet). */
	dst = st->local_dst || lb == LB4_DNAT || lb == LB4_REVNAT ? lookup_ep4(pkt.daddr) : NULL;
	if (dst) {
		ret = policy4_check(src_id, SLUICE_POLICY_EGRESS, &flow, POLICY4_CT_UNKNOWN);
		if (ret < 0)
			return ret;
		return redirect_to_endpoint(skb, dst, &pkt, &flow, ret);
	}
	ret = policy4_check(src_id, SLUICE_POLICY_EGRESS, &flow, POLICY4_CT_UNKNOWN);
	if (ret < 0)
		return ret;
	peer = tunnel4_lookup(pkt.daddr);
	if (peer && tunnel_mode(cfg) && tunnel_too_big(skb, &pkt, cfg))
		return tunnel_frag_needed(skb, &pkt, cfg);
	if (peer)
		return redirect_to_node(skb, &pkt, cfg, peer);
	/* A reply now comes from a frontend, possibly this node's own address (NodePort), which
	 * the stack would refuse as a martian source: route it here. */
	if (lb == LB4_REVNAT)
		return redirect_by_fib(skb, &pkt);
	return TC_ACT_OK;
}

/* IPv4 Service translation: DNAT to a backend, or a backend's reply back from its frontend; then
 * policy and forward. A local pod is never a frontend, so traffic to one only needs the reply
 * check. Returns a TC verdict or minus a drop reason. */
static __always_inline int from_pod_lb4(struct __sk_buff *skb, struct stage4_state *st)
{
	struct ct4_pkt p;
	int lb;

	if (ct4_tuple(&st->pkt, &p) != CT4_TUPLE)
		return -SLUICE_DROP_INVALID_PACKET; /* the entry calls this stage for tuples only */
	lb = st->local_dst ? lb4_rev_nat(skb, &st->pkt, &p)
			   : lb4_from_pod(skb, &st->pkt, &p, node_config());
	if (lb < 0)
		return lb;
	if (lb == LB4_REJECT)
		return reject(skb, &st->pkt, SLUICE_DROP_DIR_EGRESS);
	st->lb = lb;
	return from_pod_fwd4(skb, st);
}

/* Parse and dispatch by family; IPv4 traffic that is surely no Service's (pod -> pod) is judged
 * and forwarded here, without a tail call. Returns a TC verdict or minus a drop reason. */
static __always_inline int from_pod(struct __sk_buff *skb)
{
	const struct sluice_endpoint *src;
	const struct sluice_node_config *cfg;
	struct stage4_state st, *handed;
	struct ct4_pkt p;
	__be16 h_proto;
	int ret;

	ret = parse_eth_ip4(skb, &h_proto, &st.pkt);
	if (ret == -SLUICE_DROP_UNSUPPORTED_L3 && h_proto == bpf_htons(ETH_P_ARP))
		return pod_arp(skb);
	if (ret == -SLUICE_DROP_UNSUPPORTED_L3 && h_proto == bpf_htons(ETH_P_IPV6) && enable_ipv6)
		return stage_call(skb, &sluice_pod_stages, SLUICE_POD_STAGE_IP6);
	if (ret < 0)
		return ret;

	/* A pod may only send from the address Sluice gave it, on the interface it was given. */
	src = lookup_ep4(st.pkt.saddr);
	if (!src || src->ifindex != skb->ifindex)
		return -SLUICE_DROP_SPOOFED_SOURCE;
	/* Endpoints are read where they are found and let go (lookup_ep4). */
	st.src_id = src->endpoint_id;

	/* A ClusterIP is never a local pod, so traffic to one needs no endpoint lookup. */
	cfg = node_config();
	if (cfg && st.pkt.daddr == cfg->gateway_ip4 && gateway_is_echo_request(&st.pkt))
		return gateway_echo_reply(skb, &st.pkt, src);
	st.local_dst = !lb4_in_service_cidr(cfg, st.pkt.daddr) && lookup_ep4_exists(st.pkt.daddr);
	st.lb = LB4_NONE;
	st.pad = 0;
	policy4_flow_of(&st.pkt, &st.sent);
	if (!st.local_dst || !lb4_plain_to_endpoint(&st.pkt)) {
		if (ct4_tuple(&st.pkt, &p) == CT4_TUPLE) {
			/* A per-CPU array's only entry: never missing. */
			handed = stage4_state();
			if (!handed)
				return -SLUICE_DROP_MISSING_STAGE;
			*handed = st;
			return stage_call(skb, &sluice_pod_stages, SLUICE_POD_STAGE_LB4);
		}
		/* A later fragment whose first never came: no backend to follow. */
		if ((st.pkt.flags & PKT4_F_NO_L4) && lb4_in_service_cidr(cfg, st.pkt.daddr))
			return -SLUICE_DROP_FRAGMENT;
	}
	/* No Service step: policy and forward here (one call site, walked once by the verifier). */
	return from_pod_fwd4(skb, &st);
}

SEC("tc")
int sluice_from_pod(struct __sk_buff *skb)
{
	int ret = from_pod(skb);

	return SLUICE_STAGE_VERDICT(skb, verdict_or_drop(skb, ret, SLUICE_FWD_POD_EGRESS));
}

SEC("tc")
int sluice_pod_lb4(struct __sk_buff *skb)
{
	struct stage4_state *st = stage4_state();
	int ret = st ? from_pod_lb4(skb, st) : -SLUICE_DROP_MISSING_STAGE;

	return SLUICE_STAGE_VERDICT(skb, verdict_or_drop(skb, ret, SLUICE_FWD_POD_EGRESS));
}

/* Returns a TC verdict or minus a drop reason. */
static __always_inline int to_pod(struct __sk_buff *skb)
{
	const struct sluice_endpoint *ep;
	struct policy4_flow flow;
	struct lb4_target t;
	struct ct4_pkt p;
	struct pkt4 pkt;
	__be16 h_proto;
	__u32 ep_id;
	int ret;

	if (skb->mark == SLUICE_SKB_MARK_TO_SHAPED_POD) {
		skb->mark = 0;
		return TC_ACT_OK;
	}
	/* ARP and what is not IPv4 pass: policy is about IPv4 flows. */
	if (parse_eth_ip4(skb, &h_proto, &pkt) < 0)
		return TC_ACT_OK;
	ep = lookup_ep4(pkt.daddr);
	if (!ep || ep->ifindex != skb->ifindex)
		return TC_ACT_OK;
	ep_id = ep->endpoint_id;
	policy4_flow_of(&pkt, &flow);
	ret = policy4_check(ep_id, SLUICE_POLICY_INGRESS, &flow, POLICY4_CT_UNKNOWN);
	if (ret < 0)
		return ret;
	/* A reply from a backend in the node's own stack (a hostNetwork pod here) to a pod that
	 * reached it through a Service: it must come from the frontend. Policy judged it as sent. */
	if (ct4_tuple(&pkt, &p) == CT4_TUPLE && lb4_rev_nat_lookup(&p, &t) == LB4_REVNAT) {
		ret = lb4_rev_nat_rewrite(skb, &pkt, &p, &t);
		if (ret < 0)
			return ret;
	}
	return TC_ACT_OK;
}

SEC("tc")
int sluice_to_pod(struct __sk_buff *skb)
{
	return verdict_or_drop(skb, to_pod(skb), SLUICE_FWD_POD_INGRESS);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
