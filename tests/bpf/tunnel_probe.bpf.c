/* Test companion of tests/bpf/overlay_priv_test.cc, attached nowhere: runs the production paths
 * of sluice_from_pod, sluice_to_net and sluice_from_net, then reads back with
 * bpf_skb_get_tunnel_key the tunnel metadata they left on the packet (BPF_PROG_TEST_RUN shows
 * the verdict and the bytes, not the metadata). Built from the same sources, against the same
 * pinned maps; the stages a path moves to record where the path ends (SLUICE_STAGE_VERDICT). */
#include "lib/ctx/skb.h"
#include "tunnel_probe.h"

struct tunnel_probe_out probe_out;

static __always_inline int record(struct __sk_buff *skb, int verdict)
{
	struct bpf_tunnel_key key = {};

	probe_out.verdict = verdict;
	probe_out.get_ret = bpf_skb_get_tunnel_key(skb, &key, sizeof(key), 0);
	probe_out.remote_ipv4 = key.local_ipv4; /* see tunnel_probe.h */
	probe_out.tunnel_id = key.tunnel_id;
	probe_out.tunnel_ttl = key.tunnel_ttl;
	return verdict;
}

#define SLUICE_STAGE_VERDICT(skb, verdict) record(skb, verdict)
#include "pod_egress.bpf.c"
#include "lib/netdev.h"

int probe_net_lb4(struct __sk_buff *skb);
int probe_net_nat4(struct __sk_buff *skb);

/* sluice_from_net's stages (bpf/netdev.bpf.c), recording. */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, SLUICE_NET_STAGES);
	__uint(key_size, sizeof(__u32));
	__array(values, int(struct __sk_buff *));
} probe_net_stages SEC(".maps") = {
	.values = {
		[SLUICE_NET_STAGE_LB4] = (void *)&probe_net_lb4,
		[SLUICE_NET_STAGE_NAT4] = (void *)&probe_net_nat4,
	},
};

SEC("tc")
int probe_net_lb4(struct __sk_buff *skb)
{
	struct stage4_state *st = stage4_state();

	return record(skb, verdict_or_drop(skb,
					   st ? netdev_from_net_lb4(skb, st, &probe_net_stages)
					      : -SLUICE_DROP_MISSING_STAGE,
					   SLUICE_FWD_NET_INGRESS));
}

SEC("tc")
int probe_net_nat4(struct __sk_buff *skb)
{
	struct stage4_state *st = stage4_state();

	return record(skb, verdict_or_drop(skb,
					   st ? netdev_from_net_nat4(skb, st)
					      : -SLUICE_DROP_MISSING_STAGE,
					   SLUICE_FWD_NET_INGRESS));
}

SEC("tc")
int probe_from_pod(struct __sk_buff *skb)
{
	return record(skb, verdict_or_drop(skb, from_pod(skb), SLUICE_FWD_POD_EGRESS));
}

SEC("tc")
int probe_to_net(struct __sk_buff *skb)
{
	struct pkt4 pkt;
	__be16 h_proto;

	if (parse_eth_ip4(skb, &h_proto, &pkt) < 0)
		return record(skb, TC_ACT_OK);
	return record(skb, verdict_or_drop(skb, netdev_to_net(skb, &pkt), SLUICE_FWD_NET_EGRESS));
}

SEC("tc")
int probe_from_net(struct __sk_buff *skb)
{
	struct pkt4 pkt;
	__be16 h_proto;

	if (parse_eth_ip4(skb, &h_proto, &pkt) < 0)
		return record(skb, TC_ACT_OK);
	return record(skb, verdict_or_drop(skb, netdev_from_net(skb, &pkt, &probe_net_stages), SLUICE_FWD_NET_INGRESS));
}
