#!/usr/bin/env bash
# Service maps full (issue 9), in a one-node lab whose agent has room for 12 frontends
# (--bpf_lb_revnat_max=12: one sluice_lb4_rnat entry per frontend). A Service programmed first
# ("good", TCP and UDP) answers from a pod, without a single failed request, while more Services
# than fit are created; the ones that do not fit are refused whole (no master, no slots), gauged
# on /metrics (sluice_services_unprogrammed{reason="map_full",map_name="sluice_lb4_rnat"}),
# listed by `sluicectl services` and counted by `sluicectl status`, logged once each however
# many batches follow; deleting two programmed Services lets the first two waiting, in name
# order, in (and they answer), without an agent restart. Then the endpoint map full
# (--bpf_ep_max=3: a pod beyond it does not start, its sandbox Event names the map, nothing of it
# is left, and it starts once a pod is deleted), and the masquerade maps full (--bpf_nat_max=256,
# see the NAT section below for what a user gets).
set -euo pipefail
NAME=flt-mp$$
source "$(dirname "$0")/lib.sh"
lab_init
WORK=$(mktemp -d /tmp/sluice-map-pressure.XXXXXX)
KEEP_LOGS=/tmp/map_pressure_test-$NAME
CAP=12
NAT_MAX=256
EP_MAX=3
export SLUICE_LAB_AGENT_ARGS="${SLUICE_LAB_AGENT_ARGS:-} --metrics_address=127.0.0.1:9879 --bpf_lb_revnat_max=$CAP --bpf_nat_max=$NAT_MAX --bpf_ep_max=$EP_MAX --ct_gc_interval=1s"
START=$SECONDS
KUBECONFIG_PATH=$("$LAB" up --nodes 1 --name "$NAME") || fail "up"
log "lab $NAME up"
NAT_SERVER=
before_down() {
  touch "$WORK/load.stop" 2>/dev/null || true
  if [ -n "$NAT_SERVER" ]; then kill "$NAT_SERVER" 2>/dev/null || true; fi
}

{
  cat <<'YAML'
apiVersion: v1
kind: Service
metadata: {name: good}
spec:
  selector: {app: good}
  ports:
  - {name: tcp, port: 80, targetPort: 8080, protocol: TCP}
  - {name: udp, port: 80, targetPort: 8080, protocol: UDP}
YAML
  pod_manifest good-1 --labels app=good --node node1 --ports 8080/TCP,8080/UDP
  pod_manifest client --node node1 --ports 8080
} | K apply --validate=false -f - >/dev/null || fail "apply good"
K wait --for=condition=Ready pod/good-1 pod/client --timeout=60s >/dev/null || fail "pods not Ready"
GOOD=$(K get svc good -o jsonpath='{.spec.clusterIP}')
answers() {  # answers IP PROTO
  [ "$(lab request --from default/client --to "$1:80" --proto "$2" --data hostname --timeout 2)" = good-1 ]
}
wait_for 30 answers "$GOOD" tcp || fail "good does not answer over TCP"
wait_for 30 answers "$GOOD" udp || fail "good does not answer over UDP"

