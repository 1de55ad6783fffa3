#!/usr/bin/env bash
# New TCP connections per second and connect latency through a ClusterIP with N Services
# installed: Sluice vs kube-proxy's iptables layout (iptables-legacy and iptables-nft), its
# nftables layout, and a single DNAT rule, all measured side by side in the same run.
#
# Topology, one per datapath, all built the same way and alive at the same time:
#   <p>-c (client pod, 10.244.0.10) --veth-- <p>-n (node, ip_forward on) --veth-- <p>-s (server
#   pod, 10.250.0.1..E, `conn_load serve 8080`)
# Pods reach everything through a gateway 169.254.1.1 whose MAC is their host-side veth's.
# - sluice:   the real Datapath (sluice_lb_setup): endpoint entries for both pods and
#             sluice_from_pod on both host-side veths, as the agent plumbs a pod; N Services in
#             the maps. Service traffic never enters the node's stack (DNAT + redirect_peer).
# - legacy:   kube-proxy's jump rules, then its sync input, `iptables-legacy-restore -w --noflush`.
# - ipt-nft:  the same rules with iptables-nft-restore, loaded as one full restore (jumps
#             included, no --noflush: 1.8.9's --noflush restore of 10k+ chains takes minutes; the
#             resulting ruleset is the same).
# - nftables: kube-proxy's nftables layout (`nft -f`).
# - 1-dnat:   one `-j DNAT` rule (iptables-legacy), the floor of netfilter NAT; N does not apply.
# The probed Service is the last one (last in KUBE-SERVICES). Every measurement is validated:
# no errors and every backend answered (the answer names the backend's address).
#
# usage: bench/service_conn_bench.sh BUILD_DIR [--services "1 1000 5000 10000"] [--rounds 5]
#          [--seconds 3] [--per-service 3] [--threads 1] [--modes "sluice legacy ipt-nft nftables"]
#          [--pin]
set -euo pipefail
BUILD=$(cd "${1:?usage: $0 BUILD_DIR [options]}" && pwd)
shift
HERE=$(cd "$(dirname "$0")" && pwd)
SERVICES="1 1000 5000 10000"
ROUNDS=5
SECONDS_PER_RUN=3
PER_SERVICE=3
THREADS=1
PIN=
MODES="sluice legacy ipt-nft nftables"
while [ $# -gt 0 ]; do
  case "$1" in
    --services) SERVICES=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --seconds) SECONDS_PER_RUN=$2; shift 2 ;;
    --per-service) PER_SERVICE=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --pin) PIN=1; shift ;;
    --modes) MODES=$2; shift 2 ;;
    *) echo "service_conn_bench.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "service_conn_bench.sh: needs root" >&2; exit 1; }
LOAD=$BUILD/bench/conn_load
# --pin: the client on CPU 0, the servers on CPU 1 (the datapath runs in softirq on the sender's
# CPU), so each side's socket work does not share a CPU with the other's.
SERVER_CPU=
CLIENT_CPU=
if [ -n "$PIN" ]; then
  [ "$(nproc)" -ge 2 ] || { echo "service_conn_bench.sh: --pin needs 2 CPUs" >&2; exit 1; }
  SERVER_CPU="taskset -c 1"
  CLIENT_CPU="taskset -c 0"
fi
SETUP=$BUILD/bench/sluice_lb_setup
GEN=$HERE/gen_kube_proxy_rules.py
for b in "$LOAD" "$SETUP"; do
  [ -x "$b" ] || { echo "service_conn_bench.sh: $b missing: cmake --build $BUILD --target conn_load sluice_lb_setup" >&2; exit 1; }
done
for t in iptables-legacy-restore iptables-nft-restore nft python3; do
  command -v $t >/dev/null || { echo "service_conn_bench.sh: $t missing (make deps)" >&2; exit 1; }
done

PFX=sbc$$
WORK=$(mktemp -d /tmp/sluice-svc-bench.XXXXXX)
GW=169.254.1.1
CLIENT=10.244.0.10
C_MAC=02:00:00:00:0c:01 HC_MAC=02:aa:00:00:0c:02 S_MAC=02:00:00:00:0d:01 HS_MAC=02:aa:00:00:0d:02
PROBED=$(seq -s, -f "10.250.0.%g" 1 "$PER_SERVICE")
SERVER_PIDS=()

