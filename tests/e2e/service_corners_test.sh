#!/usr/bin/env bash
# Service corners end to end in a 2-node lab (issue 9), as users meet them:
#   - a hostNetwork pod runs in its node's namespace, reports the node's address as its podIP,
#     and a Service selecting it has the node's address as its endpoint;
#   - that Service (backend: node1's own address) is reached over TCP and UDP from a pod on
#     node1, from a pod on node2, from outside through node1's and node2's NodePort, and from
#     node1 itself through the ClusterIP;
#   - a node process reaches its own nodeIP:nodePort (TCP and UDP);
#   - externalTrafficPolicy: Local, reached from inside the cluster (a pod, a node process) on a
#     node without a local endpoint, goes to the endpoints elsewhere, as kube-proxy does;
#   - a pod's ping to its gateway address is answered, other traffic to the gateway is dropped
#     and counted (to_gateway), and nothing to the gateway leaves over the underlay.
# Every address used lives in namespaces the lab creates.
set -euo pipefail
NAME=svc$$
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/lablib.sh"
WORK=$(mktemp -d)
CAPTURE=
before_down() { if [ -n "$CAPTURE" ]; then kill -TERM "$CAPTURE" 2>/dev/null || true; fi; }

# KEEP_GOING=1: a failed expectation is reported and the script goes on (to see every corner
# that fails, e.g. on an older datapath); it still fails at the end.
FAILS=0
if [ -n "${KEEP_GOING:-}" ]; then
  expect() {
    if [ "$2" = "$3" ]; then log "ok: $1 -> $2"; else
      log "FAIL (going on): $1: got '$2', want '$3'"; FAILS=$((FAILS + 1)); fi
  }
fi

KUBECONFIG_PATH=$("$LAB" up --nodes 2 --name "$NAME") || fail "up"
node_ip() { K get node "$1" -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}'; }
NODE1_IP=$(node_ip node1)
NODE2_IP=$(node_ip node2)

K apply --validate=false -f - <<'YAML' >/dev/null || fail "apply"
apiVersion: v1
kind: Pod
metadata: {name: host-1, labels: {app: host}}
spec:
  nodeName: node1
  hostNetwork: true
  containers:
  - {name: c, image: netexec, ports: [{containerPort: 8081}, {containerPort: 8081, protocol: UDP}]}
---
apiVersion: v1
kind: Pod
metadata: {name: client-1}
spec:
  nodeName: node1
  containers:
  - {name: c, image: netexec, ports: [{containerPort: 9090}]}
---
apiVersion: v1
kind: Pod
metadata: {name: client-2}
spec:
  nodeName: node2
  containers:
  - {name: c, image: netexec, ports: [{containerPort: 9090}]}
