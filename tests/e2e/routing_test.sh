#!/usr/bin/env bash
# Pod traffic between nodes in a 3-node lab (docs/routing.md), in the routing mode of
# SLUICE_ROUTING_MODE (tunnel, the default; routing_native_test.sh runs this natively): every pod
# (one of them with a MAC changed after its ADD) to every other node's pod over TCP and UDP with its
# own address, a pod to another node's host process and a node to another node's pod, a pod to the
# outside (masqueraded), a ClusterIP from a pod and a NodePort from the external namespace served by
# a backend on a third node, 1400-byte UDP datagrams and a 10 MB TCP transfer across nodes;
# meanwhile a capture on the underlay shows VXLAN on the tunnel port and no pod address outside it
# (tunnel), or plain pod addresses and no VXLAN (native). Then a node joining and leaving is
# reflected in the other nodes' peer maps within a second, and a third node's agent restarting or
# crashing meanwhile costs the traffic between the other two nothing. Every address used lives in
# namespaces the lab creates.
set -euo pipefail
NAME=rt$$
MODE=${SLUICE_ROUTING_MODE:-tunnel}
WORK=$(mktemp -d)
source "$(dirname "$0")/lib.sh"
lab_init
BG_PIDS=()
before_down() { for p in "${BG_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }

# Every agent relays its flows (docs/observe.md) for `sluicectl observe --nodes`.
head -c 24 /dev/urandom | base64 >"$WORK/relay.token"
export SLUICE_LAB_AGENT_ARGS="${SLUICE_LAB_AGENT_ARGS:-} --relay_address=0.0.0.0:4245 --relay_token_file=$WORK/relay.token"
KUBECONFIG_PATH=$("$LAB" up --nodes 3 --name "$NAME") || fail "up"
log "lab $NAME up ($MODE routing)"
N1=$(node_ip node1); N2=$(node_ip node2); N3=$(node_ip node3)
EXTERNAL_IP=$(lab status | awk '/^external:/ {print $2}')
[ -n "$EXTERNAL_IP" ] || fail "no external address in: $(lab status)"

{
  pod_manifest a --node node1 --ports 8080,8080/UDP
  pod_manifest b --node node2 --ports 8080,8080/UDP
  pod_manifest c --labels app=web --node node3 --ports 8080,8080/UDP
  cat <<'YAML'
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  selector: {app: web}
  ports:
  - {name: tcp, port: 80, targetPort: 8080, protocol: TCP}
  - {name: udp, port: 80, targetPort: 8080, protocol: UDP}
YAML
} | K apply --validate=false -f - >/dev/null || fail "apply"
K wait --for=condition=Ready pod/a pod/b pod/c --timeout=60s >/dev/null ||
  fail "pods not Ready: $(K get pods -o yaml)"
A=$(ip_of a); B=$(ip_of b); C=$(ip_of c)
CLUSTER_IP=$(K get svc web -o jsonpath='{.spec.clusterIP}')
NODEPORT=$(K get svc web -o jsonpath='{.spec.ports[0].nodePort}')
UDP_NODEPORT=$(K get svc web -o jsonpath='{.spec.ports[1].nodePort}')
log "pods a=$A (node1) b=$B (node2) c=$C (node3); web $CLUSTER_IP, NodePorts $NODEPORT/$UDP_NODEPORT"

# c's MAC changes after its ADD (what a chained tuning's "mac" does; here from inside the pod):
# everything below that reaches c (from other nodes, through the Service and the NodePort, from
# node3 itself) goes through the MAC node3's agent followed.
lab exec c -- ip link set eth0 address 02:5e:00:00:00:0c || fail "set c's MAC"
wait_for 5 sh -c "ip netns exec $NAME-node3 ip neigh show $C | grep -q 'lladdr 02:5e:00:00:00:0c PERMANENT'" ||
  fail "node3 did not follow c's MAC: $(ip netns exec "$NAME-node3" ip neigh show "$C")"
log "ok: node3's agent followed c's new MAC 02:5e:00:00:00:0c"

# What the mode puts on the nodes.
if [ "$MODE" = tunnel ]; then
  for n in 1 2 3; do
    ip netns exec "$NAME-node$n" ip -d link show sluice_vxlan | grep -q "vxlan external.*dstport 8472" ||
      fail "node$n: no collect_md VXLAN device on 8472: $(ip netns exec "$NAME-node$n" ip -d link)"
    [ -z "$(ip netns exec "$NAME-node$n" ip route show proto 181)" ] || fail "node$n has peer routes"
  done
  lab exec a -- ip -o link show eth0 | grep -q " mtu 1450 " || fail "pod MTU is not 1500 - 50"
else
  wait_for 10 sh -c "ip netns exec $NAME-node1 ip route show proto 181 | grep -q 'via $N2'" ||
    fail "node1 has no direct route to node2's pods: $(ip netns exec "$NAME-node1" ip route)"
  ! ip netns exec "$NAME-node1" ip link show sluice_vxlan >/dev/null 2>&1 || fail "native node has sluice_vxlan"
  lab exec a -- ip -o link show eth0 | grep -q " mtu 1500 " || fail "native pod MTU is not 1500"
fi

# sluicectl trace across nodes: the source node's program sends the packet to the right node (by
# the mode's means), and that node's receiving program, run on the packet as it left, delivers
# it to the pod; each hop's conntrack state is taken back.
ctl_on() {  # ctl_on N ARGS...: sluicectl on node N
  local n=$1; shift
  ip netns exec "$NAME-node$n" "$SLUICECTL" --bpffs_root="$DIR/node$n/bpf" \
    --state_dir="$DIR/node$n/state" "$@"
}
want_tunnel=True; [ "$MODE" = tunnel ] || want_tunnel=False
for to in "$B:8080 2 $N2" "$CLUSTER_IP:80 3 $N3"; do
  set -- $to
  hop1=$(ctl_on 1 trace -o json --from default/a --to "$1") || fail "trace a -> $1: $hop1"
  [ "$(echo "$hop1" | jget 'd["outcome"], d["nextNode"], d["steps"][-1]["tunnel"]')" = \
    "('forwarded', '$3', $want_tunnel)" ] || fail "trace a -> $1 on node1: $hop1"
  hop2=$(ctl_on "$2" trace -o json --arrive "$(echo "$hop1" | jget 'd["outputHex"]')") ||
    fail "trace --arrive on node$2: $hop2"
  # Natively the receiving program passes a local pod's packet to the stack, and the pod's host
  # veth egress program (its ingress policy point) runs next: its conntrack entry is made there.
  [ "$(echo "$hop2" | jget 'd["outcome"], d["output"]["destination"], (d.get("stackDelivery") or d)["undone"]["conntrack"] >= 1')" = \
    "('delivered', '$(echo "$hop1" | jget 'd["output"]["destination"]')', True)" ] ||
    fail "trace a -> $1, second hop on node$2: $hop2"
  [ "$(ctl_on "$2" -o json ct list | jget 'len([e for e in d if e["source"].startswith("'"$A"':")])')" = 0 ] ||
    fail "the second hop left conntrack on node$2: $(ctl_on "$2" ct list)"
done
log "ok: sluicectl trace a -> b and a -> web across nodes, both hops"

# One command sees the flows of every node: node1's sluicectl follows all three relays while a
# talks to b across nodes; a's egress point (node1) and b's ingress point (node2) both report.
# A wrong token is refused.
ip netns exec "$NAME-node1" "$SLUICECTL" observe --nodes "$N1:4245,$N2:4245,$N3:4245" \
  --token-file "$WORK/relay.token" --follow -o json --pod default/b >"$WORK/relay.json" \
  2>"$WORK/relay.err" &
RELAY=$!
BG_PIDS+=($RELAY)
relays_attached() {
  for n in 1 2 3; do grep -q "an observer is attached" "$DIR/node$n/log/agent.log" || return 1; done
}
wait_for 10 relays_attached || fail "the relays never attached: $(cat "$WORK/relay.err")"
expect "a -> b while relayed" "$(lab request --from default/a --to "$B:8080" --data hostname)" b
both_nodes() {
  python3 -c '
import json, sys
nodes = {json.loads(l)["node"] for l in open(sys.argv[1]) if l.strip()}
sys.exit(0 if {"node1", "node2"} <= nodes else 1)' "$WORK/relay.json"
}
wait_for 10 both_nodes || fail "the relayed flows lack a node: $(cat "$WORK/relay.json" "$WORK/relay.err")"
kill "$RELAY"
echo wrong-token-wrong-token >"$WORK/bad.token"
rc=0; ip netns exec "$NAME-node1" "$SLUICECTL" observe --nodes "$N2:4245" --token-file "$WORK/bad.token" \
  --last 1 2>"$WORK/bad.err" || rc=$?
[ "$rc" = 1 ] && grep -q "permission denied" "$WORK/bad.err" || fail "a wrong token: rc $rc, $(cat "$WORK/bad.err")"
log "ok: observe --nodes follows node1's and node2's flows of a -> b; a wrong token is refused"

# Servers outside the pods: on node2's host network and in the external namespace.
ip netns exec "$NAME-node2" "$LAB" netexec --port 9090 --name node2-host --tcp --udp \
  >"$WORK/node2-netexec.log" 2>&1 &
BG_PIDS+=($!)
ip netns exec "$NAME-external" "$LAB" netexec --port 9091 --name outside --tcp --udp \
  >"$WORK/ext-netexec.log" 2>&1 &
BG_PIDS+=($!)
ip netns exec "$NAME-underlay" python3 "$HERE/underlay_capture.py" --port 8472 \
  --pods 10.244.0.0/16 --ready "$WORK/capture.ready" >"$WORK/capture.json" 2>"$WORK/capture.err" &
CAPTURE=$!
BG_PIDS+=($CAPTURE)
wait_for 10 test -e "$WORK/capture.ready" || fail "capture did not start: $(cat "$WORK/capture.err")"
wait_for 10 sh -c "[ \"\$($LAB request --name $NAME --from node/node1 --to $N2:9090 --data hostname --timeout 1)\" = node2-host ]" ||
  fail "node2's host server does not answer"

# Pod to pod across nodes, every direction, TCP and UDP, with the sender's own address.
declare -A IP=([a]=$A [b]=$B [c]=$C)
for from in a b c; do
  for to in a b c; do
    [ "$from" != "$to" ] || continue
    expect "$from -> $to tcp" "$(lab request --from "default/$from" --to "${IP[$to]}:8080" --data hostname)" "$to"
    expect "$from -> $to udp" \
      "$(lab request --from "default/$from" --to "${IP[$to]}:8080" --proto udp --data hostname)" "$to"
  done
done
got=$(lab request --from default/a --to "$C:8080" --data clientip)
case $got in "$A":*) log "ok: c sees a's own address ($got)";; *) fail "a -> c clientip '$got'";; esac

