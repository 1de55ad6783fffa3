/* The record tests/bpf/tunnel_probe.bpf.c leaves in its .bss, read by overlay_priv_test.cc. */
#ifndef SLUICE_TESTS_TUNNEL_PROBE_H
#define SLUICE_TESTS_TUNNEL_PROBE_H

#include <linux/types.h>

/* The last run's verdict and the tunnel key on the packet (get_ret < 0: none). */
struct tunnel_probe_out {
	__s32 verdict;
	__s32 get_ret;
	/* The outer destination, host order. The helper is made for received packets: it reports
	 * the header's destination as local_ipv4 (and its source as remote_ipv4), so for a key set
	 * to send with, local_ipv4 is where the packet goes. */
	__u32 remote_ipv4;
	__u32 tunnel_id;
	__u32 tunnel_ttl;
};

#endif
