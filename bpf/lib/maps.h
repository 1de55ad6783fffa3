/* BPF-side definitions of Sluice's maps. Keys, values, names and sizes come from maps/; every
 * map is pinned by name under the loader's bpffs root, so all programs share one instance and a
 * restarted agent finds the same maps. */
#ifndef SLUICE_BPF_MAPS_H
#define SLUICE_BPF_MAPS_H

#include "lib/common.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct sluice_ep4_key);
	__type(value, struct sluice_endpoint);
	__uint(max_entries, SLUICE_EP4_MAX_ENTRIES);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_ep4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct sluice_node_config);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_node SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct sluice_lpm4_key);
	__type(value, __u8);
	__uint(max_entries, SLUICE_NOMASQ4_MAX_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_nomasq4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct sluice_nat4_key);
	__type(value, struct sluice_nat4_entry);
	__uint(max_entries, SLUICE_NAT4_MAX_ENTRIES);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_snat4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct sluice_nat4_key);
	__type(value, struct sluice_nat4_entry);
	__uint(max_entries, SLUICE_NAT4_MAX_ENTRIES);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_rnat4 SEC(".maps");

/* The LB maps are written only by the agent, so they need no preallocation (which would cost
 * memory for a million entries up front); BPF only looks them up. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct sluice_lb4_key);
	__type(value, struct sluice_lb4_service);
	__uint(max_entries, SLUICE_LB4_SVC_MAX_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_lb4_svc SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct sluice_lb4_backend);
	__uint(max_entries, SLUICE_LB4_BACKENDS_MAX_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_lb4_be SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct sluice_lb4_revnat);
	__uint(max_entries, SLUICE_LB4_REVNAT_MAX_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_lb4_rnat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct sluice_lb4_srcrange_key);
	__type(value, __u8);
	__uint(max_entries, SLUICE_LB4_SRC_RANGES_MAX_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_lb4_srcr SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct sluice_lb4_affinity_key);
	__type(value, struct sluice_lb4_affinity);
	__uint(max_entries, SLUICE_LB4_AFFINITY_MAX_ENTRIES);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_lb4_aff SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct sluice_ct4_key);
	__type(value, struct sluice_ct4_entry);
	__uint(max_entries, SLUICE_CT4_MAX_ENTRIES);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_ct4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct sluice_drop_count);
	__uint(max_entries, SLUICE_DROP_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_drops SEC(".maps");

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
