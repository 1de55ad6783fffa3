/* The slots of the program arrays that join a hook's stages (bpf/lib/stages.h). Numbers are
 * what an entry program of a build calls; a build only ever calls stages of its own (each load has
 * its own array), so they may change between builds, but tests and tools read them here. */
#ifndef SLUICE_MAPS_STAGES_H
#define SLUICE_MAPS_STAGES_H

/* SLUICE_ALT_STAGES builds another stage layout from the same sources: every slot moved up by 4
 * in arrays twice as large, so that no slot holds a stage in both layouts and an entry program
 * of one build calling into the other's array would find its slot empty (a missing_stage drop).
 * Only tests build it: the agent sluice-agent-altstages (tests/CMakeLists.txt) is the other
 * build that tests/e2e/upgrade_stages_test.sh upgrades to and back from under traffic. */
#ifdef SLUICE_ALT_STAGES
#define SLUICE_STAGE_BASE 4
#define SLUICE_STAGE_ARRAY 8
#else
#define SLUICE_STAGE_BASE 0
#define SLUICE_STAGE_ARRAY 4
#endif

/* Slots of sluice_from_pod's program array (sluice_pod_stages, bpf/pod_egress.bpf.c). Each
 * object load makes and fills its own array (libbpf fills it from the array's initialiser as it
 * loads the object), so an entry program only ever calls stages of its own build. */
enum sluice_pod_stage {
	SLUICE_POD_STAGE_IP6 = SLUICE_STAGE_BASE + 0, /* IPv6 from a pod: empty until an IPv6
							 datapath fills it */
	SLUICE_POD_STAGE_LB4 = SLUICE_STAGE_BASE + 1, /* IPv4 Service translation (DNAT, a
							 backend's reply), then policy and forward */
	SLUICE_POD_STAGES = SLUICE_STAGE_ARRAY,       /* size of the array: room for the next stage */
};

/* Slots of the program array of sluice_from_net and of sluice_from_overlay (sluice_net_stages,
 * bpf/netdev.bpf.c and bpf/overlay.bpf.c: each object its own), which share their paths
 * (lib/netdev.h). */
enum sluice_net_stage {
	SLUICE_NET_STAGE_IP6 = SLUICE_STAGE_BASE + 0,  /* IPv6 from the network: empty until an
							  IPv6 datapath fills it */
	SLUICE_NET_STAGE_LB4 = SLUICE_STAGE_BASE + 1,  /* IPv4 NodePorts, ExternalIPs, LoadBalancer
							  IPs */
	SLUICE_NET_STAGE_NAT4 = SLUICE_STAGE_BASE + 2, /* IPv4 replies to masqueraded flows */
	SLUICE_NET_STAGES = SLUICE_STAGE_ARRAY,
};

#endif
