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
#   - 2000-byte UDP datagrams (fragmented at the pods' and the underlay's MTU) and 2000-byte TCP
#     answers through a ClusterIP from a pod (backend on the same and on another node), a
#     NodePort from a pod and a NodePort from outside (local backend, remote backend): echoed
#     whole, and no `fragment` drop counted;
#   - a pod that reached a backend through a ClusterIP from port P then connects to that
#     backend's own address from the same port P (TCP and UDP, 50 times each, from a pod on the
#     backend's node and from one on the other node): every answer comes from the backend.
# Every address used lives in namespaces the lab creates.
set -euo pipefail
NAME=${LAB_NAME:-svc$$}  # LAB_NAME: a name of the caller's (unique per run)
source "$(dirname "$0")/lib.sh"
lab_init
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
NODE1_IP=$(node_ip node1)
NODE2_IP=$(node_ip node2)

{
  pod_manifest host-1 --labels app=host --node node1 --host-network --ports 8081,8081/UDP
  pod_manifest client-1 --node node1 --ports 9090
  pod_manifest client-2 --node node2 --ports 9090
  pod_manifest web-2 --labels app=web --node node2 --ports 8080,8080/UDP
  cat <<'YAML'
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
metadata: {name: big}
spec:
  type: NodePort
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: 8080}
  - {name: echo, port: 53, targetPort: 8080, protocol: UDP}
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
} | K apply --validate=false -f - >/dev/null || fail "apply"
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

# 6. Datagrams larger than the MTU through every Service path: the first fragment is translated,
# the later ones follow it (sluice_frag4), both ways (the echo is as large). A TCP answer as large
# is segmented, never fragmented: it must get through the same paths too.
drops_of() {  # drops_of REASON NODE
  "$SLUICECTL" --bpffs_root="$DIR/$2/bpf" -o json drops |
    python3 -c 'import json,sys
d=json.load(sys.stdin)
rows=d if isinstance(d,list) else d.get("reasons",[])
print(sum(r.get("packets",0) for r in rows if r.get("reason")==sys.argv[1]))' "$1"
}
BIG_IP=$(K get service big -o jsonpath='{.spec.clusterIP}')
BIG_NP=$(K get service big -o jsonpath='{.spec.ports[0].nodePort}')
BIG_NP_UDP=$(K get service big -o jsonpath='{.spec.ports[1].nodePort}')
WEB2_IP=$(K get pod web-2 -o jsonpath='{.status.podIP}')
big_programmed() {
  for n in node1 node2; do
    "$SLUICECTL" --bpffs_root="$DIR/$n/bpf" services | grep -A1 "^$BIG_IP:53 " |
      grep -q "$WEB2_IP:8080" || return 1
  done
}
wait_for 30 big_programmed || fail "service big not programmed: $("$SLUICECTL" --bpffs_root="$DIR/node1/bpf" services)"
FRAG_BEFORE="$(drops_of fragment node1)/$(drops_of fragment node2)"
BIG=$(python3 -c 'print(("0123456789abcdefghijklmnopqrstuvwxyz" * 60)[:2000])')
echoed() {  # echoed FROM TO PROTO: "2000 bytes echoed", or what came back instead
  local got
  got=$(lab request --from "$1" --to "$2" --proto "$3" --data "$BIG" --timeout 3)
  if [ "$got" = "$BIG" ]; then echo "2000 bytes echoed"; else echo "${got:0:40} (${#got} bytes)"; fi
}
for proto in udp tcp; do
  if [ $proto = udp ]; then port=53 np=$BIG_NP_UDP; else port=80 np=$BIG_NP; fi
  expect "2000 bytes $proto: node2 pod -> ClusterIP, backend on its node" \
    "$(echoed client-2 "$BIG_IP:$port" $proto)" "2000 bytes echoed"
  expect "2000 bytes $proto: node1 pod -> ClusterIP, backend on node2" \
    "$(echoed client-1 "$BIG_IP:$port" $proto)" "2000 bytes echoed"
  expect "2000 bytes $proto: node1 pod -> node1 NodePort" \
    "$(echoed client-1 "$NODE1_IP:$np" $proto)" "2000 bytes echoed"
  expect "2000 bytes $proto: outside -> node2 NodePort, local backend" \
    "$(echoed external "$NODE2_IP:$np" $proto)" "2000 bytes echoed"
  expect "2000 bytes $proto: outside -> node1 NodePort, backend on node2 (masqueraded)" \
    "$(echoed external "$NODE1_IP:$np" $proto)" "2000 bytes echoed"
done
expect "fragment drops on node1/node2 during the large datagrams" \
  "$(drops_of fragment node1)/$(drops_of fragment node2)" "$FRAG_BEFORE"

# 7. The same client port through the ClusterIP, then straight to the backend it reached: the
# direct flow's answers must come from the backend, never be rewritten by the translated flow's
# leftover reply entry (which made ~14 % of such connections fail before).
cat >"$WORK/crossed.py" <<'PY'
import errno, socket, sys
vip, backend, base = sys.argv[1], sys.argv[2], int(sys.argv[3])
fails = []
def ask(kind, port, dst):
    s = socket.socket(socket.AF_INET, kind)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.settimeout(2)
    try:
        s.bind(("0.0.0.0", port))
        s.connect(dst)
        s.sendall(b"hostname\n")
        if kind != socket.SOCK_STREAM:
            return s.recv(100).decode().strip()
        # TCP: read to the server's FIN, so the connection is over on both ends before the
        # next one from this port. (The backend sees the translated flow and the direct one
        # with the same 4-tuple: a SYN racing the old connection's FIN meets a half-closed
        # socket there, as it would behind any NAT, and may wait for a retransmission.)
        s.shutdown(socket.SHUT_WR)
        got = b""
        while True:
            part = s.recv(100)
            if not part:
                return got.decode().strip()
            got += part
    except OSError as e:
        return "%s(%s)" % (type(e).__name__, errno.errorcode.get(e.errno, e.errno))
    finally:
        s.close()
for i in range(50):
    port = base + i
    for kind, svc_port in ((socket.SOCK_STREAM, 80), (socket.SOCK_DGRAM, 53)):
        name = "tcp" if kind == socket.SOCK_STREAM else "udp"
        via = ask(kind, port, (vip, svc_port))
        direct = ask(kind, port, (backend, 8080))
        if via != "web-2" or direct != "web-2":
            fails.append("%s sport %d: via service %s, direct %s" % (name, port, via, direct))
print("%d failed of 200%s" % (len(fails), (": " + "; ".join(fails[:3])) if fails else ""))
PY
# The client ports lie below the pods' ephemeral range (32768-60999): a port the kernel gave an
# earlier connection of the same pod cannot be bound (EADDRINUSE; seen once in CI with 41002).
expect "node2 pod: ClusterIP then its backend (same node) from the same port, 50 x tcp+udp" \
  "$(lab exec client-2 -- python3 "$WORK/crossed.py" "$BIG_IP" "$WEB2_IP" 21000)" "0 failed of 200"
expect "node1 pod: ClusterIP then its backend (other node) from the same port, 50 x tcp+udp" \
  "$(lab exec client-1 -- python3 "$WORK/crossed.py" "$BIG_IP" "$WEB2_IP" 22000)" "0 failed of 200"

[ "$FAILS" -eq 0 ] || fail "$FAILS expectations failed"
log "PASS"
