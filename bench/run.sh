#!/usr/bin/env bash
# Sluice's benchmarks, each reported as a ratio against a baseline measured in the same run:
#   1. per-packet cost of the pod egress BPF program vs an empty TC program (BPF_PROG_TEST_RUN);
#   2. CNI ADD/DEL latency of sluice-cni vs the reference bridge + host-local plugins;
#   3. initial sync (time, peak RSS) of the agent's Kubernetes client for 10k Services / 100k
#      endpoints vs whole-DOM parses of the same unpaginated lists (k8s_sync_bench).
# Needs root, a built tree (`cmake --build BUILD`) and containernetworking-plugins.
# usage: bench/run.sh BUILD_DIR [extra Google Benchmark flags for pod_egress_bench]
set -euo pipefail
BUILD=${1:?usage: $0 BUILD_DIR}
shift
BUILD=$(cd "$BUILD" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
[ "$(id -u)" -eq 0 ] || { echo "bench/run.sh: needs root (BPF, network namespaces)" >&2; exit 1; }
BIN=$BUILD/bench/pod_egress_bench
[ -x "$BIN" ] || { echo "bench/run.sh: $BIN missing: cmake --build $BUILD first" >&2; exit 1; }

echo "#### 1. pod egress program: ns per packet, BPF_PROG_TEST_RUN ($(uname -r), $(nproc) CPUs)"
"$BIN" "$@"

echo
echo "#### 2. CNI ADD/DEL latency"
"$HERE/cni_latency.sh" "$BUILD"

echo
echo "#### 3. Kubernetes initial sync: 10k Services / 100k endpoints vs whole-DOM parse"
SYNC=$BUILD/bench/k8s_sync_bench
[ -x "$SYNC" ] || { echo "bench/run.sh: $SYNC missing: cmake --build $BUILD --target k8s_sync_bench" >&2; exit 1; }
"$SYNC"