cleanup() {
  for p in "${SERVER_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for ns in $(ip netns list | awk -v p="$PFX-" 'index($1, p) == 1 {print $1}'); do
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT

in_ns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

# make_topology NAME: namespaces NAME-n, NAME-c, NAME-s and the accept server.
make_topology() {
  local t=$1 n=$1-n c=$1-c s=$1-s
  for ns in "$n" "$c" "$s"; do
    ip netns add "$ns"
    in_ns "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
    in_ns "$ns" ip link set lo up
  done
  ip link add hc netns "$n" address $HC_MAC type veth peer name eth0 netns "$c" address $C_MAC
  ip link add hs netns "$n" address $HS_MAC type veth peer name eth0 netns "$s" address $S_MAC
  in_ns "$n" sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0
  in_ns "$n" ip link set hc up
  in_ns "$n" ip link set hs up
  in_ns "$n" ip route add $CLIENT/32 dev hc
  in_ns "$n" ip neigh replace $CLIENT lladdr $C_MAC dev hc nud permanent
  in_ns "$c" ip addr add $CLIENT/32 dev eth0
  in_ns "$s" sysctl -qw net.core.somaxconn=4096 net.ipv4.tcp_max_syn_backlog=4096
  local ip
  for ip in ${PROBED//,/ }; do
    in_ns "$s" ip addr add "$ip"/32 dev eth0
    in_ns "$n" ip route add "$ip"/32 dev hs
    in_ns "$n" ip neigh replace "$ip" lladdr $S_MAC dev hs nud permanent
  done
  for pair in "$c:$HC_MAC" "$s:$HS_MAC"; do
    local ns=${pair%%:*} mac=${pair#*:}
    in_ns "$ns" ip link set eth0 up
    in_ns "$ns" ip route add $GW dev eth0 scope link
    in_ns "$ns" ip route add default via $GW dev eth0
    in_ns "$ns" ip neigh replace $GW lladdr "$mac" dev eth0 nud permanent
  done
  in_ns "$c" sysctl -qw net.ipv4.ip_local_port_range="1024 65535" net.ipv4.tcp_tw_reuse=1
  in_ns "$s" $SERVER_CPU "$LOAD" serve 8080 >"$WORK/$t.server.log" 2>&1 &
  SERVER_PIDS+=($!)
  local i
  for i in $(seq 1 100); do  # wait for the listener, 10s at most
    grep -q listening "$WORK/$t.server.log" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "service_conn_bench.sh: server in $s did not start: $(cat "$WORK/$t.server.log")" >&2
  return 1
}

# load MODE NAME N: program the datapath of topology NAME for N Services; prints seconds taken.
load() {
  local mode=$1 t=$2 nsvc=$3 n=$2-n f=$WORK/rules
  local start end
  case $mode in
    legacy)
      python3 "$GEN" iptables-jumps --services "$nsvc" >"$f.jumps"
      python3 "$GEN" iptables --services "$nsvc" --per-service "$PER_SERVICE" --probed "$PROBED" >"$f"
      in_ns "$n" iptables-legacy-restore -w --noflush <"$f.jumps"
      start=$(date +%s.%N)
      in_ns "$n" iptables-legacy-restore -w --noflush <"$f"
      ;;
    ipt-nft)
      python3 "$GEN" iptables --services "$nsvc" --per-service "$PER_SERVICE" --probed "$PROBED" \
        --with-jumps >"$f"
      start=$(date +%s.%N)
      in_ns "$n" iptables-nft-restore -w <"$f"
      ;;
    nftables)
      python3 "$GEN" nft --services "$nsvc" --per-service "$PER_SERVICE" --probed "$PROBED" >"$f"
      start=$(date +%s.%N)
      in_ns "$n" nft -f "$f"
      ;;
    1-dnat)
      python3 "$GEN" single-dnat --services "$nsvc" --per-service "$PER_SERVICE" --probed "$PROBED" >"$f"
      start=$(date +%s.%N)
      in_ns "$n" iptables-legacy-restore -w --noflush <"$f"
      ;;
    sluice)
      local eps="--endpoint=$CLIENT,hc,$C_MAC,$HC_MAC" ip
      for ip in ${PROBED//,/ }; do eps="$eps --endpoint=$ip,hs,$S_MAC,$HS_MAC"; done
      start=$(date +%s.%N)
      # shellcheck disable=SC2086
      in_ns "$n" "$SETUP" --bpffs="/run/sluice-bench/$t" --services="$nsvc" \
        --per-service="$PER_SERVICE" --probed="$PROBED" $eps >"$WORK/$t.setup.log" 2>&1 ||
        { cat "$WORK/$t.setup.log" >&2; return 1; }
      rmdir "/run/sluice-bench/$t" 2>/dev/null || true
      ;;
  esac
  end=$(date +%s.%N)
  awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f\n", b - a }'
}

# The probed Service's ClusterIP: 172.30.0.0 + N.
cluster_ip() { python3 -c "import ipaddress; print(ipaddress.IPv4Address('172.30.0.0') + $1)"; }

