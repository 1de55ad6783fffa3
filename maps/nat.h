/* Masquerade state: pod flows leaving through the native device get the node address and a
 * source port allocated in BPF; replies are translated back through the reverse map. */
#ifndef SLUICE_MAPS_NAT_H
#define SLUICE_MAPS_NAT_H

#include "types.h"

#define SLUICE_NAT4_MAX_ENTRIES 131072

/* A tuple as it is seen on the wire at the native device. For ICMP echo, sport carries the echo
 * identifier and dport is 0. */
struct sluice_nat4_key {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};
SLUICE_ASSERT_SIZE(struct sluice_nat4_key, 16);
SLUICE_ASSERT_OFFSET(struct sluice_nat4_key, sport, 8);
SLUICE_ASSERT_OFFSET(struct sluice_nat4_key, proto, 12);

/* Value of both maps (BPF_MAP_TYPE_LRU_HASH): the address and port to write. */
struct sluice_nat4_entry {
	__be32 addr;
	__be16 port;
	__u16 pad;
	__u64 created_ns;  /* bpf_ktime_get_ns() at allocation */
};
SLUICE_ASSERT_SIZE(struct sluice_nat4_entry, 16);
SLUICE_ASSERT_OFFSET(struct sluice_nat4_entry, port, 4);

#endif
