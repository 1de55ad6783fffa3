/* Masquerade state: pod flows leaving through the native device get the node address and a
 * source port allocated in BPF; replies are translated back through the reverse map. */
#ifndef SLUICE_MAPS_NAT_H
#define SLUICE_MAPS_NAT_H

#include "conntrack.h"
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

/* A mapping lives and dies with its flow: each direction's entry records the flow's TCP state as
 * conntrack does (SLUICE_CT_F_ESTABLISHED once a reply came back, SLUICE_CT_F_CLOSING once a FIN
 * or RST passed either way; maps/conntrack.h) and its last packet; the agent's GC
 * (agent/conntrack/gc) deletes both entries when the flow's conntrack timeout has passed, and,
 * under port pressure, frees closed TCP mappings early, oldest first. */
enum sluice_nat_flags {
	SLUICE_NAT_F_STATEFUL = 1 << 7, /* written by programs that keep that state; an entry
					   without it (older programs) has no state and its
					   allocation time in last_seen_ns: its TCP flow is taken as
					   established */
};

/* Value of both maps (BPF_MAP_TYPE_LRU_HASH): the address and port to write, and the flow's
 * state as this direction saw it. */
struct sluice_nat4_entry {
	__be32 addr;
	__be16 port;
	__u8 flags;          /* SLUICE_CT_F_ESTABLISHED, SLUICE_CT_F_CLOSING, SLUICE_NAT_F_STATEFUL */
	__u8 pad;
	__u64 last_seen_ns;  /* CLOCK_MONOTONIC_COARSE ns of the last packet this way
				(sluice_ct_now); older programs wrote the allocation time here */
};
SLUICE_ASSERT_SIZE(struct sluice_nat4_entry, 16);
SLUICE_ASSERT_OFFSET(struct sluice_nat4_entry, port, 4);
SLUICE_ASSERT_OFFSET(struct sluice_nat4_entry, flags, 6);
SLUICE_ASSERT_OFFSET(struct sluice_nat4_entry, last_seen_ns, 8);

/* The key of a mapping's reply entry (sluice_rnat4) from its leaving entry's key (sluice_snat4)
 * and the node address and port that tuple was given: the remote answers them. The datapath
 * writes and finds reply entries by it; the agent's GC and sluicectl pair the two entries by it. */
static inline void sluice_nat4_reply_key(struct sluice_nat4_key *r, const struct sluice_nat4_key *k,
					 __be32 node_addr, __be16 node_port)
{
	r->saddr = k->daddr;
	r->daddr = node_addr;
	r->sport = k->dport;
	r->dport = node_port;
	r->proto = k->proto;
	r->pad[0] = 0;
	r->pad[1] = 0;
	r->pad[2] = 0;
}

#endif
