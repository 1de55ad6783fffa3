#!/usr/bin/env bash
# The Helm chart installed into the lab as into a cluster (issue 12): `up --no-agents` brings two
# nodes without agents and without pod CIDRs, NotReady; the chart, rendered with Helm's engine
# (tests/helm/render) for cluster-pool IPAM and kube-proxy replacement, goes in with kubectl;
# the lab runs the DaemonSet's and the operator's pods as processes of the built binaries
# (agent/lab/workloads/). Then: Nodes Ready only once the agent's conflist exists, pod CIDRs
# from the operator's pool, pods reaching each other and a ClusterIP Service; a re-render with a
# changed ConfigMap rolls the agents node by node under continuous traffic with zero failures;
# `kubectl delete` runs the preStop uninstall (no conflist, no plugin binary), and
# `sluice-agent --uninstall --uninstall_datapath` leaves no pin and no attached program (tc, XDP,
# socket LB's cgroup links).
set -euo pipefail
NAME=${SLUICE_LAB_TEST_NAME:-hi$$}
WORK=$(mktemp -d)
source "$(dirname "$0")/lib.sh"
lab_init
SRC=$(cd "$HERE/../.." && pwd)
fail_logs() {
  local f
  for f in "$DIR/controlplane.log" "$DIR"/node*/log/sluice-*.log; do
    if [ -f "$f" ]; then echo "$f"; fi
  done
}
LOG_TAIL=25
RENDER=$BUILD/tests/helm/sluice-helm-render
[ -x "$RENDER" ] || fail "$RENDER missing (ctest -R helm_render_build builds it)"
before_down() { touch "$WORK/load.json.stop"; }

KUBECONFIG_PATH=$("$LAB" up --nodes 2 --name "$NAME" --no-agents) || fail "up --no-agents"
log "lab $NAME up without agents"
ready_of() { K get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}'; }
expect "node1 Ready before the install" "$(ready_of node1)" False
expect "node2 pod CIDR before the install" "$(K get node node2 -o jsonpath='{.spec.podCIDR}')" ""

API=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["apiserverUnderlay"])' \
  "$DIR/status.json")
