#!/usr/bin/env bash
# Cross-node pod-to-pod TCP throughput (iperf3, one stream) and request/response latency, Sluice
# vs a hand-built kernel baseline in the same topology (docs/routing.md, "Benchmark"):
#   tunnel: a 2-node sluice-lab (collect_md VXLAN + BPF) vs two node namespaces joined by a
#           kernel VXLAN device each (static all-zero FDB entry to the peer, plain routes);
#   native: a 2-node sluice-lab with --routing_mode=native --auto_direct_node_routes vs the same
#           node namespaces with plain routes to the peer's pod CIDR.
# Per mode both topologies are up at once and measured in ROUNDS interleaved rounds (the order
# alternates each round); each round is one iperf3 run and one RR run (bench/tcp_rr.cc) per side.
# Client and server are pinned (CPUS="client server"), by default both on CPU 1: every packet's
# whole path then runs on that CPU, so throughput and round trip measure the CPU cost of the
# path; split over the 2 CPUs of a shared machine, cross-CPU wake-ups behind the other CPU's load
# made rounds differ by 2x (bench/README.md, "Cross-node pods").
# Prints per-round figures, then medians [min..max], the ratios of the medians and, as a check on
# them, the same ratios taken within each round.
# Needs root, iperf3 (make deps) and BUILD/bench/tcp_rr (cmake --build BUILD --target benchmarks).
# usage: bench/overlay_bench.sh BUILD_DIR
#   env: ROUNDS=7 SECONDS_PER_RUN=3 RR_COUNT=20000 MODES="tunnel native" CPUS="1 1" (or "none")
#        BPF_STATS=1: after the rounds, each Sluice TC program's run time per round trip
#        (kernel.bpf_stats_enabled for one RR run, then restored)
set -euo pipefail
BUILD=$(cd "${1:?usage: $0 BUILD_DIR}" && pwd)
LAB=$BUILD/agent/lab/sluice-lab
RRBIN=$BUILD/bench/tcp_rr
ROUNDS=${ROUNDS:-7}
T=${SECONDS_PER_RUN:-3}
RR=${RR_COUNT:-20000}
MODES=${MODES:-tunnel native}
CPUS=${CPUS:-1 1}
if [ "$CPUS" = none ]; then
  PINC=() PINS=() AFF=()
else
  read -r CCPU SCPU <<<"$CPUS"
  PINC=(taskset -c "$CCPU") PINS=(taskset -c "$SCPU") AFF=(-A "$CCPU,$SCPU")
fi
P=ovb$$
WORK=$(mktemp -d)
command -v iperf3 >/dev/null || { echo "overlay_bench: needs iperf3 (make deps)" >&2; exit 1; }
[ -x "$RRBIN" ] || { echo "overlay_bench: $RRBIN missing: cmake --build $BUILD --target tcp_rr" >&2; exit 1; }
[ -x "$LAB" ] || { echo "overlay_bench: $LAB missing: make build" >&2; exit 1; }

