#!/usr/bin/env bash
# Bad Kubernetes objects (issue 9), applied through the lab apiserver to a running agent, one at a
# time: invalid IPs, IPv6 in an IPv4 slice, special addresses (loopback, unspecified, multicast),
# ports 0 and 65536, an unknown protocol, an SCTP port, a negative affinity timeout, invalid
# external and LoadBalancer IPs, an undecodable value (a 2^40 affinity timeout, a port that is a
# string), a slice of 5000 endpoints, a Service of 200 ports and names of 63 and 253 characters.
# For each: the agent counts it on /metrics (sluice_service_refusals_total{reason} or
# sluice_k8s_decode_errors_total{resource}), never exits (the lab would restart it: agentRestarts stays 0), and a valid Service next to them keeps
# answering with unchanged maps. The big objects are programmed (they are valid), within bounds.
set -euo pipefail
NAME=flt-bad$$
source "$(dirname "$0")/lib.sh"
lab_init
WORK=$(mktemp -d /tmp/sluice-bad-objects.XXXXXX)
KEEP_LOGS=/tmp/bad_objects_test-$NAME
# /metrics on the health listener (one address serves both).
export SLUICE_LAB_AGENT_ARGS="${SLUICE_LAB_AGENT_ARGS:-} --metrics_address=127.0.0.1:9879"
KUBECONFIG_PATH=$("$LAB" up --nodes 1 --name "$NAME") || fail "up"
log "lab $NAME up"

{
  cat <<'YAML'
apiVersion: v1
kind: Service
metadata: {name: good}
spec:
  selector: {app: good}
  ports: [{name: http, port: 80, targetPort: 8080}]
YAML
  pod_manifest good-1 --labels app=good --node node1 --ports 8080
} | K apply --validate=false -f - >/dev/null || fail "apply good"
K wait --for=condition=Ready pod/good-1 --timeout=60s >/dev/null || fail "good-1 not Ready"
GOOD=$(K get svc good -o jsonpath='{.spec.clusterIP}')
good_answers() { [ "$(lab request --from node/node1 --to "$GOOD:80" --data hostname --timeout 2)" = good-1 ]; }
wait_for 30 good_answers || fail "the good Service does not answer"
good_maps() { "$SLUICECTL" --bpffs_root="$DIR/node1/bpf" services 2>/dev/null | awk -v f="$GOOD:" 'index($1, f) == 1 {p = 1; print; next} /^[^ \t]/ {p = 0} p'; }
GOOD_MAPS=$(good_maps)
[ -n "$GOOD_MAPS" ] || fail "good's frontend is not programmed"
AGENT_PID=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["nodes"][0]["agentPid"])' "$DIR/status.json")

