/* Every Sluice map, declared once. SLUICE_MAPS(X) calls
 *   X(name, type, key, value, max_entries, map_flags)
 * for each map: bpf/lib/maps.h declares the BPF maps from it (the identifier is the map's name,
 * pinned as <bpffs root>/<name>), maps/sluice_maps.h makes the C++ name constants and key/value
 * types (maps::name::<name>, maps::spec::<name>), and loader/datapath.cc checks at compile time
 * that every BPF object has exactly these maps under exactly these names.
 * A map's name is ABI (its pin): a layout change is handled by the loader (the pin is replaced),
 * a rename is not. Kernel map names keep 15 characters (bpftool map list), pins the whole name. */
#ifndef SLUICE_MAPS_MAP_LIST_H
#define SLUICE_MAPS_MAP_LIST_H

#include <linux/bpf.h>

#include "conntrack.h"
#include "drop.h"
#include "endpoint.h"
#include "forward.h"
#include "events.h"
#include "frag.h"
#include "lb.h"
#include "nat.h"
#include "node.h"
#include "policy.h"
#include "sock_lb.h"
#include "tunnel.h"

/* The LB maps are written only by the agent, so they need no preallocation (which would cost
 * memory for a million entries up front); BPF only looks them up. */
#define SLUICE_MAPS(X)                                                                            \
	/* pod IPv4 -> its interface (endpoint.h) */                                               \
	X(sluice_ep4, BPF_MAP_TYPE_HASH, struct sluice_ep4_key, struct sluice_endpoint,            \
	  SLUICE_EP4_MAX_ENTRIES, 0)                                                               \
	/* sluice_ep4's direct-mapped index, read first: slot -> {addr, record} (endpoint.h) */    \
	X(sluice_ep4_slot, BPF_MAP_TYPE_ARRAY, __u32, struct sluice_ep4_ref, SLUICE_EP4_SLOTS,     \
	  BPF_F_MMAPABLE)                                                                          \
	/* ... and its records: copies of sluice_ep4 values (endpoint.h) */                        \
	X(sluice_ep4_rec, BPF_MAP_TYPE_ARRAY, __u32, struct sluice_endpoint, SLUICE_EP4_RECS, 0)   \
	/* this node's addressing, one entry (node.h) */                                           \
	X(sluice_node, BPF_MAP_TYPE_ARRAY, __u32, struct sluice_node_config, 1, 0)                 \
	/* destinations never masqueraded (node.h) */                                              \
	X(sluice_nomasq4, BPF_MAP_TYPE_LPM_TRIE, struct sluice_lpm4_key, __u8,                     \
	  SLUICE_NOMASQ4_MAX_ENTRIES, BPF_F_NO_PREALLOC)                                           \
	/* masquerade: pod flow tuple -> node address and port (nat.h) */                          \
	X(sluice_snat4, BPF_MAP_TYPE_LRU_HASH, struct sluice_nat4_key, struct sluice_nat4_entry,   \
	  SLUICE_NAT4_MAX_ENTRIES, 0)                                                              \
	/* masquerade replies: reply tuple -> pod address and port (nat.h) */                      \
	X(sluice_rnat4, BPF_MAP_TYPE_LRU_HASH, struct sluice_nat4_key, struct sluice_nat4_entry,   \
	  SLUICE_NAT4_MAX_ENTRIES, 0)                                                              \
	/* service frontends: master entries and backend slots (lb.h) */                           \
	X(sluice_lb4_svc, BPF_MAP_TYPE_HASH, struct sluice_lb4_key, struct sluice_lb4_service,     \
	  SLUICE_LB4_SVC_MAX_ENTRIES, BPF_F_NO_PREALLOC)                                           \
	/* service backends: backend id -> address, a slot array (lb.h, maps/slot_array.h) */      \
	X(sluice_lb4_be, BPF_MAP_TYPE_ARRAY, __u32, struct sluice_lb4_backend,                     \
	  SLUICE_LB4_BACKENDS_MAX_ENTRIES, BPF_F_MMAPABLE)                                         \
	/* service slot records: a frontend's backend ids as its master names them (lb.h) */       \
	X(sluice_lb4_rec, BPF_MAP_TYPE_ARRAY, __u32, struct sluice_lb4_slot_record,                \
	  SLUICE_LB4_REC_MAX_ENTRIES, 0)                                                           \
	/* service reverse NAT: rev_nat_id -> the frontend replies come from (lb.h) */             \
	X(sluice_lb4_rnat, BPF_MAP_TYPE_HASH, __u32, struct sluice_lb4_revnat,                     \
	  SLUICE_LB4_REVNAT_MAX_ENTRIES, BPF_F_NO_PREALLOC)                                        \
	/* ports no backend is on: a bitmap that spares non-service traffic the reverse NAT lookup \
	   (lb.h) */                                                                               \
	X(sluice_lb4_nbport, BPF_MAP_TYPE_ARRAY, __u32, __u32, SLUICE_LB4_NBPORT_WORDS, 0)          \
	/* loadBalancerSourceRanges per frontend (lb.h) */                                         \
	X(sluice_lb4_srcr, BPF_MAP_TYPE_LPM_TRIE, struct sluice_lb4_srcrange_key, __u8,            \
	  SLUICE_LB4_SRC_RANGES_MAX_ENTRIES, BPF_F_NO_PREALLOC)                                    \
	/* sessionAffinity ClientIP (lb.h) */                                                      \
	X(sluice_lb4_aff, BPF_MAP_TYPE_LRU_HASH, struct sluice_lb4_affinity_key,                   \
	  struct sluice_lb4_affinity, SLUICE_LB4_AFFINITY_MAX_ENTRIES, 0)                          \
	/* conntrack of balanced and policy-tracked TCP flows, never evicted (conntrack.h);        \
	   memory taken per entry as flows come (an insert costs ~90 ns less than from a           \
	   preallocated free list, bench/README.md); max_entries still bounds it */                \
	X(sluice_ct4, BPF_MAP_TYPE_HASH, struct sluice_ct4_key, struct sluice_ct4_entry,           \
	  SLUICE_CT4_MAX_ENTRIES, BPF_F_NO_PREALLOC)                                               \
	/* conntrack of every other protocol's flows, LRU (conntrack.h) */                         \
	X(sluice_ct4_any, BPF_MAP_TYPE_LRU_HASH, struct sluice_ct4_key, struct sluice_ct4_entry,   \
	  SLUICE_CT4_ANY_MAX_ENTRIES, 0)                                                           \
	/* later IPv4 fragments: datagram -> its first fragment's L4 fields (frag.h) */            \
	X(sluice_frag4, BPF_MAP_TYPE_LRU_HASH, struct sluice_frag4_key, struct sluice_frag4_entry, \
	  SLUICE_FRAG4_MAX_ENTRIES, 0)                                                             \
	/* conntrack counters: created entries, refused inserts, per map (conntrack.h) */          \
	X(sluice_ct_stats, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, __u64, SLUICE_CT_STAT_MAX, 0)         \
	/* whether flows with a forward and a reply entry may exist (conntrack.h) */              \
	X(sluice_ct_pairs, BPF_MAP_TYPE_ARRAY, __u32, __u64, SLUICE_CT_PAIRS_SLOTS, 0)             \
	/* conntrack's clock: the coarse time cached per CPU and jiffy (conntrack.h) */           \
	X(sluice_ct_clock, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct sluice_ct_clock, 1, 0)         \
	/* drop counters per reason and direction (drop.h) */                                      \
	X(sluice_drops, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct sluice_drop_count,                \
	  SLUICE_DROP_KEYS, 0)                                                                     \
	/* forwarded packets and bytes per direction (forward.h) */                                \
	X(sluice_forward, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct sluice_fwd_count,               \
	  SLUICE_FWD_DIR_MAX, 0)                                                                   \
	/* socket LB: the network namespace it acts in, one entry (sock_lb.h) */                   \
	X(sluice_sock_cfg, BPF_MAP_TYPE_ARRAY, __u32, struct sluice_sock_config, 1, 0)             \
	/* socket LB reverse translation: socket + backend -> frontend (sock_lb.h) */              \
	X(sluice_sock4_rnat, BPF_MAP_TYPE_LRU_HASH, struct sluice_sock4_revnat_key,                \
	  struct sluice_sock4_revnat, SLUICE_SOCK4_REVNAT_MAX_ENTRIES, 0)                          \
	/* NetworkPolicy: address -> security identity (policy.h) */                               \
	X(sluice_ipcache4, BPF_MAP_TYPE_LPM_TRIE, struct sluice_lpm4_key,                          \
	  struct sluice_ipcache4_entry, SLUICE_IPCACHE4_MAX_ENTRIES, BPF_F_NO_PREALLOC)            \
	/* NetworkPolicy: allowed (endpoint, peer identity, direction, proto, port prefix) */      \
	X(sluice_policy4, BPF_MAP_TYPE_LPM_TRIE, struct sluice_policy4_key,                        \
	  struct sluice_policy4_entry, SLUICE_POLICY4_MAX_ENTRIES, BPF_F_NO_PREALLOC)              \
	/* NetworkPolicy: endpoint id -> own identity, enforced directions (policy.h) */           \
	X(sluice_policy_ep, BPF_MAP_TYPE_ARRAY, __u32, struct sluice_policy_ep_entry,              \
	  SLUICE_POLICY_EP_MAX_ENTRIES, BPF_F_MMAPABLE)                                            \
	/* NetworkPolicy: policy_denied drops per endpoint and direction (policy.h) */             \
	X(sluice_pol_drops, BPF_MAP_TYPE_LRU_PERCPU_HASH, struct sluice_policy_drop_key,           \
	  struct sluice_drop_count, SLUICE_POL_DROPS_MAX_ENTRIES, 0)                               \
	/* other nodes: pod CIDR or node address -> node address (tunnel.h) */                     \
	X(sluice_tunnel4, BPF_MAP_TYPE_LPM_TRIE, struct sluice_lpm4_key,                           \
	  struct sluice_tunnel4_entry, SLUICE_TUNNEL4_MAX_ENTRIES, BPF_F_NO_PREALLOC)               \
	/* flow monitor: datapath events, read by the agent while someone observes (events.h) */   \
	X(sluice_events, BPF_MAP_TYPE_RINGBUF, struct sluice_ringbuf_none,                         \
	  struct sluice_ringbuf_none, SLUICE_EVENTS_RINGBUF_BYTES, 0)                              \
	/* flow monitor: which events the datapath emits, sampling, rate limit (events.h) */       \
	X(sluice_monitor, BPF_MAP_TYPE_ARRAY, __u32, struct sluice_monitor_config, 1, 0)           \
	/* flow monitor: per-CPU token bucket, emitted and lost events (events.h) */               \
	X(sluice_mon_cpu, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct sluice_monitor_cpu, 1, 0)

/* Maps of maps, declared apart (BPF declares their inner map too):
 *   X(name, outer type, key, inner type, inner value, max_entries, inner map_flags)
 * The outer map's value is an inner map's fd when written, its id when read. */
#define SLUICE_MAPS_OF_MAPS(X)                                                                    \
	/* Maglev tables of frontends with SLUICE_SVC_F_MAGLEV: master key -> table (lb.h) */      \
	X(sluice_lb4_mag, BPF_MAP_TYPE_HASH_OF_MAPS, struct sluice_lb4_key, BPF_MAP_TYPE_ARRAY,    \
	  __u32, SLUICE_LB4_MAGLEV_MAX_ENTRIES, BPF_F_INNER_MAP)

#endif