# A pod to another node's host network keeps its address; a node to another node's pod too.
got=$(lab request --from default/a --to "$N2:9090" --data clientip)
case $got in "$A":*) log "ok: node2's host process sees pod a ($got)";; *) fail "a -> node2 clientip '$got'";; esac
got=$(lab request --from default/a --to "$N2:9090" --proto udp --data clientip)
case $got in "$A":*) log "ok: node2's host process sees pod a over UDP";; *) fail "a -> node2 udp '$got'";; esac
got=$(lab request --from node/node1 --to "$C:8080" --data clientip)
case $got in "$N1":*) log "ok: c sees node1 ($got)";; *) fail "node1 -> c clientip '$got'";; esac
expect "node3 -> b udp" "$(lab request --from node/node3 --to "$B:8080" --proto udp --data hostname)" b

# Pod to the outside: masqueraded to its node's address.
got=$(lab request --from default/b --to "$EXTERNAL_IP:9091" --data clientip)
case $got in "$N2":*) log "ok: outside sees b as node2 ($got)";; *) fail "b -> outside clientip '$got'";; esac

# Services whose only backend is on node3: a ClusterIP from node1's pod, a NodePort from outside
# through node1 (masqueraded to node1, the reply translated back) and through node2.
expect "a -> ClusterIP tcp" "$(lab request --from default/a --to "$CLUSTER_IP:80" --data hostname)" c
expect "a -> ClusterIP udp" \
  "$(lab request --from default/a --to "$CLUSTER_IP:80" --proto udp --data hostname)" c
