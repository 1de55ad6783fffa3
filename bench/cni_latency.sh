#!/usr/bin/env bash
# CNI ADD/DEL latency of sluice-cni (with the real agent) against Debian's reference plugins
# (bridge + host-local IPAM, ipMasq on), measured in the same run the same way: N pods, each in
# its own network namespace, ADD then DEL, sequentially and 8 at a time. Both plugins are invoked
# exactly as a runtime does (environment + netconf on stdin) and through the same
# `ip netns exec NODE` wrapper, so the bridge, its addresses and its iptables rules live in the
# bench's node namespace and never touch the root namespace. Latency is the wall time of one
# invocation (wrapper included; its own cost is printed), from bash's $EPOCHREALTIME (no fork).
#
# usage: bench/cni_latency.sh BUILD_DIR
#   SLUICE_BENCH_PODS (200), SLUICE_BENCH_PARALLEL (8), SLUICE_BENCH_PREFIX (sbn$$),
#   SLUICE_BENCH_OUT (a directory to keep the raw samples in; default: none kept)
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
N=${SLUICE_BENCH_PODS:-200}
P=${SLUICE_BENCH_PARALLEL:-8}
# lib.sh names every namespace and directory after this prefix; keep it short (it names a veth).
export SLUICE_E2E_PREFIX=${SLUICE_BENCH_PREFIX:-sbn$$}
# shellcheck source-path=SCRIPTDIR source=../tests/e2e/lib.sh
source "$BENCH_DIR/../tests/e2e/lib.sh" "${1:?usage: $0 BUILD_DIR}"

REF_PLUGIN_DIR=/usr/lib/cni
REF_BRIDGE=refbr0
REF_NAME=refnet
LAT=$ROOT/lat   # one file per (plugin, mode, verb): one latency in µs per line
OUT=$ROOT/out   # stdout+stderr of every invocation
RUNTIME_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

root_refnet_rules() { { iptables-save 2>/dev/null || true; } | grep -c "$REF_NAME" || true; }

cleanup() {
  local rc=$?
  set +e
  if [ -n "${SLUICE_BENCH_OUT:-}" ] && [ -d "${LAT:-}" ]; then  # raw µs samples, in pod order
    mkdir -p "$SLUICE_BENCH_OUT" && cp -r "$LAT"/. "$SLUICE_BENCH_OUT"/
  fi
  teardown  # agent, every $T-* namespace (node: bridge + its iptables rules; pods), bpffs, $ROOT
  local after
  after=$(root_refnet_rules)
  if [ "$after" != "$ROOT_RULES_BEFORE" ]; then
    echo "WARNING: root netns has $after iptables lines naming $REF_NAME (was $ROOT_RULES_BEFORE)" >&2
    rc=1
  fi
  exit $rc
}
ROOT_RULES_BEFORE=$(root_refnet_rules)
trap cleanup EXIT
trap 'exit 130' INT TERM

for f in "$REF_PLUGIN_DIR/bridge" "$REF_PLUGIN_DIR/host-local" "$CNI" "$AGENT"; do
  [ -x "$f" ] || fail "$f missing (containernetworking-plugins installed? build done?)"
done
[ -n "${EPOCHREALTIME:-}" ] || fail "bash without \$EPOCHREALTIME"

setup_node
start_agent
mkdir -p "$LAT" "$OUT" "$ROOT/ref-ipam"
netconf >"$ROOT/sluice.conf"
printf '{"cniVersion":"1.0.0","name":"%s","type":"bridge","bridge":"%s","isGateway":true,"ipMasq":true,"ipam":{"type":"host-local","subnet":"10.245.0.0/16","dataDir":"%s"}}' \
  "$REF_NAME" "$REF_BRIDGE" "$ROOT/ref-ipam" >"$ROOT/ref.conf"

# Each plugin gets its own N pod namespaces ($T-s<i> for sluice, $T-r<i> for the reference), so
# the two can be interleaved pod by pod.
log "creating 2 x $N pod namespaces"
for i in $(seq 1 "$N"); do
  for p in s r; do
    ip netns add "$T-$p$i"
    ip -n "$T-$p$i" link set lo up
  done
done