sctl() { "$SLUICECTL" --bpffs_root="$DIR/node1/bpf" --state_dir="$DIR/node1/state" "$@"; }
metrics() { lab exec node/node1 -- curl -sf -m 2 http://127.0.0.1:9879/metrics; }
sample() {  # sample METRIC: its value (0 when absent)
  local out
  out=$(metrics) || return 1
  awk -v m="$1" '$1 == m {v = $2} END {print v + 0}' <<<"$out"
}
unprogrammed() { sample 'sluice_services_unprogrammed{reason="map_full",map_name="sluice_lb4_rnat"}'; }
unprogrammed_is() { [ "$(unprogrammed)" = "$1" ]; }  # polled by wait_for: read at every try
rnat_entries() {
  local out
  out=$(sctl status -o json) || return 1
  python3 -c 'import json,sys; print(next(m["entries"] for m in json.load(sys.stdin)["maps"] if m["name"] == "sluice_lb4_rnat"))' <<<"$out"
}
expect "refused before any filler" "$(unprogrammed)" 0
USED=$(rnat_entries)
ROOM=$((CAP - USED))
[ "$ROOM" -gt 2 ] || fail "only $ROOM frontends of room left with good programmed ($USED used)"
FILLERS=$((ROOM + 4))
log "$USED frontends programmed (good's two and the lab's), room for $ROOM: creating $FILLERS Services of one port"

# Load on good through everything that follows: one TCP and one UDP request at a time.
(
  while [ ! -e "$WORK/load.stop" ]; do
    for p in tcp udp; do
      if answers "$GOOD" $p; then echo "$p ok"; else echo "$p FAIL"; fi
    done >>"$WORK/load.log"
  done
) &
LOAD=$!
wait_for 10 test -s "$WORK/load.log" || fail "the load did not start"

# Fillers fill-00 .. fill-NN, created last name first (the agent sees them in that order).
for i in $(seq $((FILLERS - 1)) -1 0); do
  printf -- '---\napiVersion: v1\nkind: Service\nmetadata: {name: fill-%02d}\nspec:\n  selector: {app: good}\n  ports: [{name: http, port: 80, targetPort: 8080}]\n' "$i"
done | K apply --validate=false -f - >"$WORK/apply.out" 2>&1 || fail "fillers: $(cat "$WORK/apply.out")"
wait_for 30 unprogrammed_is 4 || fail "sluice_services_unprogrammed: $(unprogrammed), want 4"
expect "sluice_lb4_rnat entries" "$(rnat_entries)" "$CAP"
svc_out=$(sctl services)
refused_now() { awk '/^MAP FULL/ {m = 1; next} m && $1 != "FRONTEND" && $1 != "..." {print $NF}' <<<"$svc_out"; }
REFUSED=$(refused_now | sort)
expect "refused listed by sluicectl services" "$(wc -l <<<"$REFUSED")" 4
grep -q "not programmed (1 backends)" <<<"$svc_out" || fail "sluicectl services: no state:
$svc_out"
grep -q "sluice_lb4_rnat" <<<"$svc_out" || fail "sluicectl services names no full map:
$svc_out"
status_out=$(sctl status)
grep -q "4 frontends not (fully) programmed: sluice_lb4_rnat full" <<<"$status_out" ||
  fail "sluicectl status:
$status_out"
log "ok: sluicectl status: $(grep 'not (fully) programmed' <<<"$status_out" | sed 's/^ *//')"
# Refused whole: no master (nor slots) for any of them.
for s in $REFUSED; do
  ip=$(K get svc "${s#default/}" -o jsonpath='{.spec.clusterIP}')
  table=$(sctl services | sed '/^MAP FULL/,$d')
  entries=$(awk -v f="$ip:80" '$1 == f' <<<"$table")
  [ -z "$entries" ] || fail "$s ($ip) is refused yet has entries in sluice_lb4_svc: $entries"
  outcome=$(lab probe --from client --to "$ip:80" --timeout 1 || true)
  [ "$outcome" != CONNECTED ] || fail "$s ($ip) is refused yet answers"
done
REFUSED_OUTCOME=$outcome
json_out=$(sctl services -o json)
expect "refused in sluicectl services -o json" "$(python3 -c 'import json,sys; print(sum(1 for e in json.load(sys.stdin) if e.get("notProgrammed") == "map_full" and e.get("map") == "sluice_lb4_rnat"))' <<<"$json_out")" 4
log "ok: refused frontends have no entry and do not answer ($REFUSED_OUTCOME)"
# The programmed fillers answer.
PROGRAMMED=$(for i in $(seq 0 $((FILLERS - 1))); do printf 'default/fill-%02d\n' "$i"; done | grep -vxF -f <(echo "$REFUSED"))
for s in $PROGRAMMED; do
  ip=$(K get svc "${s#default/}" -o jsonpath='{.spec.clusterIP}')
  answers "$ip" tcp || fail "$s ($ip) is programmed and does not answer"
done
log "ok: $(wc -l <<<"$PROGRAMMED") fillers programmed and answering; refused: $(echo $REFUSED)"

# More batches (an EndpointSlice change re-applies every filler): nothing logged again.
logged() { grep -c "is full; frontend not programmed" "$DIR/node1/log/agent.log" || true; }
LOGGED=$(logged)
expect "refusals logged (one per frontend)" "$LOGGED" 4
reconciles() { sample 'sluice_reconcile_duration_seconds_count{subsystem="services"}'; }
BEFORE=$(reconciles)
for s in $REFUSED; do K annotate svc "${s#default/}" touched=1 >/dev/null || fail "annotate $s"; done
wait_for 20 output_gt "$BEFORE" reconciles || fail "no Service reconcile after the annotations"
expect "still refused after their Services changed" "$(unprogrammed)" 4

# Two programmed fillers go: the first two waiting, in name order, come in.
FIRST_WAITING=$(head -2 <<<"$REFUSED")
STILL_WAITING=$(tail -n +3 <<<"$REFUSED")
for s in $(sed -n 2,3p <<<"$PROGRAMMED"); do
  K delete svc "${s#default/}" >/dev/null || fail "delete $s"
done
wait_for 30 unprogrammed_is 2 || fail "after two deletions: sluice_services_unprogrammed $(unprogrammed), want 2"
svc_out=$(sctl services)
expect "still waiting" "$(refused_now | sort | tr '\n' ' ')" "$(echo $STILL_WAITING) "
for s in $FIRST_WAITING; do
  ip=$(K get svc "${s#default/}" -o jsonpath='{.spec.clusterIP}')
  wait_for 10 answers "$ip" tcp || fail "$s ($ip) got room and does not answer"
done
log "ok: after two deletions $(echo $FIRST_WAITING) are programmed and answer, $(echo $STILL_WAITING) wait"
expect "refusals logged (one per frontend)" "$(logged)" 4

# Endpoint map full: sluice_ep4 holds $EP_MAX pods; good-1 and client take two. "third" fits,
# "fourth" does not: its CNI ADD fails (code 104, the plugin's message names the map), the kubelet
# shows it and retries, and nothing of the failed attempts stays (no address held, no veth). Once
# third is deleted, fourth starts. good keeps answering throughout (the load above still runs).
expect "sluice_ep4 entries before" "$(python3 -c 'import json,sys; print(next(m["entries"] for m in json.load(sys.stdin)["maps"] if m["name"] == "sluice_ep4"))' <<<"$(sctl status -o json)")" 2
addresses_held() { find "$DIR/node1/state/ipam" -type f ! -name 'last_reserved*' | wc -l; }
pod_veths() { local l; l=$(ip -n "$NAME-node1" -o link show); grep -c ': slc' <<<"$l" || true; }
HELD0=$(addresses_held) VETHS0=$(pod_veths)
for p in third fourth; do
  pod_manifest "$p" --node node1 --ports 8080 | K apply --validate=false -f - >/dev/null ||
    fail "apply $p"
  [ "$p" = fourth ] || K wait --for=condition=Ready pod/third --timeout=30s >/dev/null || fail "third not Ready"
done
ep_full_event() { grep -q "failed (add): .*sluice_ep4 is full" <<<"$(K describe pod fourth)"; }
wait_for 20 ep_full_event || fail "no sandbox event naming sluice_ep4: $(K describe pod fourth)"
grep -q ContainerCreating <<<"$(K get pod fourth)" || fail "fourth is not ContainerCreating: $(K get pod fourth)"
# third's address and veth only (an ADD of fourth the kubelet retries meanwhile holds its own
# for a few ms before undoing them: polled, a leak would never go).
third_only() { [ "$(addresses_held)" = $((HELD0 + 1)) ] && [ "$(pod_veths)" = $((VETHS0 + 1)) ]; }
wait_for 10 third_only || fail "with the map full: $(addresses_held) addresses held (was $HELD0), $(pod_veths) pod veths (was $VETHS0)"
K delete pod third --grace-period=1 --wait=false >/dev/null || fail "delete third"
K wait --for=condition=Ready pod/fourth --timeout=60s >/dev/null || fail "fourth never started once third was gone"
log "ok: sluice_ep4 full: fourth refused with the map named, nothing leaked, started once third left"

touch "$WORK/load.stop"
wait "$LOAD" || true

# NAT map full: sluice_snat4 / sluice_rnat4 (LRU) hold $NAT_MAX masqueraded flows. The client pod
# has two TCP connections to the outside, one kept busy and one idle (it echoed once), then opens
# 4 x $NAT_MAX one-datagram UDP flows to the outside. What a user gets: every new flow gets out
# (the LRU evicts for it: no nat_map_full drop; sluice_nat_lru_evictions_total counts them); the kernel's LRU
# gives a second chance to entries used since they were inserted, so the flood evicts its own
# one-packet flows first and both TCP connections keep working, the idle one included.
EXTERNAL_IP=$(lab status | awk '/^external:/ {print $2}')
[ -n "$EXTERNAL_IP" ] || fail "no external namespace address in lab status"
ip netns exec "$NAME-external" python3 "$(dirname "$0")/nat_pressure.py" server 9000 >"$WORK/nat-server.out" 2>&1 &
NAT_SERVER=$!
wait_for 10 grep -q READY "$WORK/nat-server.out" || fail "the outside server did not start: $(cat "$WORK/nat-server.out")"
nat_drops() {
  local out
  out=$(metrics) || return 1
  awk '$1 ~ /^sluice_drop_count_total[{]/ && index($1, "reason=\"nat_map_full\"") {v += $2} END {print v + 0}' <<<"$out"
}
map_entries() {
  local out
  out=$(sctl status -o json) || return 1
  python3 -c 'import json,sys; print(next(m["entries"] for m in json.load(sys.stdin)["maps"] if m["name"] == sys.argv[1]))' "$1" <<<"$out"
}
m=$(metrics)
grep -q 'sluice_drop_count_total{.*reason="nat_map_full"' <<<"$m" || fail "/metrics has no nat_map_full drop counter"
DROPS_BEFORE=$(nat_drops)
NAT_START=$SECONDS
NAT_OUT=$(lab exec client -- python3 "$(cd "$(dirname "$0")" && pwd)/nat_pressure.py" client "$EXTERNAL_IP" 9000 $((4 * NAT_MAX))) ||
  fail "the NAT client failed: $NAT_OUT"
log "NAT client: $NAT_OUT"
nat_field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1]).get(sys.argv[2]))' "$NAT_OUT" "$1"; }
expect "idle connection before the flood" "$(nat_field idle_before)" ok
expect "UDP flows sent to the outside" "$(nat_field udp_sent)" $((4 * NAT_MAX))
expect "failed echoes on the active connection during the flood" "$(nat_field active_failures)" 0
[ "$(nat_field active_echoes)" -gt 10 ] || fail "the active connection hardly talked: $NAT_OUT"
IDLE_AFTER=$(nat_field idle_after)
expect "the idle connection after the flood" "$IDLE_AFTER" ok
nat_out=$(sctl nat)
TCP_MAPPINGS=$(grep -c "^tcp .*$EXTERNAL_IP:9000" <<<"$nat_out" || true)
UDP_MAPPINGS=$(grep -c "^udp .*$EXTERNAL_IP:9001" <<<"$nat_out" || true)
expect "TCP mappings of the two connections" "$TCP_MAPPINGS" 2
SNAT=$(map_entries sluice_snat4)
# The kernel's LRU frees entries in batches (per CPU): after the flood it holds from about half
# of its entries to all of them.
[ "$SNAT" -le "$NAT_MAX" ] && [ "$SNAT" -ge $((NAT_MAX / 2)) ] || fail "sluice_snat4 holds $SNAT of $NAT_MAX"
EVICTED=$((4 * NAT_MAX - UDP_MAPPINGS))
[ "$EVICTED" -ge $((3 * NAT_MAX)) ] || fail "only $EVICTED of $((4 * NAT_MAX)) UDP flows evicted"
log "ok: sluice_snat4 full ($SNAT of $NAT_MAX), $EVICTED of $((4 * NAT_MAX)) UDP flows evicted, both TCP connections kept"
expect "nat_map_full drops (the LRU evicts instead)" "$(($(nat_drops) - DROPS_BEFORE))" 0
# The evictions are counted: estimated by the GC (every second here) from the datapath's
# creation counter and what it finds in sluice_snat4.
nat_evictions() { sample 'sluice_nat_lru_evictions_total{map_name="sluice_snat4"}'; }
wait_for 15 output_gt $((2 * NAT_MAX)) nat_evictions || fail "sluice_nat_lru_evictions_total: $(nat_evictions), want over $((2 * NAT_MAX)) ($EVICTED UDP mappings gone)"
NAT_EVICTIONS=$(nat_evictions)
[ "$NAT_EVICTIONS" -le $((4 * NAT_MAX + 2)) ] || fail "sluice_nat_lru_evictions_total $NAT_EVICTIONS: more than the $((4 * NAT_MAX + 2)) mappings made"
log "ok: sluice_nat_lru_evictions_total $NAT_EVICTIONS ($EVICTED UDP mappings gone)"
NAT_SECONDS=$((SECONDS - NAT_START))
TOTAL=$(wc -l <"$WORK/load.log")
FAILED=$(grep -c FAIL "$WORK/load.log" || true)
expect "failed requests to good (of $TOTAL, TCP and UDP)" "$FAILED" 0
RESTARTS=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["nodes"][0]["agentRestarts"])' "$DIR/status.json")
expect "agent restarts" "$RESTARTS" 0
# Refusals are no errors: no failed reconcile, so no retry with back-off.
expect "failed Service reconciles" "$(sample 'sluice_reconcile_errors_total{subsystem="services"}')" 0
log "figures: room for $CAP frontends, $FILLERS Services created, 4 refused then 2 after 2 deletions, $TOTAL requests to good with 0 failed; NAT: $NAT_MAX entries, $((4 * NAT_MAX)) new flows in ${NAT_SECONDS} s, $EVICTED UDP mappings evicted ($NAT_EVICTIONS counted), 0 drops, active connection $(nat_field active_echoes) echoes 0 failed, idle one $IDLE_AFTER; $((SECONDS - START)) s in all"
echo "map_pressure_test: PASS"
