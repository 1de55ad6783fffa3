/* Bench-only: sluice_from_pod as it would be without Service load balancing, to time non-service
 * pod -> pod traffic against the pre-Services program in the same run. The real entry file is
 * compiled unchanged except that its LB step sees no TCP/UDP tuple, so the compiler drops the
 * whole LB block (frontend lookup, reverse NAT) and everything else (parse, source check,
 * endpoint lookup, policy, redirect) is the production code. Loaded against the same pinned
 * maps as the real programs. */
#include "lib/ctx/skb.h"
#include "lib/lb.h"

#define ct4_tuple(pkt, p) ((void)(pkt), (void)(p), CT4_NO_TUPLE)
#include "pod_egress.bpf.c"