got=$(lab request --from default/a --to "$CLUSTER_IP:80" --data clientip)
case $got in "$A":*) log "ok: the backend sees a ($got)";; *) fail "ClusterIP clientip '$got'";; esac
expect "external -> node1 NodePort" \
  "$(lab request --from external --to "$N1:$NODEPORT" --data hostname)" c
got=$(lab request --from external --to "$N1:$NODEPORT" --data clientip)
case $got in "$N1":*) log "ok: NodePort via node1 reaches c as node1 ($got)";; *) fail "NodePort clientip '$got'";; esac
expect "external -> node2 NodePort udp" \
  "$(lab request --from external --to "$N2:$UDP_NODEPORT" --proto udp --data hostname)" c

# Size: 1400-byte UDP datagrams both ways (echoed), a 10 MB TCP transfer.
BIG=$(head -c 1400 /dev/zero | tr '\0' x)
for i in 1 2 3; do
  [ "$(lab request --from default/a --to "$B:8080" --proto udp --data "$BIG")" = "$BIG" ] ||
    fail "1400-byte UDP a -> b (try $i) did not come back whole"
done
log "ok: 1400-byte UDP datagrams a -> b -> a"
lab exec c -- python3 "$HERE/bulk.py" serve 7070 "$WORK/bulk.ready" >"$WORK/bulk.log" 2>&1 &
BG_PIDS+=($!)
wait_for 10 test -e "$WORK/bulk.ready" || fail "bulk server did not start: $(cat "$WORK/bulk.log")"
expect "10 MB TCP a -> c" "$(lab exec a -- python3 "$HERE/bulk.py" send "$C" 7070 10485760)" OK

