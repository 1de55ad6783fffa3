/* Drops: every TC_ACT_SHOT in Sluice goes through drop(), which counts the packet under its
 * reason in the per-CPU sluice_drops array. */
#ifndef SLUICE_BPF_DROP_H
#define SLUICE_BPF_DROP_H

#include "lib/maps.h"

static __always_inline int drop(struct __sk_buff *skb, enum sluice_drop_reason reason)
{
	__u32 key = reason;
	struct sluice_drop_count *count = bpf_map_lookup_elem(&sluice_drops, &key);

	if (count) {
		count->packets++;
		count->bytes += skb->len;
	}
	return TC_ACT_SHOT;
}

#endif
