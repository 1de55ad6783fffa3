#!/usr/bin/env bash
# The CNI install lifecycle on one node, with real files: the conflist is written only once
# every binary it needs is there (missing loopback: a log line naming it, no conflist); another
# plugin's configuration that sorts first is named in a warning, or with --cni_exclusive moved
# to *.sluice_bak; `sluice-agent --uninstall` removes Sluice's conflist and binary and restores
# the others; with --uninstall_datapath also Sluice's tc programs and pins.
SLUICE_E2E_PREFIX=${SLUICE_E2E_PREFIX:-ci$$}
source "$(dirname "$0")/lib.sh"
node_init
trap teardown EXIT

setup_node
rm -f "$ROOT/bin/loopback"  # lib.sh provides it; this test takes it away first
echo '{"cniVersion":"0.4.0","name":"other","plugins":[{"type":"bridge"}]}' >"$ROOT/net.d/00-other.conflist"

agent_flags=(--pod_cidr=$POD_CIDR --native_device=eth0 --bpffs_root="$ROOT/bpf"
  --state_dir="$ROOT/state" --socket="$ROOT/sluice.sock" --cni_conf_dir="$ROOT/net.d"
  --cni_bin_dir="$ROOT/bin" --cni_plugin="$CNI")
run_agent() {
  : >"$ROOT/log/agent.log"
  ip netns exec "$NODE" "$AGENT" "${agent_flags[@]}" "$@" >>"$ROOT/log/agent.log" 2>&1 &
  AGENT_PID=$!
}
logged() { grep -qF -- "$1" "$ROOT/log/agent.log"; }

# 1. No loopback plugin: the agent says so and writes no conflist until it appears.
run_agent
wait_for 30 logged "not ready, waiting for CNI binaries: CNI plugin binaries missing in $ROOT/bin: loopback" \
  || fail "no log line naming the missing loopback: $(cat "$ROOT/log/agent.log")"
[ ! -e "$ROOT/net.d/05-sluice.conflist" ] || fail "conflist written while loopback is missing"
cni_status >/dev/null || fail "the endpoint API should already serve while CNI binaries are missing"
[ ! -e "$ROOT/net.d/05-sluice.conflist" ] || fail "conflist written while loopback is missing"
for lo in /opt/cni/bin/loopback /usr/lib/cni/loopback; do [ -x "$lo" ] && { ln -s "$lo" "$ROOT/bin/loopback"; break; }; done
[ -e "$ROOT/bin/loopback" ] || fail "no loopback plugin on this machine (containernetworking-plugins)"
wait_for 30 test -f "$ROOT/net.d/05-sluice.conflist" || fail "no conflist once loopback exists: $(cat "$ROOT/log/agent.log")"
log "ok: conflist only once loopback is there"

# 2. Not exclusive: the other configuration stays and the warning names it.
wait_for 10 logged "$ROOT/net.d/00-other.conflist sorts before 05-sluice.conflist" || fail "no warning naming 00-other.conflist"
[ -f "$ROOT/net.d/00-other.conflist" ] || fail "00-other.conflist was touched without --cni_exclusive"
stop_agent
log "ok: a configuration sorting first is named"

# 3. Exclusive: moved aside, and logged.
run_agent --cni_exclusive
wait_for 30 logged "renamed another plugin's configuration $ROOT/net.d/00-other.conflist" || fail "no log of the rename"
[ -f "$ROOT/net.d/00-other.conflist.sluice_bak" ] && [ ! -e "$ROOT/net.d/00-other.conflist" ] \
  || fail "00-other.conflist not moved to .sluice_bak: $(ls "$ROOT/net.d")"
A=$(add_pod a)
[ -n "$A" ] || fail "no pod address"
POD_LINK=$(ip -n "$NODE" -o link show | awk -F': ' '$2 ~ /^slc/ {print $2}' | cut -d@ -f1 | head -1)
[ -n "$POD_LINK" ] || fail "no pod veth on the node"
stop_agent
log "ok: --cni_exclusive moved the other configuration aside"

# 4. Uninstall: our files go, the other configuration comes back, the datapath stays.
ip netns exec "$NODE" "$AGENT" "${agent_flags[@]}" --uninstall >>"$ROOT/log/agent.log" 2>&1 || fail "--uninstall failed"
[ ! -e "$ROOT/net.d/05-sluice.conflist" ] && [ ! -e "$ROOT/bin/sluice" ] || fail "conflist or plugin left: $(ls "$ROOT/net.d" "$ROOT/bin")"
[ -f "$ROOT/net.d/00-other.conflist" ] && [ ! -e "$ROOT/net.d/00-other.conflist.sluice_bak" ] || fail "00-other.conflist not restored"
ip netns exec "$NODE" tc filter show dev eth0 egress | grep -q sluice_ || fail "--uninstall alone removed the datapath"
[ -n "$(ls "$ROOT/bpf")" ] || fail "--uninstall alone removed pins"
log "ok: --uninstall removed the conflist and plugin, restored the other configuration"

# 5. --uninstall_datapath: Sluice's programs and pins go; the qdisc stays.
ip netns exec "$NODE" "$AGENT" "${agent_flags[@]}" --uninstall --uninstall_datapath >>"$ROOT/log/agent.log" 2>&1 \
  || fail "--uninstall --uninstall_datapath failed: $(tail -3 "$ROOT/log/agent.log")"
for dev in eth0 "$POD_LINK"; do
  for dir in ingress egress; do
    ! ip netns exec "$NODE" tc filter show dev "$dev" $dir | grep -q sluice_ || fail "a Sluice program left on $dev $dir"
  done
done
# (Another plugin's filters on a shared device surviving DetachTc: coexistence_priv_test.)
ip netns exec "$NODE" tc qdisc show dev eth0 | grep -q clsact || fail "the clsact qdisc was removed"
left=$(ls -A "$ROOT/bpf" | grep -vx -e maps.debug -e progs.debug || true)  # the kernel's iterators
[ -z "$left" ] || fail "pins left: $left"
log "ok: --uninstall_datapath removed Sluice's programs and pins"
echo "5 passed, 0 failed"
