/* Test companion of tests/bpf/overlay_priv_test.cc, attached nowhere: runs the production paths
 * of sluice_from_pod, sluice_to_net and sluice_from_net, then reads back with
 * bpf_skb_get_tunnel_key the tunnel metadata they left on the packet (BPF_PROG_TEST_RUN shows
 * the verdict and the bytes, not the metadata). Built from the same sources, against the same
 * pinned maps. */
#include "pod_egress.bpf.c"
#include "lib/netdev.h"
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
	return record(skb, verdict_or_drop(skb, netdev_from_net(skb, &pkt), SLUICE_FWD_NET_INGRESS));
}
