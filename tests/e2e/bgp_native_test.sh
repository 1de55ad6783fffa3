#!/usr/bin/env bash
# BGP to a real router in native routing (docs/routing.md, "BGP"): a 2-node lab made with
# `sluice-lab up --bgp` (FRR's zebra and bgpd in a router namespace on the underlay, a client
# behind it), agents with --routing_mode=native and no direct node routes, each running BIRD
# that announces its pod CIDR. Proves: both sessions establish; the router learns each node's
# pod CIDR with that node as next hop (vtysh 'show ip bgp'); each node routes the other's pods
# via the router (a BGP route, no direct route); pod-to-pod traffic across nodes is forwarded by
# the router (nftables counters in its forward hook count every request, both ways); the client
# behind the router reaches a pod with its own address; an agent restart leaves BIRD and its
# session untouched, and BIRD killed outright is started again by the agent while the router
# keeps the node's prefix (graceful restart): a request loop from the client and across nodes
# fails 0 times through both; a node that goes silent has its prefix withdrawn within the hold
# time (9 s). Every address used lives in namespaces the lab creates.
set -euo pipefail
NAME=bgp$$
WORK=$(mktemp -d)
source "$(dirname "$0")/lib.sh"
lab_init
BG_PIDS=()
before_down() { for p in "${BG_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
fail_logs() {
  local f
  for f in "$DIR"/node*/log/agent.log "$DIR"/node*/state/bgp/bird.log "$DIR"/router/bgpd.log; do
    if [ -f "$f" ]; then echo "$f"; fi
  done
}
command -v vtysh >/dev/null && command -v bird >/dev/null || fail "FRR and BIRD are needed (make deps)"

export SLUICE_LAB_AGENT_ARGS="${SLUICE_LAB_AGENT_ARGS:-} --routing_mode=native --metrics_address=127.0.0.1:9962"
KUBECONFIG_PATH=$("$LAB" up --nodes 2 --name "$NAME" --bgp) || fail "up"
N1=$(node_ip node1); N2=$(node_ip node2)
ROUTER=$(lab status | awk '/^router:/ {print $2}')
CLIENT=$(lab status | awk '/^client:/ {print $2}')
[ -n "$ROUTER" ] && [ -n "$CLIENT" ] || fail "no router or client in: $(lab status)"
CIDR1=$(K get node node1 -o jsonpath='{.spec.podCIDR}'); CIDR2=$(K get node node2 -o jsonpath='{.spec.podCIDR}')
log "lab $NAME up: router $ROUTER, client $CLIENT; node1 $N1 ($CIDR1), node2 $N2 ($CIDR2)"
VTY=$DIR/router
router() { vtysh --vty_socket "$VTY" -c "$1"; }
on_node() { local n=$1; shift; ip netns exec "$NAME-node$n" "$@"; }

{
  pod_manifest a --node node1 --ports 8080,8080/UDP
  pod_manifest b --node node2 --ports 8080,8080/UDP
} | K apply --validate=false -f - >/dev/null || fail "apply"
K wait --for=condition=Ready pod/a pod/b --timeout=60s >/dev/null || fail "pods not Ready"
A=$(ip_of a); B=$(ip_of b)
log "pods a=$A (node1) b=$B (node2)"

# Sessions, and what the router learned: each pod CIDR, next hop its node, AS path the nodes'.
established() {
  router 'show bgp summary json' | python3 -c '
import json, sys
peers = json.load(sys.stdin)["ipv4Unicast"]["peers"]
sys.exit(0 if all(peers.get(p, {}).get("state") == "Established" for p in sys.argv[1:]) else 1)' "$@"
}
wait_for 20 established "$N1" "$N2" || fail "sessions not Established: $(router 'show bgp summary')"
log "ok: BGP sessions node1 and node2 <-> router Established"
# learned CIDR: the next hop of the router's best path to CIDR (empty: none)
learned() {
  router 'show ip bgp json' | python3 -c '
import json, sys
for p in json.load(sys.stdin).get("routes", {}).get(sys.argv[1], []):
    if p.get("bestpath") or p.get("valid"):
        print(p["nexthops"][0]["ip"], "stale" if p.get("stale") else "", sep=" ")
        break' "$1"
}
wait_for 20 output_is "$N1 " learned "$CIDR1" || fail "router: $CIDR1 not via $N1: $(router 'show ip bgp')"
wait_for 20 output_is "$N2 " learned "$CIDR2" || fail "router: $CIDR2 not via $N2: $(router 'show ip bgp')"
router 'show ip bgp' | grep -q "$CIDR1 .* 64512 i" || fail "show ip bgp: $(router 'show ip bgp')"
log "ok: the router learned $CIDR1 via $N1 and $CIDR2 via $N2"

# Each node routes the other's pods via the router, by BGP (BIRD's kernel protocol), and has no
# direct route to the other node's pods.
route_via_router() { on_node "$1" ip route show "$2" | grep -q "via $ROUTER .*proto bird"; }
wait_for 20 route_via_router 1 "$CIDR2" || fail "node1: $(on_node 1 ip route)"
wait_for 20 route_via_router 2 "$CIDR1" || fail "node2: $(on_node 2 ip route)"
! on_node 1 ip route | grep -q "via $N2" || fail "node1 has a direct route: $(on_node 1 ip route)"
! on_node 1 ip link show sluice_vxlan >/dev/null 2>&1 || fail "native node1 has sluice_vxlan"
log "ok: node1 routes $CIDR2 and node2 $CIDR1 via the router (proto bird), no direct routes"

# What the node says about it: sluicectl bgp and the agent's metrics.
ctl1() { on_node 1 "$SLUICECTL" --bpffs_root="$DIR/node1/bpf" --state_dir="$DIR/node1/state" "$@"; }
got=$(ctl1 -o json bgp | jget '[(s["established"], s["advertised"], "'"$CIDR2"'" in s["learned"]) for s in d]')
[ "$got" = "[(True, ['$CIDR1'], True)]" ] || fail "sluicectl bgp on node1: $got; $(ctl1 bgp)"
metric1() { on_node 1 curl -s 127.0.0.1:9962/metrics | grep "^$1" || true; }
[ "$(metric1 sluice_bgp_session_established)" = "sluice_bgp_session_established{peer=\"$ROUTER\",peer_asn=\"65000\"} 1" ] ||
  fail "metrics: $(metric1 sluice_bgp)"
log "ok: sluicectl bgp and sluice_bgp_session_established on node1: established, $CIDR1 advertised, $CIDR2 learned"

# Pod to pod across nodes crosses the router: its forward hook counts a -> b and b -> a.
ip netns exec "$NAME-router" nft -f - <<NFT || fail "nft"
table ip sluice_lab_proof {
  chain forward {
    type filter hook forward priority 0; policy accept;
    ip saddr $A ip daddr $B counter
    ip saddr $B ip daddr $A counter
  }
}
NFT
forwarded() {  # forwarded SRC DST: packets the router forwarded from SRC to DST
  ip netns exec "$NAME-router" nft -j list chain ip sluice_lab_proof forward | python3 -c '
import json, sys
for r in json.load(sys.stdin)["nftables"]:
    e = r.get("rule", {}).get("expr", [])
    m = [x["match"]["right"] for x in e if "match" in x]
    c = [x["counter"]["packets"] for x in e if "counter" in x]
    if m == sys.argv[1:3] and c: print(c[0])' "$1" "$2"
}
for i in $(seq 10); do
  expect "a -> b tcp ($i)" "$(lab request --from default/a --to "$B:8080" --data hostname)" b
done
expect "b -> a udp" "$(lab request --from default/b --to "$A:8080" --proto udp --data hostname)" a
AB=$(forwarded "$A" "$B"); BA=$(forwarded "$B" "$A")
[ "$AB" -ge 30 ] && [ "$BA" -ge 21 ] || fail "the router forwarded a -> b $AB, b -> a $BA packets"
log "ok: the router forwarded $AB packets a -> b and $BA b -> a"

# The client behind the router reaches pods on both nodes, with its own address.
got=$(lab request --from client --to "$A:8080" --data clientip)
case $got in "$CLIENT":*) log "ok: client -> a, a sees $got";; *) fail "client -> a: '$got'";; esac
expect "client -> b" "$(lab request --from client --to "$B:8080" --data hostname)" b

