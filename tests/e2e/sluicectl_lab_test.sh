#!/usr/bin/env bash
# sluicectl and the metrics of an agent that watches Kubernetes, in a one-node sluice-lab: four
# Services that all look like `clusterip,reject` in the maps (a selector matching no pod, a named
# targetPort no pod declares, no selector, no ready pod) each say why under `sluicectl services`;
# a serving one is named with its backend pod; `ct list --pod` shows a balanced flow and `ct flush`
# empties the map; the agent's scrape (reconcile latency per
# subsystem, watch events per resource) parses with the reference parser; with the agent stopped,
# `services` and `status` still name the Services (from the table the agent left in its state
# directory), and the restarted agent names them again.
set -euo pipefail
NAME=${SLUICE_E2E_NAME:-ops$$}  # a caller may pick a name with its own prefix
source "$(dirname "$0")/lib.sh"
lab_init
CHECK=$(cd "$(dirname "$0")/.." && pwd)/support/prom_check.py

# The lab's agents take extra flags from SLUICE_LAB_AGENT_ARGS (agent/lab/lab.cc).
export SLUICE_LAB_AGENT_ARGS="--metrics_address=127.0.0.1:9962"
KUBECONFIG_PATH=$("$LAB" up --nodes 1 --name "$NAME") || fail "up"
unset SLUICE_LAB_AGENT_ARGS
log "lab $NAME up"
NODE_NS=$NAME-node1
ctl() { ip netns exec "$NODE_NS" "$SLUICECTL" --bpffs_root="$DIR/node1/bpf" --state_dir="$DIR/node1/state" "$@"; }

