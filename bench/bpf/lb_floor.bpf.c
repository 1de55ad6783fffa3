/* Bench-only: the floor of Sluice's per-packet design on this kernel, timed by lb_packet_bench in
 * the same rounds as sluice_from_pod. One hash lookup of the destination (address, port) and a
 * DNAT onto the backend it names with direct packet writes: destination address and port, the
 * backend pod's MAC, the IPv4 checksum and the TCP checksum updated inline (RFC 1624), then the
 * same bpf_redirect_peer verdict. No conntrack, no policy, no source check: whatever Sluice costs
 * above this is the price of what it does beyond one lookup and one rewrite.
 * bench_floor_l4 is the same with the TCP checksum updated through bpf_l4_csum_replace (two
 * calls, address then port), which a TC program needs when it cannot know the skb's checksum
 * state (CHECKSUM_PARTIAL from a local socket, CHECKSUM_COMPLETE from a NIC). */
#include "lib/ctx/skb.h"
#include "lib/common.h"

struct bench_floor4_key {
	__be32 addr;
	__be16 port;
	__u8 proto;
	__u8 pad;
};

struct bench_floor4_backend {
	__be32 addr;
	__be16 port;
	__u16 pad;
	__u32 ifindex;
	__u8 mac[6];
	__u8 pad2[2];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct bench_floor4_key);
	__type(value, struct bench_floor4_backend);
	__uint(max_entries, 64);
} bench_floor4 SEC(".maps");

static __always_inline __u16 fold32(__u32 s)
{
	s = (s & 0xffff) + (s >> 16);
	return (__u16)((s & 0xffff) + (s >> 16));
}

/* The checksum at *sum after a 32-bit field changed from `from` to `to`. */
static __always_inline void floor_csum4(__sum16 *sum, __be32 from, __be32 to)
{
	__u32 s = (__u16)~*sum;

	s += (~from & 0xffff) + (~from >> 16) + (to & 0xffff) + (to >> 16);
	*sum = ~fold32(s);
}

static __always_inline void floor_csum2(__sum16 *sum, __be16 from, __be16 to)
{
	__u32 s = (__u16)~*sum;

	s += (__u16)~from + to;
	*sum = ~fold32(s);
}

#define FLOOR_L4_CSUM_OFF (ETH_HLEN_ + sizeof(struct iphdr) + offsetof(struct tcphdr, check))

static __always_inline int floor_dnat(struct __sk_buff *skb, int l4_helper)
{
	void *data = ctx_data(skb), *end = ctx_data_end(skb);
	const struct bench_floor4_backend *be;
	struct bench_floor4_key key = {};
	struct ethhdr *eth = data;
	struct iphdr *ip = data + ETH_HLEN_;
	struct tcphdr *tcp = data + ETH_HLEN_ + sizeof(*ip);
	__be32 old_addr;
	__be16 old_port;

	if ((void *)(tcp + 1) > end)
		return TC_ACT_OK;
	if (eth->h_proto != bpf_htons(ETH_P_IP) || ip->ihl != 5 || ip->protocol != IPPROTO_TCP)
		return TC_ACT_OK;
	key.addr = ip->daddr;
	key.port = tcp->dest;
	key.proto = IPPROTO_TCP;
	be = bpf_map_lookup_elem(&bench_floor4, &key);
	if (!be)
		return TC_ACT_OK;
	old_addr = ip->daddr;
	old_port = tcp->dest;
	floor_csum4(&ip->check, old_addr, be->addr);
	ip->daddr = be->addr;
	tcp->dest = be->port;
	__builtin_memcpy(eth->h_dest, be->mac, 6);
	if (!l4_helper) {
		floor_csum4(&tcp->check, old_addr, be->addr);
		floor_csum2(&tcp->check, old_port, be->port);
	} else {
		bpf_l4_csum_replace(skb, FLOOR_L4_CSUM_OFF, old_addr, be->addr,
				    BPF_F_PSEUDO_HDR | sizeof(__be32));
		bpf_l4_csum_replace(skb, FLOOR_L4_CSUM_OFF, old_port, be->port, sizeof(__be16));
	}
	return bpf_redirect_peer(be->ifindex, 0);
}

SEC("tc")
int bench_floor(struct __sk_buff *skb)
{
	return floor_dnat(skb, 0);
}

SEC("tc")
int bench_floor_l4(struct __sk_buff *skb)
{
	return floor_dnat(skb, 1);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
