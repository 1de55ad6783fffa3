/* Service load balancing of pod traffic: DNAT of packets to a service frontend onto one of its
 * backends (sluice_lb4_svc / sluice_lb4_be), and reverse NAT of the backends' replies. */
#ifndef SLUICE_BPF_LB_H
#define SLUICE_BPF_LB_H

#include "lib/conntrack.h"

static __always_inline const struct sluice_lb4_backend *lb4_backend(__u32 backend_id)
{
	return bpf_map_lookup_elem(&sluice_lb4_be, &backend_id);
}

/* A reply from a backend to a balanced flow leaves from the frontend. Returns 1 when
 * translated, 0 when the packet is no such reply, or minus a drop reason. */
static __always_inline int lb4_rev_nat(struct __sk_buff *skb, __u32 l3_off,
				       const struct ct4_pkt *p)
{
	struct sluice_ct4_key key = p->key;
	const struct sluice_lb4_revnat *rnat;
	struct sluice_ct4_entry *ct;
	__be32 addr;
	__be16 port;

	key.dir = SLUICE_CT_DIR_REPLY;
	ct = ct4_lookup(&key);
	if (!ct)
		return 0;
	rnat = bpf_map_lookup_elem(&sluice_lb4_rnat, &ct->rev_nat_id);
	if (!rnat)
		return 0;
	addr = rnat->addr;
	port = rnat->port;
	if (rewrite_ip4_addr(skb, l3_off, offsetof(struct iphdr, saddr), p->key.saddr, addr,
			     &p->csum) ||
	    rewrite_l4_port(skb, p->l4_off, p->key.sport, port, &p->csum))
		return -SLUICE_DROP_CSUM_ERROR;
	return 1;
}

/* Picks the backend of a new flow to the service whose master entry is svc. Returns 0 or a drop
 * reason. */
static __always_inline int lb4_select(const struct sluice_lb4_key *master_key,
				      const struct sluice_lb4_service *svc, __u32 *backend_id,
				      const struct sluice_lb4_backend **be)
{
	struct sluice_lb4_key key = *master_key;
	const struct sluice_lb4_service *slot;
	__u16 count = svc->count;

	if (count == 0)
		return SLUICE_DROP_SERVICE_NO_BACKEND;
	key.backend_slot = 1 + bpf_get_prandom_u32() % count;
	slot = bpf_map_lookup_elem(&sluice_lb4_svc, &key);
	if (!slot)
		return SLUICE_DROP_SERVICE_NO_BACKEND;
	*backend_id = slot->backend_id;
	*be = lb4_backend(*backend_id);
	return *be ? 0 : SLUICE_DROP_SERVICE_NO_BACKEND;
}

/* DNATs a packet to a service frontend onto its flow's backend. Existing flows keep their backend
 * as long as it exists, whatever happened to the slots since. Returns 0 (translated, or not for
 * a service) or a drop reason. */
static __always_inline int lb4_dnat(struct __sk_buff *skb, __u32 l3_off, const struct ct4_pkt *p)
{
	struct sluice_lb4_key key = {
		.addr = p->key.daddr,
		.dport = p->key.dport,
		.proto = p->key.proto,
		.scope = SLUICE_LB_SCOPE_EXTERNAL,
	};
	const struct sluice_lb4_backend *be = NULL;
	const struct sluice_lb4_service *svc;
	struct sluice_ct4_entry *ct;
	__u32 backend_id = 0;
	__be32 addr;
	__be16 port;
	int reason;

	svc = bpf_map_lookup_elem(&sluice_lb4_svc, &key);
	if (!svc)
		return 0;
	ct = ct4_lookup(&p->key);
	if (ct)
		be = lb4_backend(ct->backend_id);
	if (!be) {
		reason = lb4_select(&key, svc, &backend_id, &be);
		if (reason)
			return reason;
		if (!be)
			return SLUICE_DROP_SERVICE_NO_BACKEND;
		reason = ct4_create(&p->key, be->addr, be->port, backend_id, svc->rev_nat_id);
		if (reason)
			return reason;
	}
	addr = be->addr;
	port = be->port;
	if (rewrite_ip4_addr(skb, l3_off, offsetof(struct iphdr, daddr), p->key.daddr, addr,
			     &p->csum) ||
	    rewrite_l4_port(skb, p->l4_off + 2, p->key.dport, port, &p->csum))
		return SLUICE_DROP_CSUM_ERROR;
	return 0;
}

/* Service translation of a packet a pod sends: reverse NAT when it is a backend's reply, DNAT when
 * it goes to a frontend. Returns 0 to go on with the (possibly rewritten) packet, or a drop
 * reason. */
static __always_inline int lb4_from_pod(struct __sk_buff *skb, __u32 l3_off,
					const struct iphdr *ip)
{
	struct ct4_pkt p;
	int ret;

	if (ct4_load(skb, l3_off, ip, &p))
		return 0;
	ret = lb4_rev_nat(skb, l3_off, &p);
	if (ret)
		return ret < 0 ? -ret : 0;
	return lb4_dnat(skb, l3_off, &p);
}

#endif
