/* The flow monitor: datapath events (drops, policy verdicts, service translations, closing TCP
 * flows) into the sluice_events ring buffer, as sluice_monitor asks, through a per-CPU token
 * bucket. With the monitor off a packet pays one array lookup here; see docs/observe.md. */
#ifndef SLUICE_BPF_EVENTS_H
#define SLUICE_BPF_EVENTS_H

#include "lib/maps.h"
#include "lib/parse.h"

#define EVENTS_NSEC_PER_SEC 1000000000ull

/* bench/monitor_bench's baseline, "the datapath without a monitor", builds the programs with
 * -DSLUICE_EVENTS_COMPILED_OUT: every event_* call below is then empty. Production never sets
 * it. */
#ifdef SLUICE_EVENTS_COMPILED_OUT
#define event_drop(ctx, reason) ((void)(ctx), (void)(reason))
#define event_policy(...) ((void)0)
#define event_translate(...) ((void)0)
#define event_ct_close(ct, fwd) ((void)(ct), (void)(fwd))
#else

/* The monitor's configuration when it wants events of `type`, else NULL. The one lookup every
 * hook point pays; an array lookup the verifier inlines. */
static __always_inline const struct sluice_monitor_config *event_wanted(__u32 type)
{
	__u32 zero = 0;
	const struct sluice_monitor_config *cfg = bpf_map_lookup_elem(&sluice_monitor, &zero);

	if (!cfg || !(cfg->events & (1u << type)))
		return NULL;
	return cfg;
}

/* Whether this CPU's bucket has a token for one more event (taking it); a refusal is counted.
 * The bucket refills at cfg->rate per second up to cfg->burst. Only this CPU touches its slot. */
static __always_inline int event_take_token(const struct sluice_monitor_config *cfg,
					    struct sluice_monitor_cpu *st, __u64 now)
{
	__u64 elapsed, add;

	if (!cfg->rate)
		return 1;
	elapsed = now - st->refill_ns;
	if (elapsed >= EVENTS_NSEC_PER_SEC) {
		st->tokens = cfg->burst;
		st->refill_ns = now;
	} else {
		/* elapsed < 2^30 and rate < 2^32: the product fits. A partial token stays in
		 * elapsed until it is whole. */
		add = elapsed * cfg->rate / EVENTS_NSEC_PER_SEC;
		if (add) {
			st->tokens += add;
			if (st->tokens > cfg->burst)
				st->tokens = cfg->burst;
			st->refill_ns = now;
		}
	}
	if (!st->tokens) {
		st->lost_rate++;
		return 0;
	}
	st->tokens--;
	return 1;
}

/* A zeroed record of `type` in the ring buffer, or NULL when sampling, the bucket or a full ring
 * buffer says no (the latter two counted as lost). The caller fills it in and submits it. */
static __always_inline struct sluice_event *event_reserve(const struct sluice_monitor_config *cfg,
							  __u32 type)
{
	struct sluice_monitor_cpu *st;
	struct sluice_event *e;
	__u32 zero = 0;
	__u64 now;

	if (type != SLUICE_EVENT_DROP && cfg->sample > 1 && bpf_get_prandom_u32() % cfg->sample)
		return NULL;
	st = bpf_map_lookup_elem(&sluice_mon_cpu, &zero);
	if (!st)
		return NULL;
	now = bpf_ktime_get_ns();
	if (!event_take_token(cfg, st, now))
		return NULL;
	e = bpf_ringbuf_reserve(&sluice_events, sizeof(*e), 0);
	if (!e) {
		st->lost_full++;
		return NULL;
	}
	st->emitted++;
	__builtin_memset(e, 0, sizeof(*e));
	e->ts_ns = now;
	e->type = type;
	e->cpu = bpf_get_smp_processor_id();
	return e;
}

/* Waking the reader is an irq_work per event, more than the event itself costs; the agent polls
 * every 50 ms anyway, so only a ring buffer an eighth full wakes it early. */
static __always_inline void event_submit(struct sluice_event *e)
{
	__u64 queued = bpf_ringbuf_query(&sluice_events, BPF_RB_AVAIL_DATA);

	bpf_ringbuf_submit(e, queued > SLUICE_EVENTS_RINGBUF_BYTES / 8 ? BPF_RB_FORCE_WAKEUP :
									 BPF_RB_NO_WAKEUP);
}

static __always_inline void event_set_tuple4(struct sluice_event *e, __be32 saddr, __be32 daddr,
					     __be16 sport, __be16 dport, __u8 proto)
{
	e->family = 4;
	e->saddr[0] = saddr;
	e->daddr[0] = daddr;
	e->sport = sport;
	e->dport = dport;
	e->proto = proto;
}

