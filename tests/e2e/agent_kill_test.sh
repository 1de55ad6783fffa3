#!/usr/bin/env bash
# Proofs under faults (issue 9): node agents killed with SIGKILL at random points, in a 2-node
# sluice-lab that restarts them itself (as a DaemonSet would), under continuous load through a
# Service and pod to pod across nodes:
#   - new TCP connections and UDP request/reply to a ClusterIP (backends on both nodes) and to a
#     pod on the other node, from a client pod on each node, plus long-lived TCP connections
#     (through the ClusterIP and pod to pod) that exchange a line every 100 ms;
#   - phase 1: SLUICE_KILLS/2 kills with nothing changing; phase 2: the rest while Services scale
#     up (2 more backends) and pods churn (CNI ADD/DEL in a loop), then scale back down;
#   - asserts: zero failed connections or datagrams, no long-lived connection interrupted, the
#     programmed maps (LB, endpoints, ipcache, policy; tests/e2e/fault_maps.py) identical to those
#     before the first kill once converged, and after the churn nothing leaked on either node:
#     IPAM addresses, endpoint records, slc* links, sluice_ep4 / sluice_policy_ep entries, pod
#     network namespaces.
# SLUICE_KILLS (default 20) and SLUICE_CHURN_SECONDS (phase 2's minimum length, default 15);
# `make soak` runs it with 100 kills and longer churn. Prints the figures as "figures: ...".
set -euo pipefail
NAME=flt-kill$$
source "$(dirname "$0")/lib.sh"
lab_init
WORK=$(mktemp -d /tmp/sluice-agent-kill.XXXXXX)
KEEP_LOGS=/tmp/agent_kill_test-$NAME
KILLS=${SLUICE_KILLS:-20}
CHURN_SECONDS=${SLUICE_CHURN_SECONDS:-15}
PY=$(python3 -c 'import sys; print(sys.executable)')  # pods' commands run without pyenv's shims
# SLUICE_KEEP_LAB=1 leaves the lab up after a failure, to look at it (sluice-lab down --name ...).
if [ "${SLUICE_KEEP_LAB:-0}" = 1 ]; then trap 'log "lab $NAME kept"' EXIT; fi
before_down() { touch "$WORK/load1.json.stop" "$WORK/load2.json.stop" "$WORK/churn.stop" 2>/dev/null || true; }
START=$SECONDS

KUBECONFIG_PATH=$("$LAB" up --nodes 2 --name "$NAME") || fail "up"
log "lab $NAME up"

pod_yaml() {  # pod_yaml POD NODE [APP]: netexec on 8080 TCP+UDP and a line echo server on 9000
  pod_manifest "$1" --labels "app=${3:-none}" --node "$2" --ports 8080,8080/UDP \
    --container "{name: echo, image: echo, command: [\"$PY\", \"$HERE/fault_echo.py\", \"9000\"]}"
}
{
  cat <<'YAML'
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: 8080}
  - {name: dns, port: 53, targetPort: 8080, protocol: UDP}
  - {name: echo, port: 9000, targetPort: 9000}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-from-pods}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {}}]
YAML
  pod_yaml web-1 node1 web
  pod_yaml web-2 node2 web
  pod_yaml client1 node1
  pod_yaml client2 node2
} | K apply --validate=false -f - >/dev/null || fail "apply"
K wait --for=condition=Ready pod/web-1 pod/web-2 pod/client1 pod/client2 --timeout=60s >/dev/null ||
  fail "pods not Ready: $(K get pods -o wide)"
