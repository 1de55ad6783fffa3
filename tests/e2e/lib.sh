# Shared set-up for Sluice's end-to-end tests: a node network namespace running the real
# sluice-agent, an "internet" namespace behind it, and pods created through sluice-cni exactly
# as a container runtime does (environment + stdin). Every address used lives in namespaces this
# file creates; teardown removes all of it.
set -euo pipefail

BUILD=${1:?usage: $0 BUILD_DIR}
BUILD=$(cd "$BUILD" && pwd)
AGENT=$BUILD/agent/sluice-agent
CNI=$BUILD/cni/sluice-cni
SLUICECTL=$BUILD/agent/sluicectl
T=${SLUICE_E2E_PREFIX:-se$$}          # prefix of every namespace and directory of this run
ROOT=/run/sluice-e2e/$T
NODE=$T-node
INET=$T-inet
NODE_IP=10.99.0.2
INET_GW=10.99.0.1
INTERNET_HOST=198.51.100.10
POD_CIDR=${POD_CIDR:-10.244.0.0/24}
GATEWAY=10.244.0.1
AGENT_PID=

log() { echo "[$(date +%T)] $*" >&2; }
fail() { echo "FAIL: $*" >&2; exit 1; }

# Polls `cmd` until it succeeds or `timeout` seconds pass.
wait_for() {
  local timeout=$1; shift
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.05
  done
}

# DEL sets a pod's host veth down at once (its route and neighbour entry go with it) and the
# agent deletes it right after answering (the kernel's unregister takes 10-30 ms).
link_absent() { ! ip -n "$1" link show "$2" >/dev/null 2>&1; }
# (Output captured first: with pipefail, grep -q leaving early fails the writer with SIGPIPE.)
link_not_up() { local l; l=$(ip -n "$1" -o link show "$2" 2>/dev/null); ! grep -q '[<,]UP[,>]' <<<"$l"; }
no_sluice_links() { local l; l=$(ip -n "$1" -o link show); ! grep -q ' slc' <<<"$l"; }
# No pod veth of a DEL is still waiting for its deletion (those are the down ones).
no_sluice_links_down() {
  local l; l=$(ip -n "$1" -o link show)
  ! awk '/ slc/ && !/[<,]UP[,>]/ {found = 1} END {exit !found}' <<<"$l"
}

teardown() {
  set +e
  stop_agent
  for ns in $(ip netns list | awk '{print $1}' | grep "^$T-"); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9
    ip netns del "$ns"
  done
  umount "$ROOT/bpf" 2>/dev/null
  rm -rf "$ROOT"
}

setup_node() {
  mkdir -p "$ROOT"/{bpf,state,net.d,bin,log}
  # The runtime's reference loopback plugin, as on a node: the agent waits for it.
  for lo in /opt/cni/bin/loopback /usr/lib/cni/loopback; do
    [ -x "$lo" ] && { ln -sf "$lo" "$ROOT/bin/loopback"; break; }
  done
  # bpffs mounted here, outside the agent's `ip netns exec` mount namespace, so pins survive
  # an agent restart exactly as /sys/fs/bpf does on a real node.
  mount -t bpf bpffs "$ROOT/bpf"
  ip netns add "$NODE"
  ip netns add "$INET"
  ip -n "$NODE" link set lo up
  ip -n "$INET" link set lo up
  ip link add "$T-up" netns "$NODE" type veth peer name eth0 netns "$INET"
  ip -n "$NODE" link set "$T-up" name eth0
  ip -n "$NODE" addr add $NODE_IP/24 dev eth0
  ip -n "$INET" addr add $INET_GW/24 dev eth0
  ip -n "$INET" addr add $INTERNET_HOST/32 dev lo
  ip -n "$NODE" link set eth0 up
  ip -n "$INET" link set eth0 up
  ip -n "$NODE" route add default via $INET_GW
  # The internet knows only the node's address: an unmasqueraded pod reply has no way back.
}

# launch_agent: starts the agent in the node namespace (AGENT_PID) without waiting for it.
launch_agent() {
  ip netns exec "$NODE" "$AGENT" --pod_cidr=$POD_CIDR --native_device=eth0 \
    --bpffs_root="$ROOT/bpf" --state_dir="$ROOT/state" --socket="$ROOT/sluice.sock" \
    --cni_conf_dir="$ROOT/net.d" --cni_bin_dir="$ROOT/bin" --cni_plugin="$CNI" ${AGENT_ARGS:-} \
    >>"$ROOT/log/agent.log" 2>&1 &
  AGENT_PID=$!
}