# Restarts under load: the client -> a (node1) and b -> a loops run throughout.
load() {  # load NAME FROM: requests to a until $WORK/load.done
  while [ ! -e "$WORK/load.done" ]; do
    r=$("$LAB" request --name "$NAME" --from "$2" --to "$A:8080" --data hostname --timeout 2)
    [ "$r" = a ] || echo "$(date +%T.%N) $r" >>"$WORK/$1.failures"
    echo x >>"$WORK/$1.count"
  done
}
load client client & BG_PIDS+=($!)
load pod default/b & BG_PIDS+=($!)
count() { cat "$WORK/$1.count" 2>/dev/null | wc -l; }
more_than() { [ "$(count client)" -gt "$1" ] && [ "$(count pod)" -gt "$1" ]; }
wait_for 10 more_than 3 || fail "the load does not run"
BIRD1=$(cat "$DIR/node1/state/bgp/bird.pid")
lab agent restart --node node1 --wait >/dev/null || fail "agent restart node1"
wait_for 20 sh -c "grep -q 'adopted BIRD (pid $BIRD1)' $DIR/node1/log/agent.log" ||
  fail "the restarted agent did not adopt BIRD $BIRD1"
[ "$(cat "$DIR/node1/state/bgp/bird.pid")" = "$BIRD1" ] && kill -0 "$BIRD1" || fail "BIRD changed"
seen=$(count client)
wait_for 10 more_than $((seen + 3)) || fail "the load stalled after the agent restart"
log "ok: node1's agent restarted; BIRD $BIRD1 and its session untouched"

