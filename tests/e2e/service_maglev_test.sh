#!/usr/bin/env bash
# Maglev end to end in a 2-node lab with the real agents: the same client flow (address and
# source port) sent from the external namespace to the NodePort of node1 and of node2 lands on
# the same backend pod when the Service is annotated for Maglev (Cilium's annotation), because
# both nodes compute the same table; a Service left random does not (20 flows, 2 backends: all
# 20 agreeing by chance is a 1 in 10^6 event). Every address used lives in namespaces the lab
# creates.
set -euo pipefail
NAME=mg$$
source "$(dirname "$0")/lib.sh"
lab_init

KUBECONFIG_PATH=$("$LAB" up --nodes 2 --name "$NAME") || fail "up"
NODE1_IP=$(node_ip node1)
NODE2_IP=$(node_ip node2)

{
  pod_manifest web-1 --labels app=web --node node1 --ports 8080
  pod_manifest web-2 --labels app=web --node node2 --ports 8080
  cat <<'YAML'
---
apiVersion: v1
kind: Service
metadata:
  name: mag
  annotations: {service.cilium.io/lb-algorithm: maglev}
spec:
  type: NodePort
  selector: {app: web}
  ports:
  - {port: 80, targetPort: 8080}
---
apiVersion: v1
kind: Service
metadata: {name: rnd}
spec:
  type: NodePort
  selector: {app: web}
  ports:
  - {port: 80, targetPort: 8080}
YAML
} | K apply --validate=false -f - >/dev/null || fail "apply"
K wait --for=condition=Ready pod/web-1 pod/web-2 --timeout=60s >/dev/null || fail "pods not Ready"
MAG_PORT=$(K get service mag -o jsonpath='{.spec.ports[0].nodePort}')
RND_PORT=$(K get service rnd -o jsonpath='{.spec.ports[0].nodePort}')
log "mag nodePort=$MAG_PORT (maglev), rnd nodePort=$RND_PORT (random)"

# The pod answering a TCP connection from the external namespace's source port $3 to $1:$2.
answer() {
  ip netns exec "$NAME-external" python3 - "$1" "$2" "$3" <<'PY'
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.settimeout(3)
s.bind(("", int(sys.argv[3])))
s.connect((sys.argv[1], int(sys.argv[2])))
s.sendall(b"hostname\n")
print(s.makefile().readline().strip())
PY
}
serves() {
  [ -n "$(answer "$NODE1_IP" "$1" 20999 2>/dev/null)" ] &&
    [ -n "$(answer "$NODE2_IP" "$1" 20998 2>/dev/null)" ]
}
wait_for 30 serves "$MAG_PORT" || fail "mag NodePort never served on both nodes"
wait_for 30 serves "$RND_PORT" || fail "rnd NodePort never served on both nodes"

agree() {  # agree NODEPORT: how many of 20 client ports get the same pod through both nodes
  local same=0 a b seen=""
  for sport in $(seq 21000 21019); do
    a=$(answer "$NODE1_IP" "$1" "$sport") || fail "node1:$1 from port $sport"
    b=$(answer "$NODE2_IP" "$1" "$sport") || fail "node2:$1 from port $sport"
    case "$a $b" in web-[12]\ web-[12]) ;; *) fail "answers '$a' '$b'";; esac
    [ "$a" = "$b" ] && same=$((same + 1))
    seen="$seen $a"
  done
  # Both backends take flows: the table is no constant.
  [[ $seen == *web-1* && $seen == *web-2* ]] || fail "NodePort $1: one backend only:$seen"
  echo "$same"
}
expect "maglev: flows landing on the same pod through both nodes" "$(agree "$MAG_PORT")" 20
same=$(agree "$RND_PORT")
[ "$same" -lt 20 ] || fail "random: all 20 flows agreed across nodes"
log "ok: random: $same of 20 flows agreed across nodes"
log "PASS"