# invoke PLUGIN VERB POD: one plugin invocation as a runtime makes it; prints its latency in µs.
invoke() {
  local plugin=$1 verb=$2 i=$3 conf bin path netns t0 t1 rc=0
  case $plugin in
    sluice) conf=$ROOT/sluice.conf bin=$CNI path=$ROOT/bin netns=$T-s$i ;;
    ref) conf=$ROOT/ref.conf bin=$REF_PLUGIN_DIR/bridge path=$REF_PLUGIN_DIR netns=$T-r$i ;;
  esac
  t0=$EPOCHREALTIME
  ip netns exec "$NODE" env -i PATH="$RUNTIME_PATH" CNI_COMMAND="$verb" \
    CNI_CONTAINERID="$plugin-p$i" CNI_NETNS="/var/run/netns/$netns" CNI_IFNAME=eth0 \
    CNI_PATH="$path" CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=p$i" \
    "$bin" <"$conf" >"$OUT/$plugin-$verb-p$i" 2>&1 || rc=$?
  t1=$EPOCHREALTIME
  if [ $rc -ne 0 ]; then
    echo "$plugin $verb p$i failed ($rc): $(head -c 500 "$OUT/$plugin-$verb-p$i")" >&2
    return 1
  fi
  echo $(( ${t1//[.,]/} - ${t0//[.,]/} ))
}
# record PLUGIN MODE VERB POD: invoke, appending the latency to its file (O_APPEND, one short
# write per line, so parallel workers do not interleave).
record() {
  local lat
  lat=$(invoke "$1" "$3" "$4") || return 1
  echo "$lat" >>"$LAT/$1-$2-$3"
}
export -f invoke record
export ROOT LAT OUT CNI NODE T REF_PLUGIN_DIR RUNTIME_PATH

# seq_phase VERB: the verb on all N pods one at a time, sluice and reference alternating pod by
# pod, so both see the same machine load and the same number of pods already present.
seq_phase() {
  local verb=$1 plugin i
  for plugin in sluice ref; do : >"$LAT/$plugin-seq-$verb"; done
  for i in $(seq 1 "$N"); do
    for plugin in sluice ref; do
      record "$plugin" seq "$verb" "$i" || fail "$plugin $verb p$i"
    done
  done
  for plugin in sluice ref; do
    [ "$(wc -l <"$LAT/$plugin-seq-$verb")" -eq "$N" ] || fail "$plugin seq $verb: missing samples"
  done
}
# par_phase PLUGIN VERB: the verb on all N pods of one plugin, P at a time (xargs -P).
par_phase() {
  local plugin=$1 verb=$2 t0 t1
  : >"$LAT/$plugin-par-$verb"
  t0=$EPOCHREALTIME
  seq 1 "$N" | xargs -P "$P" -I{} bash -c 'record "$@"' _ "$plugin" par "$verb" {} ||
    fail "$plugin parallel $verb: a worker failed"
  t1=$EPOCHREALTIME
  [ "$(wc -l <"$LAT/$plugin-par-$verb")" -eq "$N" ] || fail "$plugin par $verb: missing samples"
  echo $(( (${t1//[.,]/} - ${t0//[.,]/}) / 1000 )) >"$LAT/$plugin-par-$verb.wall_ms"
}

# Every ADD of a phase returned an address, all distinct; DEL left no pod link on the node.
check_adds() {
  local plugin=$1 got
  got=$(cat "$OUT/$plugin-ADD-p"* | sed -n 's/.*"address": *"\([0-9.]*\)\/[0-9]*".*/\1/p' |
        sort -u | wc -l)
  [ "$got" -eq "$N" ] || fail "$plugin: $got distinct pod addresses after $N ADDs"
  if [ "$plugin" = ref ]; then  # ipMasq really is on, and its rules are in the node namespace
    got=$(ip netns exec "$NODE" iptables-save -t nat | grep -c "$REF_NAME" || true)
    [ "$got" -ge "$N" ] || fail "ref: $got masquerade rules in $NODE after $N ADDs"
  fi
}
check_dels() {
  local left p=s up start
  if [ "$1" = sluice ]; then
    # DEL answers with the pod's veth down; the agent deletes it in the background just after.
    up=$(ip -n "$NODE" -o link show | grep ' slc' | grep -c '[<,]UP[,>]' || true)
    [ "$up" -eq 0 ] || fail "sluice: $up pod veths still up after DEL answered"
    start=$EPOCHREALTIME
    wait_for 60 no_sluice_links "$NODE" || true
    log "sluice: the last veth was deleted $(python3 -c "import sys; print(round(float(sys.argv[1]) - float(sys.argv[2]), 2))" "$EPOCHREALTIME" "$start") s after the last DEL answered"
    left=$(ip -n "$NODE" -o link show | grep -c ' slc' || true)
  else
    p=r
    left=$(ip -n "$NODE" -o link show master "$REF_BRIDGE" | grep -c . || true)
  fi
  [ "$left" -eq 0 ] || fail "$1: $left pod links left on the node after DEL"
  for i in 1 $((N / 2)) "$N"; do
    ip -n "$T-$p$i" link show eth0 >/dev/null 2>&1 && fail "$1: pod $p$i still has eth0 after DEL"
  done
  return 0
}

# Warm-up (page cache, first bridge/chain creation): not recorded.
for plugin in sluice ref; do
  for _ in 1 2 3; do
    invoke "$plugin" ADD 1 >/dev/null || fail "warm-up $plugin ADD"
    invoke "$plugin" DEL 1 >/dev/null || fail "warm-up $plugin DEL"
  done
done
# The wrapper alone, for scale.
: >"$LAT/wrapper"
for _ in $(seq 1 50); do
  t0=$EPOCHREALTIME
  ip netns exec "$NODE" env -i PATH="$RUNTIME_PATH" /bin/true
  t1=$EPOCHREALTIME
  echo $(( ${t1//[.,]/} - ${t0//[.,]/} )) >>"$LAT/wrapper"
done

log "sequential ADD x$N, sluice and reference alternating"
seq_phase ADD
check_adds sluice
check_adds ref
log "sequential DEL x$N, sluice and reference alternating"
seq_phase DEL
check_dels sluice
check_dels ref
# Parallel phases in A-B-B-A order, so a steady drift in machine load cancels out.
for step in sluice:ADD ref:ADD ref:DEL sluice:DEL; do
  plugin=${step%:*} verb=${step#*:}
  log "parallel-$P $verb x$N: $plugin"
  par_phase "$plugin" "$verb"
  if [ "$verb" = ADD ]; then check_adds "$plugin"; else check_dels "$plugin"; fi
done
[ "$(map_count sluice_ep4)" -eq 0 ] || fail "sluice_ep4 not empty after every DEL"

# pct FILE P: nearest-rank percentile, in ms.
pct() { sort -n "$1" | awk -v p="$2" '{ v[NR] = $1 } END { i = int(p * NR); if (i < p * NR) i++;
  if (i < 1) i = 1; printf "%.2f", v[i] / 1000 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }'; }

echo
echo "== CNI latency: sluice-cni + agent vs reference bridge + host-local (ipMasq), $N pods, ms"
echo "   each sample = one plugin invocation incl. the 'ip netns exec' wrapper (wrapper alone: p50 $(pct "$LAT/wrapper" 0.50) ms)"
printf '%-10s %-4s | %10s %10s %8s | %10s %10s %8s | %s\n' mode verb \
  "sluice p50" "ref p50" ratio "sluice p99" "ref p99" ratio "phase wall s, sluice / ref"
for mode in seq par; do
  label=sequential; [ "$mode" = par ] && label=parallel-$P
  for verb in ADD DEL; do
    s=$LAT/sluice-$mode-$verb r=$LAT/ref-$mode-$verb
    s50=$(pct "$s" 0.50) r50=$(pct "$r" 0.50) s99=$(pct "$s" 0.99) r99=$(pct "$r" 0.99)
    wall="(interleaved)"
    [ -f "$s.wall_ms" ] && wall=$(awk '{ printf "%.2f", $1 / 1000 }' "$s.wall_ms")" / "$(
      awk '{ printf "%.2f", $1 / 1000 }' "$r.wall_ms")
    printf '%-10s %-4s | %10s %10s %8s | %10s %10s %8s | %s\n' "$label" "$verb" \
      "$s50" "$r50" "$(ratio "$s50" "$r50")" "$s99" "$r99" "$(ratio "$s99" "$r99")" "$wall"
  done
done
# Issue 14's targets, sequential, the plugin's own time: a sample less the wrapper's p50 (the
# runtime's own cost of entering the node's namespace, paid by any plugin).
w50=$(pct "$LAT/wrapper" 0.50)
target() {  # target TEXT OK-CONDITION(awk, a=value b=bound) VALUE BOUND
  local verdict="NOT MET"
  if awk -v a="$3" -v b="$4" "BEGIN { exit !($2) }"; then verdict=MET; fi
  echo "target (issue 14): $1: $verdict ($3 vs $4)"
}
net() { awk -v a="$1" -v w="$w50" 'BEGIN { printf "%.2f", a - w }'; }
s50=$(pct "$LAT/sluice-seq-ADD" 0.50) r50=$(pct "$LAT/ref-seq-ADD" 0.50)
target "ADD p50 <= 0.5x the reference's" "a <= b" "$(ratio "$s50" "$r50" | tr -d x)" 0.5
target "ADD p50 less the wrapper <= 5 ms" "a <= b" "$(net "$s50")" 5
target "ADD p99 less the wrapper <= 20 ms" "a <= b" "$(net "$(pct "$LAT/sluice-seq-ADD" 0.99)")" 20
target "DEL p50 less the wrapper <= 5 ms" "a <= b" "$(net "$(pct "$LAT/sluice-seq-DEL" 0.50)")" 5
