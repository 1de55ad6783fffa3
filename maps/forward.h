/* Forwarded packets: what each Sluice program lets pass or redirects, counted per CPU and
 * direction in sluice_forward (one array update per packet, bpf/lib/drop.h). */
#ifndef SLUICE_MAPS_FORWARD_H
#define SLUICE_MAPS_FORWARD_H

#include "types.h"

/* Which program forwarded the packet, named by where the packet goes. Numbers are ABI; append
 * before SLUICE_FWD_DIR_MAX. */
enum sluice_fwd_dir {
	SLUICE_FWD_POD_EGRESS = 0,  /* sluice_from_pod: what a pod sends */
	SLUICE_FWD_POD_INGRESS = 1, /* sluice_to_pod: what the node's stack delivers to a pod */
	SLUICE_FWD_NET_INGRESS = 2, /* sluice_from_net, sluice_from_overlay: from the network */
	SLUICE_FWD_NET_EGRESS = 3,  /* sluice_to_net: what leaves through the native device */
	SLUICE_FWD_NET_XDP = 4,     /* sluice_xdp_net: from the network, sent on at XDP */
	SLUICE_FWD_DIR_MAX = 5,     /* size of sluice_forward; keep last */
};

/* Value of sluice_forward (BPF_MAP_TYPE_PERCPU_ARRAY, key = enum sluice_fwd_dir). bytes is the
 * packet's length as the program hands it on (after any rewrite). */
struct sluice_fwd_count {
	__u64 packets;
	__u64 bytes;
};
SLUICE_ASSERT_SIZE(struct sluice_fwd_count, 16);

#if !defined(__bpf__)
/* Metric label (sluice_forward_packets_total{direction}) and sluicectl column. */
static inline const char *sluice_fwd_dir_name(unsigned int dir)
{
	switch (dir) {
	case SLUICE_FWD_POD_EGRESS: return "pod_egress";
	case SLUICE_FWD_POD_INGRESS: return "pod_ingress";
	case SLUICE_FWD_NET_INGRESS: return "net_ingress";
	case SLUICE_FWD_NET_EGRESS: return "net_egress";
	case SLUICE_FWD_NET_XDP: return "net_xdp";
	default: return (const char *)0;
	}
}
#endif

#endif