---
apiVersion: v1
kind: Pod
metadata: {name: web-2, labels: {app: web}}
spec:
  nodeName: node2
  containers:
  - {name: c, image: netexec, ports: [{containerPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: host}
spec:
  type: NodePort
  selector: {app: host}
  ports:
  - {name: http, port: 80, targetPort: 8081}
  - {name: dns, port: 53, targetPort: 8081, protocol: UDP}
---
apiVersion: v1
kind: Service
metadata: {name: web-local}
spec:
  type: NodePort
  externalTrafficPolicy: Local
  selector: {app: web}
  ports:
  - {port: 80, targetPort: 8080}
YAML
K wait --for=condition=Ready pod/host-1 pod/client-1 pod/client-2 pod/web-2 --timeout=60s \
  >/dev/null || fail "pods not Ready"

# 1. The hostNetwork pod: the node's address, no namespace or interface of its own.
expect "hostNetwork pod's podIP" "$(K get pod host-1 -o jsonpath='{.status.podIP}')" "$NODE1_IP"
expect "hostNetwork pod's hostIP" "$(K get pod host-1 -o jsonpath='{.status.hostIP}')" "$NODE1_IP"
[ ! -e "/var/run/netns/$NAME-default-host-1" ] && ! ls /var/run/netns | grep -q -- "-host-1$" ||
  fail "a network namespace was made for the hostNetwork pod"
expect "hostNetwork pod answers in node1's namespace" \
  "$(lab request --from node/node1 --to "$NODE1_IP:8081" --data hostname)" host-1
expect "lab request --from a hostNetwork pod runs in its node" \
  "$(lab request --from default/host-1 --to "$NODE1_IP:8081" --data hostname)" host-1
endpoints() {
  K get endpointslices -l kubernetes.io/service-name=host -o jsonpath='{.items[*].endpoints[*].addresses[*]}'
}
wait_for 20 sh -c "[ \"\$(kubectl --kubeconfig $KUBECONFIG_PATH get endpointslices -l kubernetes.io/service-name=host -o jsonpath='{.items[*].endpoints[*].addresses[*]}')\" = $NODE1_IP ]" ||
  fail "Service host's endpoints: '$(endpoints)', want $NODE1_IP"
log "ok: Service host's endpoint is node1's address"

HOST=$(K get service host -o jsonpath='{.spec.clusterIP}')
HOST_NP=$(K get service host -o jsonpath='{.spec.ports[0].nodePort}')
HOST_NP_UDP=$(K get service host -o jsonpath='{.spec.ports[1].nodePort}')
LOCAL_NP=$(K get service web-local -o jsonpath='{.spec.ports[0].nodePort}')
log "host=$HOST nodePorts tcp $HOST_NP udp $HOST_NP_UDP; web-local nodePort $LOCAL_NP"
programmed() {
  for n in node1 node2; do
    "$SLUICECTL" --bpffs_root="$DIR/$n/bpf" services | grep -q "^$HOST:53 " || return 1
    "$SLUICECTL" --bpffs_root="$DIR/$n/bpf" services | grep -A1 "^$HOST:80 " |
      grep -q "$NODE1_IP:8081" || return 1
  done
}
wait_for 30 programmed || fail "services not programmed: $("$SLUICECTL" --bpffs_root="$DIR/node1/bpf" services)"

answer() {  # answer FROM TO [PROTO]: the hostname that answers, or REFUSED / TIMEOUT
  lab request --from "$1" --to "$2" --proto "${3:-tcp}" --data hostname --timeout 2
}
# 2. A Service whose endpoint is node1's own address.
expect "node1 pod -> ClusterIP, hostNetwork backend, tcp" "$(answer client-1 "$HOST:80")" host-1
expect "node1 pod -> ClusterIP, hostNetwork backend, udp" "$(answer client-1 "$HOST:53" udp)" host-1
expect "node2 pod -> ClusterIP, hostNetwork backend on node1, tcp" "$(answer client-2 "$HOST:80")" host-1
expect "node2 pod -> ClusterIP, hostNetwork backend on node1, udp" \
  "$(answer client-2 "$HOST:53" udp)" host-1
expect "outside -> node1 NodePort, its own hostNetwork backend, tcp" \
  "$(answer external "$NODE1_IP:$HOST_NP")" host-1
expect "outside -> node1 NodePort, its own hostNetwork backend, udp" \
  "$(answer external "$NODE1_IP:$HOST_NP_UDP" udp)" host-1
expect "outside -> node2 NodePort, hostNetwork backend on node1" \
  "$(answer external "$NODE2_IP:$HOST_NP")" host-1
expect "node1 process -> ClusterIP, its own hostNetwork backend" \
  "$(answer node/node1 "$HOST:80")" host-1

# 3. A node process to its own nodeIP:nodePort, and to the other node's.
expect "node1 process -> own NodePort, tcp" "$(answer node/node1 "$NODE1_IP:$HOST_NP")" host-1
expect "node1 process -> own NodePort, udp" "$(answer node/node1 "$NODE1_IP:$HOST_NP_UDP" udp)" host-1
expect "node2 process -> own NodePort, tcp" "$(answer node/node2 "$NODE2_IP:$HOST_NP")" host-1
expect "node2 process -> own NodePort, udp" "$(answer node/node2 "$NODE2_IP:$HOST_NP_UDP" udp)" host-1
expect "node2 process -> node1's NodePort" "$(answer node/node2 "$NODE1_IP:$HOST_NP")" host-1

# 4. externalTrafficPolicy: Local from inside the cluster, on node1 (no local endpoint): to the
# endpoint on node2, as kube-proxy sends in-cluster traffic; from outside node1 still drops.
expect "node1 pod -> node1 NodePort, ETP Local, endpoint on node2" \
  "$(answer client-1 "$NODE1_IP:$LOCAL_NP")" web-2
expect "node1 process -> own NodePort, ETP Local, endpoint on node2" \
  "$(answer node/node1 "$NODE1_IP:$LOCAL_NP")" web-2
expect "outside -> node1 NodePort, ETP Local, no local endpoint" \
  "$(lab probe --from external --to "$NODE1_IP:$LOCAL_NP" --timeout 2)" TIMEOUT
expect "outside -> node2 NodePort, ETP Local" "$(answer external "$NODE2_IP:$LOCAL_NP")" web-2

# 5. The gateway address: ping answered, other traffic dropped and counted, nothing upstream.
GW=$(lab exec client-1 -- ip -4 route show default | awk '{print $3; exit}')
[ -n "$GW" ] || fail "client-1 has no default gateway"
to_gateway_drops() {
  "$SLUICECTL" --bpffs_root="$DIR/node1/bpf" -o json drops |
    python3 -c 'import json,sys
d=json.load(sys.stdin)
rows=d if isinstance(d,list) else d.get("reasons",[])
print(sum(r.get("packets",0) for r in rows if r.get("reason")=="to_gateway"))'
}
DROPS_BEFORE=$(to_gateway_drops)
ip netns exec "$NAME-underlay" python3 "$HERE/underlay_capture.py" --pods "$GW/32" \
  --ready "$WORK/capture.ready" >"$WORK/capture.json" 2>"$WORK/capture.err" &
CAPTURE=$!
wait_for 10 test -e "$WORK/capture.ready" || fail "capture did not start: $(cat "$WORK/capture.err")"
got=$(lab exec client-1 -- ping -n -c 3 -i 0.2 -W 2 "$GW" 2>&1 || true)
expect "ping to the gateway $GW" "$(grep -o '3 received' <<<"$got" || echo "$got" | tail -2)" \
  "3 received"
expect "udp to the gateway" "$(lab probe --from default/client-1 --to "$GW:53" --proto udp --timeout 1)" TIMEOUT
expect "tcp to the gateway" "$(lab probe --from default/client-1 --to "$GW:80" --timeout 1)" TIMEOUT
counted() { [ "$(to_gateway_drops)" -ge $((DROPS_BEFORE + 2)) ]; }
expect "udp and tcp to the gateway counted as to_gateway" \
  "$(wait_for 5 counted && echo counted || echo "$(to_gateway_drops) (before: $DROPS_BEFORE)")" counted
kill -TERM "$CAPTURE"
wait "$CAPTURE" || true
CAPTURE=
read -r PODADDR INNER < <(python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); print(c["pod_addressed"], c["vxlan_inner"])' "$WORK/capture.json") ||
  fail "capture: $(cat "$WORK/capture.json" "$WORK/capture.err")"
expect "frames to or from the gateway on the underlay (plain/in VXLAN)" "$PODADDR/$INNER" "0/0"
[ "$FAILS" -eq 0 ] || fail "$FAILS expectations failed"
log "PASS"
