#!/usr/bin/env bash
# `make demo`: a two-node lab cluster on this machine (network namespaces running the real
# sluice-agent, an embedded Kubernetes API), the pods of examples/ applied with kubectl, and
# traffic between them on one node and across nodes, and the `web` Service balanced in BPF over
# backends on both nodes (ClusterIP from a pod and from a node, NodePort from outside). It stays
# up for you to look around.
# `make demo-helm` (demo.sh BUILD --helm): the nodes come up without agents (`up --no-agents`)
# and Sluice is installed as on a cluster: the Helm chart rendered (cluster-pool IPAM,
# kubeProxyReplacement) and applied with kubectl; the lab runs its DaemonSet and operator.
set -euo pipefail
BUILD=$(cd "${1:-build}" && pwd)
HELM=${2:-}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
LAB=$BUILD/agent/lab/sluice-lab
NAME=${SLUICE_DEMO_NAME:-demo}
BPF_SUB=  # where a node's pins are below its bpffs

if [ -d "/run/sluice-lab/$NAME" ]; then
  echo "a lab named $NAME is already up; remove it with: $LAB down --name $NAME" >&2
  exit 1
fi
K() { kubectl --kubeconfig "$KCFG" "$@"; }
if [ "$HELM" = --helm ]; then
  RENDER=$BUILD/tests/helm/sluice-helm-render
  [ -x "$RENDER" ] || ctest --test-dir "$BUILD" -R helm_render_build >/dev/null
  echo "== bringing up lab '$NAME': 2 nodes without agents (sluice-lab up --no-agents)"
  KCFG=$("$LAB" up --nodes 2 --name "$NAME" --no-agents)
  trap 'echo "demo failed; tearing down" >&2; "$LAB" down --name "$NAME"' ERR
  K get nodes | sed 's/^/   /'
  API=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["apiserverUnderlay"])' \
    "/run/sluice-lab/$NAME/status.json")
  API_HOST=${API#https://}; API_HOST=${API_HOST%:*}
  echo "== helm template helm/sluice (tests/helm/render) | kubectl apply -f -"
  "$RENDER" -chart "$SRC/helm/sluice" -name sluice -namespace kube-system \
    -set kubeProxyReplacement=true -set "k8sServiceHost=$API_HOST" -set k8sServicePort=6443 \
    -set ipam.mode=cluster-pool -set 'ipam.operator.clusterPoolIPv4PodCIDRList={10.11.0.0/16}' \
    -set serviceCIDR=10.96.0.0/16 > "/run/sluice-lab/$NAME/sluice.yaml"
  K apply --validate=false -f "/run/sluice-lab/$NAME/sluice.yaml" | sed 's/^/   /'
  K wait --for=condition=Ready node --all --timeout=60s >/dev/null
  K -n kube-system wait --for=condition=Ready pod --all --timeout=60s >/dev/null
  K -n kube-system get pods -o wide | sed 's/^/   /'
  K get nodes | sed 's/^/   /'
  BPF_SUB=/sluice
else
  echo "== bringing up lab '$NAME': 2 nodes"
  KCFG=$("$LAB" up --nodes 2 --name "$NAME")
  trap 'echo "demo failed; tearing down" >&2; "$LAB" down --name "$NAME"' ERR
fi

for n in node1 node2; do
  echo "   $n: $(K get node $n -o jsonpath='{.status.addresses[0].address}'), pod CIDR $(K get node $n -o jsonpath='{.spec.podCIDR}')"
done
echo "== kubectl apply -f examples/"
K apply --validate=false -f "$SRC/examples/" | sed 's/^/   /'
K wait --for=condition=Ready pod --all --timeout=60s >/dev/null
for p in web-1 web-2 client; do
  echo "   $p on $(K get pod $p -o jsonpath='{.spec.nodeName}') at $(K get pod $p -o jsonpath='{.status.podIP}')"
done
ip() { K get pod "$1" -o jsonpath='{.status.podIP}'; }
show() { printf '   %-46s -> %s\n' "$1" "$2"; }
echo "== traffic (sluice-lab request sends a line and prints the answer)"
show "client (node1) -> web-1 (node1) hostname" "$("$LAB" request --name "$NAME" --from default/client --to "$(ip web-1):8080" --data hostname)"
show "client (node1) -> web-2 (node2) hostname" "$("$LAB" request --name "$NAME" --from default/client --to "$(ip web-2):8080" --data hostname)"
show "client (node1) -> web-2 (node2) clientip" "$("$LAB" request --name "$NAME" --from default/client --to "$(ip web-2):8080" --data clientip)"
show "client -> web-2 udp/5353 hostname" "$("$LAB" request --name "$NAME" --from default/client --to "$(ip web-2):5353" --proto udp --data hostname)"
show "node2 -> web-1 probe" "$("$LAB" probe --name "$NAME" --from node/node2 --to "$(ip web-1):8080")"
show "client -> web-1 closed port probe" "$("$LAB" probe --name "$NAME" --from default/client --to "$(ip web-1):9999")"

CIP=$(K get service web -o jsonpath='{.spec.clusterIP}')
NODEPORT=$(K get service web -o jsonpath='{.spec.ports[0].nodePort}')
NODE1_IP=$(K get node node1 -o jsonpath='{.status.addresses[0].address}')
echo "== Service web: ClusterIP $CIP (80/tcp, 53/udp), NodePort $NODEPORT; backends web-1, web-2"
spread() {  # spread N FROM TO [PROTO]: who answered N requests
  for _ in $(seq "$1"); do
    "$LAB" request --name "$NAME" --from "$2" --to "$3" --proto "${4:-tcp}" --data hostname --timeout 2
  done | sort | uniq -c | awk '{printf "%s x%s  ", $2, $1}'
}
for _ in $(seq 100); do  # the agents program the Service once they have seen its EndpointSlice
  [ "$("$LAB" request --name "$NAME" --from default/client --to "$CIP:80" --data hostname --timeout 1)" != TIMEOUT ] && break
  sleep 0.1
done
show "client -> $CIP:80, 20 requests" "$(spread 20 default/client "$CIP:80")"
show "client -> $CIP:53/udp, 20 requests" "$(spread 20 default/client "$CIP:53" udp)"
show "node2 host process -> $CIP:80, 10 requests" "$(spread 10 node/node2 "$CIP:80")"
show "external -> node1 $NODE1_IP:$NODEPORT, 20 requests" "$(spread 20 external "$NODE1_IP:$NODEPORT")"
trap - ERR

# sluicectl inside node1 (--node): its agent tells it where the maps and records are. The
# chart's agent runs in a container, whose paths are the lab's stand-ins on this side.
CTL="$BUILD/agent/sluicectl --node node1 --lab $NAME"
if [ "$HELM" = --helm ]; then
  CTL="$CTL --bpffs_root=/run/sluice-lab/$NAME/node1/bpf$BPF_SUB --state_dir=/run/sluice-lab/$NAME/node1/state"
fi
cat <<TXT

== look around
  kubectl --kubeconfig $KCFG get pods -o wide
  $LAB status --name $NAME
  $LAB probe --name $NAME --from default/client --to $(ip web-2):8080
  $LAB exec --name $NAME client -- ip route
  $CTL status
  $CTL endpoints
  $CTL services
  $CTL drops
  $CTL trace --from default/client --to $(ip web-2):8080   # to node2's pod, through the tunnel
  bpftool map dump pinned /run/sluice-lab/$NAME/node1/bpf$BPF_SUB/sluice_lb4_svc | head -40

== tear down
  $LAB down --name $NAME
TXT
