/* Socket-level load balancing of the node's own sockets: connect()/sendmsg() to a service
 * frontend are given a backend before any packet exists, and recvmsg()/getpeername() show the
 * frontend again, so host-network clients never see (or need NAT for) the backend's address. */
#ifndef SLUICE_BPF_SOCK_LB_H
#define SLUICE_BPF_SOCK_LB_H

#include <linux/errno.h>

#include "lib/lb.h"

#define SOCK_PROCEED 1
#define SOCK_REJECT 0

/* The programs hang off a cgroup shared with other namespaces (other lab nodes, pods): only the
 * node's namespace, as the agent recorded it, is translated. */
static __always_inline int sock_in_node_netns(struct bpf_sock_addr *ctx)
{
	const struct sluice_sock_config *cfg;
	__u32 zero = 0;

	cfg = bpf_map_lookup_elem(&sluice_sock_cfg, &zero);
	return cfg && cfg->netns_cookie && cfg->netns_cookie == bpf_get_netns_cookie(ctx);
}

/* A refused connect()/sendmsg() carries no packet: it counts as one with no bytes. */
static __always_inline void sock_count_reject(enum sluice_drop_reason reason)
{
	count_drop(reason, SLUICE_DROP_DIR_EGRESS, 0);
}

/* sessionAffinity ClientIP and source ranges: host-network sockets have no source address yet
 * at connect(); the node's address stands for all of them (it is what a backend sees of them). */
static __always_inline __be32 sock_client_addr(const struct sluice_node_config *node)
{
	return node ? node->node_ip4 : 0;
}

/* connect() of TCP or UDP, and sendmsg() of unconnected UDP, to a service frontend: the
 * destination becomes a backend, chosen as the TC path chooses one for a new flow (lb4_frontend,
 * lb4_select). Returns 0 (translated, or not a frontend this node balances for its own sockets)
 * or minus the errno the system call fails with. */
static __always_inline int sock4_xlate_fwd(struct bpf_sock_addr *ctx)
{
	const struct sluice_node_config *node;
	struct sluice_sock4_revnat_key rkey = {};
	struct sluice_sock4_revnat rval = {};
	const struct sluice_lb4_backend *be = NULL;
	const struct sluice_lb4_service *svc = NULL;
	struct sluice_lb4_key key;
	struct ct4_pkt p = {};
	__u32 backend_id = 0;
	__be32 client;
	__u8 proto;
	int ret;

	proto = ctx->protocol;
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return 0;
	if (!sock_in_node_netns(ctx))
		return 0;

	node = node_config();
	p.key.daddr = ctx->user_ip4;
	p.key.dport = (__be16)ctx->user_port;
	p.key.proto = proto;
	ret = lb4_frontend(&p, node, &key, &svc);
	if (ret == LB4_NONE)
		return 0;
	if (ret == LB4_REJECT) {
		sock_count_reject(SLUICE_DROP_SERVICE_REJECTED);
		return -ECONNREFUSED;
	}
	if (ret < 0) {
		/* A service-range address no Service has: no route to it, at once. */
		sock_count_reject(-ret);
		return -EHOSTUNREACH;
	}
	if (!svc)
		return 0;
	lb4_in_cluster(&key, &svc);
	/* NodePort frontends are this node's own addresses: translated here too, as no packet of
	 * a local connection to them passes a TC hook. */

	client = sock_client_addr(node);
	if (!lb4_source_allowed(svc, client)) {
		sock_count_reject(SLUICE_DROP_SOURCE_RANGE);
		return -ECONNREFUSED;
	}
	if (svc->flags & SLUICE_SVC_F_REJECT) {
		sock_count_reject(SLUICE_DROP_SERVICE_REJECTED);
		return -ECONNREFUSED;
	}
	/* No client port at connect() yet (an unbound socket gets one later), and one node's
	 * sockets need no agreement with other nodes: a Maglev frontend picks at random here. */
	ret = lb4_select(&key, svc, client, 0, 0, &backend_id, &be);
	if (ret < 0 || !be) {
		sock_count_reject(ret < 0 ? -ret : SLUICE_DROP_SERVICE_NO_BACKEND);
		return -ECONNREFUSED;
	}

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.addr = be->addr;
	rkey.port = be->port;
	rval.addr = key.addr;
	rval.port = key.dport;
	rval.rev_nat_id = svc->rev_nat_id;
	/* Only fails when the LRU cannot allocate: the socket then works but shows the backend. */
	bpf_map_update_elem(&sluice_sock4_rnat, &rkey, &rval, BPF_ANY);

	ctx->user_ip4 = be->addr;
	ctx->user_port = (__u32)be->port;
	return 0;
}

/* recvmsg() source and getpeername() of a translated socket: the backend reads as the frontend. */
static __always_inline void sock4_xlate_rev(struct bpf_sock_addr *ctx)
{
	struct sluice_sock4_revnat_key rkey = {};
	const struct sluice_sock4_revnat *rval;

	if (!sock_in_node_netns(ctx))
		return;
	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.addr = ctx->user_ip4;
	rkey.port = (__be16)ctx->user_port;
	rval = bpf_map_lookup_elem(&sluice_sock4_rnat, &rkey);
	if (!rval)
		return;
	ctx->user_ip4 = rval->addr;
	ctx->user_port = (__u32)rval->port;
}

#endif
