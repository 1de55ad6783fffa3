#!/usr/bin/env bash
# Control-plane time to program N Services x E endpoints (default 10k x 10), side by side:
#   - sluice, map API:   sluice_lb_setup writes the maps directly (lb_cluster.h, hitless order);
#   - sluice, reconciler: the agent's ServiceReconciler::ApplyAll (when sluice_reconcile_setup is
#                         built: agent/service/reconciler.h exists);
#   - iptables-legacy-restore -w --noflush of kube-proxy's sync input (jump rules loaded first,
#     not timed), as kube-proxy does;
#   - iptables-nft-restore -w --noflush the same way (bounded by --limit: 1.8.9 takes minutes),
#     and iptables-nft-restore -w of the same rules as one full restore;
#   - nft -f of kube-proxy's nftables layout.
# Each in a fresh network namespace (the Sluice tools too, so their bpffs mount is private and
# goes away with them). Then the BPF maps' memlock (bpftool map show) at N Services x E backends,
# and at 1 Service for comparison (the hash maps are preallocated).
#
# usage: bench/service_program_bench.sh BUILD_DIR [--services 10000] [--per-service 10]
#          [--rounds 3] [--limit 300]
set -euo pipefail
BUILD=$(cd "${1:?usage: $0 BUILD_DIR [options]}" && pwd)
shift
HERE=$(cd "$(dirname "$0")" && pwd)
N=10000 E=10 ROUNDS=3 LIMIT=300
while [ $# -gt 0 ]; do
  case "$1" in
    --services) N=$2; shift 2 ;;
    --per-service) E=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --limit) LIMIT=$2; shift 2 ;;
    *) echo "service_program_bench.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "service_program_bench.sh: needs root" >&2; exit 1; }
SETUP=$BUILD/bench/sluice_lb_setup
RECONCILE=$BUILD/bench/sluice_reconcile_setup
GEN=$HERE/gen_kube_proxy_rules.py
[ -x "$SETUP" ] || { echo "service_program_bench.sh: $SETUP missing" >&2; exit 1; }

PFX=sbp$$
WORK=$(mktemp -d /tmp/sluice-prog-bench.XXXXXX)
cleanup() {
  for ns in $(ip netns list | awk -v p="$PFX-" 'index($1, p) == 1 {print $1}'); do
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
seq_ns=0
fresh_ns() { seq_ns=$((seq_ns + 1)); ip netns add "$PFX-$seq_ns"; echo "$PFX-$seq_ns"; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }

python3 "$GEN" iptables-jumps --services "$N" >"$WORK/jumps"
python3 "$GEN" iptables --services "$N" --per-service "$E" >"$WORK/ipt"
python3 "$GEN" iptables --services "$N" --per-service "$E" --with-jumps >"$WORK/ipt-full"
python3 "$GEN" nft --services "$N" --per-service "$E" >"$WORK/nft"
echo "# $N Services x $E endpoints: iptables input $(wc -l <"$WORK/ipt") lines," \
  "nft input $(wc -l <"$WORK/nft") lines; $ROUNDS rounds (1 when a run exceeds 60s)," \
  "limit ${LIMIT}s; $(nproc) CPUs, $(uname -r)"

RESULTS=$WORK/results
: >"$RESULTS"
# run_case NAME: time one way of loading in a fresh namespace; appends "NAME seconds" or
# "NAME >LIMIT".
run_case() {
  local name=$1 ns t0 t1 rc=0 out
  ns=$(fresh_ns)
  case $name in
    sluice-maps)
      out=$(ip netns exec "$ns" "$SETUP" --bpffs="/run/sluice-bench/$ns" --services="$N" \
        --per-service="$E")
      rmdir "/run/sluice-bench/$ns" 2>/dev/null || true
      # program_ms: the map writes only (Datapath::Load is reported apart).
      echo "$name $(echo "$out" | sed -n 's/.*program_ms=\([0-9.]*\).*/\1/p' | awk '{printf "%.3f", $1 / 1000}')" >>"$RESULTS"
      echo "# $name: $out"
      ;;
    sluice-reconciler)
      out=$(ip netns exec "$ns" "$RECONCILE" --bpffs="/run/sluice-bench/$ns" --services="$N" \
        --per-service="$E" --floor)
      rmdir "/run/sluice-bench/$ns" "/run/sluice-bench/$ns-floor" 2>/dev/null || true
      echo "$name $(echo "$out" | sed -n 's/.*reconcile_ms=\([0-9.]*\).*/\1/p' | awk '{printf "%.3f", $1 / 1000}')" >>"$RESULTS"
      # The same entries written straight with BPF_MAP_UPDATE_BATCH, in the same process.
      echo "sluice-floor $(echo "$out" | sed -n 's/.*floor_ms=\([0-9.]*\).*/\1/p' | awk '{printf "%.3f", $1 / 1000}')" >>"$RESULTS"
      echo "# $name: $out"
      ;;
    legacy | ipt-nft-noflush)
      local bin=iptables-legacy-restore
      [ "$name" = ipt-nft-noflush ] && bin=iptables-nft-restore
      ip netns exec "$ns" $bin -w --noflush <"$WORK/jumps"
      t0=$(now)
      timeout "$LIMIT" ip netns exec "$ns" $bin -w --noflush <"$WORK/ipt" || rc=$?
      t1=$(now)
      ;;
    ipt-nft-full)
      t0=$(now)
      timeout "$LIMIT" ip netns exec "$ns" iptables-nft-restore -w <"$WORK/ipt-full" || rc=$?
      t1=$(now)
      ;;
    nftables)
      t0=$(now)
      timeout "$LIMIT" ip netns exec "$ns" nft -f "$WORK/nft" || rc=$?
      t1=$(now)
      ;;
  esac
  case $name in
    sluice-*) ;;
    *)
      if [ $rc -eq 124 ]; then
        echo "$name >$LIMIT" >>"$RESULTS"
        echo "# $name: did not finish within ${LIMIT}s"
      elif [ $rc -ne 0 ]; then
        echo "service_program_bench.sh: $name failed ($rc)" >&2
        exit 1
      else
        echo "$name $(elapsed "$t0" "$t1")" >>"$RESULTS"
        echo "# $name: $(elapsed "$t0" "$t1")s"
      fi
      ;;
  esac
  ip netns del "$ns"
}

