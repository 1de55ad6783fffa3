# The one library of the end-to-end tests (tests/e2e/*_test.sh). Sourced with the script's
# arguments (BUILD_DIR); gives BUILD, SLUICECTL and HERE (this folder), log, fail, wait_for (with
# output_is, output_gt), expect, jget, K (kubectl on KUBECONFIG_PATH), node_ip, ip_of and
# pod_manifest. Then a script sets up one of two worlds:
#   - lab_init (with NAME set, the lab's name, unique per run): a sluice-lab, whole nodes with
#     their agents, driven through its apiserver. Gives LAB, DIR (the lab's directory), lab,
#     stop_restarted_agent, and an EXIT trap that takes the lab down, stops the agent a script
#     restarted itself (RESTARTED_AGENT) and removes $WORK.
#   - node_init: one hand-built node network namespace running the real sluice-agent, an
#     "internet" namespace behind it, and pods created through sluice-cni exactly as a container
#     runtime does (environment + stdin). Every address used lives in namespaces it creates;
#     teardown removes all of it.
set -euo pipefail

BUILD=${1:?usage: $0 BUILD_DIR}
BUILD=$(cd "$BUILD" && pwd)
SLUICECTL=$BUILD/agent/sluicectl
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
POLL_SECONDS=0.1  # wait_for's poll interval
LOG_TAIL=20       # lines of each log fail shows
KEEP_LOGS=        # a directory: fail also copies the logs there, to outlive the lab

log() { echo "[$(date +%T)] $*" >&2; }
# The logs fail shows, one path a line (lab_init: every node's agent's). A script may redefine it.
fail_logs() { :; }
fail() {
  echo "FAIL: $*" >&2
  local f
  for f in $(fail_logs); do
    if [ -n "$KEEP_LOGS" ]; then
      mkdir -p "$KEEP_LOGS"
      cp "$f" "$KEEP_LOGS/$(basename "$(dirname "$(dirname "$f")")")-$(basename "$f")"
      echo "--- $f (kept in $KEEP_LOGS)" >&2
    else
      echo "--- $f" >&2
    fi
    tail -"$LOG_TAIL" "$f" >&2
  done
  exit 1
}

# Conditions on a command's output for wait_for, read afresh at every poll (a "$(...)" among
# wait_for's arguments is expanded once, before the first poll, and would be polled unchanged):
# wait_for 30 output_is 2 backends_of node1 80; wait_for 20 output_gt 5 reconciles.
output_is() { local want=$1; shift; [ "$("$@")" = "$want" ]; }
output_gt() { local n=$1; shift; [ "$("$@")" -gt "$n" ]; }
wait_for() {  # wait_for SECONDS CMD...: polls CMD until it succeeds
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep "$POLL_SECONDS"
  done
}
expect() {  # expect WHAT GOT WANT
  [ "$2" = "$3" ] || fail "$1: got '$2', want '$3'"
  log "ok: $1 -> $2"
}

# jget EXPR: evaluates a Python expression over the JSON document `d` read from stdin.
jget() { /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))' "$1"; }

K() { kubectl --kubeconfig "$KUBECONFIG_PATH" "$@"; }
node_ip() { K get node "$1" -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}'; }
ip_of() { K get pod "$1" -o jsonpath='{.status.podIP}'; }

# yaml_flow_map K=V,...: a YAML flow mapping of quoted keys and values.
yaml_flow_map() {
  local kv items=() out=
  IFS=, read -r -a items <<<"$1"
  for kv in ${items[@]+"${items[@]}"}; do out+="${out:+, }\"${kv%%=*}\": \"${kv#*=}\""; done
  echo "{$out}"
}