# Socket-LB hooks of another Sluice on this machine see every connect(); ours go to 172.30/15.
hooks=$(bpftool cgroup tree 2>/dev/null | grep -c connect4 || true)
[ "${hooks:-0}" -eq 0 ] || echo "# note: $hooks cgroup connect4 program(s) attached on this machine (bpftool cgroup tree)"

RESULTS=$WORK/results
: >"$RESULTS"
echo "# per-service backends: $PER_SERVICE; ${SECONDS_PER_RUN}s per measurement after 0.5s warm-up," \
  "$THREADS client thread(s), $ROUNDS rounds in shuffled order; $(nproc) CPUs, $(uname -r)${PIN:+; client pinned to CPU 0, servers to CPU 1}"
first=1
for nsvc in $SERVICES; do
  modes=$MODES
  [ $first -eq 1 ] && modes="$modes 1-dnat"
  first=0
  cip=$(cluster_ip "$nsvc")
  for m in $modes; do
    make_topology "$PFX-$m"
    secs=$(load "$m" "$PFX-$m" "$nsvc")
    printf '# loaded %-8s N=%-6s in %6.2fs\n' "$m" "$nsvc" "$secs"
    # Validation before timing: the Service answers from every backend, with no error.
    out=$(in_ns "$PFX-$m-c" "$LOAD" client "$cip" 80 --seconds=0.5 --warmup=0.1) || true
    want=${PROBED//,/ }
    [ "$m" = 1-dnat ] && want=${PROBED%%,*}  # one rule, one backend
    for ip in $want; do
      case $out in *"$ip:"*) ;; *) echo "service_conn_bench.sh: $m N=$nsvc: backend $ip never answered: $out" >&2; exit 1 ;; esac
    done
    case $out in *" errors=0 "*) ;; *) echo "service_conn_bench.sh: $m N=$nsvc: errors: $out" >&2; exit 1 ;; esac
  done
  for r in $(seq 1 "$ROUNDS"); do
    for m in $(printf '%s\n' $modes | shuf); do
      out=$(in_ns "$PFX-$m-c" $CLIENT_CPU "$LOAD" client "$cip" 80 --seconds="$SECONDS_PER_RUN" --warmup=0.5 \
        --threads="$THREADS") || echo "service_conn_bench.sh: $m N=$nsvc round $r: no connection completed: $out" >&2
      echo "$nsvc $m $r $out" >>"$RESULTS"
      echo "# N=$nsvc $m round $r: $out"
    done
  done
  for p in "${SERVER_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  SERVER_PIDS=()
  for m in $modes; do
    for x in n c s; do ip netns del "$PFX-$m-$x"; done
  done
done

python3 - "$RESULTS" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    n, mode = int(f[0]), f[1]
    kv = dict(x.split("=", 1) for x in f[3:])
    rows.setdefault((n, mode), []).append(kv)
def med(n, mode, key):
    v = rows.get((n, mode))
    return statistics.median(float(r[key]) for r in v) if v else None
ns = sorted({n for n, _ in rows})
modes = [m for m in ["sluice", "legacy", "ipt-nft", "nftables", "1-dnat"] if any(k[1] == m for k in rows)]
print("\n== New connections through a ClusterIP (connect + request + close), median over rounds")
print(f"{'services':>8} {'datapath':>9} {'conns/s':>9} {'p50 us':>8} {'p99 us':>8} "
      f"{'conn/s vs legacy':>17} {'vs nftables':>12} {'p99 vs legacy':>14}")
for n in ns:
    for m in modes:
        c = med(n, m, "conns_per_s")
        if c is None:
            continue
        p50, p99 = med(n, m, "p50_us"), med(n, m, "p99_us")
        leg, nft, legp99 = med(n, "legacy", "conns_per_s"), med(n, "nftables", "conns_per_s"), med(n, "legacy", "p99_us")
        r1 = f"{c / leg:.2f}x" if leg else "-"
        r2 = f"{c / nft:.2f}x" if nft else "-"
        r3 = f"{p99 / legp99:.2f}x" if legp99 else "-"
        print(f"{n:>8} {m:>9} {c:>9.0f} {p50:>8.1f} {p99:>8.1f} {r1:>17} {r2:>12} {r3:>14}")
if "sluice" in modes and len(ns) > 1:
    a, b = med(ns[0], "sluice", "conns_per_s"), med(ns[-1], "sluice", "conns_per_s")
    print(f"sluice flat across N: conns/s at {ns[-1]} / at {ns[0]} Services = {b / a:.3f}x")
    for base in ("legacy", "nftables"):
        x = med(ns[-1], base, "conns_per_s")
        if x:
            print(f"at {ns[-1]} Services: sluice / {base} conn rate = {b / x:.2f}x")
EOF
