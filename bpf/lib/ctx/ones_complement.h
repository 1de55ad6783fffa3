/* One's complement arithmetic of the Internet checksum (RFC 1071, RFC 1624), shared by both
 * contexts' incremental checksum updates. Sums are kept unfolded in 32 bits; 16-bit words in
 * network byte order sum to the same folded value whichever half of a word they sit in. */
#ifndef SLUICE_BPF_CTX_ONES_COMPLEMENT_H
#define SLUICE_BPF_CTX_ONES_COMPLEMENT_H

#include <linux/types.h>

#include <bpf/bpf_helpers.h>

/* The complement of the folded sum: the checksum of what sum covers. */
static __always_inline __u16 ctx_csum_fold(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/* What a checksum's sum moves by when a 2- or 4-byte field it covers changes from `from` to
 * `to`: ~m + m' of RFC 1624, word by word. */
static __always_inline __u32 ctx_csum_words(__u32 from, __u32 to, __u32 size)
{
	if (size == 4)
		return (~from & 0xffff) + (~from >> 16) + (to & 0xffff) + (to >> 16);
	return (__u16)~from + (__u16)to;
}

/* RFC 1624 on a checksum field: HC' = ~(~HC + ~m + m') (the kernel's csum_replace2/4). */
static __always_inline __u16 ctx_csum_update(__u16 csum, __u32 from, __u32 to, __u32 size)
{
	return ctx_csum_fold((__u16)~csum + ctx_csum_words(from, to, size));
}

#endif
