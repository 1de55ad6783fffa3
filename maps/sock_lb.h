/* Socket-level load balancing of the node's own (host-network) sockets: which network namespace
 * the cgroup programs act in, and the per-socket reverse translation that makes replies and
 * getpeername() show the service frontend instead of the backend. */
#ifndef SLUICE_MAPS_SOCK_LB_H
#define SLUICE_MAPS_SOCK_LB_H

#include "types.h"

#define SLUICE_SOCK4_REVNAT_MAX_ENTRIES 262144

/* Pins of the cgroup links, under <bpffs root>/links/. Removing a pin (or the whole bpffs) detaches
 * its program. */
#define SLUICE_LINKS_DIR "links"
#define SLUICE_LINK_SOCK_CONNECT4 "sluice_sock_connect4"
#define SLUICE_LINK_SOCK_SENDMSG4 "sluice_sock_sendmsg4"
#define SLUICE_LINK_SOCK_RECVMSG4 "sluice_sock_recvmsg4"
#define SLUICE_LINK_SOCK_GETPEERNAME4 "sluice_sock_getpeername4"

/* Value of sluice_sock_cfg (BPF_MAP_TYPE_ARRAY, one entry, key 0). The programs are attached to a
 * cgroup that may hold processes of other network namespaces (other lab nodes, pods sharing the
 * hierarchy): they translate only sockets of the namespace whose cookie is here. */
struct sluice_sock_config {
	__u64 netns_cookie; /* SO_NETNS_COOKIE of the node's namespace; 0: translate nothing */
};
SLUICE_ASSERT_SIZE(struct sluice_sock_config, 8);

/* Key of sluice_sock4_rnat (BPF_MAP_TYPE_LRU_HASH): a translated socket and the backend it was
 * sent to. */
struct sluice_sock4_revnat_key {
	__u64 cookie; /* bpf_get_socket_cookie() */
	__be32 addr;  /* backend */
	__be16 port;
	__u16 pad;
};
SLUICE_ASSERT_SIZE(struct sluice_sock4_revnat_key, 16);
SLUICE_ASSERT_OFFSET(struct sluice_sock4_revnat_key, addr, 8);
SLUICE_ASSERT_OFFSET(struct sluice_sock4_revnat_key, port, 12);

/* Value of sluice_sock4_rnat: the frontend the application addressed. */
struct sluice_sock4_revnat {
	__be32 addr;
	__be16 port;
	__u16 pad;
	__u32 rev_nat_id; /* the service's sluice_lb4_rnat key, for inspection */
};
SLUICE_ASSERT_SIZE(struct sluice_sock4_revnat, 12);
SLUICE_ASSERT_OFFSET(struct sluice_sock4_revnat, rev_nat_id, 8);

#endif
