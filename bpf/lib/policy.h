/* NetworkPolicy verdicts: egress at the source endpoint, ingress at the destination endpoint, on
 * the real addresses (after service translation), in a constant number of lookups whatever the
 * number of rules (sluice_policy_ep, sluice_ipcache4, sluice_policy4 twice; see docs/policy.md).
 * Replies of a flow a policy point let through pass by its conntrack entry (SLUICE_CT_DIR_POLICY
 * in sluice_ct4 / sluice_ct4_any). */
#ifndef SLUICE_BPF_POLICY_H
#define SLUICE_BPF_POLICY_H

#include "lib/conntrack.h"

/* What a policy point judges: the packet as the endpoints themselves send and receive it (a
 * DNATed packet with its backend, a backend's reply before its frontend is put back). */
struct policy4_flow {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u16 tot_len;
	__u8 proto;
	__u8 tracked;   /* TCP/UDP/SCTP with ports: conntrack lets its replies pass */
	__u8 tcp_flags; /* TCP: the flags byte (CT4_TCP_*), which moves the flow's state; else 0 */
};

/* What a policy point learned of the flow's conntrack entries (policy4_check's answer), handed to
 * the next point judging the same flow in the same program (a pod's egress, then the ingress of
 * the pod on this node it sends to), which need not look them up again: both points track a flow
 * under the same keys. */
enum policy4_ct_known {
	POLICY4_CT_UNKNOWN = 0, /* not looked up (passed without: no policy entry, untracked) */
	POLICY4_CT_REPLY = 1,   /* the reply of a tracked flow */
	POLICY4_CT_TRACKED = 2, /* no reply; tracked as a flow of its own (found or written) */
	POLICY4_CT_OWN = 3,     /* tracked as a flow of its own (found); the reply not looked up */
};

static __always_inline void policy4_flow_of(const struct pkt4 *pkt, struct policy4_flow *f)
{
	f->saddr = pkt->saddr;
	f->daddr = pkt->daddr;
	f->sport = pkt->sport;
	f->dport = pkt->dport;
	f->tot_len = pkt->tot_len;
	f->proto = pkt->proto;
	f->tcp_flags = pkt->tcp_flags; /* 0 but for TCP (parse_eth_ip4) */
	f->tracked = (pkt->flags & PKT4_F_PORTS) &&
		     (pkt->proto == IPPROTO_TCP || pkt->proto == IPPROTO_UDP ||
		      pkt->proto == IPPROTO_SCTP);
}

/* The TCP state a packet of a tracked flow moves the flow's entry to, for the GC's timeouts (one
 * table for every kind of entry, docs/operating.md): closing on a FIN or RST either way; from
 * the initiator (own), a SYN without ACK on a closing entry opens a new connection on the same
 * tuple (TIME-WAIT reuse), unanswered again. Only those flags change anything (UDP carries none),
 * so other packets make no call (ct4_tcp_state is verified once, not at every policy point). */
static __always_inline void policy4_ct_state(struct sluice_ct4_entry *ct, __u8 tcp_flags, int own)
{
	if (tcp_flags & (CT4_TCP_FIN | CT4_TCP_RST | CT4_TCP_SYN))
		sluice_ct_tcp_state(ct, tcp_flags, own);
}

/* The identity of an address. The agent keeps 0.0.0.0/0 in the ipcache, so a miss only happens
 * before its first write: the address is then nobody the policies know, i.e. world. */
static __always_inline __u32 policy4_identity(__be32 addr)
{
	struct sluice_lpm4_key key = { .prefixlen = 32, .addr = addr };
	const struct sluice_ipcache4_entry *e = bpf_map_lookup_elem(&sluice_ipcache4, &key);

	return e ? e->identity : SLUICE_IDENTITY_WORLD;
}

/* Whether a rule of the endpoint admits the peer identity (or any peer) on proto/port. */
static __always_inline int policy4_allows(__u32 endpoint_id, __u32 identity, __u8 dir,
					  __u8 proto, __be16 port)
{
	struct sluice_policy4_key key = {
		.prefixlen = SLUICE_POLICY4_PREFIX_FULL,
		.endpoint_id = bpf_htonl(endpoint_id),
		.identity = bpf_htonl(identity),
		.direction = dir,
		.proto = proto,
		.port = port,
	};
	const struct sluice_policy4_entry *e;

	e = bpf_map_lookup_elem(&sluice_policy4, &key);
	if (e && e->verdict == SLUICE_POLICY_ALLOW)
		return 1;
	key.identity = bpf_htonl(SLUICE_IDENTITY_ANY);
	e = bpf_map_lookup_elem(&sluice_policy4, &key);
	return e && e->verdict == SLUICE_POLICY_ALLOW;
}

static __always_inline void policy4_count_denied(__u32 endpoint_id, __u8 dir, __u16 bytes)
{
	struct sluice_policy_drop_key key = { .endpoint_id = endpoint_id, .direction = dir };
	struct sluice_drop_count one = { .packets = 1, .bytes = bytes };
	struct sluice_drop_count *c = bpf_map_lookup_elem(&sluice_pol_drops, &key);

	if (c) {
		c->packets++;
		c->bytes += bytes;
		return;
	}
	/* From BPF this writes the current CPU's slot only; the others start at zero. */
	bpf_map_update_elem(&sluice_pol_drops, &key, &one, BPF_NOEXIST);
}

