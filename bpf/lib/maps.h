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

static __always_inline const struct sluice_node_config *node_config(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&sluice_node, &zero);
}

static __always_inline const struct sluice_endpoint *lookup_ep4(__be32 addr)
{
	struct sluice_ep4_key key = { .addr = addr };
	return bpf_map_lookup_elem(&sluice_ep4, &key);
}

#endif
