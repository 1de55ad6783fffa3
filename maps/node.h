/* This node's addressing as the datapath needs it: one entry in sluice_node, written by the agent
 * before any program is attached, plus the LPM of destinations that are never masqueraded. */
#ifndef SLUICE_MAPS_NODE_H
#define SLUICE_MAPS_NODE_H

#include "types.h"

#define SLUICE_NOMASQ4_MAX_ENTRIES 1024

enum sluice_node_flags {
	SLUICE_NODE_F_MASQUERADE = 1 << 0, /* masquerade pod traffic leaving the node */
};

/* skb->mark of a packet Sluice's programs sent on themselves: routed out of a device after a FIB
 * lookup (bpf_redirect / bpf_redirect_neigh) or into the VXLAN device, whose encapsulated packet
 * keeps it. The native device's sluice_to_net has nothing left to decide for such a packet and
 * only clears the mark, so it never leaves the node. A redirect after a FIB lookup bypasses
 * netfilter; the overlay's packet passes the node's OUTPUT and POSTROUTING hooks with it. A
 * crossing into a pod's namespace scrubs it. */
#define SLUICE_SKB_MARK_ROUTED 0x51c0f00dU

/* skb->mark of a packet Sluice redirected to the host veth of a pod with an ingress limit
 * (SLUICE_EP_F_INGRESS_SHAPED) after judging it at the pod's ingress policy point: that veth's
 * sluice_to_pod lets it by unjudged a second time, clearing the mark, and its qdisc shapes it. */
#define SLUICE_SKB_MARK_TO_SHAPED_POD 0x51c0f00eU

/* Value of sluice_node (BPF_MAP_TYPE_ARRAY, one entry at key 0). Addresses in network order,
 * ports in host order. */
struct sluice_node_config {
	__be32 node_ip4;      /* address pod traffic is masqueraded to */
	__be32 pod_cidr4;     /* this node's pod CIDR, network address */
	__be32 gateway_ip4;   /* the pods' default gateway */
	__u8 pod_cidr4_len;
	__u8 flags;           /* enum sluice_node_flags */
	__u16 nat_port_min;   /* masquerade source-port range, inclusive */
	__u16 nat_port_max;
	__u16 pad;
	__be32 service_cidr4; /* ClusterIP range, network address (0/0: unknown) */
	__u8 service_cidr4_len;
	__u8 pad2[3];
	__u32 tunnel_ifindex; /* tunnel mode: the collect_md VXLAN device; 0: native routing */
	__u16 tunnel_mtu;     /* tunnel mode: the largest packet sent into it unfragmented */
	__u16 tunnel_port;    /* tunnel mode: the overlay's UDP port (VXLAN) on node addresses;
				 0 (native routing, or an agent from before this field) */
};
SLUICE_ASSERT_SIZE(struct sluice_node_config, 36);
SLUICE_ASSERT_OFFSET(struct sluice_node_config, tunnel_mtu, 32);
SLUICE_ASSERT_OFFSET(struct sluice_node_config, tunnel_port, 34);
SLUICE_ASSERT_OFFSET(struct sluice_node_config, tunnel_ifindex, 28);
SLUICE_ASSERT_OFFSET(struct sluice_node_config, service_cidr4, 20);
SLUICE_ASSERT_OFFSET(struct sluice_node_config, node_ip4, 0);
SLUICE_ASSERT_OFFSET(struct sluice_node_config, pod_cidr4, 4);
SLUICE_ASSERT_OFFSET(struct sluice_node_config, gateway_ip4, 8);
SLUICE_ASSERT_OFFSET(struct sluice_node_config, pod_cidr4_len, 12);
SLUICE_ASSERT_OFFSET(struct sluice_node_config, nat_port_min, 14);

/* Key of sluice_nomasq4 (BPF_MAP_TYPE_LPM_TRIE): destinations reached without masquerade.
 * The agent always inserts the pod CIDR. */
struct sluice_lpm4_key {
	__u32 prefixlen;
	__be32 addr;
};
SLUICE_ASSERT_SIZE(struct sluice_lpm4_key, 8);

#endif
