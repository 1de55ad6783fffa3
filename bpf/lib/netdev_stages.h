/* The stages of the native device's ingress (netdev_from_net, lib/netdev.h) as programs, with the
 * program array that holds them: the native device's object (netdev.bpf.c) and the overlay
 * device's (overlay.bpf.c) take the same paths after their entry, so each includes this once,
 * after lib/netdev.h, and gets its own copy of the array and the stages (lib/stages.h: an entry
 * only ever calls stages of its own object's load). */
#pragma once

#include "netdev.h"

int sluice_net_lb4(struct __sk_buff *skb);
int sluice_net_nat4(struct __sk_buff *skb);

/* The ingress program's stages, filled by libbpf at each load of the object; not pinned by name
 * (lib/stages.h). */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, SLUICE_NET_STAGES);
	__uint(key_size, sizeof(__u32)); /* a program array takes no BTF key type */
	__array(values, int(struct __sk_buff *));
} sluice_net_stages SEC(".maps") = {
	.values = {
		[SLUICE_NET_STAGE_LB4] = (void *)&sluice_net_lb4,
		[SLUICE_NET_STAGE_NAT4] = (void *)&sluice_net_nat4,
	},
};

SEC("tc")
int sluice_net_lb4(struct __sk_buff *skb)
{
	struct stage4_state *st = stage4_state();

	return verdict_or_drop(skb,
			       st ? netdev_from_net_lb4(skb, st, &sluice_net_stages)
				  : -SLUICE_DROP_MISSING_STAGE,
			       SLUICE_FWD_NET_INGRESS);
}

SEC("tc")
int sluice_net_nat4(struct __sk_buff *skb)
{
	struct stage4_state *st = stage4_state();

	return verdict_or_drop(skb, st ? netdev_from_net_nat4(skb, st) : -SLUICE_DROP_MISSING_STAGE,
			       SLUICE_FWD_NET_INGRESS);
}