# pod_manifest NAME [--namespace NS] [--labels K=V,...] [--annotations K=V,...] [--node NODE]
#              [--host-network] [--image IMAGE] [--ports PORT,...] [--container YAML]...
# Prints a Pod document (after a "---"): one container `c` running IMAGE (netexec: the lab's
# agnhost-netexec stand-in) with the ports given, PORT as [NAME=]NUMBER[/PROTOCOL] (no protocol:
# the API's default, TCP), then each --container, a YAML flow mapping, as written. No --node: the
# pod is not bound to a node.
pod_manifest() {
  local name=$1 ns= labels= annotations= node= host_network= image=netexec ports= containers=()
  shift
  while [ $# -gt 0 ]; do
    case $1 in
      --namespace) ns=$2 ;;
      --labels) labels=$2 ;;
      --annotations) annotations=$2 ;;
      --node) node=$2 ;;
      --host-network) host_network=1; shift; continue ;;
      --image) image=$2 ;;
      --ports) ports=$2 ;;
      --container) containers+=("$2") ;;
      *) fail "pod_manifest $name: unknown option '$1'" ;;
    esac
    [ $# -ge 2 ] || fail "pod_manifest $name: $1 needs a value"
    shift 2
  done
  # Names are quoted: kubectl reads YAML 1.1, where y, yes, on and the like are booleans.
  local metadata="name: \"$name\"" port_list= p number protocol items=()
  if [ -n "$ns" ]; then metadata+=", namespace: \"$ns\""; fi
  if [ -n "$labels" ]; then metadata+=", labels: $(yaml_flow_map "$labels")"; fi
  if [ -n "$annotations" ]; then metadata+=", annotations: $(yaml_flow_map "$annotations")"; fi
  IFS=, read -r -a items <<<"$ports"
  for p in ${items[@]+"${items[@]}"}; do
    number=${p#*=} protocol=
    case $number in */*) protocol=${number#*/} number=${number%/*} ;; esac
    port_list+="${port_list:+, }{"
    case $p in *=*) port_list+="name: ${p%%=*}, " ;; esac
    port_list+="containerPort: $number${protocol:+, protocol: $protocol}}"
  done
  printf -- '---\napiVersion: v1\nkind: Pod\nmetadata: {%s}\nspec:\n' "$metadata"
  if [ -n "$node" ]; then printf '  nodeName: "%s"\n' "$node"; fi
  if [ -n "$host_network" ]; then printf '  hostNetwork: true\n'; fi
  printf '  containers:\n  - {name: c, image: %s%s}\n' "$image" "${port_list:+, ports: [$port_list]}"
  for p in ${containers[@]+"${containers[@]}"}; do printf '  - %s\n' "$p"; done
}

# ---- The lab ---------------------------------------------------------------------------------

lab_init() {
  LAB=$BUILD/agent/lab/sluice-lab
  DIR=/run/sluice-lab/${NAME:?set NAME before lab_init}
  WORK=${WORK:-}
  RESTARTED_AGENT=
  # Every node's agent, and the agent a script restarted itself.
  fail_logs() {
    local f
    for f in "$DIR"/node*/log/agent.log ${WORK:+"$WORK/agent-restarted.log"}; do
      if [ -f "$f" ]; then echo "$f"; fi
    done
  }
  trap lab_cleanup EXIT
}

lab() { local cmd=$1; shift; "$LAB" "$cmd" --name "$NAME" "$@"; }

# Stops the agent a script started in place of a lab's (our child, or disowned).
stop_restarted_agent() {
  if [ -n "$RESTARTED_AGENT" ]; then
    kill -TERM "$RESTARTED_AGENT" 2>/dev/null || true
    wait_for 15 sh -c "! kill -0 $RESTARTED_AGENT" || kill -KILL "$RESTARTED_AGENT" 2>/dev/null || true
    wait "$RESTARTED_AGENT" 2>/dev/null || true
    RESTARTED_AGENT=
  fi
}
# Run first on exit; a script redefines it to stop what it started itself.
before_down() { :; }
lab_cleanup() {
  before_down
  # The lab's pods go first (their CNI DEL needs the agents), then an agent we started.
  "$LAB" down --name "$NAME" >/dev/null 2>&1 || true
  stop_restarted_agent
  if [ -n "$WORK" ]; then rm -rf "$WORK"; fi
}

# ---- The hand-built node ---------------------------------------------------------------------

node_init() {
  AGENT=$BUILD/agent/sluice-agent
  CNI=$BUILD/cni/sluice-cni
  T=${SLUICE_E2E_PREFIX:-se$$}  # prefix of every namespace and directory of this run
  ROOT=/run/sluice-e2e/$T
  NODE=$T-node
  INET=$T-inet
  NODE_IP=10.99.0.2
  INET_GW=10.99.0.1
  INTERNET_HOST=198.51.100.10
  POD_CIDR=${POD_CIDR:-10.244.0.0/24}
  GATEWAY=10.244.0.1
  AGENT_PID=
  NETEXEC=$HERE/netexec.py
  POLL_SECONDS=0.05  # its waits are on links, map entries and files: cheap to poll
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