API_HOST=${API#https://}; API_HOST=${API_HOST%:*}
render() {  # render EXTRA_SET...: the chart with the lab's values
  "$RENDER" -chart "$SRC/helm/sluice" -name sluice -namespace kube-system \
    -set kubeProxyReplacement=true -set "k8sServiceHost=$API_HOST" -set k8sServicePort=6443 \
    -set ipam.mode=cluster-pool -set 'ipam.operator.clusterPoolIPv4PodCIDRList={10.11.0.0/16}' \
    -set serviceCIDR=10.96.0.0/16 -set updateStrategy.rollingUpdate.maxUnavailable=1 "$@"
}
render > "$WORK/v1.yaml" || fail "render"
K apply --validate=false -f "$WORK/v1.yaml" >/dev/null || fail "kubectl apply: $(K apply --validate=false -f "$WORK/v1.yaml" 2>&1)"
log "chart applied ($(grep -c '^kind:' "$WORK/v1.yaml") objects)"

# The operator's pod CIDRs, then the agents' conflists, then Ready; never Ready without one.
agents_ready() {
  [ "$(K -n kube-system get pods -l app.kubernetes.io/component=agent \
        -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{" "}{end}')" \
    = "True True " ]
}
NOT_READY_SEEN=0
while ! { [ "$(ready_of node1)" = True ] && [ "$(ready_of node2)" = True ]; }; do
  for n in node1 node2; do
    if [ "$(ready_of $n)" = True ]; then
      [ -f "$DIR/$n/net.d/05-sluice.conflist" ] || fail "$n Ready without a conflist"
    else
      NOT_READY_SEEN=1
    fi
  done
  [ $SECONDS -lt 60 ] || fail "nodes not Ready: $(K get nodes; K -n kube-system get pods -o wide)"
  sleep 0.1
done
expect "a node seen NotReady while the chart's agents started" "$NOT_READY_SEEN" 1
wait_for 30 agents_ready || fail "agent pods not Ready: $(K -n kube-system get pods -o wide)"
for n in node1 node2; do
  [ -f "$DIR/$n/net.d/05-sluice.conflist" ] || fail "$n: no conflist"
  [ -x "$DIR/$n/bin/sluice" ] || fail "$n: no plugin binary (install-cni-binaries)"
  cidr=$(K get node $n -o jsonpath='{.spec.podCIDR}')
  [[ $cidr == 10.11.*.0/24 ]] || fail "$n podCIDR '$cidr' not from the cluster pool 10.11.0.0/16"
  log "ok: $n Ready, pod CIDR $cidr (sluice-operator)"
done
# With the chart's capabilities (NET_BROADCAST among them) the agent hears the pods' link changes
# (a MAC set by a chained tuning is followed at once: docs/operating.md).
for n in node1 node2; do
  grep -qs "hearing link changes in the pods' network namespaces" "$DIR/$n"/log/*.log ||
    fail "$n: the agent does not hear pod link changes: $(grep -hs "will not be heard" "$DIR/$n"/log/*.log)"
done
log "ok: both agents hear the pods' link changes (NET_BROADCAST)"
grep -q "node1 .*10.11.0.0/24 .*DaemonSet pod" <<<"$(lab status)" || fail "status: $(lab status)"
HOLDER=$(K -n kube-system get lease sluice-operator -o jsonpath='{.spec.holderIdentity}')
[[ $HOLDER == sluice-operator-* ]] || fail "Lease holder '$HOLDER'"
log "ok: operator Lease held by $HOLDER"

# Workloads: addresses from the pool, pod to pod across nodes, pod to a ClusterIP Service.
K apply --validate=false -f "$SRC/examples/pods.yaml" -f "$SRC/examples/service.yaml" >/dev/null ||
  fail "apply examples"
K wait --for=condition=Ready pod --all --timeout=30s >/dev/null || fail "pods: $(K get pods -o wide)"
WEB1=$(K get pod web-1 -o jsonpath='{.status.podIP}')
WEB2=$(K get pod web-2 -o jsonpath='{.status.podIP}')
[[ $WEB1 == 10.11.* && $WEB2 == 10.11.* ]] || fail "pod IPs $WEB1 $WEB2 not from 10.11.0.0/16"
SVC=$(K get service web -o jsonpath='{.spec.clusterIP}')
expect "client -> web-2 (other node)" "$(lab probe --from default/client --to "$WEB2:8080")" CONNECTED
expect "client -> ClusterIP web" "$(lab probe --from default/client --to "$SVC:80")" CONNECTED
expect "node2 -> web-1" "$(lab request --from node/node2 --to "$WEB1:8080" --data hostname)" web-1

# A changed ConfigMap (log level) rolls the agents, one node at a time, under load.
lab exec client -- python3 "$HERE/fault_load.py" "$WORK/load.json" \
  "svc-tcp=tcp:$SVC:80" "pod-tcp=tcp:$WEB2:8080" "svc-udp=udp:$SVC:53" >>"$WORK/load.log" 2>&1 &
wait_for 20 test -f "$WORK/load.json.started" || fail "load got no answers: $(cat "$WORK/load.log")"
OLD=$(K -n kube-system get pods -l app.kubernetes.io/component=agent -o name | sort | tr '\n' ' ')
render -set debug.enabled=true -set cni.uninstall=true > "$WORK/v2.yaml" || fail "render v2"
K apply --validate=false -f "$WORK/v2.yaml" >/dev/null || fail "apply v2"
# Rolled: every agent pod is a new one and Ready. Meanwhile maxUnavailable=1 keeps at least one
# agent Ready at every poll.
MIN_READY=2
rolled() {
  local now p n
  n=$(K -n kube-system get pods -l app.kubernetes.io/component=agent \
        -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{" "}{end}' |
      grep -o True | wc -l)
  if [ "$n" -lt "$MIN_READY" ]; then MIN_READY=$n; fi
  now=$(K -n kube-system get pods -l app.kubernetes.io/component=agent -o name | sort | tr '\n' ' ')
  for p in $OLD; do if grep -qF "$p " <<<"$now"; then return 1; fi; done
  agents_ready
}
deadline=$((SECONDS + 60))
until rolled; do
  [ $SECONDS -lt $deadline ] || fail "agents not rolled: $(K -n kube-system get pods -o wide)"
  sleep 0.1
done
expect "fewest Ready agents during the roll (maxUnavailable=1 of 2)" "$MIN_READY" 1
touch "$WORK/load.json.stop"
wait_for 20 test -s "$WORK/load.json" || fail "load did not stop: $(cat "$WORK/load.log")"
python3 - "$WORK/load.json" <<'PY' || fail "traffic during the roll: $(cat "$WORK/load.json")"
import json, sys
r = json.load(open(sys.argv[1]))
for name, s in r.items():
    print(f"{name}: {s['total']} requests, {s['failures']} failed", file=sys.stderr)
    assert s["total"] > 20 and s["failures"] == 0, name
PY
DEBUG_FILE=$(cat "$DIR"/node1/pods/kube-system_sluice-*/volumes/config/log_level 2>/dev/null | head -1)
expect "rolled agent reads the new ConfigMap" "$DEBUG_FILE" debug
log "ok: agents rolled, zero failed connections"

