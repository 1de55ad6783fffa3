#!/usr/bin/env bash
# A single node without Kubernetes: a network namespace running the real sluice-agent, three
# pods made through sluice-cni, and traffic between them, to the node and out to an "internet"
# namespace.
# Everything stays up for you to look around; `tests/e2e/demo.sh BUILD down` removes it.
BUILD_ARG=${1:-build}
ACTION=${2:-up}
export SLUICE_E2E_PREFIX=sluice-demo
source "$(dirname "$0")/lib.sh" "$BUILD_ARG"
node_init

if [ "$ACTION" = down ]; then
  pkill -f -- "--bpffs_root=$ROOT/bpf" 2>/dev/null || true
  teardown
  echo "demo removed"
  exit 0
fi
if [ -d "$ROOT" ]; then
  echo "a demo is already up; remove it with: $0 $BUILD_ARG down" >&2
  exit 1
fi
trap 'echo "demo failed; cleaning up" >&2; teardown' ERR

setup_node
# setsid: the agent outlives this script, as a DaemonSet pod outlives kubectl.
start_agent() {
  setsid ip netns exec "$NODE" "$AGENT" --pod_cidr=$POD_CIDR --native_device=eth0 \
    --bpffs_root="$ROOT/bpf" --state_dir="$ROOT/state" --socket="$ROOT/sluice.sock" \
    --cni_conf_dir="$ROOT/net.d" --cni_bin_dir="$ROOT/bin" --cni_plugin="$CNI" \
    >>"$ROOT/log/agent.log" 2>&1 </dev/null &
  wait_for 30 test -f "$ROOT/net.d/05-sluice.conflist" || fail "agent not ready: $(cat "$ROOT/log/agent.log")"
}
start_agent
echo "== node $NODE (10.99.0.2) runs sluice-agent; log: $ROOT/log/agent.log"

A=$(add_pod a); B=$(add_pod b); C=$(add_pod c)
echo "== pods created through sluice-cni: a=$A b=$B c=$C"
for p in b c; do setsid ip netns exec "$T-$p" /usr/bin/python3 "$NETEXEC" --port 8080 --name "pod-$p" </dev/null >/dev/null 2>&1 & done
setsid ip netns exec "$INET" /usr/bin/python3 "$NETEXEC" --port 80 --name internet </dev/null >/dev/null 2>&1 &
wait_for 10 ip netns exec "$T-b" sh -c "ss -ltn | grep -q ':8080 '"
wait_for 10 ip netns exec "$T-c" sh -c "ss -ltn | grep -q ':8080 '"
wait_for 10 ip netns exec "$INET" sh -c "ss -ltn | grep -q ':80 '"

show() { printf '  %-44s -> %s\n' "$1" "$2"; }
echo "== traffic (each server answers 'hostname' with its name, 'clientip' with who it sees)"
show "pod a -> pod b   tcp hostname" "$(tcp_request "$T-a" "$B" 8080 hostname)"
show "pod a -> pod c   udp hostname" "$(udp_request "$T-a" "$C" 8080 hostname)"
show "pod a -> pod b   tcp clientip" "$(tcp_request "$T-a" "$B" 8080)"
show "pod a -> internet 198.51.100.10 clientip" "$(tcp_request "$T-a" 198.51.100.10 80)"
show "node  -> pod c   tcp hostname" "$(tcp_request "$NODE" "$C" 8080 hostname)"

cat <<TXT

== look around
  ip netns exec $NODE $SLUICECTL status      # the node's agent tells sluicectl its paths
  ip netns exec $NODE $SLUICECTL endpoints   # pods the datapath delivers to
  ip netns exec $NODE $SLUICECTL nat         # masqueraded flows
  ip netns exec $NODE $SLUICECTL drops       # drops by reason
  bpftool map dump pinned $ROOT/bpf/sluice_ep4
  ip netns exec $NODE tc filter show dev \$(ip -n $NODE -o link | awk -F': ' '/slc/{print \$2; exit}' | cut -d@ -f1) ingress
  ip netns exec $T-a ping -c2 $C
  echo hostname | ip netns exec $T-a socat - TCP:$B:8080

== tear down
  $0 $BUILD_ARG down
TXT
trap - ERR