metrics() { lab exec node/node1 -- curl -sf -m 2 http://127.0.0.1:9879/metrics; }
metric() {  # metric NAME LABEL=VALUE: the sample's value (0 when absent)
  metrics | awk -v n="$1" -v l="$2" '$1 ~ "^"n"[{]" && index($1, l) {v = $2} END {print v + 0}'
}
refusals() { metric sluice_service_refusals_total "reason=\"$1\""; }
decode_errors() { metric sluice_k8s_decode_errors_total "resource=\"$1\""; }
metrics | grep -q '^sluice_service_refusals_total' || fail "/metrics has no sluice_service_refusals_total:
$(metrics | grep -i refus)"

counter_above() { [ "$($1 "$2")" -gt "$3" ]; }
# bad CASE COUNTER-FN ARG: applies stdin, then waits for the counter to rise, the agent to be the
# same process, and the good Service to answer with the same maps.
bad() {
  local what=$1 fn=$2 arg=$3 before
  before=$($fn "$arg")
  K apply --validate=false -f - >"$WORK/apply.out" 2>&1 || fail "$what: the apiserver refused it: $(cat "$WORK/apply.out")"
  wait_for 20 counter_above "$fn" "$arg" "$before" || fail "$what: $fn $arg stayed at $before"
  kill -0 "$AGENT_PID" 2>/dev/null || fail "$what: the agent ($AGENT_PID) died"
  good_answers || fail "$what: the good Service stopped answering"
  [ "$(good_maps)" = "$GOOD_MAPS" ] || fail "$what: good's maps changed:
$(good_maps)"
  echo "$what" >>"$WORK/cases"  # bad runs at the end of a pipeline: in a subshell
  log "ok: $what: counted ($fn $arg $before -> $($fn "$arg")), agent alive, good Service unchanged"
}
slice() {  # slice NAME SERVICE ADDRESS_TYPE PORT ADDRESS...
  local name=$1 svc=$2 type=$3 port=$4; shift 4
  echo "---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: $name, labels: {kubernetes.io/service-name: $svc}}
addressType: $type
ports: [{name: http, port: $port, protocol: TCP}]
endpoints:"
  for a in "$@"; do echo "- {addresses: [\"$a\"], conditions: {ready: true}}"; done
}
manual_svc() {  # manual_svc NAME [PORT [PROTOCOL]]: a selector-less Service
  echo "---
apiVersion: v1
kind: Service
metadata: {name: $1}
spec:
  ports: [{name: http, port: ${2:-80}, targetPort: 8080, protocol: ${3:-TCP}}]"
}

{ manual_svc b-ip; slice b-ip-1 b-ip IPv4 8080 10.0.0.300; } | bad "invalid IPv4 backend" refusals backend_invalid
{ manual_svc b-word; slice b-word-1 b-word IPv4 8080 not-an-ip; } | bad "non-address backend" refusals backend_invalid
{ manual_svc b-v6; slice b-v6-1 b-v6 IPv4 8080 fd00::1; } | bad "IPv6 in an IPv4 slice" refusals backend_invalid
{ manual_svc b-lo; slice b-lo-1 b-lo IPv4 8080 127.0.0.1; } | bad "loopback backend" refusals backend_loopback
{ manual_svc b-zero; slice b-zero-1 b-zero IPv4 8080 0.0.0.0; } | bad "unspecified backend" refusals backend_unspecified
{ manual_svc b-mc; slice b-mc-1 b-mc IPv4 8080 224.0.0.1; } | bad "multicast backend" refusals backend_multicast
manual_svc b-p0 0 | bad "Service port 0" refusals port_invalid
manual_svc b-p65536 65536 | bad "Service port 65536" refusals port_invalid
{ manual_svc b-ep0; slice b-ep0-1 b-ep0 IPv4 0 10.244.9.9; } | bad "EndpointSlice port 0" refusals port_invalid
manual_svc b-foo 80 FOO | bad "protocol FOO" refusals protocol_unknown
# The datapath balances TCP and UDP only: an SCTP port is refused, not a frontend shown as '?'.
manual_svc b-sctp 80 SCTP | bad "SCTP port" refusals protocol_unsupported
# The apiserver refuses a timeout outside 1..86400 (this lab's stores it): the Service is refused.
bad "negative affinity timeout" refusals session_affinity_timeout_invalid <<'YAML'
apiVersion: v1
kind: Service
metadata: {name: b-neg-aff}
spec:
  selector: {app: good}
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: -5}}
  ports: [{name: http, port: 80, targetPort: 8080}]
YAML
for svc in b-sctp b-neg-aff; do
  ip=$(K get svc "$svc" -o jsonpath='{.spec.clusterIP}')
  [ -n "$ip" ] || fail "$svc has no ClusterIP"
  programmed=$("$SLUICECTL" --bpffs_root="$DIR/node1/bpf" services 2>/dev/null | awk -v f="$ip:" 'index($1, f) == 1')
  [ -z "$programmed" ] || fail "$svc ($ip) is programmed: $programmed"
