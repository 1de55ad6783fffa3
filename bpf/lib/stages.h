/* Stages: a hook's program is a short chain of programs joined by tail calls through its object's
 * own program array, each verified on its own (docs/architecture.md, "Stages"). This file owns the
 * slots of the pod hook's array, the per-CPU scratch entry in which one stage hands the next what
 * it found, and the call that moves to the next stage. */
#ifndef SLUICE_BPF_STAGES_H
#define SLUICE_BPF_STAGES_H

#include "lib/drop.h"
#include "lib/parse.h"
#include "lib/policy.h"
#include "maps/stages.h"

/* What an IPv4 stage hands the next: the packet as parsed (and as the Service stage rewrote it);
 * in sluice_from_pod also the flow as the pod sent it, the pod's endpoint id, and what the stages
 * before decided. Valid from the stage's write until the next stage's read: the stages of one
 * packet run back to back on one CPU and nothing else runs between them there. */
struct stage4_state {
	struct pkt4 pkt;
	struct policy4_flow sent; /* policy4_flow_of before any translation */
	__u32 src_id;		  /* the sending pod's endpoint id */
	__s32 lb;		  /* enum lb4_result of the Service stage (LB4_NONE before it) */
	__u32 local_dst;	  /* the destination was a pod of this node before translation */
	__u32 pad;
};

/* One entry per CPU, private to the object (not pinned): what a stage hands the next. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct stage4_state);
	__uint(max_entries, 1);
} sluice_stage4 SEC(".maps");

static __always_inline struct stage4_state *stage4_state(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&sluice_stage4, &zero);
}

/* Moves the packet to the program in `slot` of `stages`, which returns its verdict; returns only
 * when that slot is empty (or the chain is too long), as the drop of a missing stage. */
#define stage_call(ctx, stages, slot)                                                              \
	({                                                                                         \
		bpf_tail_call(ctx, stages, slot);                                                  \
		-SLUICE_DROP_MISSING_STAGE;                                                        \
	})

#endif
