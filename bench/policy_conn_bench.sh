#!/usr/bin/env bash
# New TCP connections per second and connect latency from a client pod to a server pod whose
# ingress one NetworkPolicy with N rules restricts (the client's rule last), at N = 10, 1k, 10k:
# Sluice vs kube-router's iptables + ipset layout of the same policy (gen_kube_router_rules.py)
# vs the same topology without any policy, all measured side by side in the same run.
#
# Topology, one per datapath, all built the same way and alive at the same time:
#   <p>-c (client pod, 10.244.0.10) --veth-- <p>-n (node, ip_forward on) --veth-- <p>-s (server
#   pod, 10.244.0.20, `conn_load serve 8080` and 8081)
# Pods reach everything through a gateway 169.254.1.1 whose MAC is their host-side veth's.
# - sluice:      the real Datapath (sluice_policy_setup): endpoint entries and pod programs on both
#                host-side veths, the server's ingress enforced with N rules in the maps. Pod ->
#                pod traffic never enters the node's stack (verdict + redirect_peer).
# - kube-router: routed by the node's stack; `ipset restore` then `iptables-legacy-restore
#                --noflush` of kube-router's layout (pod firewall chain, policy chain with two
#                rules per ingress rule and port, one ipset per rule).
# - none:        routed by the node's stack, no policy: the floor of the stack path (N does not
#                apply; measured with the first N).
# Validated before timing: 8080 answers and every policy mode refuses 8081 (no rule admits it);
# `none` answers on 8081.
#
# usage: bench/policy_conn_bench.sh BUILD_DIR [--rules "10 1000 10000"] [--rounds 5]
#          [--seconds 3] [--threads 1] [--modes "sluice kube-router"]
set -euo pipefail
BUILD=$(cd "${1:?usage: $0 BUILD_DIR [options]}" && pwd)
shift
HERE=$(cd "$(dirname "$0")" && pwd)
RULES="10 1000 10000"
ROUNDS=5
SECONDS_PER_RUN=3
THREADS=1
MODES="sluice kube-router"
while [ $# -gt 0 ]; do
  case "$1" in
    --rules) RULES=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --seconds) SECONDS_PER_RUN=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --modes) MODES=$2; shift 2 ;;
    *) echo "policy_conn_bench.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "policy_conn_bench.sh: needs root" >&2; exit 1; }
LOAD=$BUILD/bench/conn_load
SETUP=$BUILD/bench/sluice_policy_setup
GEN=$HERE/gen_kube_router_rules.py
for b in "$LOAD" "$SETUP"; do
  [ -x "$b" ] || { echo "policy_conn_bench.sh: $b missing: cmake --build $BUILD --target conn_load sluice_policy_setup" >&2; exit 1; }
done
for t in iptables-legacy-restore ipset python3; do
  command -v $t >/dev/null || { echo "policy_conn_bench.sh: $t missing (make deps)" >&2; exit 1; }
done

PFX=pb$$
WORK=$(mktemp -d /tmp/sluice-pol-bench.XXXXXX)
GW=169.254.1.1
CLIENT=10.244.0.10
SERVER=10.244.0.20
C_MAC=02:00:00:00:0c:01 HC_MAC=02:aa:00:00:0c:02 S_MAC=02:00:00:00:0d:01 HS_MAC=02:aa:00:00:0d:02
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

# make_topology NAME: namespaces NAME-n, NAME-c, NAME-s and the accept servers.
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
  in_ns "$n" ip route add $SERVER/32 dev hs
  in_ns "$n" ip neigh replace $SERVER lladdr $S_MAC dev hs nud permanent
  in_ns "$c" ip addr add $CLIENT/32 dev eth0
  in_ns "$s" ip addr add $SERVER/32 dev eth0
  in_ns "$s" sysctl -qw net.core.somaxconn=4096 net.ipv4.tcp_max_syn_backlog=4096
  for pair in "$c:$HC_MAC" "$s:$HS_MAC"; do
    local ns=${pair%%:*} mac=${pair#*:}
    in_ns "$ns" ip link set eth0 up
    in_ns "$ns" ip route add $GW dev eth0 scope link
    in_ns "$ns" ip route add default via $GW dev eth0
    in_ns "$ns" ip neigh replace $GW lladdr "$mac" dev eth0 nud permanent
  done
  in_ns "$c" sysctl -qw net.ipv4.ip_local_port_range="1024 65535" net.ipv4.tcp_tw_reuse=1
  local port
  for port in 8080 8081; do
    in_ns "$s" "$LOAD" serve $port >"$WORK/$t.server$port.log" 2>&1 &
    SERVER_PIDS+=($!)
  done
  local i
  for i in $(seq 1 100); do  # wait for both listeners, 10s at most
    grep -q listening "$WORK/$t.server8080.log" 2>/dev/null &&
      grep -q listening "$WORK/$t.server8081.log" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "policy_conn_bench.sh: servers in $s did not start" >&2
  return 1
}