{
  pod_manifest web-1 --labels app=web --image x --ports http=8080
  pod_manifest client --labels role=client --image x
  pod_manifest slow-1 --labels app=slow --annotations lab.sluice.dev/ready=false --image x --ports 8080
  cat <<'YAML'
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec: {selector: {app: web}, ports: [{name: http, port: 80, targetPort: http}]}
---
apiVersion: v1
kind: Service
metadata: {name: typo}
spec: {selector: {app: wbe}, ports: [{port: 80, targetPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: badport}
spec: {selector: {app: web}, ports: [{port: 80, targetPort: htpp}]}
---
apiVersion: v1
kind: Service
metadata: {name: noselector}
spec: {ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: slow}
spec: {selector: {app: slow}, ports: [{port: 80, targetPort: 8080}]}
YAML
} | K apply --validate=false -f - >/dev/null
K wait --for=condition=Ready pod/web-1 pod/client --timeout=60s >/dev/null ||
  fail "web-1 or client not ready"

# The reasons come from the agent's store once it has seen the pods and slices.
want_why() {  # want_why SERVICE REASON
  ctl services | grep -A1 " default/$1\$" | grep -qF "why: $2"
}
wait_for 20 want_why slow "1 pod(s) match the selector, none is ready" ||
  fail "slow: $(ctl services)"
want_why typo "selector app=wbe matches no pod in namespace default" || fail "typo: $(ctl services)"
want_why badport "targetPort 'htpp' is no container port (TCP) of the 1 pod(s) the selector matches" ||
  fail "badport: $(ctl services)"
want_why noselector "no selector, and no EndpointSlice was made for it by hand" ||
  fail "noselector: $(ctl services)"
log "ok: the four empty Services say why"
wait_for 20 sh -c "ip netns exec $NODE_NS $SLUICECTL --bpffs_root=$DIR/node1/bpf \
  --state_dir=$DIR/node1/state services | grep -A1 ' default/web:http\$' | grep -q 'default/web-1'" ||
  fail "web is not named with its backend pod: $(ctl services)"
[ "$(ctl -o json services | /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
print(sorted(f.get("service", "") for f in d if f.get("service", "").startswith("default/")))')" = \
  "['default/badport', 'default/kubernetes:https', 'default/noselector', 'default/slow', 'default/typo', 'default/web:http']" ] ||
  fail "services -o json: $(ctl -o json services)"
only=$(ctl --service=default/typo services | awk 'NR > 1 && $1 !~ /^(why|slot)/ {print $NF}' | sort -u)
[ "$only" = "default/typo" ] || fail "services --service=default/typo: $(ctl --service=default/typo services)"
log "ok: services named, -o json, --service"

# A balanced flow leaves conntrack entries; ct list shows them by pod, ct flush empties the map.
WEB_IP=$(K get svc web -o jsonpath='{.spec.clusterIP}')
[ "$(lab probe --from default/web-1 --to "$WEB_IP:80")" = CONNECTED ] || fail "web-1 -> web"
n=$(ctl -o json --pod=default/web-1 ct list | jget 'len(d)')
[ "$n" -ge 2 ] || fail "ct list --pod: $(ctl ct list)"
ctl ct flush | grep -q "^deleted [1-9]" || fail "ct flush deleted nothing"
[ "$(ctl -o json ct list | jget 'len(d)')" = 0 ] || fail "ct list after flush: $(ctl ct list)"
log "ok: ct list --pod ($n entries), ct flush"

# sluicectl trace: one packet through the live program, each decision named, its state taken
# back; what it says agrees with a real connection.
WEB_POD=$(K get pod web-1 -o jsonpath='{.status.podIP}')
SLOW_IP=$(K get svc slow -o jsonpath='{.spec.clusterIP}')
client_ct() { ctl -o json --pod=default/client ct list | jget 'len(d)'; }
tr=$(ctl trace -o json --from default/client --to "$WEB_IP:80") || fail "trace to web: $tr"
[ "$(echo "$tr" | jget 'd["outcome"]')" = delivered ] || fail "trace to web: $tr"
[ "$(echo "$tr" | jget '[s.get("service") for s in d["steps"] if s["stage"] == "service"][0]')" = \
  default/web:http ] || fail "trace names no Service: $tr"
[ "$(echo "$tr" | jget '[s["pod"] for s in d["steps"] if s["stage"] == "dnat"][0]')" = \
  default/web-1 ] || fail "trace names no backend pod: $tr"
[ "$(echo "$tr" | jget 'd["output"]["destination"]')" = "$WEB_POD" ] || fail "trace output: $tr"
[ "$(echo "$tr" | jget 'd["undone"]["conntrack"] >= 1')" = True ] || fail "trace undid nothing: $tr"
[ "$(client_ct)" = 0 ] || fail "trace left conntrack entries: $(ctl ct list)"
ctl trace --from default/client --to "$WEB_IP:80" | grep -q "^  delivery .*default/web-1" ||
  fail "trace table: $(ctl trace --from default/client --to "$WEB_IP:80")"
tr=$(ctl trace -o json --from default/client --to "$WEB_POD:8080" --proto udp)
[ "$(echo "$tr" | jget 'd["outcome"], d["steps"][0]["result"]')" = \
  "('delivered', 'no Service frontend: not translated')" ] || fail "trace udp to pod: $tr"
# A rejected or dropped packet is an answer, but no success: trace exits 3.
rc=0; tr=$(ctl trace -o json --from default/client --to "$SLOW_IP:80") || rc=$?
[ "$(echo "$tr" | jget 'd["outcome"], d["output"]["tcpFlags"]')" = "('rejected', 'AR')" ] ||
  fail "trace to a Service without ready endpoints: $tr"
[ "$rc" = 3 ] || fail "trace of a rejected packet: exit $rc, want 3"
ctl trace --from default/nobody --to "$WEB_IP:80" 2>/dev/null && fail "trace from an unknown pod"
rc=0; ctl trace --from default/client --to "$WEB_IP" 2>/dev/null || rc=$?
[ "$rc" = 2 ] || fail "trace without a port: exit $rc, want 2 (usage)"
K apply --validate=false -f - >/dev/null <<'YAML'
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-deny}
spec: {podSelector: {matchLabels: {app: web}}, policyTypes: [Ingress]}
YAML
denied() {
  local rc=0 tr
  tr=$(ctl trace -o json --from default/client --to "$WEB_POD:8080") || rc=$?
  [ "$rc" = 3 ] &&
    echo "$tr" | jget 'd["outcome"], d["dropReason"]' | grep -qx "('dropped', 'policy_denied')"
}
wait_for 20 denied || fail "trace under deny: $(ctl trace --from default/client --to "$WEB_POD:8080")"
{ ctl trace --from default/client --to "$WEB_POD:8080" || true; } |
  grep -q "policy-ingress  denied: " ||
  fail "trace names no denying policy point: $(ctl trace --from default/client --to "$WEB_POD:8080")"
[ "$(lab probe --from default/client --to "$WEB_POD:8080")" != CONNECTED ] ||
  fail "the trace says denied, a real connection went through"
K delete networkpolicy web-deny >/dev/null
reaches_web() { [ "$(lab probe --from default/client --to "$WEB_POD:8080")" = CONNECTED ]; }
wait_for 20 reaches_web ||
  fail "client -> web-1 after the policy went"
[ "$(ctl trace -o json --from default/client --to "$WEB_POD:8080" | jget 'd["outcome"]')" = \
  delivered ] || fail "trace after the policy went"
log "ok: trace (Service + backend, UDP to a pod, reject, policy deny agrees with a connection)"

# sluicectl finds its node: inside node1 (--node, or sluice-lab sluicectl) the agent tells it
# its bpffs root, state directory and observe socket, so no path is passed.
CTL_NODE() { "$SLUICECTL" --node node1 --lab "$NAME" "$@"; }
CTL_NODE endpoints | grep -q " default/web-1\$" || fail "--node endpoints: $(CTL_NODE endpoints)"
CTL_NODE endpoints | grep -qF "(no endpoint record)" && fail "--node endpoints: $(CTL_NODE endpoints)"
lab sluicectl node1 services | grep -A1 " default/web:http\$" | grep -q "default/web-1" ||
  fail "sluice-lab sluicectl node1 services: $(lab sluicectl node1 services)"
st=$(CTL_NODE status 2>&1) || fail "--node status: $st"
echo "$st" | grep -qE "^IPAM: +[1-9][0-9]*/253 allocated from " || fail "--node status IPAM: $st"
echo "$st" | grep -q "^Agent: *up" || fail "--node status: $st"
echo "$st" | grep -qF "which may not be the agent's" && fail "--node status warned: $st"
lab sluicectl node1 observe --last 1 >/dev/null 2>&1 || fail "--node observe: no flow monitor found"
# On the host, where no agent answers (--agent=127.0.0.1:1 stands for it), sluicectl says so and
# what to pass, and counts nothing from a directory that may not be the agent's.
host=$("$SLUICECTL" --agent=127.0.0.1:1 --bpffs_root="$DIR/node1/bpf" status 2>&1) ||
  fail "status on the host: $host"
echo "$host" | grep -qF "reads the defaults --state_dir=/var/lib/sluice, which may not be the agent's" ||
  fail "status on the host does not say what it guessed: $host"
echo "$host" | grep -q "^IPAM: *unknown" || fail "status on the host counts IPAM: $host"
echo "$host" | grep -qE "^IPAM: +[0-9]+/" && fail "status on the host prints a count: $host"
log "ok: sluicectl --node / sluice-lab sluicectl learn the node from its agent; the host says what to pass"

# Empty answers that would look like success: each says what it is.
rc=0; out=$(ctl --pod=default/nosuch ct list 2>&1) || rc=$?
[ "$rc" = 1 ] || fail "ct list --pod=default/nosuch: exit $rc: $out"
echo "$out" | grep -qF -- "--pod=default/nosuch: no endpoint of that pod on this node" ||
  fail "ct list --pod=default/nosuch: $out"
out=$(ctl observe --last 5 --pod default/nosuch --port 1 2>&1) || fail "observe nothing: $out"
echo "$out" | grep -qF "no flow matches the filters" || fail "observe matching nothing: '$out'"
# policy get: POD alone is namespace default, as observe reads it; -o json is honoured.
ctl policy get web-1 | grep -q "^pod default/web-1 " || fail "policy get web-1: $(ctl policy get web-1)"
[ "$(ctl -o json policy get web-1 | jget 'd["pod"], type(d["policy"]).__name__')" = \
  "('default/web-1', 'bool')" ] || fail "policy get -o json: $(ctl -o json policy get web-1)"
# -o json before the command word is honoured by every command, or refused; never ignored.
# (The agent records flows while someone follows: a follower, then traffic.)
ctl -o json observe --follow --pod default/client >"$DIR/follow.json" 2>/dev/null &
FOLLOWER=$!
followed() {
  lab probe --from default/client --to "$WEB_POD:8080" >/dev/null || true
  [ -s "$DIR/follow.json" ]
}
wait_for 20 followed || fail "-o json observe --follow printed nothing"
kill "$FOLLOWER" 2>/dev/null; wait "$FOLLOWER" 2>/dev/null || true
[ "$(head -1 "$DIR/follow.json" | jget '"source" in d and "verdict" in d')" = True ] ||
  fail "-o json observe printed no JSON flow: $(head -3 "$DIR/follow.json")"
[ "$(ctl -o json ct flush | jget 'type(d["deleted"]).__name__')" = int ] ||
  fail "-o json ct flush: $(ctl -o json ct flush)"
rc=0; ctl -o yaml endpoints >/dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "-o yaml: exit $rc, want 2"
log "ok: ct list of an unknown pod fails, observe says nothing matched, policy get defaults its namespace and speaks json"

scrape=$(ip netns exec "$NODE_NS" curl -sf -m 3 http://127.0.0.1:9962/metrics) || fail "no /metrics"
echo "$scrape" | "$CHECK" >/dev/null || fail "scrape does not parse"
for want in 'sluice_reconcile_duration_seconds_count{subsystem="services"}' \
            'sluice_reconcile_duration_seconds_count{subsystem="policy"}' \
            'sluice_reconcile_duration_seconds_count{subsystem="routing"}' \
            'sluice_k8s_watch_synced{resource="Service"} 1' \
            'sluice_k8s_watch_events_total{resource="Pod"}'; do
  echo "$scrape" | grep -qF "$want" || fail "scrape lacks $want"
done
events=$(echo "$scrape" | sed -n 's/^sluice_k8s_watch_events_total{resource="Service"} //p')
[ "${events:-0}" -ge 1 ] || fail "no Service watch event counted: '$events'"
log "ok: scrape parses; reconcile latency per subsystem, watch events per resource"

# With the agent down, sluicectl names the Services from the table the agent left in its state
# directory (services.json, written after each Service batch); back up, the agent names them.
names_json() {
  ctl -o json services | /usr/bin/python3 -c '
import json, sys
print(sorted(f.get("service", "") for f in json.load(sys.stdin) if f.get("service", "").startswith("default/")))'
}
NAMED_UP=$(names_json)
lab agent stop --node node1 >/dev/null || fail "stop node1's agent"
agent_down() { ! ip netns exec "$NODE_NS" curl -sf -m 1 -o /dev/null http://127.0.0.1:9879/readyz; }
wait_for 20 agent_down || fail "node1's agent still answers after agent stop"
down=$(ctl services)
echo "$down" | grep -qF "(Service names from $DIR/node1/state/services.json (the agent is down" ||
  fail "services with the agent down: $down"
echo "$down" | grep -q " default/web:http\$" || fail "web unnamed with the agent down: $down"
[ "$(names_json)" = "$NAMED_UP" ] ||
  fail "names with the agent down: $(names_json), up: $NAMED_UP"
st=$(ctl status)
echo "$st" | grep -q "^Agent: *down" || fail "status with the agent down: $st"
echo "$st" | grep -qE "^ +[0-9]+ Services named from $DIR/node1/state/services.json" ||
  fail "status names no Services with the agent down: $st"
echo "$st" | grep -q "serves nothing: default/typo (tcp " ||
  fail "status does not name the empty Service typo with the agent down: $st"
[ "$(ctl -o json status | jget 'd["services"]["named"] >= 6')" = True ] ||
  fail "status -o json with the agent down: $(ctl -o json status)"
log "ok: agent down: services and status name the Services from services.json"
lab agent start --node node1 >/dev/null || fail "start node1's agent"
named_by_agent() { ctl services | grep -A1 " default/typo\$" | grep -q "why: "; }
wait_for 60 named_by_agent || fail "the restarted agent does not name the Services: $(ctl services)"
[ "$(names_json)" = "$NAMED_UP" ] || fail "names after the restart: $(names_json)"
log "ok: agent started again, names from the agent"
