/* Drops and forwards: every packet Sluice drops and every socket call it refuses is counted under
 * its reason and direction in the per-CPU sluice_drops array, by count_drop() and nothing else;
 * every packet a program lets pass or redirects is counted under the program's direction in
 * sluice_forward, by forwarded() and nothing else. Either is one array update per packet.
 * The return convention of bpf/lib: a helper returns a verdict (CTX_ACT_*, a redirect) or a small
 * enum of outcomes (>= 0), or minus a drop reason; only the entry files turn the latter into a
 * drop, with verdict_or_drop(), which also counts the forwarded ones. */
#ifndef SLUICE_BPF_DROP_H
#define SLUICE_BPF_DROP_H

#include "lib/events.h"
#include "lib/maps.h"

/* bench/monitor_bench's "counters as before" object builds the programs with
 * -DSLUICE_DIR_COUNTERS_COMPILED_OUT: drops are counted per reason only (direction ignored) and
 * nothing counts forwards, which is what the datapath did before sluice_forward. Production never
 * sets it. */
#ifdef SLUICE_DIR_COUNTERS_COMPILED_OUT
#define DROP_KEY(reason, dir) ((void)(dir), (__u32)(reason))
#else
#define DROP_KEY(reason, dir) SLUICE_DROP_KEY(reason, dir)
#endif

/* The drop direction of the packets a program forwards in direction `fwd` (maps/drop.h). */
static __always_inline enum sluice_drop_dir drop_dir_of(enum sluice_fwd_dir fwd)
{
	return fwd == SLUICE_FWD_POD_EGRESS || fwd == SLUICE_FWD_NET_EGRESS
		       ? SLUICE_DROP_DIR_EGRESS
		       : SLUICE_DROP_DIR_INGRESS;
}

/* bytes is what the dropped packet occupied; 0 for a refused socket call, which has none. */
static __always_inline void count_drop(enum sluice_drop_reason reason, enum sluice_drop_dir dir,
				       __u32 bytes)
{
	__u32 key = DROP_KEY(reason, dir);
	struct sluice_drop_count *count = bpf_map_lookup_elem(&sluice_drops, &key);

	if (count) {
		count->packets++;
		count->bytes += bytes;
	}
}

/* Counts the packet under reason (and reports it to the flow monitor when that asks for drops)
 * and returns the verdict that drops it. */
static __always_inline int drop(struct sluice_ctx *ctx, enum sluice_drop_reason reason,
				enum sluice_drop_dir dir)
{
	count_drop(reason, dir, ctx_len(ctx));
	event_drop(ctx, reason);
	return CTX_ACT_DROP;
}

/* Counts the packet as forwarded by a program of direction `fwd` and returns `verdict` (a pass or
 * a redirect). An answered packet (service_rejected, frag_needed) is counted as dropped and its
 * answer, which the program sends, as forwarded. */
static __always_inline int forwarded(struct sluice_ctx *ctx, enum sluice_fwd_dir fwd, int verdict)
{
#ifdef SLUICE_DIR_COUNTERS_COMPILED_OUT
	(void)ctx;
	(void)fwd;
#else
	__u32 key = fwd;
	struct sluice_fwd_count *count = bpf_map_lookup_elem(&sluice_forward, &key);

	if (count) {
		count->packets++;
		count->bytes += ctx_len(ctx);
	}
#endif
	return verdict;
}

/* The verdict of a helper's result in a program of direction `fwd`: a verdict as is (counted as
 * forwarded), minus a drop reason as that drop. */
static __always_inline int verdict_or_drop(struct sluice_ctx *ctx, int ret, enum sluice_fwd_dir fwd)
{
	return ret < 0 ? drop(ctx, -ret, drop_dir_of(fwd)) : forwarded(ctx, fwd, ret);
}

#endif
