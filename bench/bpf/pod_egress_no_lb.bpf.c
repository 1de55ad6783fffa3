/* Bench-only: sluice_from_pod as it would be without Service load balancing, to time non-service
 * pod -> pod traffic against the pre-Services program in the same run. The real entry file is
 * compiled unchanged except that its LB step sees no TCP/UDP tuple and skips plain pod -> pod
 * traffic without looking at sluice_lb4_nbport, so the compiler drops the whole LB block
 * (frontend lookup, reverse NAT, the port check) and everything else (parse, source check,
 * endpoint lookup, policy, redirect) is the production code. Loaded against the same pinned
 * maps as the real programs. */
#include "lib/ctx/skb.h"
#include "lib/lb.h"

#define ct4_tuple(pkt, p) ((void)(pkt), (void)(p), CT4_NO_TUPLE)
/* Plain pod -> pod TCP skips the LB step without the port lookup. */
#define lb4_plain_to_endpoint(pkt) ((void)(pkt), 1)
#include "pod_egress.bpf.c"
