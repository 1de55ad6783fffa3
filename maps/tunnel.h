/* The other nodes, as the datapath reaches them (docs/routing.md): sluice_tunnel4 maps each other
 * node's pod CIDR, and its address, to that node's address. Tunnel mode encapsulates to it; native
 * mode routes a hit with the FIB. Written by the agent from the Node objects. */
#ifndef SLUICE_MAPS_TUNNEL_H
#define SLUICE_MAPS_TUNNEL_H

#include "node.h"
#include "types.h"

#define SLUICE_TUNNEL4_MAX_ENTRIES 16384

/* Every packet is sent with this VNI; the receiver ignores it (the source identity comes from the
 * receiver's ipcache, docs/policy.md). */
#define SLUICE_TUNNEL_VNI 1

enum sluice_tunnel_flags {
	/* The key is a node's pod CIDR (else it is a node's own address): traffic the node itself
	 * sends there is encapsulated too. */
	SLUICE_TUNNEL_F_POD_CIDR = 1 << 0,
};

/* Value of sluice_tunnel4 (BPF_MAP_TYPE_LPM_TRIE, key struct sluice_lpm4_key). */
struct sluice_tunnel4_entry {
	__be32 node_ip4; /* the node's underlay address, network order */
	__u8 flags;      /* enum sluice_tunnel_flags */
	__u8 pad[3];
};
SLUICE_ASSERT_SIZE(struct sluice_tunnel4_entry, 8);
SLUICE_ASSERT_OFFSET(struct sluice_tunnel4_entry, node_ip4, 0);
SLUICE_ASSERT_OFFSET(struct sluice_tunnel4_entry, flags, 4);

#endif