/* A dropped packet, as it is when dropped (after any rewrite on the way). Policy denials are
 * reported by event_policy, which knows the endpoint and direction. */
static __always_inline void event_drop(struct sluice_ctx *ctx, enum sluice_drop_reason reason)
{
	const struct sluice_monitor_config *cfg = event_wanted(SLUICE_EVENT_DROP);
	struct sluice_event *e;
	struct pkt4 pkt;
	__be16 h_proto;

	if (!cfg || reason == SLUICE_DROP_POLICY_DENIED)
		return;
	e = event_reserve(cfg, SLUICE_EVENT_DROP);
	if (!e)
		return;
	e->verdict = SLUICE_VERDICT_DROPPED;
	e->reason = reason;
	e->ifindex = ctx_ifindex(ctx);
	e->point = ctx_at_ingress(ctx) ? SLUICE_POINT_INGRESS : SLUICE_POINT_EGRESS;
	e->len = ctx_len(ctx);
	if (parse_eth_ip4(ctx, &h_proto, &pkt) == 0) {
		event_set_tuple4(e, pkt.saddr, pkt.daddr,
				 pkt.flags & PKT4_F_ICMP ? pkt.icmp_id : pkt.sport, pkt.dport,
				 pkt.proto);
		e->tcp_flags = pkt.tcp_flags;
	}
	event_submit(e);
}

/* A policy point's verdict on a flow: denied (the packet is dropped), or allowed for a flow it has
 * not seen (the first packet of each tracked flow, enforced or not). */
static __always_inline void event_policy(__u32 endpoint_id, __u8 dir, __be32 saddr, __be32 daddr,
					 __be16 sport, __be16 dport, __u8 proto, __u16 len,
					 int denied, int enforced)
{
	const struct sluice_monitor_config *cfg = event_wanted(SLUICE_EVENT_POLICY);
	struct sluice_event *e;

	if (!cfg)
		return;
	e = event_reserve(cfg, SLUICE_EVENT_POLICY);
	if (!e)
		return;
	event_set_tuple4(e, saddr, daddr, sport, dport, proto);
	e->verdict = denied ? SLUICE_VERDICT_DROPPED : SLUICE_VERDICT_FORWARDED;
	e->reason = denied ? SLUICE_DROP_POLICY_DENIED : 0;
	e->policy_dir = dir;
	e->id = endpoint_id;
	e->len = len;
	e->flags = enforced ? SLUICE_EVENT_F_ENFORCED : 0;
	event_submit(e);
}

/* A new flow to a frontend (key: the tuple as the client sent it) given backend addr:port. */
static __always_inline void event_translate(const struct sluice_ct4_key *key, __be32 be_addr,
					    __be16 be_port, __u32 rev_nat_id, __u8 tcp_flags)
{
	const struct sluice_monitor_config *cfg = event_wanted(SLUICE_EVENT_TRANSLATE);
	struct sluice_event *e;

	if (!cfg)
		return;
	e = event_reserve(cfg, SLUICE_EVENT_TRANSLATE);
	if (!e)
		return;
	event_set_tuple4(e, key->saddr, key->daddr, key->sport, key->dport, key->proto);
	e->verdict = SLUICE_VERDICT_FORWARDED;
	e->tcp_flags = tcp_flags;
	e->nat_addr[0] = be_addr;
	e->nat_port = be_port;
	e->id = rev_nat_id;
	event_submit(e);
}

/* The first FIN or RST of a balanced TCP flow (fwd: its forward tuple), once: before its entry
 * carries SLUICE_CT_F_CLOSING. */
static __always_inline void event_ct_close(const struct sluice_ct4_entry *ct,
					   const struct sluice_ct4_key *fwd)
{
	const struct sluice_monitor_config *cfg;
	struct sluice_event *e;

	if (ct->flags & SLUICE_CT_F_CLOSING)
		return;
	cfg = event_wanted(SLUICE_EVENT_CT_CLOSE);
	if (!cfg)
		return;
	e = event_reserve(cfg, SLUICE_EVENT_CT_CLOSE);
	if (!e)
		return;
	event_set_tuple4(e, fwd->saddr, fwd->daddr, fwd->sport, fwd->dport, fwd->proto);
	e->verdict = SLUICE_VERDICT_FORWARDED;
	e->nat_addr[0] = ct->backend_addr;
	e->nat_port = ct->backend_port;
	e->id = ct->rev_nat_id;
	event_submit(e);
}

#endif /* SLUICE_EVENTS_COMPILED_OUT */
#endif
