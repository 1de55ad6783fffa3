/* IPv4 fragments of translated flows: only a datagram's first fragment carries its L4 header, so
 * every program that parses a first fragment remembers the L4 fields it read (ports, or the ICMP
 * echo type and id) under the datagram's (saddr, daddr, proto, IP id) as they are on the wire at
 * that point; the later fragments of the datagram take them from here and so follow the same
 * conntrack, service and masquerade entries as the first (each fragment is then rewritten in its
 * IPv4 header only: it has no L4 header). Written and read by the datapath only; an LRU hash, a
 * datagram's entry is pushed out by newer ones (the agent never writes it). */
#ifndef SLUICE_MAPS_FRAG_H
#define SLUICE_MAPS_FRAG_H

#include "types.h"

#define SLUICE_FRAG4_MAX_ENTRIES 8192 /* datagrams in flight (default; --bpf_frag_max) */

/* Key of sluice_frag4 (BPF_MAP_TYPE_LRU_HASH): a datagram as the program sees it. */
struct sluice_frag4_key {
	__be32 saddr;
	__be32 daddr;
	__be16 id;   /* the IPv4 identification field */
	__u8 proto;
	__u8 pad;
};
SLUICE_ASSERT_SIZE(struct sluice_frag4_key, 12);
SLUICE_ASSERT_OFFSET(struct sluice_frag4_key, id, 8);
SLUICE_ASSERT_OFFSET(struct sluice_frag4_key, proto, 10);

enum sluice_frag4_flags {
	SLUICE_FRAG4_F_PORTS = 1 << 0, /* TCP/UDP/SCTP: sport and dport */
	SLUICE_FRAG4_F_ICMP = 1 << 1,  /* ICMP: icmp_type and icmp_id */
};

/* Value of sluice_frag4: the L4 fields of the datagram's first fragment, network order. */
struct sluice_frag4_entry {
	__be16 sport;
	__be16 dport;
	__be16 icmp_id;
	__u8 icmp_type;
	__u8 flags; /* enum sluice_frag4_flags */
};
SLUICE_ASSERT_SIZE(struct sluice_frag4_entry, 8);
SLUICE_ASSERT_OFFSET(struct sluice_frag4_entry, icmp_id, 4);

#endif
