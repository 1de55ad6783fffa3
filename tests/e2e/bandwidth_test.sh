#!/usr/bin/env bash
# Pod bandwidth limits, end to end with real TCP transfers (iperf3): a pod annotated
# kubernetes.io/ingress-bandwidth and egress-bandwidth (8M each) gets them through the runtime's
# runtimeConfig (the conflist declares the capability) and Sluice enforces them on every path:
# from a pod on the same node (which the datapath would otherwise reach with bpf_redirect_peer,
# past the host veth's qdisc), from a pod on another node, from the node itself, and what the pod
# sends. An unlimited pod on the same node receives clearly more. The limits show in
# `sluicectl endpoints`, live in the endpoint record, and still hold after the agent restarts; a
# bad runtimeConfig is refused with code 7, and an annotation the runtime cannot read fails the
# pod's sandbox. Every address used lives in namespaces the lab creates.
set -euo pipefail
NAME=${SLUICE_LAB_TEST_NAME:-bw$$}
source "$(dirname "$0")/lib.sh"
lab_init

LIMIT=8000000      # bits/s, the annotations' 8M
LOW=0.70 HIGH=1.10  # goodput within this band of the limit (tbf counts frames, iperf3 payload)
SECONDS_PER_RUN=2
SERVERS=()
before_down() { local p; for p in ${SERVERS[@]+"${SERVERS[@]}"}; do kill "$p" 2>/dev/null || true; done; }

KUBECONFIG_PATH=$("$LAB" up --nodes 2 --name "$NAME") || fail "up"
{
  pod_manifest lim --node node1 --ports 8080 \
    --annotations "kubernetes.io/ingress-bandwidth=8M,kubernetes.io/egress-bandwidth=8M"
  pod_manifest free --node node1 --ports 8080
  pod_manifest near --node node1 --ports 8080
  pod_manifest far --node node2 --ports 8080
  pod_manifest badbw --node node1 --ports 8080 --annotations "kubernetes.io/ingress-bandwidth=10"
} | K apply --validate=false -f - >/dev/null || fail "apply"
K wait --for=condition=Ready pod/lim pod/free pod/near pod/far --timeout=60s >/dev/null ||
  fail "pods not Ready: $(K get pods -o wide)"
LIM=$(ip_of lim); FREE=$(ip_of free); NEAR=$(ip_of near)
ns() { echo "$NAME-pod-default-$1"; }
log "lim=$LIM free=$FREE near=$NEAR"

# An iperf3 server in each pod that receives.
for p in lim free near; do
  ip netns exec "$(ns "$p")" iperf3 -s -p 5201 >/dev/null 2>&1 &
  SERVERS+=($!)
done
for p in lim free near; do
  wait_for 10 ip netns exec "$(ns "$p")" sh -c "ss -ltn | grep -q ':5201 '" || fail "iperf3 in $p"
done

# rate NETNS ADDRESS: the bits/s the server at ADDRESS received from a transfer out of NETNS.
rate() {
  local out
  out=$(ip netns exec "$1" iperf3 -c "$2" -p 5201 -t "$SECONDS_PER_RUN" -J --connect-timeout 3000) ||
    fail "iperf3 $1 -> $2: $out"
  jget 'int(d["end"]["sum_received"]["bits_per_second"])' <<<"$out"
}
within_limit() {  # within_limit WHAT BITS_PER_SECOND
  python3 -c 'import sys; r, l, lo, hi = map(float, sys.argv[1:]); sys.exit(not (lo*l <= r <= hi*l))' \
    "$2" "$LIMIT" "$LOW" "$HIGH" || fail "$1: $2 bit/s, not within $LOW..$HIGH of $LIMIT"
  log "ok: $1 $2 bit/s (limit $LIMIT)"
}

within_limit "same-node pod -> limited pod" "$(rate "$(ns near)" "$LIM")"
within_limit "other-node pod -> limited pod" "$(rate "$(ns far)" "$LIM")"
within_limit "node -> limited pod" "$(rate "$NAME-node1" "$LIM")"
within_limit "limited pod -> same-node pod" "$(rate "$(ns lim)" "$NEAR")"
free=$(rate "$(ns near)" "$FREE")
python3 -c 'import sys; sys.exit(not float(sys.argv[1]) > 4 * float(sys.argv[2]))' "$free" "$LIMIT" ||
  fail "the unlimited pod got $free bit/s, not clearly more than the limit $LIMIT"
