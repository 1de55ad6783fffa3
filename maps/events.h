/* The flow monitor's ABI: datapath events in the sluice_events ring buffer, the agent's switch
 * (sluice_monitor) and the per-CPU rate limiter and loss counters (sluice_mon_cpu).
 * The datapath emits an event only when sluice_monitor's `events` mask asks for its type; with the
 * mask 0 (nobody listens) the cost per packet is that one array lookup. See docs/observe.md. */
#ifndef SLUICE_MAPS_EVENTS_H
#define SLUICE_MAPS_EVENTS_H

#include "types.h"

/* Ring buffer bytes (a power of two, a multiple of the page size): 1 MiB holds ~11k events, which
 * the agent drains well within the per-CPU burst of every CPU. */
#define SLUICE_EVENTS_RINGBUF_BYTES (1u << 20)

/* Event types; numbers are ABI. Bit (1 << type) of sluice_monitor_config.events enables one. */
enum sluice_event_type {
	SLUICE_EVENT_DROP = 1,      /* a packet dropped: reason, interface, observation point */
	SLUICE_EVENT_POLICY = 2,    /* a NetworkPolicy verdict: denied, or allowed for a new flow */
	SLUICE_EVENT_TRANSLATE = 3, /* a new flow to a Service frontend got its backend (its CT
				       entries were just made): frontend -> backend */
	SLUICE_EVENT_CT_CLOSE = 4,  /* a balanced TCP flow's first FIN or RST */
	SLUICE_EVENT_TYPE_MAX = 5,
};

#define SLUICE_MON_EVENTS_ALL                                                      \
	((1u << SLUICE_EVENT_DROP) | (1u << SLUICE_EVENT_POLICY) |                 \
	 (1u << SLUICE_EVENT_TRANSLATE) | (1u << SLUICE_EVENT_CT_CLOSE))

enum sluice_event_verdict {
	SLUICE_VERDICT_FORWARDED = 1,
	SLUICE_VERDICT_DROPPED = 2,
};

/* Where a drop was seen: the TC/XDP hook's direction on `ifindex`. */
enum sluice_event_point {
	SLUICE_POINT_UNKNOWN = 0, /* no packet context (policy, translation, conntrack events) */
	SLUICE_POINT_INGRESS = 1,
	SLUICE_POINT_EGRESS = 2,
};

/* sluice_event.flags */
#define SLUICE_EVENT_F_ENFORCED 0x01 /* POLICY: the direction is enforced (else open, logged) */

/* One ring buffer record. Addresses are 16 bytes for IPv6; IPv4 uses the first 4. */
struct sluice_event {
	__u64 ts_ns;      /* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
	__u8 type;        /* enum sluice_event_type */
	__u8 verdict;     /* enum sluice_event_verdict */
	__u8 reason;      /* enum sluice_drop_reason (DROP, POLICY denied); else 0 */
	__u8 point;       /* enum sluice_event_point */
	__u8 family;      /* 4 or 6 (0: no IP header could be read) */
	__u8 proto;       /* IPPROTO_* */
	__u8 tcp_flags;   /* TCP flags byte when read */
	__u8 policy_dir;  /* POLICY: SLUICE_POLICY_INGRESS / SLUICE_POLICY_EGRESS */
	__u32 ifindex;    /* DROP: the interface of the hook; else 0 */
	__u32 len;        /* packet bytes (DROP: skb/xdp length; POLICY: IP total length) */
	__u32 id;         /* TRANSLATE, CT_CLOSE: the frontend's rev_nat_id; POLICY: endpoint id */
	__u32 cpu;
	__be32 saddr[4];
	__be32 daddr[4];
	__be16 sport;     /* TCP/UDP/SCTP ports, ICMP echo: id in sport */
	__be16 dport;
	__be32 nat_addr[4]; /* TRANSLATE, CT_CLOSE: the backend */
	__be16 nat_port;
	__u8 flags;       /* SLUICE_EVENT_F_* */
	__u8 pad;
};
SLUICE_ASSERT_SIZE(struct sluice_event, 88);
SLUICE_ASSERT_OFFSET(struct sluice_event, ifindex, 16);
SLUICE_ASSERT_OFFSET(struct sluice_event, saddr, 32);
SLUICE_ASSERT_OFFSET(struct sluice_event, sport, 64);
SLUICE_ASSERT_OFFSET(struct sluice_event, nat_addr, 68);
SLUICE_ASSERT_OFFSET(struct sluice_event, nat_port, 84);

/* Value of sluice_monitor (array of one, key 0), written by the agent. */
struct sluice_monitor_config {
	__u32 events; /* mask of (1 << enum sluice_event_type); 0: the monitor is off */
	__u32 sample; /* emit 1 in `sample` events other than drops, at random; 0 or 1: all */
	__u32 rate;   /* per CPU: events per second the bucket refills with; 0: unlimited */
	__u32 burst;  /* per CPU: bucket size (events emitted back to back) */
};
SLUICE_ASSERT_SIZE(struct sluice_monitor_config, 16);

/* Value of sluice_mon_cpu (per-CPU array of one): the token bucket and what it cost. */
struct sluice_monitor_cpu {
	__u64 tokens;
	__u64 refill_ns;
	__u64 emitted;    /* events put into the ring buffer */
	__u64 lost_rate;  /* events the bucket refused */
	__u64 lost_full;  /* events the ring buffer had no room for (the reader fell behind) */
};
SLUICE_ASSERT_SIZE(struct sluice_monitor_cpu, 40);

/* The key and value of the ring buffer in the map list: a ring buffer has neither (size 0 in
 * C, which is what the kernel wants; C++ only names the type). */
struct sluice_ringbuf_none {
};

#endif
