#!/usr/bin/env bash
# A policy that does not fit sluice_policy4 (issue 32), in a one-node sluice-lab whose agent runs
# with --bpf_policy_max=32. Pod `server` is selected by NetworkPolicy `small` (pod `a` may reach
# TCP 8080); then NetworkPolicy `big` adds 40 single ports for pod `b` (plus 8080), which the map
# cannot take. The server keeps its last complete policy: a still reaches it, b still does not,
# and the degraded state is told by `sluicectl status` and `policy get`, the metrics
# sluice_policy_endpoints{state="degraded"} and sluice_policy_endpoint_degraded{pod}, a Warning
# Event PolicyNotApplied on the Pod and an agent log line naming default/big. Once `big` shrinks
# to 8080 alone the server is whole again by itself: b reaches it, the metric says healthy and a
# Normal Event PolicyApplied is posted.
# Then an invalid NetworkPolicy (an ipBlock that is not a CIDR) isolates only the pod it selects
# (fail closed): that pod is unreachable, its neighbour in the same namespace is not; the policy
# is named in a Warning Event PolicyInvalid and in `sluicectl status`.
set -euo pipefail
NAME=${SLUICE_E2E_NAME:-pmf$$}  # a caller may pick a name with its own prefix
source "$(dirname "$0")/lib.sh"
lab_init
WORK=$(mktemp -d /tmp/sluice-policy-map-full.XXXXXX)
KEEP_LOGS=/tmp/policy_map_full_test-$NAME

export SLUICE_LAB_AGENT_ARGS="${SLUICE_LAB_AGENT_ARGS:-} --bpf_policy_max=32 --metrics_address=127.0.0.1:9879"
KUBECONFIG_PATH=$("$LAB" up --nodes 1 --name "$NAME") || fail "up"
log "lab $NAME up"

# Pods before policies: a pod created in a namespace with a policy starts closed (one entry).
{
  cat <<'YAML'
---
apiVersion: v1
kind: Namespace
metadata: {name: inv}
YAML
  pod_manifest server --labels app=server --node node1 --ports 8080
  pod_manifest a --labels app=a --node node1
  pod_manifest b --labels app=b --node node1
  pod_manifest iso --namespace inv --labels app=iso --node node1 --ports 8080
  pod_manifest free --namespace inv --labels app=free --node node1 --ports 8080
} | K apply --validate=false -f - >/dev/null || fail "apply pods"
K wait --for=condition=Ready pod/server pod/a pod/b --timeout=60s >/dev/null || fail "pods not Ready"
K wait -n inv --for=condition=Ready pod/iso pod/free --timeout=60s >/dev/null || fail "inv pods not Ready"
SERVER=$(ip_of server)
ISO=$(K get pod -n inv iso -o jsonpath='{.status.podIP}')
FREE=$(K get pod -n inv free -o jsonpath='{.status.podIP}')

# probe FROM HOST:PORT: CONNECTED, TIMEOUT, ...
probe() { lab probe --from "$1" --to "$2" --timeout 1 || true; }
ctl() { lab sluicectl node1 -- "$@"; }
metrics() { lab exec node/node1 -- curl -sf -m 5 http://127.0.0.1:9879/metrics; }
sample() { metrics | awk -v n="$1" '$1 == n {v = $2} END {print v + 0}'; }
# events KIND NAME REASON: how many Events with that reason are about that object.
events() {
  K get events -A -o json | jget "sum(1 for e in d['items'] if e['involvedObject']['kind'] == '$1'
    and e['involvedObject']['name'] == '$2' and e['reason'] == '$3')"
}
degraded_pods() { ctl -o json status | jget "','.join(x['pod'] for x in d['policy']['degraded'])"; }

cat <<'YAML' | K apply --validate=false -f - >/dev/null || fail "apply small"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: small}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: a}}}]
    ports: [{port: 8080}]
YAML
wait_for 20 output_is CONNECTED probe default/a "$SERVER:8080" || fail "a -> server under small"
wait_for 20 output_is TIMEOUT probe default/b "$SERVER:8080" || fail "b -> server not denied under small"
expect "degraded endpoints under small" "$(degraded_pods)" ""
log "small in force: a -> server allowed, b -> server denied"

