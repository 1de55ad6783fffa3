/* cgroup sock_addr hooks: socket-level load balancing for the node's host-network processes
 * (the kubelet, node agents). connect4 covers TCP and connected UDP, sendmsg4 unconnected UDP;
 * recvmsg4 and getpeername4 translate back, so the application only ever sees the frontend. */
#include "lib/ctx/skb.h"
#include "lib/sock_lb.h"

/* A refused socket fails with ECONNREFUSED (bpf_set_retval), not the default EPERM of a 0
 * verdict, like a connection to a port nobody listens on. */
static __always_inline int sock_verdict(int err)
{
	if (!err)
		return SOCK_PROCEED;
	bpf_set_retval(err);
	return SOCK_REJECT;
}

SEC("cgroup/connect4")
int sluice_connect4(struct bpf_sock_addr *ctx)
{
	return sock_verdict(sock4_xlate_fwd(ctx));
}

SEC("cgroup/sendmsg4")
int sluice_sendmsg4(struct bpf_sock_addr *ctx)
{
	return sock_verdict(sock4_xlate_fwd(ctx));
}

SEC("cgroup/recvmsg4")
int sluice_recvmsg4(struct bpf_sock_addr *ctx)
{
	sock4_xlate_rev(ctx);
	return SOCK_PROCEED;
}

SEC("cgroup/getpeername4")
int sluice_getpeer4(struct bpf_sock_addr *ctx)
{
	sock4_xlate_rev(ctx);
	return SOCK_PROCEED;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