# Path MTU across the overlay: a pod whose MTU is above what fits the tunnel (both veth ends at
# 1500, as --mtu=1500 would make them) gets ICMP fragmentation needed (from its gateway) for a DF
# packet, and its kernel learns the path MTU.
if [ "$MODE" = tunnel ]; then
  HOST_VETH=$(ip netns exec "$NAME-node1" ip -o route get "$A" | sed -n 's/.* dev \([^ ]*\).*/\1/p')
  [ -n "$HOST_VETH" ] || fail "no host veth for a"
  ip netns exec "$NAME-node1" ip link set "$HOST_VETH" mtu 1500
  lab exec a -- ip link set eth0 mtu 1500
  got=$(lab exec a -- ping -n -c 1 -W 2 -M do -s 1472 "$B" 2>&1 || true)
  grep -q "Frag needed.*mtu = 1450" <<<"$got" || fail "no fragmentation needed for a 1500-byte DF ping: $got"
  lab exec a -- ip route get "$B" | grep -q "mtu 1450" ||
    fail "pod a did not learn the path MTU: $(lab exec a -- ip route get "$B")"
  expect "DF ping that fits after PMTU" \
    "$(lab exec a -- ping -n -c 1 -W 2 -M do -s 1422 "$B" >/dev/null 2>&1 && echo ok)" ok
  lab exec a -- ip link set eth0 mtu 1450
  ip netns exec "$NAME-node1" ip link set "$HOST_VETH" mtu 1450
  log "ok: ICMP fragmentation needed from the gateway, path MTU 1450 learned"
fi

# The underlay.
kill -TERM "$CAPTURE"
wait "$CAPTURE" || true
read -r FRAMES VXLAN INNER PODADDR < <(python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); print(c["frames"], c["vxlan"], c["vxlan_inner"], c["pod_addressed"])' "$WORK/capture.json") ||
  fail "capture: $(cat "$WORK/capture.json" "$WORK/capture.err")"
log "underlay: $FRAMES IPv4 frames, $VXLAN VXLAN ($INNER with pod addresses inside), $PODADDR pod-addressed"
if [ "$MODE" = tunnel ]; then
  [ "$VXLAN" -gt 0 ] && [ "$INNER" -gt 0 ] || fail "no VXLAN on UDP 8472 on the underlay"
  [ "$PODADDR" -eq 0 ] || fail "$PODADDR frames with a pod address on the underlay in tunnel mode"
else
  [ "$VXLAN" -eq 0 ] || fail "$VXLAN VXLAN datagrams on the underlay in native mode"
  [ "$PODADDR" -gt 0 ] || fail "no plain pod addresses on the underlay in native mode"
fi