# Uninstall: kubectl delete; preStop (cni.uninstall=true) removes the conflist and the binary.
K delete -f "$SRC/examples/pods.yaml" -f "$SRC/examples/service.yaml" --grace-period=1 --wait=false >/dev/null
wait_for 30 output_is "" K get pods -o name || fail "example pods not gone"
K delete -f "$WORK/v2.yaml" --wait=false >/dev/null || fail "kubectl delete"
wait_for 40 output_is "" K -n kube-system get pods -o name ||
  fail "chart pods not gone: $(K -n kube-system get pods)"
for n in node1 node2; do
  [ ! -e "$DIR/$n/net.d/05-sluice.conflist" ] || fail "$n: conflist left behind"
  [ ! -e "$DIR/$n/bin/sluice" ] || fail "$n: plugin binary left behind"
done
expect "node1 Ready after uninstall" "$(ready_of node1)" False
log "ok: uninstall left no conflist or plugin binary; nodes NotReady"
# The datapath stays after the pod's uninstall (pins, attached programs: a new install takes
# them over hitlessly). Removing it is `sluice-agent --uninstall --uninstall_datapath` on the node.
sluice_tc() {  # sluice_tc NETNS: Sluice's tc programs on every link of the namespace
  ip netns exec "$1" sh -c 'for d in $(ls /sys/class/net); do
      tc filter show dev $d ingress; tc filter show dev $d egress; done 2>/dev/null' |
    grep -c sluice || true
}
# Socket LB's cgroup links (on the machine's cgroup2 root, which every lab shares): this node's
# are told apart by the link ids its pins hold.
no_bpf_object() { ! bpftool "$1" show id "$2" >/dev/null 2>&1; }
sock_links() {  # sock_links NODE: "link_id:prog_id" of each pinned socket-LB link
  local p
  for p in "$DIR/$1/bpf/sluice/links"/sluice_sock_*; do
    [ -e "$p" ] || continue
    bpftool -j link show pinned "$p" |
      python3 -c 'import json,sys; l=json.load(sys.stdin); print("%d:%d" % (l["id"], l["prog_id"]))'
  done
}
for n in node1 node2; do
  NETNS=$NAME-$n
  [ -n "$(ls "$DIR/$n/bpf/sluice" 2>/dev/null)" ] || fail "$n: datapath pins gone before --uninstall_datapath"
  SOCK_LINKS=$(sock_links $n)
  expect "$n: socket-LB cgroup links before --uninstall_datapath" "$(wc -w <<<"$SOCK_LINKS")" 4
  [ "$(sluice_tc "$NETNS")" -gt 0 ] || fail "$n: no Sluice tc program even before --uninstall_datapath"
  ip netns exec "$NETNS" "$BUILD/agent/sluice-agent" --uninstall --uninstall_datapath \
    --bpffs_root="$DIR/$n/bpf/sluice" --cni_conf_dir="$DIR/$n/net.d" --cni_bin_dir="$DIR/$n/bin" \
    --state_dir="$DIR/$n/state" >>"$WORK/uninstall.log" 2>&1 ||
    fail "$n: --uninstall_datapath: $(tail -5 "$WORK/uninstall.log")"
  left=$(find "$DIR/$n/bpf/sluice" -mindepth 1 2>/dev/null | head -3)
  [ -z "$left" ] || fail "$n: pinned objects left: $left"
  expect "$n: tc programs of Sluice left" "$(sluice_tc "$NETNS")" 0
  xdp=$(ip netns exec "$NETNS" ip -d link show | grep -c "prog/xdp" || true)
  expect "$n: XDP programs left" "$xdp" 0
  # The link gone detaches its program from the cgroup; with no agent left the program itself is
  # freed (the kernel frees it after an RCU grace period).
  for pair in $SOCK_LINKS; do
    wait_for 5 no_bpf_object link "${pair%%:*}" || fail "$n: socket-LB link ${pair%%:*} left"
    wait_for 5 no_bpf_object prog "${pair##*:}" ||
      fail "$n: socket-LB program ${pair##*:} still loaded: $(bpftool prog show id "${pair##*:}")"
  done
done
log "PASS"