/* The policy point of endpoint_id in direction dir for flow f. An endpoint the agent has no
 * sluice_policy_ep entry for is outside policy (the agent writes one for every endpoint it
 * manages, open or not, before the pod's first packet). A reply of a tracked flow passes; other
 * packets need an allow when the direction is enforced, and are then tracked so that their
 * replies pass both policy points on the way back. Every packet of the initiating direction is
 * judged, not only the first: removing an allow stops established flows too. known: what an
 * earlier point of the same program found in conntrack for f (policy4_check's answer there), or
 * POLICY4_CT_UNKNOWN. Returns minus a drop reason, or (pass) what this point knows of f's
 * conntrack entries (enum policy4_ct_known). */
static __always_inline int policy4_check(__u32 endpoint_id, __u8 dir, const struct policy4_flow *f,
					 int known)
{
	const struct sluice_policy_ep_entry *pep =
		bpf_map_lookup_elem(&sluice_policy_ep, &endpoint_id);
	__u8 flag = dir == SLUICE_POLICY_INGRESS ? SLUICE_POLICY_EP_F_INGRESS :
						   SLUICE_POLICY_EP_F_EGRESS;
	struct sluice_ct4_key key = {};
	struct sluice_ct4_entry e = {};
	struct sluice_ct4_entry *ct;
	__u32 identity;
	int own_missing = 0; /* the flow's own entry was looked up and is not there */
	int ret;

	/* A free slot (all zero): the endpoint has no entry. */
	if (!pep || (!pep->identity && !pep->flags))
		return known;
	if (known == POLICY4_CT_REPLY || (known == POLICY4_CT_OWN && !(pep->flags & flag)))
		return known;
	key.proto = f->proto;
	key.dir = SLUICE_CT_DIR_POLICY;
	/* At a point that judges nothing, a packet from a higher port to a lower one (a client's
	 * ephemeral port to a service's) most likely goes the way its flow opened: its own entry,
	 * looked up first, ends the check in one lookup where the reply's would miss. Where that
	 * entry is missing, the reply check follows as below; the outcome is the same either way
	 * (a later point that judges looks the reply up before judging: POLICY4_CT_OWN). */
	if (f->tracked && known == POLICY4_CT_UNKNOWN && !(pep->flags & flag) &&
	    bpf_ntohs(f->sport) > bpf_ntohs(f->dport)) {
		key.saddr = f->saddr;
		key.daddr = f->daddr;
		key.sport = f->sport;
		key.dport = f->dport;
		ct = ct4_lookup(&key);
		if (ct) {
			policy4_ct_state(ct, f->tcp_flags, 1);
			return POLICY4_CT_OWN;
		}
		own_missing = 1;
	}
	if (f->tracked && known != POLICY4_CT_TRACKED) {
		key.saddr = f->daddr;
		key.daddr = f->saddr;
		key.sport = f->dport;
		key.dport = f->sport;
		ct = ct4_lookup(&key);
		if (ct) {
			/* The reply of a tracked TCP flow: established from now on (GC timeouts). */
			if (!(ct->flags & SLUICE_CT_F_ESTABLISHED) && f->proto == IPPROTO_TCP)
				ct->flags |= SLUICE_CT_F_ESTABLISHED;
			policy4_ct_state(ct, f->tcp_flags, 0);
			return POLICY4_CT_REPLY;
		}
	}
	if (pep->flags & flag) {
		identity = policy4_identity(dir == SLUICE_POLICY_INGRESS ? f->saddr : f->daddr);
		if (!policy4_allows(endpoint_id, identity, dir, f->proto, f->dport)) {
			policy4_count_denied(endpoint_id, dir, f->tot_len);
			event_policy(endpoint_id, dir, f->saddr, f->daddr, f->sport, f->dport,
				     f->proto, f->tot_len, 1, 1);
			return -SLUICE_DROP_POLICY_DENIED;
		}
	}
	if (!f->tracked || known == POLICY4_CT_TRACKED)
		return known;
	if (known == POLICY4_CT_OWN)
		return POLICY4_CT_TRACKED;
	key.saddr = f->saddr;
	key.daddr = f->daddr;
	key.sport = f->sport;
	key.dport = f->dport;
	if (!own_missing) {
		ct = ct4_lookup(&key);
		if (ct) {
			policy4_ct_state(ct, f->tcp_flags, 1);
			return POLICY4_CT_TRACKED;
		}
	}
	event_policy(endpoint_id, dir, f->saddr, f->daddr, f->sport, f->dport, f->proto,
		     f->tot_len, 0, pep->flags & flag);
	e.created_ns = sluice_ct_now();
	e.last_seen_ns = e.created_ns;
	/* A stray FIN or RST (its flow's entry gone) opens nothing that lasts. */
	e.flags = ct4_closing_flag(f->tcp_flags);
	ret = ct4_create_one(&key, &e);
	return ret < 0 ? ret : POLICY4_CT_TRACKED;
}

#endif