done
log "ok: the SCTP port and the Service with a negative affinity timeout have no frontend"
bad "invalid external IP" refusals external_ip_invalid <<'YAML'
apiVersion: v1
kind: Service
metadata: {name: b-ext}
spec:
  selector: {app: good}
  externalIPs: [999.1.1.1]
  ports: [{name: http, port: 80, targetPort: 8080}]
YAML
bad "undecodable affinity timeout" decode_errors Service <<'YAML'
apiVersion: v1
kind: Service
metadata: {name: b-aff}
spec:
  selector: {app: good}
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 1099511627776}}
  ports: [{name: http, port: 80, targetPort: 8080}]
YAML
bad "a port that is a string" decode_errors EndpointSlice <<'YAML'
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: b-strport-1, labels: {kubernetes.io/service-name: b-ip}}
addressType: IPv4
ports: [{name: http, port: "eighty", protocol: TCP}]
endpoints: [{addresses: [10.244.9.9]}]
YAML

# Big but valid: programmed whole, agent alive, good unchanged.
# 63 characters: the longest Service name (a DNS label) Kubernetes takes, and the longest label
# value (its slices' kubernetes.io/service-name); 253: what the lab apiserver stores anyway
# (a real one refuses it), which gets no slices: the agent must just live with it.
LONG=$(printf 'l%.0s' $(seq 1 63))
LONGER=$(printf 'm%.0s' $(seq 1 253))
{
  manual_svc huge
  slice huge-1 huge IPv4 8080 $(python3 -c 'print(" ".join(f"10.200.{i // 256}.{i % 256}" for i in range(1, 5001)))')
  echo "---
apiVersion: v1
kind: Service
metadata: {name: many-ports}
spec:
  ports:"
  for p in $(seq 1000 1199); do echo "  - {name: p$p, port: $p, targetPort: 8080}"; done
  echo "---
apiVersion: v1
kind: Service
metadata: {name: $LONG}
spec:
  selector: {app: good}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: $LONGER}
spec:
  selector: {app: good}
  ports: [{name: http, port: 80, targetPort: 8080}]"
} | K apply --validate=false -f - >"$WORK/apply.out" 2>&1 || fail "big objects refused: $(cat "$WORK/apply.out")"
HUGE=$(K get svc huge -o jsonpath='{.spec.clusterIP}')
MANY=$(K get svc many-ports -o jsonpath='{.spec.clusterIP}')
LONGIP=$(K get svc "$LONG" -o jsonpath='{.spec.clusterIP}')
slots_of() { "$SLUICECTL" --bpffs_root="$DIR/node1/bpf" services 2>/dev/null | awk -v f="$1" '$1 == f {print $6}'; }
frontends_of() { "$SLUICECTL" --bpffs_root="$DIR/node1/bpf" services 2>/dev/null | awk -v f="$1:" 'index($1, f) == 1 && $1 !~ /:\*$/' | wc -l; }
wait_for 60 output_is 5000 slots_of "$HUGE:80" || fail "the 5000-endpoint slice: $(slots_of "$HUGE:80") slots"
log "ok: a 5000-endpoint slice is programmed with 5000 backends"
wait_for 30 output_is 200 frontends_of "$MANY" || fail "the 200-port Service: $(frontends_of "$MANY") frontends"
log "ok: a 200-port Service is programmed with 200 frontends"
wait_for 30 output_is 1 slots_of "$LONGIP:80" || fail "the Service with a 63-character name is not programmed"
log "ok: a Service named with 63 characters is programmed (and one of 253 did no harm)"
kill -0 "$AGENT_PID" 2>/dev/null || fail "the agent died on the big objects"
good_answers || fail "the good Service stopped answering after the big objects"
[ "$(good_maps)" = "$GOOD_MAPS" ] || fail "good's maps changed after the big objects"
RESTARTS=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["nodes"][0]["agentRestarts"])' "$DIR/status.json")
expect "agent restarts" "$RESTARTS" 0
log "figures: $(wc -l <"$WORK/cases") bad objects each refused and counted, 3 big objects programmed, 0 agent restarts"
echo "bad_objects_test: PASS"