# start_agent: launch_agent, then wait until it has installed its conflist and answers STATUS.
# After a restart the conflist is there already, so the wait for STATUS covers the whole start
# (loading the programs alone took 11 s on a loaded 2-core machine) and gets the same budget.
start_agent() {
  launch_agent
  wait_for 30 test -f "$ROOT/net.d/05-sluice.conflist" || { cat "$ROOT/log/agent.log"; fail "agent not ready"; }
  wait_for 30 cni_status || fail "agent does not answer STATUS"
}

stop_agent() {
  if [ -n "$AGENT_PID" ]; then
    kill -TERM "$AGENT_PID" 2>/dev/null && wait "$AGENT_PID" 2>/dev/null
    AGENT_PID=
  fi
}

netconf() {
  printf '{"cniVersion":"%s","name":"sluice","type":"sluice","socketPath":"%s"%s}' \
    "${CNI_VERSION:-1.1.0}" "$ROOT/sluice.sock" "${1:-}"
}

# cni COMMAND CONTAINERID NETNS IFNAME [EXTRA_CONF_FIELDS] - the runtime's way of calling.
cni() {
  local cmd=$1 id=$2 netns=$3 ifname=${4:-eth0} extra=${5:-}
  netconf "$extra" | env -i CNI_COMMAND="$cmd" CNI_CONTAINERID="$id" CNI_NETNS="$netns" \
    CNI_IFNAME="$ifname" CNI_PATH="$ROOT/bin" \
    CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=$id" "$CNI"
}
cni_status() { netconf | env -i CNI_COMMAND=STATUS CNI_PATH="$ROOT/bin" "$CNI"; }

# add_pod NAME: a pod namespace plus CNI ADD; prints the pod's address.
add_pod() {
  local name=$1
  ip netns add "$T-$name"
  ip -n "$T-$name" link set lo up
  local out
  out=$(cni ADD "$name" "/var/run/netns/$T-$name") || fail "ADD $name: $out"
  echo "$out" | sed -n 's/.*"address": *"\([0-9.]*\)\/32".*/\1/p' | head -1
}
del_pod() { cni DEL "$1" "/var/run/netns/$T-$1" >/dev/null; }

in_ns() { local ns=$1; shift; ip netns exec "$T-$ns" "$@"; }

NETEXEC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/netexec.py

# A TCP and a UDP server in namespace NS (agnhost-netexec style: "hostname", "clientip", echo).
serve_clientip() {
  local ns=$1 port=$2
  ip netns exec "$ns" /usr/bin/python3 "$NETEXEC" --port "$port" --name "$ns" &
  wait_for 10 ip netns exec "$ns" sh -c "ss -ltn | grep -q ':$port '"
  wait_for 10 ip netns exec "$ns" sh -c "ss -lun | grep -q ':$port '"
}
# tcp_request NS HOST PORT [DATA]: sends DATA (default clientip), prints the reply.
tcp_request() { echo "${4:-clientip}" | ip netns exec "$1" socat -T3 - "TCP:$2:$3,connect-timeout=3"; }
udp_request() { echo "${4:-clientip}" | ip netns exec "$1" socat -T2 - "UDP:$2:$3"; }

# jget EXPR: evaluates a Python expression over the JSON document `d` read from stdin.
jget() { /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))' "$1"; }

# endpoint_field CONTAINERID FIELD: a field of the agent's endpoint record.
endpoint_field() {
  /usr/bin/python3 - "$ROOT/state/endpoints" "$1" "$2" <<'PY'
import json, os, sys
d, cid, field = sys.argv[1:]
for f in os.listdir(d):
    if f.endswith(".json"):
        ep = json.load(open(os.path.join(d, f)))
        if ep.get("containerID") == cid:
            print(ep[field])
PY
}

ctl() { "$SLUICECTL" --bpffs_root="$ROOT/bpf" "$@"; }
drops() { ctl drops | awk -v r="$1" '$2 == r {print $3}'; }

map_has_ip() {  # map_has_ip IP: is IP a key of sluice_ep4?
  local hex
  hex=$(printf '0x%02x 0x%02x 0x%02x 0x%02x' $(echo "$1" | tr . ' '))
  bpftool map lookup pinned "$ROOT/bpf/sluice_ep4" key $hex >/dev/null 2>&1
}
map_count() {
  bpftool -j map dump pinned "$ROOT/bpf/$1" | /usr/bin/python3 -c 'import json,sys; print(len(json.load(sys.stdin)))'
}
