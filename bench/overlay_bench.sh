#!/usr/bin/env bash
# Cross-node pod-to-pod TCP throughput (iperf3, one stream) and request/response latency, Sluice
# vs a hand-built kernel baseline in the same topology, measured in the same run (docs/routing.md):
#   tunnel: a 2-node sluice-lab (collect_md VXLAN + BPF) vs two node namespaces joined by a
#           kernel VXLAN device each (static all-zero FDB entry to the peer, plain routes);
#   native: a 2-node sluice-lab with --routing_mode=native --auto_direct_node_routes vs the same
#           node namespaces with plain routes to the peer's pod CIDR.
# Pods have MTU 1450 in tunnel mode and 1500 natively in both. Needs root and iperf3 (make deps).
# usage: bench/overlay_bench.sh BUILD_DIR   (SECONDS_PER_RUN=5, RR_COUNT=5000)
set -euo pipefail
BUILD=$(cd "${1:?usage: $0 BUILD_DIR}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
LAB=$BUILD/agent/lab/sluice-lab
T=${SECONDS_PER_RUN:-5}
RR=${RR_COUNT:-5000}
P=ovb$$
WORK=$(mktemp -d)
command -v iperf3 >/dev/null || { echo "overlay_bench: needs iperf3 (make deps)" >&2; exit 1; }

cleanup() {
  "$LAB" down --name "${P}t" >/dev/null 2>&1 || true
  "$LAB" down --name "${P}n" >/dev/null 2>&1 || true
  for ns in u n1 n2 p1 p2; do ip netns del "$P-$ns" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# measure CLIENT_CMD_PREFIX SERVER_CMD_PREFIX SERVER_IP: prints "Gbit/s mean_us p99_us"
measure() {
  local client=$1 server=$2 ip=$3 gbps rr
  $server iperf3 -s -1 -p 5201 >/dev/null 2>&1 &
  local srv=$!
  for _ in $(seq 50); do $client iperf3 -c "$ip" -p 5201 -t 1 >/dev/null 2>&1 && break; sleep 0.1; done
  wait "$srv" 2>/dev/null || true
  $server iperf3 -s -1 -p 5201 >/dev/null 2>&1 &
  srv=$!
  sleep 0.3
  gbps=$($client iperf3 -c "$ip" -p 5201 -t "$T" -J |
    python3 -c 'import json,sys; print("%.2f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 1e9))')
  wait "$srv" 2>/dev/null || true
  rm -f "$WORK/rr.ready"
  $server python3 "$HERE/tcp_rr.py" serve 5202 "$WORK/rr.ready" &
  srv=$!
  for _ in $(seq 100); do [ -e "$WORK/rr.ready" ] && break; sleep 0.05; done
  rr=$($client python3 "$HERE/tcp_rr.py" run "$ip" 5202 "$RR")
  wait "$srv" 2>/dev/null || true
  echo "$gbps $rr"
}

sluice() {  # sluice MODE NAME: a 2-node lab, pods a (node1) and b (node2); prints the figures
  local mode=$1 name=$2 kcfg b
  if [ "$mode" = native ]; then
    kcfg=$(SLUICE_LAB_AGENT_ARGS="--routing_mode=native --auto_direct_node_routes" "$LAB" up --nodes 2 --name "$name")
  else
    kcfg=$("$LAB" up --nodes 2 --name "$name")
  fi
  kubectl --kubeconfig "$kcfg" apply --validate=false -f - >/dev/null <<'YAML'
apiVersion: v1
kind: Pod
metadata: {name: a}
spec: {nodeName: node1, containers: [{name: c, image: netexec, ports: [{containerPort: 8080}]}]}
---
apiVersion: v1
kind: Pod
metadata: {name: b}
spec: {nodeName: node2, containers: [{name: c, image: netexec, ports: [{containerPort: 8080}]}]}
YAML
  kubectl --kubeconfig "$kcfg" wait --for=condition=Ready pod/a pod/b --timeout=60s >/dev/null
  b=$(kubectl --kubeconfig "$kcfg" get pod b -o jsonpath='{.status.podIP}')
  measure "ip netns exec $name-pod-default-a" "ip netns exec $name-pod-default-b" "$b"
  "$LAB" down --name "$name" >/dev/null
}

baseline() {  # baseline MODE: the same shape by hand; prints the figures
  local mode=$1 mtu=1500 i
  ip netns add "$P-u"
  ip -n "$P-u" link add br0 type bridge
  ip -n "$P-u" link set br0 up
  for i in 1 2; do
    ip netns add "$P-n$i"
    ip netns add "$P-p$i"
    ip link add eth0 netns "$P-n$i" type veth peer name "n$i" netns "$P-u"
    ip -n "$P-u" link set "n$i" master br0 up
    ip -n "$P-n$i" link set lo up
    ip -n "$P-n$i" link set eth0 up
    ip -n "$P-n$i" addr add "172.31.99.1$i/24" dev eth0
    ip netns exec "$P-n$i" sysctl -qw net.ipv4.ip_forward=1
  done
  [ "$mode" = tunnel ] && mtu=1450
  for i in 1 2; do
    local peer=$((3 - i))
    ip link add eth0 netns "$P-p$i" mtu "$mtu" type veth peer name pod netns "$P-n$i" mtu "$mtu"
    ip -n "$P-p$i" link set lo up
    ip -n "$P-p$i" link set eth0 up
    ip -n "$P-p$i" addr add "10.99.$i.2/24" dev eth0
    ip -n "$P-p$i" route add default via "10.99.$i.1"
    ip -n "$P-n$i" link set pod up
    ip -n "$P-n$i" addr add "10.99.$i.1/24" dev pod
    if [ "$mode" = tunnel ]; then
      ip -n "$P-n$i" link add vx0 type vxlan id 42 dstport 8472 local "172.31.99.1$i" nolearning
      ip -n "$P-n$i" link set vx0 mtu 1450 up
      ip -n "$P-n$i" addr add "10.98.0.$i/24" dev vx0
      ip netns exec "$P-n$i" bridge fdb append 00:00:00:00:00:00 dev vx0 dst "172.31.99.1$peer"
      ip -n "$P-n$i" route add "10.99.$peer.0/24" via "10.98.0.$peer" dev vx0
    else
      ip -n "$P-n$i" route add "10.99.$peer.0/24" via "172.31.99.1$peer" dev eth0
    fi
  done
  measure "ip netns exec $P-p1" "ip netns exec $P-p2" 10.99.2.2
  for ns in u n1 n2 p1 p2; do ip netns del "$P-$ns"; done
}

printf '%-8s %-10s %10s %12s %10s\n' mode datapath Gbit/s "RR mean us" "RR p99 us"
for mode in tunnel native; do
  read -r bg bm bp < <(baseline "$mode")
  read -r sg sm sp < <(sluice "$mode" "$P${mode:0:1}")
  printf '%-8s %-10s %10s %12s %10s\n' "$mode" kernel "$bg" "$bm" "$bp"
  printf '%-8s %-10s %10s %12s %10s\n' "$mode" sluice "$sg" "$sm" "$sp"
  python3 -c 'import sys; bg,sg,bm,sm=map(float,sys.argv[1:5]); print("%-8s ratio      %9.1f%% %11.1f%%   (throughput vs baseline; added RR latency)" % (sys.argv[5], 100*sg/bg, 100*(sm-bm)/bm))' \
    "$bg" "$sg" "$bm" "$sm" "$mode"
done
