#!/usr/bin/env bash
# Ready after a restart (issue 30: "an agent restarted with 100 pods on its node is ready
# (/readyz 200) <= 3 s after the restart"): a one-node sluice-lab with N pods on the node and a
# Service over all of them, its agent restarted R times each way, timed from the restart to the
# agent's /readyz answering 200 (bench/agent_ready_probe.py, polled every 10 ms in the node):
#   - kill:  SIGKILL; the lab's supervisor starts the agent again after its restart delay (200 ms
#            after an agent that ran >= 3 s, as a kubelet restarts a DaemonSet's pod);
#   - start: the agent held down (`sluice-lab agent stop`), then let go: its own start-up alone.
# After each round the Service still has every pod as a backend in the node's maps, and the next
# kill waits until the agent has run 4 s (so the supervisor's back-off stays at its first step).
# Prints each round and "ready: ..." with p50 and max per way, and the last start's agent log with
# the seconds since its first line, where the time goes (SLUICE_READY_PHASES=0: not).
# SLUICE_LAB_AGENT=PATH runs another build's agent (the lab starts that binary).
#
# usage: bench/agent_ready_bench.sh BUILD_DIR
#   SLUICE_READY_PODS (100), SLUICE_READY_ROUNDS (5), SLUICE_READY_MAX_SECONDS (unset: no
#   assertion; a number: exit 1 when a round's restart -> ready exceeds it)
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NAME=startup-ready$$
# shellcheck source-path=SCRIPTDIR source=../tests/e2e/lib.sh
source "$BENCH_DIR/../tests/e2e/lib.sh" "${1:?usage: $0 BUILD_DIR}"
lab_init
PODS=${SLUICE_READY_PODS:-100}
ROUNDS=${SLUICE_READY_ROUNDS:-5}
MAX_SECONDS=${SLUICE_READY_MAX_SECONDS:-}
NODE=node1
PROBE=$BENCH_DIR/agent_ready_probe.py
PY=$(python3 -c 'import sys; print(sys.executable)')

T0=$SECONDS
KUBECONFIG_PATH=$("$LAB" up --nodes 1 --name "$NAME") || fail "up"
log "lab $NAME up in $((SECONDS - T0)) s"
{
  cat <<'YAML'
apiVersion: v1
kind: Service
metadata: {name: ready-bench}
spec:
  selector: {app: ready-bench}
  ports:
  - {name: http, port: 80, targetPort: 8080}
YAML
  for i in $(seq 1 "$PODS"); do pod_manifest "rb-$i" --labels app=ready-bench --node "$NODE"; done
} | K apply --validate=false -f - >/dev/null || fail "apply $PODS pods"
K wait --for=condition=Ready pod -l app=ready-bench --timeout=600s >/dev/null ||
  fail "pods not Ready: $(K get pods | grep -vc Running) of $PODS"
log "$PODS pods Ready on $NODE in $((SECONDS - T0)) s"

AGENT_LOG=$DIR/$NODE/log/agent.log
backends() {
  local ip
  ip=$(K get svc ready-bench -o jsonpath='{.spec.clusterIP}')
  "$SLUICECTL" --bpffs_root="$DIR/$NODE/bpf" services | awk -v f="$ip:80" '$1 == f {print $6}'
}
agent_ready() { lab exec "node/$NODE" -- curl -sf -m 1 -o /dev/null http://127.0.0.1:9879/readyz; }
wait_for 60 output_is "$PODS" backends || fail "the Service has $(backends) backends, want $PODS"
wait_for 60 agent_ready || fail "agent not ready"
# Up 4 s: the supervisor's next restart is after its first delay again (it resets after 3 s).
agent_settled() {
  local pid
  pid=$(jget '[n["agentPid"] for n in d["nodes"] if n["name"] == "'"$NODE"'"][0]' <"$DIR/status.json")
  [ "$pid" -gt 0 ] && [ "$(ps -o etimes= -p "$pid" | tr -d ' ')" -ge 4 ]
}

round() {  # round WAY: one timed restart; appends its seconds to $WORK_DIR/WAY
  local way=$1 out
  if [ "$way" = start ]; then lab agent stop --node "$NODE" >/dev/null || fail "stop"; fi
  LOG_OFFSET=$(stat -c %s "$AGENT_LOG")  # the new agent's lines follow
  out=$(lab exec "node/$NODE" -- "$PY" "$PROBE" "$LAB" "$NAME" "$NODE" "$way") ||
    fail "round ($way): $out"
  echo "$out" | jget 'd["seconds"]' >>"$WORK_DIR/$way"
  log "$way -> ready: $out"
  wait_for 30 output_is "$PODS" backends || fail "after $way: $(backends) backends, want $PODS"
}

WORK_DIR=$(mktemp -d /tmp/sluice-ready-bench.XXXXXX)
before_down() { rm -rf "$WORK_DIR"; }
for r in $(seq 1 "$ROUNDS"); do
  for way in kill start; do
    wait_for 30 agent_settled || true
    round "$way"
  done
done

summary() {  # summary WAY: "p50 X s, max Y s (N rounds)"
  sort -n "$WORK_DIR/$1" | awk '{v[NR] = $1} END {printf "p50 %.2f s, max %.2f s (%d rounds)", v[int((NR + 1) / 2)], v[NR], NR}'
}
echo "ready: $PODS pods on the node; kill -> ready: $(summary kill); start -> ready: $(summary start)"
if [ "${SLUICE_READY_PHASES:-1}" = 1 ]; then
  # The last start's agent, line by line, with the seconds since its first line.
  echo "the last start's log (s since its first line):"
  tail -c +"$((LOG_OFFSET + 1))" "$AGENT_LOG" | "$PY" -c '
import re, sys, datetime
t0 = None
for line in sys.stdin:
    m = re.match(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)\]", line)
    if not m:
        continue
    t = datetime.datetime.fromisoformat(m.group(1))
    t0 = t0 or t
    print(f"  {(t - t0).total_seconds():6.3f} {line[m.end():].strip()[:150]}")'
fi
if [ -n "$MAX_SECONDS" ]; then
  for way in kill start; do
    worst=$(sort -n "$WORK_DIR/$way" | tail -1)
    awk -v w="$worst" -v m="$MAX_SECONDS" 'BEGIN {exit !(w <= m)}' ||
      fail "$way -> ready took $worst s, more than $MAX_SECONDS s"
  done
fi
