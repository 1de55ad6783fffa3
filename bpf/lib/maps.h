/* BPF-side definitions of every Sluice map, made from the one list in maps/map_list.h (keys,
 * values, names, sizes and flags come from maps/). Every map is pinned by name under the loader's
 * bpffs root, so all programs share one instance and a restarted agent finds the same maps. Every
 * object defines all of them, whichever it uses. */
#ifndef SLUICE_BPF_MAPS_H
#define SLUICE_BPF_MAPS_H

#include "lib/common.h"
#include "maps/map_list.h"

#define SLUICE_BPF_MAP(name_, type_, key_, value_, max_entries_, map_flags_) \
	struct {                                                            \
		__uint(type, type_);                                        \
		__type(key, key_);                                          \
		__type(value, value_);                                      \
		__uint(max_entries, max_entries_);                          \
		__uint(map_flags, map_flags_);                              \
		__uint(pinning, LIBBPF_PIN_BY_NAME);                        \
	} name_ SEC(".maps");

SLUICE_MAPS(SLUICE_BPF_MAP)

/* The inner map is a template: BPF_F_INNER_MAP lets the agent's inner maps have any size. */
#define SLUICE_BPF_MAP_OF_MAPS(name_, type_, key_, inner_type_, inner_value_, max_entries_, \
			       inner_flags_)                                                \
	struct name_##_inner {                                                              \
		__uint(type, inner_type_);                                                  \
		__type(key, __u32);                                                         \
		__type(value, inner_value_);                                                \
		__uint(max_entries, 1);                                                     \
		__uint(map_flags, inner_flags_);                                            \
	};                                                                                  \
	struct {                                                                            \
		__uint(type, type_);                                                        \
		__type(key, key_);                                                          \
		__uint(max_entries, max_entries_);                                          \
		__uint(map_flags, BPF_F_NO_PREALLOC);                                       \
		__uint(pinning, LIBBPF_PIN_BY_NAME);                                        \
		__array(values, struct name_##_inner);                                      \
	} name_ SEC(".maps");

SLUICE_MAPS_OF_MAPS(SLUICE_BPF_MAP_OF_MAPS)

static __always_inline const struct sluice_node_config *node_config(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&sluice_node, &zero);
}

/* The local endpoint of addr, or NULL when addr is no local pod: through its slot of
 * sluice_ep4_slot and the record it names (two array lookups, inlined), else through the
 * sluice_ep4 hash (maps/endpoint.h). The slot is read in one load, so its address and record
 * belong together, and the record is read through the slot's value (an address dependency: read
 * after it). Record 0 is never named, so a free slot (all zero) matches no address.
 * The answer points into one map or the other, and the verifier follows what comes after once
 * for each: callers read the fields they need at once and let the pointer go (measured: kept
 * across the load balancing, it doubled the instructions verified). lookup_ep4_exists is the
 * question alone. */
static __always_inline const struct sluice_endpoint *lookup_ep4(__be32 addr)
{
	__u32 index = bpf_ntohl(addr) & (SLUICE_EP4_SLOTS - 1);
	struct sluice_ep4_key key = { .addr = addr };
	const __u64 *slot;
	struct sluice_ep4_ref s;
	__u64 bits;

	slot = bpf_map_lookup_elem(&sluice_ep4_slot, &index);
	if (slot) {
		bits = *(const volatile __u64 *)slot;
		__builtin_memcpy(&s, &bits, sizeof(s));
		if (s.addr == addr && s.rec) {
			const struct sluice_endpoint *ep = bpf_map_lookup_elem(&sluice_ep4_rec, &s.rec);

			if (ep)
				return ep;
		}
	}
	return bpf_map_lookup_elem(&sluice_ep4, &key);
}

/* Whether addr is a local pod's, as a plain number (no pointer for the verifier to follow). */
static __always_inline int lookup_ep4_exists(__be32 addr)
{
	int found = lookup_ep4(addr) != NULL;

	barrier_var(found);
	return found;
}

#endif