# big: 8080 and 40 even ports (no two share a prefix) for b: 41 more entries than 32 can hold.
{
  cat <<'YAML'
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: big}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: b}}}]
    ports:
    - {port: 8080}
YAML
  for i in $(seq 0 39); do echo "    - {port: $((20000 + 2 * i))}"; done
} | K apply --validate=false -f - >/dev/null || fail "apply big"
wait_for 20 output_is default/server degraded_pods || fail "server not reported degraded: $(ctl status)"
log "ok: sluicectl status: $(ctl status | grep -A1 '^Policy:' | tr -s ' ' | tr '\n' ' ')"
# The last complete policy is what the datapath holds: a in, b out.
expect "a -> server while degraded" "$(probe default/a "$SERVER:8080")" CONNECTED
expect "b -> server while degraded" "$(probe default/b "$SERVER:8080")" TIMEOUT
get=$(ctl -o json policy get default/server)
expect "policy get state" "$(jget "d['state']" <<<"$get")" degraded
expect "policy get reason" "$(jget "d['degraded']['reason']" <<<"$get")" map_full
expect "policy get names big" "$(jget "'default/big' in d['degraded']['policies']" <<<"$get")" True
# small's one port allow (for a) and none of big's (b's 8080 nor the 40 ports).
expect "policy get keeps small's allows" \
  "$(jget "sorted(x['ports'] for x in d['ingress']['allows'] if x['ports'] != 'any')" <<<"$get")" \
  "['tcp/8080']"
ctl policy get default/server | grep -q '^state degraded (map_full)' || fail "policy get text"
expect "metric degraded endpoints" "$(sample 'sluice_policy_endpoints{state="degraded"}')" 1
expect "metric degraded server" \
  "$(sample 'sluice_policy_endpoint_degraded{pod="default/server",reason="map_full"}')" 1
wait_for 10 output_is 1 events Pod server PolicyNotApplied || fail "no PolicyNotApplied Event"
line=$(grep 'policy: endpoint [0-9]* of pod default/server: the policy of NetworkPolicies' \
  "$DIR"/node1/log/agent.log | grep 'does not fit sluice_policy4' | tail -1)
grep -q 'default/big' <<<"$line" || fail "no log line naming default/big: '$line'"
log "ok: log: ${line#*policy: }"
log "ok: degraded in status, policy get, metrics, Event and log"

# big shrinks to 8080: it fits, the server is whole again without anything else happening.
cat <<'YAML' | K apply --validate=false -f - >/dev/null || fail "shrink big"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: big}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: b}}}]
    ports: [{port: 8080}]
YAML
wait_for 20 output_is "" degraded_pods || fail "server still degraded: $(ctl status)"
wait_for 20 output_is CONNECTED probe default/b "$SERVER:8080" || fail "b -> server under shrunk big"
expect "a -> server after recovery" "$(probe default/a "$SERVER:8080")" CONNECTED
expect "metric degraded endpoints after recovery" "$(sample 'sluice_policy_endpoints{state="degraded"}')" 0
expect "policy get state after recovery" "$(ctl -o json policy get default/server | jget "d['state']")" healthy
wait_for 10 output_is 1 events Pod server PolicyApplied || fail "no PolicyApplied Event"
log "ok: healthy again"

# An invalid policy isolates only what it selects, and is named.
cat <<'YAML' | K apply --validate=false -f - >/dev/null || fail "apply bad"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: bad, namespace: inv}
spec:
  podSelector: {matchLabels: {app: iso}}
  ingress:
  - from: [{ipBlock: {cidr: 10.1.2.0}}]
YAML
wait_for 20 output_is TIMEOUT probe default/a "$ISO:8080" || fail "a -> inv/iso not denied"
expect "a -> inv/free (not selected)" "$(probe default/a "$FREE:8080")" CONNECTED
wait_for 10 output_is 1 events NetworkPolicy bad PolicyInvalid || fail "no PolicyInvalid Event"
status=$(ctl status)
grep -q 'invalid: inv/bad ingress\[0\]: .*invalid CIDR' <<<"$status" || fail "status does not name inv/bad: $status"
expect "metric invalid" "$(sample 'sluice_policy_invalid{policy="inv/bad"}')" 1
log "ok: inv/bad isolates inv/iso only, named in an Event and in status"
log "PASS"