# load MODE NAME N: program the datapath of topology NAME for N rules; prints seconds taken.
load() {
  local mode=$1 t=$2 nrules=$3 n=$2-n f=$WORK/rules
  local start end
  case $mode in
    kube-router)
      python3 "$GEN" ipset --rules "$nrules" --client $CLIENT --server $SERVER >"$f.ipset"
      python3 "$GEN" iptables --rules "$nrules" --client $CLIENT --server $SERVER >"$f"
      start=$(date +%s.%N)
      in_ns "$n" ipset restore <"$f.ipset"
      in_ns "$n" iptables-legacy-restore -w --noflush <"$f"
      ;;
    none)
      start=$(date +%s.%N)
      ;;
    sluice)
      start=$(date +%s.%N)
      in_ns "$n" "$SETUP" --bpffs="/run/sluice-bench/$t" --rules="$nrules" \
        --client=$CLIENT,hc,$C_MAC,$HC_MAC --server=$SERVER,hs,$S_MAC,$HS_MAC \
        >"$WORK/$t.setup.log" 2>&1 || { cat "$WORK/$t.setup.log" >&2; return 1; }
      rmdir "/run/sluice-bench/$t" 2>/dev/null || true
      ;;
  esac
  end=$(date +%s.%N)
  awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f\n", b - a }'
}

# Whether a TCP connection from the client pod to the server's PORT completes within 1 s.
connects() { in_ns "$1-c" timeout 1 bash -c "exec 3<>/dev/tcp/$SERVER/$2" 2>/dev/null; }

RESULTS=$WORK/results
: >"$RESULTS"
echo "# ${SECONDS_PER_RUN}s per measurement after 0.5s warm-up, $THREADS client thread(s)," \
  "$ROUNDS rounds in shuffled order; $(nproc) CPUs, $(uname -r)"
first=1
for nrules in $RULES; do
  modes=$MODES
  [ $first -eq 1 ] && modes="$modes none"
  first=0
  for m in $modes; do
    make_topology "$PFX-$m"
    secs=$(load "$m" "$PFX-$m" "$nrules")
    printf '# loaded %-11s N=%-6s in %6.2fs\n' "$m" "$nrules" "$secs"
    out=$(in_ns "$PFX-$m-c" "$LOAD" client $SERVER 8080 --seconds=0.5 --warmup=0.1) || true
    case $out in *"$SERVER:"*" errors=0 "*|*" errors=0 "*"$SERVER:"*) ;; *)
      echo "policy_conn_bench.sh: $m N=$nrules: 8080 not answered cleanly: $out" >&2; exit 1 ;;
    esac
    if [ "$m" = none ]; then
      connects "$PFX-$m" 8081 || { echo "policy_conn_bench.sh: none: 8081 refused" >&2; exit 1; }
    elif connects "$PFX-$m" 8081; then
      echo "policy_conn_bench.sh: $m N=$nrules: 8081 connected, the policy admits no such rule" >&2
      exit 1
    fi
  done
  for r in $(seq 1 "$ROUNDS"); do
    for m in $(printf '%s\n' $modes | shuf); do
      out=$(in_ns "$PFX-$m-c" "$LOAD" client $SERVER 8080 --seconds="$SECONDS_PER_RUN" \
        --warmup=0.5 --threads="$THREADS") ||
        echo "policy_conn_bench.sh: $m N=$nrules round $r: no connection completed: $out" >&2
      echo "$nrules $m $r $out" >>"$RESULTS"
      echo "# N=$nrules $m round $r: $out"
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
    kv = dict(x.split("=", 1) for x in f[3:] if "=" in x)
    rows.setdefault((n, mode), []).append(kv)
def med(n, mode, key):
    v = rows.get((n, mode))
    return statistics.median(float(r[key]) for r in v) if v else None
ns = sorted({n for n, _ in rows})
none = med(ns[0], "none", "conns_per_s")
modes = [m for m in ["sluice", "kube-router", "none"] if any(k[1] == m for k in rows)]
print("\n== New connections client pod -> server pod under a NetworkPolicy of N ingress rules "
      "(connect + request + close), median over rounds")
print(f"{'rules':>6} {'datapath':>11} {'conns/s':>9} {'p50 us':>8} {'p99 us':>8} "
      f"{'vs kube-router':>15} {'vs no policy':>13}")
for n in ns:
    for m in modes:
        c = med(n, m, "conns_per_s")
        if c is None:
            continue
        kr = med(n, "kube-router", "conns_per_s")
        r1 = f"{c / kr:.2f}x" if kr else "-"
        r2 = f"{c / none:.2f}x" if none else "-"
        print(f"{n:>6} {m:>11} {c:>9.0f} {med(n, m, 'p50_us'):>8.1f} {med(n, m, 'p99_us'):>8.1f} "
              f"{r1:>15} {r2:>13}")
for m in ("sluice", "kube-router"):
    if len(ns) > 1 and med(ns[0], m, "conns_per_s") and med(ns[-1], m, "conns_per_s"):
        a, b = med(ns[0], m, "conns_per_s"), med(ns[-1], m, "conns_per_s")
        print(f"{m}: conns/s at {ns[-1]} / at {ns[0]} rules = {b / a:.3f}x")
EOF
