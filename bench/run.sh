#!/usr/bin/env bash
# Sluice's benchmarks, each reported as a ratio against a baseline measured in the same run:
#   1. per-packet cost of the pod egress BPF program vs an empty TC program (BPF_PROG_TEST_RUN);
#   2. CNI ADD/DEL latency of sluice-cni vs the reference bridge + host-local plugins;
#   3. initial sync (time, peak RSS) of the agent's Kubernetes client for 10k Services / 100k
#      endpoints vs whole-DOM parses of the same unpaginated lists (k8s_sync_bench);
#   4. per-packet cost of Service load balancing (first packet / established) at 1, 1k, 10k and
#      100k Services vs an empty TC program (lb_packet_bench);
#   5. new connections/s and connect latency through a ClusterIP at 1, 1k, 5k, 10k Services:
#      Sluice vs kube-proxy's iptables (legacy, nft) and nftables layouts vs one DNAT rule
#      (service_conn_bench.sh);
#   6. time to program 10k Services x 10 endpoints (maps vs iptables-restore / nft -f) and the BPF
#      maps' memlock (service_program_bench.sh);
#   7. the agent's Service stack (lab apiserver over HTTPS -> KubernetesState -> ServiceSync ->
#      ServiceReconciler -> BPF maps) at 10k Services x 10 endpoints: initial sync time, RSS, and
#      the latency of single EndpointSlice changes at 100/s (service_churn_bench);
#   8. cross-node pod TCP throughput (iperf3) and request/response latency in tunnel and native
#      routing vs hand-built kernel VXLAN / plain routes in the same topology (overlay_bench.sh).
#   9. per-packet cost of the flow monitor: nobody listening and a listener at full rate vs the
#      same program built without monitor code (monitor_bench).
#  10. NetworkPolicy verdict per packet (sluice_from_pod egress, sluice_to_pod ingress) at 10, 1k
#      and 10k rules with 100k ipcache entries vs policy off (policy_packet_bench);
#  11. NetworkPolicy change -> enforced through PolicySync, the reconciler and the real maps:
#      100 changes and a namespace relabel of 1000 pods, p50/p99 vs a no-op batch
#      (policy_change_bench);
#  12. new connections/s to a pod under a policy of 10, 1k, 10k rules: Sluice vs kube-router's
#      iptables + ipset layout vs no policy (policy_conn_bench.sh);
#  13. packets/s through a NodePort to a backend on another node: sluice_xdp_net (XDP_TX) vs the
#      TC path vs kube-proxy's iptables (legacy) and nftables NodePort layouts, with the rig's
#      floor, on a veth pair (xdp_pps).
#  14. what the verifier costs each agent start: instructions verified and load time of each
#      object, main build vs its SLUICE_NO_KERN_CTX build, and with SLUICE_BENCH_BASELINE_OBJS
#      ("NAME=PATH ...", objects built from another tree) new vs old (verifier_bench).
#  15. an agent restarted with 100 pods on its node: restart -> /readyz 200, p50 and max
#      (agent_ready_bench.sh; target <= 3 s).
#  16. one real agent against a large cluster's state at 1/10, 1/2 and full scale (5,000 Nodes,
#      150k Pods, 10k Services over 100k endpoints, 5,000 NetworkPolicies): ready, memory over an
#      empty cluster's, CPU, bytes received, map entries, change -> datapath at 50 mixed
#      changes/s (cluster_scale_bench; SLUICE_SCALE_STEPS="0.1 0.5 1" picks the scales).
#  17. Maglev: flows moved when 1 of N backends leaves or joins, max/mean balance over 1M flows,
#      and table computation (M = 65537, 1,000 backends) vs the paper's / Katran's fill
#      (maglev_bench).
# Needs root, a built tree with the benchmarks (`cmake --build BUILD --target benchmarks`, as `make bench` does), containernetworking-plugins, iptables and
# nftables (`make deps`). SLUICE_BENCH_ONLY="4 5" runs only the listed sections.
# usage: bench/run.sh BUILD_DIR [extra Google Benchmark flags for pod_egress_bench]
set -euo pipefail
BUILD=${1:?usage: $0 BUILD_DIR}
shift
BUILD=$(cd "$BUILD" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
[ "$(id -u)" -eq 0 ] || { echo "bench/run.sh: needs root (BPF, network namespaces)" >&2; exit 1; }
BIN=$BUILD/bench/pod_egress_bench
[ -x "$BIN" ] || { echo "bench/run.sh: $BIN missing: cmake --build $BUILD --target benchmarks first" >&2; exit 1; }

want() { [ -z "${SLUICE_BENCH_ONLY:-}" ] || [[ " $SLUICE_BENCH_ONLY " == *" $1 "* ]]; }

if want 1; then
echo "#### 1. pod egress program: ns per packet, BPF_PROG_TEST_RUN ($(uname -r), $(nproc) CPUs)"
"$BIN" "$@"
fi

if want 2; then
echo
echo "#### 2. CNI ADD/DEL latency"
"$HERE/cni_latency.sh" "$BUILD"
fi

if want 3; then
echo
echo "#### 3. Kubernetes initial sync: 10k Services / 100k endpoints vs whole-DOM parse"
SYNC=$BUILD/bench/k8s_sync_bench
[ -x "$SYNC" ] || { echo "bench/run.sh: $SYNC missing: cmake --build $BUILD --target k8s_sync_bench" >&2; exit 1; }
"$SYNC"
fi

for b in lb_packet_bench conn_load sluice_lb_setup; do
  [ -x "$BUILD/bench/$b" ] || { echo "bench/run.sh: $BUILD/bench/$b missing: cmake --build $BUILD --target $b" >&2; exit 1; }
done

if want 4; then
echo
echo "#### 4. Service LB per packet: 1 / 1k / 10k / 100k Services, BPF_PROG_TEST_RUN"
"$BUILD/bench/lb_packet_bench"
fi

if want 5; then
echo
echo "#### 5. New connections through a ClusterIP: Sluice vs kube-proxy iptables / nftables"
"$HERE/service_conn_bench.sh" "$BUILD"
fi

if want 6; then
echo
echo "#### 6. Programming 10k Services x 10 endpoints, and BPF map memory"
"$HERE/service_program_bench.sh" "$BUILD"
fi

if want 7; then
echo
echo "#### 7. Agent Service stack: initial sync, RSS, single-change latency at 10k Services x 10 endpoints"
CHURN=$BUILD/bench/service_churn_bench
[ -x "$CHURN" ] || { echo "bench/run.sh: $CHURN missing: cmake --build $BUILD --target service_churn_bench" >&2; exit 1; }
"$CHURN"
fi

if want 8; then
echo
echo "#### 8. Cross-node pods: Sluice tunnel / native vs kernel VXLAN / plain routes"
"$HERE/overlay_bench.sh" "$BUILD"
fi

if want 9; then
echo
echo "#### 9. Flow monitor per packet: off / nobody listens / a listener at full rate, BPF_PROG_TEST_RUN"
"$BUILD/bench/monitor_bench"
fi

for b in policy_packet_bench policy_change_bench sluice_policy_setup; do
  [ -x "$BUILD/bench/$b" ] || { echo "bench/run.sh: $BUILD/bench/$b missing: cmake --build $BUILD --target $b" >&2; exit 1; }
done

if want 10; then
echo
echo "#### 10. NetworkPolicy verdict per packet: 10 / 1k / 10k rules, 100k ipcache entries, BPF_PROG_TEST_RUN"
"$BUILD/bench/policy_packet_bench"
fi

if want 11; then
echo
echo "#### 11. NetworkPolicy change -> enforced: 100 changes, namespace relabel of 1000 pods"
"$BUILD/bench/policy_change_bench"
fi

if want 12; then
echo
echo "#### 12. New connections to a pod under a NetworkPolicy: Sluice vs kube-router iptables + ipset"
"$HERE/policy_conn_bench.sh" "$BUILD"
fi

if want 13; then
echo
echo "#### 13. NodePort to a remote backend, packets/s: XDP vs the TC path vs kube-proxy iptables / nftables, veth pair"
[ -x "$BUILD/bench/xdp_pps" ] || { echo "bench/run.sh: $BUILD/bench/xdp_pps missing: cmake --build $BUILD --target xdp_pps" >&2; exit 1; }
"$BUILD/bench/xdp_pps" 2000000 5
fi

if want 14; then
echo
echo "#### 14. Verifier cost at start-up: TC objects, main build vs SLUICE_NO_KERN_CTX build"
[ -x "$BUILD/bench/verifier_bench" ] || { echo "bench/run.sh: $BUILD/bench/verifier_bench missing: cmake --build $BUILD --target verifier_bench" >&2; exit 1; }
base_args=()
for b in ${SLUICE_BENCH_BASELINE_OBJS:-}; do base_args+=("--baseline_obj=$b"); done
"$BUILD/bench/verifier_bench" --rounds=5 ${base_args[@]+"${base_args[@]}"}
fi

if want 15; then
echo
echo "#### 15. Ready after a restart: 100 pods on the node, restart -> /readyz 200"
"$HERE/agent_ready_bench.sh" "$BUILD"
fi

if want 16; then
echo
echo "#### 16. One agent against a large cluster: 5,000 Nodes, 150k Pods, 10k Services / 100k endpoints, 5,000 policies"
[ -x "$BUILD/bench/cluster_scale_bench" ] || { echo "bench/run.sh: $BUILD/bench/cluster_scale_bench missing: cmake --build $BUILD --target cluster_scale_bench" >&2; exit 1; }
for s in ${SLUICE_SCALE_STEPS:-0.1 0.5 1}; do
  "$BUILD/bench/cluster_scale_bench" "$BUILD" --scale="$s"
done
fi

if want 17; then
echo
echo "#### 17. Maglev: disruption, balance, table computation vs the paper's / Katran's fill"
[ -x "$BUILD/bench/maglev_bench" ] || { echo "bench/run.sh: $BUILD/bench/maglev_bench missing: cmake --build $BUILD --target maglev_bench" >&2; exit 1; }
"$BUILD/bench/maglev_bench"
fi