log "ok: same-node pod -> unlimited pod $free bit/s"

# Visible: sluicectl names the limits; the record holds them.
CTL="$SLUICECTL --node node1 --lab $NAME"
row=$($CTL endpoints | grep " default/lim$") || fail "no endpoints row for lim: $($CTL endpoints)"
grep -q "in 8Mbit/s,out 8Mbit/s" <<<"$row" || fail "endpoints row: $row"
expect "endpoints -o json ingressRate" \
  "$($CTL endpoints -o json | jget '[e["ingressRate"] for e in d if e["pod"] == "default/lim"][0]')" \
  "$LIMIT"
expect "free pod shaped" \
  "$($CTL endpoints -o json | jget '[e["ingressShaped"] for e in d if e["pod"] == "default/free"][0]')" \
  False

# node1's plugin configuration as the runtime hands it over, with RUNTIME_CONFIG (JSON) added.
plugin_conf() {
  python3 -c 'import json,sys; l=json.load(open(sys.argv[1])); p=l["plugins"][0]
p.update(cniVersion=l["cniVersion"], name=l["name"], runtimeConfig=json.loads(sys.argv[2]))
print(json.dumps(p))' "$DIR/node1/net.d/05-sluice.conflist" "$1"
}
node1_plugin() {  # node1_plugin COMMAND CONTAINERID RUNTIME_CONFIG: the runtime's way of calling
  plugin_conf "$3" | env -i CNI_COMMAND="$1" CNI_CONTAINERID="$2" CNI_NETNS="/var/run/netns/$NAME-bad" \
    CNI_IFNAME=eth0 CNI_PATH="$DIR/node1/bin" "$DIR/node1/bin/sluice"
}

# A runtimeConfig the agent cannot enforce: code 7, nothing made, and its DEL still succeeds.
ip netns add "$NAME-bad"
out=$(node1_plugin ADD badburst '{"bandwidth": {"ingressRate": 8000000, "ingressBurst": 800}}') &&
  fail "ADD with a burst below one frame succeeded: $out"
expect "code of a burst below one frame" "$(jget 'd["code"]' <<<"$out")" 7
out=$(node1_plugin ADD badrate '{"bandwidth": {"egressRate": 10}}') && fail "ADD at 10 bit/s succeeded"
expect "code of a rate under 1 kbit/s" "$(jget 'd["code"]' <<<"$out")" 7
node1_plugin DEL badrate '{"bandwidth": {"egressRate": 10}}' >/dev/null || fail "DEL of the refused ADD"
ip -n "$NAME-bad" link show eth0 >/dev/null 2>&1 && fail "a refused ADD made eth0"
ip netns del "$NAME-bad"

# The agent restarts: once it serves again (its restore is done) the limits hold: the record
# marked the map entry again and the qdiscs stayed.
lab agent restart --node node1 --wait >/dev/null || fail "agent restart node1"
node1_status() {  # STATUS is CNI 1.1.0's
  plugin_conf '{}' | sed 's/"cniVersion": "[0-9.]*"/"cniVersion": "1.1.0"/' |
    env -i CNI_COMMAND=STATUS CNI_PATH="$DIR/node1/bin" "$DIR/node1/bin/sluice"
}
wait_for 60 node1_status || fail "node1's agent does not answer STATUS after its restart"
within_limit "after restart: same-node pod -> limited pod" "$(rate "$(ns near)" "$LIM")"
expect "lim still shaped after restart" \
  "$($CTL endpoints -o json | jget '[e["ingressShaped"] for e in d if e["pod"] == "default/lim"][0]')" \
  True
# An annotation the runtime cannot read: the sandbox fails, as containerd's does.
badbw_event() { K get events --field-selector involvedObject.name=badbw -o json | grep -q 'unreasonably small'; }
wait_for 20 badbw_event ||
  fail "badbw: no event about its annotation: $(K get events --field-selector involvedObject.name=badbw)"
log "bandwidth test passed"