cases="sluice-maps legacy ipt-nft-full nftables"
[ -x "$RECONCILE" ] && cases="sluice-reconciler $cases"
for r in $(seq 1 "$ROUNDS"); do
  for c in $(printf '%s\n' $cases | shuf); do
    run_case "$c"
  done
  # Cases that take more than a minute (or time out) are run once.
  slow=$(awk '$2 ~ /^>/ || $2 > 60 {print $1}' "$RESULTS" | sort -u)
  for s in $slow; do cases=$(printf '%s\n' $cases | grep -vx "$s" | tr '\n' ' '); done
done
run_case ipt-nft-noflush  # kube-proxy's way with iptables-nft: once, bounded by --limit

python3 - "$RESULTS" "$N" "$E" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    name, v = line.split()
    runs.setdefault(name, []).append(v)
def med(name):
    v = runs.get(name, [])
    if not v: return None
    if any(x.startswith(">") for x in v): return v[0]
    return statistics.median(float(x) for x in v)
label = {"sluice-maps": "Sluice, map API (lb_cluster.h)",
         "sluice-floor": "Sluice, BPF_MAP_UPDATE_BATCH alone (floor)",
         "sluice-reconciler": "Sluice, agent ServiceReconciler::ApplyAll",
         "legacy": "iptables-legacy-restore -w --noflush",
         "ipt-nft-noflush": "iptables-nft-restore -w --noflush",
         "ipt-nft-full": "iptables-nft-restore -w (full restore)",
         "nftables": "nft -f (kube-proxy nftables layout)"}
base = med("sluice-maps")
leg = med("legacy")
print(f"\n== Time to program {sys.argv[2]} Services x {sys.argv[3]} endpoints (median over rounds)")
print(f"{'how':<44} {'seconds':>9} {'runs':>5} {'x sluice maps':>14} {'vs legacy':>10}")
for k in ["sluice-maps", "sluice-floor", "sluice-reconciler", "legacy", "ipt-nft-noflush", "ipt-nft-full", "nftables"]:
    m = med(k)
    if m is None: continue
    if isinstance(m, str):
        print(f"{label[k]:<44} {m + 's':>9} {len(runs[k]):>5} {'-':>14} {'-':>10}")
        continue
    r1 = f"{m / base:.1f}x" if isinstance(base, float) and base else "-"
    r2 = f"{m / leg:.2f}x" if isinstance(leg, float) and leg else "-"
    print(f"{label[k]:<44} {m:>9.3f} {len(runs[k]):>5} {r1:>14} {r2:>10}")
fl, rc = runs.get("sluice-floor", []), runs.get("sluice-reconciler", [])
if fl and len(fl) == len(rc):
    ratios = [float(r) / float(f) for r, f in zip(rc, fl) if float(f) > 0]
    if ratios:
        print(f"ServiceReconciler::ApplyAll / its batched writes alone (same process): "
              f"{statistics.median(ratios):.2f}x median")
EOF

echo
echo "== BPF map memory (bpftool map show: memlock) of the datapath's maps"
for n in 1 "$N"; do
  ns=$(fresh_ns)
  echo "# $n Services x $E backends ($((n * E)) backends):"
  ip netns exec "$ns" "$SETUP" --bpffs="/run/sluice-bench/$ns" --services="$n" --per-service="$E" \
    --memlock >"$WORK/memlock-$n"
  sed 's/^/  /' "$WORK/memlock-$n"
  rmdir "/run/sluice-bench/$ns" 2>/dev/null || true
  ip netns del "$ns"
done
# What each backend (a Service's share: its slot, backend entry, 1/E of its master and reverse
# NAT entry) costs in locked kernel memory: the growth from 1 to N Services over the backends
# added. Maps whose memlock does not grow (preallocated at max_entries) are not listed.
python3 - "$WORK/memlock-1" "$WORK/memlock-$N" "$(((N - 1) * E))" <<'EOF'
import re, sys
def read(path):
    out = {}
    for line in open(path):
        m = re.match(r"memlock\s+(\d+) \|.* name (\S+)", line)
        if m: out[m.group(2)] = int(m.group(1))
    return out
a, b, n = read(sys.argv[1]), read(sys.argv[2]), int(sys.argv[3])
if n > 0:
    print(f"== memlock per backend ({n} backends added)")
    total = 0
    for name in sorted(b):
        d = b[name] - a.get(name, 0)
        total += d
        if d: print(f"  {name:<20} {d / n:8.1f} bytes")
    print(f"  {'all maps':<20} {total / n:8.1f} bytes")
EOF