# Nodes joining, changing address and leaving: the other nodes' peer maps follow within 1 s.
peer_entry() {  # peer_entry NODE PREFIXLEN A.B.C.D: the node address that exact entry holds
  local out v
  out=$(bpftool -j map lookup pinned "$DIR/$1/bpf/sluice_tunnel4" key "$2" 0 0 0 ${3//./ } 2>/dev/null) ||
    return 0
  # An LPM lookup answers the longest prefix covering the key: keep only an exact answer.
  case $out in *"\"prefixlen\":$2,"*) ;; *) return 0;; esac
  v=$(sed -n 's/.*"value":\["\(0x[0-9a-f]*\)","\(0x[0-9a-f]*\)","\(0x[0-9a-f]*\)","\(0x[0-9a-f]*\)".*/\1 \2 \3 \4/p' <<<"$out")
  [ -z "$v" ] || printf '%d.%d.%d.%d\n' $v
}
# within_1s WHAT CMD...: CMD succeeds within one second from now.
within_1s() {
  local what=$1; shift
  local start; start=$(date +%s%N)
  until "$@"; do
    [ $(($(date +%s%N) - start)) -lt 1000000000 ] || fail "$what: not within 1 s"
    sleep 0.05
  done
  log "ok: $what within $((($(date +%s%N) - start) / 1000000)) ms"
}
entry_is() { [ "$(peer_entry "$1" "$2" "$3")" = "$4" ]; }
entry_is node1 24 "${B%.*}.0" "$N2" || fail "node1's peer map has no entry for node2's pods"
# Traffic between a and b keeps flowing meanwhile.
( while [ ! -e "$WORK/churn.done" ]; do
    r=$("$LAB" request --name "$NAME" --from default/a --to "$B:8080" --data hostname --timeout 2)
    [ "$r" = b ] || echo "failed: $r" >>"$WORK/churn.failures"
    echo x >>"$WORK/churn.count"
  done ) &
CHURN=$!
BG_PIDS+=($CHURN)
K apply --validate=false -f - >/dev/null <<'YAML' || fail "apply node4"
apiVersion: v1
kind: Node
metadata: {name: node4}
spec: {podCIDR: 10.244.200.0/24}
status: {addresses: [{type: InternalIP, address: 172.30.250.4}]}
YAML
joined() { entry_is node1 24 10.244.200.0 172.30.250.4 && entry_is node3 32 172.30.250.4 172.30.250.4; }
within_1s "node4 joining, in node1's and node3's peer maps" joined
K patch node node4 --subresource=status --type=merge -p '{"status":{"addresses":[{"type":"InternalIP","address":"172.30.250.5"}]}}' \
  >/dev/null || fail "patch node4"
moved() { entry_is node1 24 10.244.200.0 172.30.250.5 && [ -z "$(peer_entry node1 32 172.30.250.4)" ]; }
within_1s "node4's new address, in node1's peer map" moved
K delete node node4 --wait=false >/dev/null || fail "delete node4"
left() { [ -z "$(peer_entry node1 24 10.244.200.0)" ] && [ -z "$(peer_entry node2 24 10.244.200.0)" ]; }
within_1s "node4 leaving, out of node1's and node2's peer maps" left
# A third node's agent restarting (SIGTERM, as a DaemonSet rollout does) and crashing (SIGKILL)
# never disturbs traffic between the other two: a -> b keeps flowing through both.
requests() { wc -l <"$WORK/churn.count"; }
more_requests_than() { [ "$(requests)" -gt "$1" ]; }
for action in restart kill; do
  seen=$(requests)
  lab agent "$action" --node node3 --wait >/dev/null || fail "agent $action node3"
  wait_for 20 more_requests_than $((seen + 5)) || fail "a -> b stalled after node3's agent $action"
done
log "ok: node3's agent restarted and killed while a -> b flowed"
touch "$WORK/churn.done"
wait "$CHURN" || true
[ ! -e "$WORK/churn.failures" ] || fail "a -> b failed during node churn: $(cat "$WORK/churn.failures")"
log "ok: $(wc -l <"$WORK/churn.count") requests a -> b during node churn, none failed"

"$LAB" down --name "$NAME" || fail "down"
trap - EXIT
rm -rf "$WORK"
echo "routing_test ($MODE): PASS"