# BIRD itself dies: the router keeps node1's prefix (stale, graceful restart) and forwards to it
# until the agent has started BIRD again and the session is back.
kill -KILL "$BIRD1"
wait_for 10 output_is "$N1 stale" learned "$CIDR1" || fail "no stale $CIDR1 kept: $(router 'show ip bgp')"
log "ok: BIRD killed on node1: the router keeps $CIDR1 as stale"
bird_back() { local p; p=$(cat "$DIR/node1/state/bgp/bird.pid"); [ "$p" != "$BIRD1" ] && kill -0 "$p"; }
wait_for 20 bird_back || fail "the agent did not start BIRD again"
wait_for 30 established "$N1" || fail "node1's session did not come back"
wait_for 30 output_is "$N1 " learned "$CIDR1" || fail "$CIDR1 still stale: $(router 'show ip bgp')"
seen=$(count client)
wait_for 10 more_than $((seen + 3)) || fail "the load stalled after BIRD's restart"
touch "$WORK/load.done"
wait
for l in client pod; do
  [ ! -e "$WORK/$l.failures" ] || fail "$l -> a failed: $(cat "$WORK/$l.failures")"
done
grep -q "BGP: BIRD (pid $BIRD1) is gone" "$DIR/node1/log/agent.log" || fail "no restart logged"
[ "$(metric1 sluice_bgp_speaker_restarts_total)" = "sluice_bgp_speaker_restarts_total 1" ] ||
  fail "restart not counted: $(metric1 sluice_bgp)"
log "ok: BIRD back on node1, $CIDR1 fresh; $(count client) client -> a and $(count pod) b -> a requests, none failed"

# A node that goes silent (its link down): the router withdraws its prefix within the hold time.
start=$(date +%s%N)
on_node 2 ip link set eth0 down
wait_for 15 output_is "" learned "$CIDR2" || fail "$CIDR2 not withdrawn: $(router 'show ip bgp')"
ms=$((($(date +%s%N) - start) / 1000000))
[ "$ms" -le 10500 ] || fail "$CIDR2 withdrawn after $ms ms, hold time 9 s"
log "ok: node2 silent: $CIDR2 withdrawn after $ms ms (hold time 9 s)"

"$LAB" down --name "$NAME" || fail "down"
trap - EXIT
rm -rf "$WORK"
echo "bgp_native_test: PASS"
