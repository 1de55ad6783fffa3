/* Headers, constants and small packet-access helpers every Sluice program uses.
 * Kernel UAPI headers only (no vmlinux.h): the one kernel-internal field the programs read, the
 * skb's checksum state, is declared for CO-RE in lib/ctx/skb.h. */
#ifndef SLUICE_BPF_COMMON_H
#define SLUICE_BPF_COMMON_H

/* The context lib/ is built for: an entry file includes lib/ctx/skb.h (TC, cgroup) or
 * lib/ctx/xdp.h before any other lib/ header. */
#if !defined(SLUICE_CTX_SKB) && !defined(SLUICE_CTX_XDP)
#error "include lib/ctx/skb.h or lib/ctx/xdp.h first"
#endif

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <linux/pkt_cls.h>
#include <stddef.h>

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "maps/conntrack.h"
#include "maps/drop.h"
#include "maps/lb.h"
#include "maps/endpoint.h"
#include "maps/nat.h"
#include "maps/node.h"

/* linux/icmp.h and linux/if_arp.h pull in libc socket headers that do not build for BPF, so the
 * few definitions needed from them live here. */
#define ARPHRD_ETHER 1
#define ARPOP_REQUEST 1
#define ARPOP_REPLY 2
#define ICMP_ECHOREPLY 0
#define ICMP_ECHO 8

struct icmphdr {
	__u8 type;
	__u8 code;
	__sum16 checksum;
	union {
		struct {
			__be16 id;
			__be16 sequence;
		} echo;
		__be32 gateway;
	} un;
};

#define IP_MF 0x2000
#define IP_OFFSET 0x1FFF

#define ETH_HLEN_ 14 /* sizeof(struct ethhdr); L3 starts here on every device Sluice attaches to */

/* Bounds-checked pointer into linear packet data; NULL when the header is not all there. */
#define CTX_HDR(ctx, off, type)                                                  \
	({                                                                         \
		void *__p = ctx_data(ctx) + (off);                                 \
		(__p + sizeof(type) <= ctx_data_end(ctx)) ? (type *)__p : NULL;    \
	})

#endif