WEB=$(K get svc web -o jsonpath='{.spec.clusterIP}')
WEB1=$(K get pod web-1 -o jsonpath='{.status.podIP}')
WEB2=$(K get pod web-2 -o jsonpath='{.status.podIP}')
log "web=$WEB web-1=$WEB1 web-2=$WEB2"
backends_of() {  # backends_of NODE PORT: slot count of web's frontend in NODE's maps
  "$SLUICECTL" --bpffs_root="$DIR/$1/bpf" services | awk -v f="$WEB:$2" '$1 == f {print $6}'
}
agent_ready() { lab exec "node/$1" -- curl -sf -m 1 -o /dev/null http://127.0.0.1:9879/readyz; }
both_ready() { agent_ready node1 && agent_ready node2; }
for n in node1 node2; do
  wait_for 30 output_is 2 backends_of $n 80 || fail "$n does not program web with 2 backends"
done
wait_for 30 both_ready || fail "agents not ready"

snapshot() { python3 "$HERE/fault_maps.py" "$DIR/$1/bpf"; }
maps_match() { [ "$(snapshot "$1")" = "$(cat "$WORK/maps-$1.before")" ]; }
for n in node1 node2; do snapshot $n >"$WORK/maps-$n.before"; done
log "maps before: node1 $(wc -l <"$WORK/maps-node1.before") entries, node2 $(wc -l <"$WORK/maps-node2.before")"

# Load from both nodes: each client reaches the Service (both backends, one local, one remote)
# and the backend on the other node directly.
# The direct (pod to pod) streams take source ports of their own, below the kernel's range the
# Service streams use: a known datapath issue of its own (conntrack, not restarts) is that a
# direct connection to a backend from the source port of a recently closed Service connection
# to that backend gets its SYN-ACK reverse-NATed by the Service flow's leftover reply entry (it
# arrives from the ClusterIP) and times out. This test proves restarts; that one is reported.
start_load() {  # start_load N REMOTE_POD_IP
  rm -f "$WORK/load$1.json"*
  lab exec "client$1" -- sysctl -qw net.ipv4.ip_local_port_range="30000 60999"
  lab exec "client$1" -- python3 "$HERE/fault_load.py" "$WORK/load$1.json" \
    "svc-tcp=tcp:$WEB:80" "svc-udp=udp:$WEB:53" "pod-tcp=tcp:$2:8080:10000-19999" \
    "pod-udp=udp:$2:8080:20000-29999" \
    "svc-long-a=long:$WEB:9000" "svc-long-b=long:$WEB:9000" "pod-long=long:$2:9000" \
    >>"$WORK/load$1.log" 2>&1 &
}
start_load 1 "$WEB2"
start_load 2 "$WEB1"
wait_for 30 test -f "$WORK/load1.json.started" -a -f "$WORK/load2.json.started" ||
  fail "load got no answers: $(cat "$WORK"/load*.log)"
log "load running"

KILLED=0
kill_agents() {  # kill_agents N: N SIGKILLs, each of a random node's agent at a random point
  local i node
  for i in $(seq 1 "$1"); do
    node=node$((RANDOM % 2 + 1))
    # Half the kills hit an agent that is serving, half one still restoring or syncing.
    if [ $((RANDOM % 2)) = 0 ]; then wait_for 30 agent_ready $node || fail "$node's agent never ready"; fi
    sleep "$(python3 -c 'import random; print(round(random.uniform(0, 1.5), 2))')"  # the kill point
    echo "$(date +%s.%N) $node" >>"$WORK/kills"
    lab agent kill --node $node --wait >/dev/null || fail "kill $node's agent"
    KILLED=$((KILLED + 1))
  done
}
converge() {  # converge WHAT: both agents ready and both nodes' maps equal to the snapshot
  local t0=$SECONDS n
  wait_for 60 both_ready || fail "$1: agents not ready again"
  for n in node1 node2; do
    wait_for 30 maps_match $n || fail "$1: $n's maps differ from before the kills:
$(diff <(cat "$WORK/maps-$n.before") <(snapshot $n) | head -40)"
  done
  log "ok: $1: maps identical to before the kills on both nodes ($((SECONDS - t0)) s to converge)"
}

# Phase 1: kills with nothing changing.
kill_agents $((KILLS / 2))
converge "phase 1 ($KILLED kills)"

# Phase 2: the rest of the kills during a scale-up and pod churn (each round: a pod per node,
# created, Ready, deleted).
{
  j=0
  while [ ! -f "$WORK/churn.stop" ]; do
    j=$((j + 1))
    { pod_yaml "churn-$j-a" node1; pod_yaml "churn-$j-b" node2; } |
      K apply --validate=false -f - >/dev/null || echo "round $j: apply failed" >>"$WORK/churn.err"
    K wait --for=condition=Ready "pod/churn-$j-a" "pod/churn-$j-b" --timeout=60s >/dev/null ||
      echo "round $j: not Ready" >>"$WORK/churn.err"
    K delete pod "churn-$j-a" "churn-$j-b" --grace-period=0 --wait=false >/dev/null ||
      echo "round $j: delete failed" >>"$WORK/churn.err"
    echo "$j" >"$WORK/churn.rounds"
  done
} >>"$WORK/churn.log" 2>&1 &
CHURN=$!
PHASE2=$SECONDS
{ pod_yaml web-3 node1 web; pod_yaml web-4 node2 web; } | K apply --validate=false -f - >/dev/null ||
  fail "scale up"
kill_agents $((KILLS - KILLS / 2 - KILLS / 4))
K wait --for=condition=Ready pod/web-3 pod/web-4 --timeout=60s >/dev/null || fail "web-3/4 not Ready"
wait_for 60 output_is 4 backends_of node1 80 || fail "node1 did not scale web to 4 backends"
log "scaled up to 4 backends"
kill_agents $((KILLS / 4))
while [ $((SECONDS - PHASE2)) -lt "$CHURN_SECONDS" ]; do kill_agents 1; done
touch "$WORK/churn.stop"
wait "$CHURN" || true
# The scale-down comes after the kills, with both agents serving again: a backend that goes while
# a node's agent is down stays in that node's slots until the agent is back (as a stopped
# kube-proxy leaves its rules), and connections balanced onto it meanwhile fail.
wait_for 60 both_ready || fail "agents not ready before the scale-down"
K delete pod web-3 web-4 --grace-period=1 --wait=false >/dev/null || fail "scale down"
wait_for 60 sh -c "[ -z \"\$(kubectl --kubeconfig $KUBECONFIG_PATH get pods -o name | grep -E 'pod/(churn-|web-[34])')\" ]" ||
  fail "churned pods not gone: $(K get pods -o wide)"
ROUNDS=$(cat "$WORK/churn.rounds" 2>/dev/null || echo 0)
log "phase 2: $ROUNDS churn rounds ($((ROUNDS * 2)) pods), churn problems: $(cat "$WORK/churn.err" 2>/dev/null | wc -l)"
converge "phase 2 ($KILLED kills, scale-up and $((ROUNDS * 2)) pods churned)"

# The load must have seen none of it.
touch "$WORK/load1.json.stop" "$WORK/load2.json.stop"
wait_for 30 test -f "$WORK/load1.json" -a -f "$WORK/load2.json" || fail "load wrote no summary"
FIGURES=$(python3 - "$WORK/load1.json" "$WORK/load2.json" <<'PY'
import json, sys
total, bad = {}, []
for i, path in enumerate(sys.argv[1:], 1):
    for name, r in json.load(open(path)).items():
        total[r["kind"]] = total.get(r["kind"], 0) + r["total"]
        if r["failures"] or r["interrupted"] or r["died"] or r["total"] < 10:
            bad.append(f"client{i} {name} -> {r['target']}: {r['failures']} of {r['total']} failed, "
                       f"interrupted={r['interrupted']}, died={r['died']}, first errors {r['errors'][:3]}")
print(f"tcp connections {total.get('tcp', 0)}, udp exchanges {total.get('udp', 0)}, "
      f"long-lived exchanges {total.get('long', 0)} over 6 connections")
for b in bad:
    print("BAD " + b)
PY
)
if grep -q '^BAD' <<<"$FIGURES"; then
  for n in node1 node2; do log "$n drops: $("$SLUICECTL" --bpffs_root="$DIR/$n/bpf" drops 2>&1 | head -20)"; done
  log "kills (time node): $(tr '\n' ' ' <"$WORK/kills")"
  log "failure times: $(python3 -c 'import json,sys; [print(n, r["error_times"]) for p in sys.argv[1:] for n, r in json.load(open(p)).items() if r["failures"]]' "$WORK/load1.json" "$WORK/load2.json")"
  fail "load under kills: $FIGURES"
fi
log "ok: $KILLED kills: $FIGURES; 0 failures, 0 long-lived connections interrupted"

# Nothing of the churned pods left behind (each node holds exactly what its live pods need).
K get pods -o json >"$WORK/pods.json"
slc_links() { ip -n "$1" -o link show | awk -F': ' '{print $2}' | grep -c '^slc' || true; }
for n in node1 node2; do
  NETNS=$(python3 -c 'import json,sys; print([x["netns"] for x in json.load(open(sys.argv[1]))["nodes"] if x["name"] == sys.argv[2]][0])' "$DIR/status.json" $n)
  PODS=$(python3 -c 'import json,sys; print(sum(1 for p in json.load(open(sys.argv[1]))["items"] if p["spec"].get("nodeName") == sys.argv[2]))' "$WORK/pods.json" $n)
  # A deleted pod's veth goes just after its DEL answered (the agent deletes it in the background).
  wait_for 10 output_is "$PODS" slc_links "$NETNS" || true
  LINKS=$(slc_links "$NETNS")
  EP4=$(bpftool -j map dump pinned "$DIR/$n/bpf/sluice_ep4" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
  POLEP=$(python3 "$HERE/fault_maps.py" "$DIR/$n/bpf" sluice_policy_ep | grep -c . || true)  # used slots
  ADDRS=$(find "$DIR/$n/state/ipam" -type f -regextype egrep -regex '.*/[0-9]+(\.[0-9]+){3}' | wc -l)
  RECORDS=$(find "$DIR/$n/state/endpoints" -type f | wc -l)
  NS=$(ip netns list | awk '{print $1}' | grep -c "^$NAME-pod-" || true)
  log "$n: $PODS pods; slc links $LINKS, sluice_ep4 $EP4, sluice_policy_ep $POLEP, IPAM addresses $ADDRS, endpoint records $RECORDS"
  expect "$n slc* links" "$LINKS" "$PODS"
  expect "$n sluice_ep4 entries" "$EP4" "$PODS"
  expect "$n sluice_policy_ep entries" "$POLEP" "$PODS"
  expect "$n IPAM addresses" "$ADDRS" "$PODS"
  expect "$n endpoint records" "$RECORDS" "$PODS"
done
expect "pod network namespaces" "$NS" "$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["items"]))' "$WORK/pods.json")"
RESTARTS=$(python3 -c 'import json,sys; print(sum(n["agentRestarts"] for n in json.load(open(sys.argv[1]))["nodes"]))' "$DIR/status.json")
expect "restarts the lab made" "$RESTARTS" "$KILLED"
log "figures: kills $KILLED, $FIGURES, failures 0, churned pods $((ROUNDS * 2)), leaks 0, $((SECONDS - START)) s"
echo "agent_kill_test: PASS"