SERVERS=()
cleanup() {
  local pid
  for pid in "${SERVERS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for mode in $MODES; do "$LAB" down --name "$P${mode:0:1}" >/dev/null 2>&1 || true; done
  for ns in u n1 n2 p1 p2; do ip netns del "$P-$ns" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

baseline_up() {  # baseline_up MODE: the lab's shape by hand, pods $P-p1 (10.99.1.2), $P-p2 (10.99.2.2)
  local mode=$1 mtu=1500 i peer
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
    peer=$((3 - i))
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
}

sluice_up() {  # sluice_up MODE NAME: a 2-node lab, pods a (node1) and b (node2); prints b's IP
  local mode=$1 name=$2 kcfg
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
  kubectl --kubeconfig "$kcfg" get pod b -o jsonpath='{.status.podIP}'
}

serve() {  # serve NETNS: iperf3 and tcp_rr servers for the whole mode, pinned to the server CPU
  local ns=$1 i
  "${PINS[@]}" ip netns exec "$ns" iperf3 -s -p 5201 >/dev/null 2>&1 &
  SERVERS+=($!)
  "${PINS[@]}" ip netns exec "$ns" "$RRBIN" serve 5202 >"$WORK/$ns.rr" 2>&1 &
  SERVERS+=($!)
  for i in $(seq 100); do grep -q listening "$WORK/$ns.rr" && return; sleep 0.05; done
  echo "overlay_bench: tcp_rr serve in $ns did not start" >&2
  exit 1
}

throughput() {  # throughput CLIENT_NETNS SERVER_IP: Gbit/s received, one stream, T seconds
  local i
  for i in $(seq 20); do  # the server may still be closing the previous test
    if "${PINC[@]}" ip netns exec "$1" iperf3 -c "$2" -p 5201 -t "$T" "${AFF[@]}" -J \
      >"$WORK/iperf.json" 2>/dev/null; then
      python3 -c 'import json, sys
print("%.3f" % (json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"] / 1e9))' \
        "$WORK/iperf.json"
      return
    fi
    sleep 0.2
  done
  echo "overlay_bench: iperf3 from $1 to $2 failed: $(cat "$WORK/iperf.json")" >&2
  exit 1
}

rr() {  # rr CLIENT_NETNS SERVER_IP [N]: "p50 mean p99" microseconds of one-byte round trips
  "${PINC[@]}" ip netns exec "$1" "$RRBIN" run "$2" 5202 "${3:-$RR}"
}

counter() {  # counter NETNS DEV: packets the device received
  ip netns exec "$1" cat "/sys/class/net/$2/statistics/rx_packets"
}

# bpf_costs NAME CLIENT_NETNS SERVER_IP: with kernel.bpf_stats_enabled for the length of one RR
# run, the run count and run time of each TC program attached in lab NAME's nodes, per round trip
# (the stats add their own clock reads: a few tens of ns per run).
bpf_costs() {
  local name=$1 ns dev dir id ids=() was
  for ns in "$name-node1" "$name-node2"; do
    for dev in $(ip -n "$ns" -o link show | awk -F': ' '{print $2}' | cut -d@ -f1); do
      for dir in ingress egress; do
        for id in $(ip netns exec "$ns" tc filter show dev "$dev" "$dir" | sed -n 's/.* id \([0-9]*\) .*/\1/p'); do
          ids+=("$id:${ns#"$name"-}:${dev/#slc*/pod-veth}:$dir")
        done
      done
    done
  done
  was=$(sysctl -n kernel.bpf_stats_enabled)
  sysctl -qw kernel.bpf_stats_enabled=1
  bpftool prog show -j >"$WORK/before.json"
  "${PINC[@]}" ip netns exec "$2" "$RRBIN" run "$3" 5202 "$RR" 0 >/dev/null  # no warm-up
  bpftool prog show -j >"$WORK/after.json"
  sysctl -qw kernel.bpf_stats_enabled="$was"
  python3 - "$WORK/before.json" "$WORK/after.json" "$RR" "${ids[@]}" <<'PY'
import json
import sys

before = {p["id"]: p for p in json.load(open(sys.argv[1]))}
n, total = int(sys.argv[3]), 0
where = {int(a.split(":")[0]): " ".join(a.split(":")[1:]) for a in sys.argv[4:]}
for p in sorted(json.load(open(sys.argv[2])), key=lambda p: where.get(p["id"], "")):
    runs = p.get("run_cnt", 0) - before.get(p["id"], {}).get("run_cnt", 0)
    ns = p.get("run_time_ns", 0) - before.get(p["id"], {}).get("run_time_ns", 0)
    if p["id"] in where and runs:
        total += ns
        print("    %-20s %-26s %7d runs %6.1f ns/run %6.3f us per round trip"
              % (p["name"], where[p["id"]], runs, ns / runs, ns / n / 1000))
print("    all programs: %.3f us per round trip" % (total / n / 1000))
PY
}

echo "overlay_bench: $ROUNDS rounds of iperf3 -t $T and $RR round trips per side, CPUS (client server): $CPUS"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
RES=$WORK/results
: >"$RES"
for mode in $MODES; do
  name=$P${mode:0:1}
  baseline_up "$mode"
  bip=$(sluice_up "$mode" "$name")
  # side -> client netns, server netns, server address
  declare -A cli=([kernel]=$P-p1 [sluice]=$name-pod-default-a)
  declare -A srv=([kernel]=$P-p2 [sluice]=$name-pod-default-b)
  declare -A dst=([kernel]=10.99.2.2 [sluice]=$bip)
  serve "${srv[kernel]}"
  serve "${srv[sluice]}"
  # Warm-up and a check that each side takes the path it claims: in tunnel mode the server
  # node's VXLAN device (vx0, sluice_vxlan) receives the traffic; natively, no device does.
  for side in kernel sluice; do
    if [ "$side" = kernel ]; then node=$P-n2 dev=vx0; else node=$name-node2 dev=sluice_vxlan; fi
    before=0
    [ "$mode" = tunnel ] && before=$(counter "$node" "$dev")
    T=1 throughput "${cli[$side]}" "${dst[$side]}" >/dev/null
    rr "${cli[$side]}" "${dst[$side]}" 2000 >/dev/null
    if [ "$mode" = tunnel ] && [ $(($(counter "$node" "$dev") - before)) -lt 1000 ]; then
      echo "overlay_bench: $mode/$side: the traffic did not cross $node/$dev" >&2
      exit 1
    fi
    if [ "$mode" = native ] && ip -n "$node" link show "$dev" >/dev/null 2>&1; then
      echo "overlay_bench: $mode/$side: $node has a $dev device in native mode" >&2
      exit 1
    fi
  done
  for r in $(seq "$ROUNDS"); do
    if [ $((r % 2)) -eq 1 ]; then order="kernel sluice"; else order="sluice kernel"; fi
    declare -A g=() l=()
    for side in $order; do g[$side]=$(throughput "${cli[$side]}" "${dst[$side]}"); done
    for side in $order; do l[$side]=$(rr "${cli[$side]}" "${dst[$side]}"); done
    for side in kernel sluice; do
      echo "$mode $side $r ${g[$side]} ${l[$side]}" >>"$RES"
      printf '  %-7s %-7s round %2d: %7.2f Gbit/s  RR p50 %7.1f us  mean %7.1f  p99 %7.1f\n' \
        "$mode" "$side" "$r" "${g[$side]}" ${l[$side]}
    done
  done
  if [ "${BPF_STATS:-0}" = 1 ]; then
    echo "  $mode: BPF programs on the Sluice side, one RR run of $RR round trips:"
    bpf_costs "$name" "${cli[sluice]}" "${dst[sluice]}"
  fi
  for pid in "${SERVERS[@]}"; do kill "$pid" 2>/dev/null || true; done
  SERVERS=()
  "$LAB" down --name "$name" >/dev/null
  for ns in u n1 n2 p1 p2; do ip netns del "$P-$ns"; done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$RES" <<'PY'
import statistics as st
import sys

rows = {}
for line in open(sys.argv[1]):
    mode, side, _, g, p50, mean, p99 = line.split()
    rows.setdefault((mode, side), []).append((float(g), float(p50), float(mean), float(p99)))

def span(v, fmt):
    return ("%s [%s..%s]" % (fmt, fmt, fmt)) % (st.median(v), min(v), max(v))

print("%-7s %-7s %-24s %-24s %10s" % ("mode", "side", "Gbit/s median [min..max]",
                                     "RR p50 us median [range]", "RR p99 us"))
for mode in dict.fromkeys(m for m, _ in rows):
    med = {}
    for side in ("kernel", "sluice"):
        r = rows[(mode, side)]
        g, p50, p99 = [x[0] for x in r], [x[1] for x in r], [x[3] for x in r]
        med[side] = (st.median(g), st.median(p50))
        print("%-7s %-7s %-24s %-24s %10.1f" % (mode, side, span(g, "%.2f"), span(p50, "%.1f"),
                                               st.median(p99)))
    tput = 100 * med["sluice"][0] / med["kernel"][0]
    added = 100 * (med["sluice"][1] - med["kernel"][1]) / med["kernel"][1]
    print("%-7s ratio   throughput %.1f%% of the baseline (target >= 95%%: %s), added RR latency "
          "%+.1f%% (target <= +5%%: %s)" % (mode, tput, "met" if tput >= 95 else "MISSED", added,
                                           "met" if added <= 5 else "MISSED"))
    # The same ratios taken within each round (both sides measured a few seconds apart), as a
    # check on the medians: their spread is the noise of the machine.
    pg = [100 * s[0] / k[0] for k, s in zip(rows[(mode, "kernel")], rows[(mode, "sluice")])]
    pl = [100 * (s[1] - k[1]) / k[1] for k, s in zip(rows[(mode, "kernel")], rows[(mode, "sluice")])]
    print("%-7s         per round: throughput %s%%, added RR latency %s%%"
          % (mode, span(pg, "%.1f"), span(pl, "%+.1f")))
PY
