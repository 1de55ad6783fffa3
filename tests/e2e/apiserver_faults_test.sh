#!/usr/bin/env bash
# Apiserver faults during changes (issue 9): a 1-node sluice-lab; for each fault kind (a stream
# cut mid-event, 410 Gone on re-watch, a stall, go-away, compaction) SLUICE_FAULT_ROUNDS times
# (default 3; `make soak`: 10) the fault is injected around a change of Services and
# EndpointSlices, and the time until the node's pinned maps match the API state is measured
# (tests/e2e/fault_converge.py). Prints p50/max per kind; fails above SLUICE_FAULT_BOUND seconds
# (default 5, generous for a loaded CI machine; the agent's target after the apiserver returns is
# under 2 s).
set -euo pipefail
NAME=flt-api$$
source "$(dirname "$0")/lib.sh"
lab_init
ROUNDS=${SLUICE_FAULT_ROUNDS:-3}
BOUND=${SLUICE_FAULT_BOUND:-5}
KUBECONFIG_PATH=$("$LAB" up --nodes 1 --name "$NAME") || fail "up"
log "lab $NAME up"
AGENT_PID=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["nodes"][0]["agentPid"])' "$DIR/status.json")
python3 "$HERE/fault_converge.py" "$NAME" "$SLUICECTL" "$DIR/node1/bpf" "$KUBECONFIG_PATH" \
  "$ROUNDS" "$BOUND" >"$DIR/converge.out" 2>&1 || fail "convergence: $(cat "$DIR/converge.out")"
while read -r line; do log "$line"; done <"$DIR/converge.out"
kill -0 "$AGENT_PID" 2>/dev/null || fail "the agent exited during the faults"
echo "apiserver_faults_test: PASS"
