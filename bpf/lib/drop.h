/* Drops: every packet Sluice drops and every socket call it refuses is counted under its reason
 * in the per-CPU sluice_drops array, by count_drop() and nothing else.
 * The return convention of bpf/lib: a helper returns a verdict (CTX_ACT_*, a redirect) or a small
 * enum of outcomes (>= 0), or minus a drop reason; only the entry files turn the latter into a
 * drop. */
#ifndef SLUICE_BPF_DROP_H
#define SLUICE_BPF_DROP_H

#include "lib/events.h"
#include "lib/maps.h"

/* bytes is what the dropped packet occupied; 0 for a refused socket call, which has none. */
static __always_inline void count_drop(enum sluice_drop_reason reason, __u32 bytes)
{
	__u32 key = reason;
	struct sluice_drop_count *count = bpf_map_lookup_elem(&sluice_drops, &key);

	if (count) {
		count->packets++;
		count->bytes += bytes;
	}
}

/* Counts the packet under reason (and reports it to the flow monitor when that asks for drops)
 * and returns the verdict that drops it. */
static __always_inline int drop(struct sluice_ctx *ctx, enum sluice_drop_reason reason)
{
	count_drop(reason, ctx_len(ctx));
	event_drop(ctx, reason);
	return CTX_ACT_DROP;
}

/* The verdict of a helper's result: a verdict as is, minus a drop reason as that drop. */
static __always_inline int verdict_or_drop(struct sluice_ctx *ctx, int ret)
{
	return ret < 0 ? drop(ctx, -ret) : ret;
}

#endif
