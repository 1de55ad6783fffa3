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

/* The local endpoint of addr, or NULL when addr is no local pod: through its slot of
 * sluice_ep4_slot and the record it names (two array lookups, inlined), else through the
 * sluice_ep4 hash (maps/endpoint.h). The slot is read in one load, so its address and record
 * belong together, and the record is read through the slot's value (an address dependency: read
 * after it). Record 0 is never named, so a free slot (all zero) matches no address.
 * The answer is a copy in this CPU's sluice_ep4_copy[which] (SLUICE_EP4_COPY_*: endpoints a
 * program holds at once use different ones), valid until the next lookup into the same one. The
 * copy is for the verifier: a pointer into either map would make it follow every later
 * instruction once per map, and a copy on the stack makes it track every field (measured: twice
 * the instructions verified, either way); a copy in a map value is one pointer whichever map
 * answered, with fields it does not track. */
static __always_inline const struct sluice_endpoint *lookup_ep4(__be32 addr, __u32 which)
{
	__u32 index = bpf_ntohl(addr) & (SLUICE_EP4_SLOTS - 1);
	struct sluice_ep4_key key = { .addr = addr };
	const struct sluice_endpoint *ep = NULL;
	struct sluice_endpoint *copy;
	const __u64 *slot;
	struct sluice_ep4_ref s;
	__u64 bits;

	copy = bpf_map_lookup_elem(&sluice_ep4_copy, &which);
	if (!copy)
		return NULL;
	slot = bpf_map_lookup_elem(&sluice_ep4_slot, &index);
	if (slot) {
		bits = *(const volatile __u64 *)slot;
		__builtin_memcpy(&s, &bits, sizeof(s));
		if (s.addr == addr && s.rec)
			ep = bpf_map_lookup_elem(&sluice_ep4_rec, &s.rec);
	}
	if (!ep)
		ep = bpf_map_lookup_elem(&sluice_ep4, &key);
	if (!ep)
		return NULL;
	*copy = *ep;
	return copy;
}

#endif
