#!/usr/bin/env bash
# Services beyond ClusterIP spread, end to end in a 2-node lab with the real agents as the only
# proxy: a Service without endpoints refuses (TCP RST, UDP ICMP port unreachable), an undefined
# port on a ClusterIP refuses, NodePort from the external namespace through each node (both
# backends seen), externalTrafficPolicy Local (client address preserved, a node without a local
# endpoint drops, health-check NodePort 200/503), an ExternalIP, a LoadBalancer ingress IP and its
# loadBalancerSourceRanges, session affinity, hairpin, only
# terminating endpoints still serving, and a host process on a node reaching a ClusterIP.
# Every address used lives in namespaces the lab creates.
set -euo pipefail
NAME=sx$$
source "$(dirname "$0")/lib.sh"
lab_init

KUBECONFIG_PATH=$("$LAB" up --nodes 2 --name "$NAME") || fail "up"
NODE1_IP=$(node_ip node1)
NODE2_IP=$(node_ip node2)
EXTERNAL_IP=$(lab status | awk '/^external:/ {print $2}')

{
  pod_manifest web-1 --labels app=web,local=yes --node node1 --ports 8080,8080/UDP
  pod_manifest web-2 --labels app=web --node node2 --ports 8080,8080/UDP
  pod_manifest client --node node1 --ports 9090
  cat <<'YAML'
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: 8080}
  - {name: dns, port: 53, targetPort: 8080, protocol: UDP}
---
apiVersion: v1
kind: Service
metadata: {name: web-local}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  selector: {local: "yes"}
  ports:
  - {port: 80, targetPort: 8080}
---
apiVersion: v1
kind: Service
metadata: {name: web-ext}
spec:
  selector: {app: web}
  externalIPs: [192.0.2.10]
  ports:
  - {port: 8000, targetPort: 8080}
---
apiVersion: v1
kind: Service
metadata: {name: empty}
spec:
  selector: {app: nothing}
  ports:
  - {name: tcp, port: 80, targetPort: 8080}
  - {name: udp, port: 53, targetPort: 8080, protocol: UDP}
---
apiVersion: v1
kind: Service
metadata: {name: sticky}
spec:
  selector: {app: web}
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}
  ports:
  - {port: 80, targetPort: 8080}
YAML
} | K apply --validate=false -f - >/dev/null || fail "apply"
K wait --for=condition=Ready pod/web-1 pod/web-2 pod/client --timeout=60s >/dev/null ||
  fail "pods not Ready"
cip() { K get service "$1" -o jsonpath='{.spec.clusterIP}'; }
WEB=$(cip web); EMPTY=$(cip empty); STICKY=$(cip sticky)
NODEPORT=$(K get service web -o jsonpath='{.spec.ports[0].nodePort}')
LOCAL_NODEPORT=$(K get service web-local -o jsonpath='{.spec.ports[0].nodePort}')
HC_PORT=$(K get service web-local -o jsonpath='{.spec.healthCheckNodePort}')
log "web=$WEB:80 nodePort=$NODEPORT; web-local nodePort=$LOCAL_NODEPORT hc=$HC_PORT; empty=$EMPTY"

# The agents program the Services once they have seen them: wait until both nodes list every
# frontend (web: 2 ClusterIP ports + 2 NodePorts; web-local: 1 + 1; web-ext: 1 + the ExternalIP;
# empty: 2; sticky: 1; kubernetes: 1).
programmed() {
  for n in node1 node2; do
    [ "$("$BUILD/agent/sluicectl" --bpffs_root="$DIR/$n/bpf" services | grep -cE '^[0-9.]+:[0-9]+ ')" -ge 12 ] || return 1
  done
}
wait_for 30 programmed || fail "services not programmed: $("$BUILD/agent/sluicectl" --bpffs_root="$DIR/node1/bpf" services)"

# Every request below must be answered by one of the Service's pods.
hosts_seen() {  # hosts_seen N FROM TO [PROTO]: distinct hostnames over N requests, fails on error
  local n=$1 from=$2 to=$3 proto=${4:-tcp} got
  for _ in $(seq "$n"); do
    got=$(lab request --from "$from" --to "$to" --proto "$proto" --data hostname --timeout 2)
    case $got in web-1|web-2) echo "$got";; *) fail "request $from -> $to ($proto): '$got'";; esac
  done | sort -u | tr '\n' ' '
}

# No endpoints: refused at once, never a timeout.
expect "no endpoints, tcp" "$(lab probe --from default/client --to "$EMPTY:80" --timeout 3)" REFUSED
expect "no endpoints, udp" \
  "$(lab probe --from default/client --to "$EMPTY:53" --proto udp --timeout 3)" REFUSED
expect "undefined port on a ClusterIP" \
  "$(lab probe --from default/client --to "$WEB:81" --timeout 3)" REFUSED

# ClusterIP over UDP, both backends.
expect "udp ClusterIP, both backends" "$(hosts_seen 30 default/client "$WEB:53" udp)" "web-1 web-2 "

# NodePort from outside the cluster, through each node.
expect "NodePort via node1" "$(hosts_seen 30 external "$NODE1_IP:$NODEPORT")" "web-1 web-2 "
expect "NodePort via node2" "$(hosts_seen 30 external "$NODE2_IP:$NODEPORT")" "web-1 web-2 "
got=$(lab request --from external --to "$NODE1_IP:$LOCAL_NODEPORT" --data clientip)
case $got in "$EXTERNAL_IP":*) log "ok: ETP Local keeps the client address ($got)";;
  *) fail "ETP Local clientip '$got', want $EXTERNAL_IP:*";; esac
expect "ETP Local, node without local endpoints drops" \
  "$(lab probe --from external --to "$NODE2_IP:$LOCAL_NODEPORT" --timeout 2)" TIMEOUT
hc() { lab exec node/"$1" -- curl -s -o /dev/null -w '%{http_code}' "http://$2:$HC_PORT/"; }
expect "health check node1 (1 local endpoint)" "$(hc node1 "$NODE1_IP")" 200
expect "health check node2 (none)" "$(hc node2 "$NODE2_IP")" 503
lab exec node/node1 -- curl -s "http://$NODE1_IP:$HC_PORT/" | grep -q '"localEndpoints": *1' ||
  fail "health check body: $(lab exec node/node1 -- curl -s "http://$NODE1_IP:$HC_PORT/")"

# An ExternalIP, routed to node1 by the client's network.
ip netns exec "$NAME-external" ip route replace 192.0.2.10/32 via "$NODE1_IP"
expect "ExternalIP from outside" "$(hosts_seen 20 external 192.0.2.10:8000)" "web-1 web-2 "

# A LoadBalancer ingress IP (written to the Service's status as a cloud controller would), then
# loadBalancerSourceRanges that leave the external client out, then ones that admit it.
K patch service web-local --subresource=status --type=merge \
  -p '{"status":{"loadBalancer":{"ingress":[{"ip":"192.0.2.20"}]}}}' >/dev/null || fail "patch status"
ip netns exec "$NAME-external" ip route replace 192.0.2.20/32 via "$NODE1_IP"
lb_clientip() { lab request --from external --to 192.0.2.20:80 --data clientip --timeout 1; }
lb_probe_is() { [ "$(lab probe --from external --to 192.0.2.20:80 --timeout 1)" = "$1" ]; }
lb_keeps_client() { lb_clientip | grep -q "^$EXTERNAL_IP:"; }
wait_for 20 lb_keeps_client || fail "LoadBalancer IP never served: $(lb_clientip)"
log "ok: LoadBalancer ingress IP serves, client address kept ($(lb_clientip))"
K patch service web-local --type=merge -p '{"spec":{"loadBalancerSourceRanges":["10.0.0.0/8"]}}' >/dev/null
wait_for 20 lb_probe_is TIMEOUT ||
  fail "a client outside loadBalancerSourceRanges still reaches the LoadBalancer IP"
log "ok: loadBalancerSourceRanges keep the external client out"
K patch service web-local --type=merge \
  -p "{\"spec\":{\"loadBalancerSourceRanges\":[\"10.0.0.0/8\",\"$EXTERNAL_IP/32\"]}}" >/dev/null
wait_for 20 lb_probe_is CONNECTED ||
  fail "a client inside loadBalancerSourceRanges cannot reach the LoadBalancer IP"
log "ok: a range with the client admits it"

# Session affinity: one client, one backend.
n=$(hosts_seen 20 default/client "$STICKY:80" | wc -w)
expect "ClientIP affinity: backends seen by one client" "$n" 1

# Hairpin: web-1 reaches itself through its own Service.
expect "hairpin, web-1 -> its Service" "$(hosts_seen 30 default/web-1 "$WEB:80")" "web-1 web-2 "

# A process on the node (host network) reaches a ClusterIP.
expect "node1 host process -> ClusterIP" "$(lab probe --from node/node1 --to "$WEB:80")" CONNECTED
got=$(lab request --from node/node2 --to "$WEB:80" --data hostname)
case $got in web-1|web-2) log "ok: node2 host process -> ClusterIP answered by $got";;
  *) fail "node2 -> ClusterIP: '$got'";; esac

# Only terminating endpoints left: they still serve.
K delete pod web-2 --grace-period=60 --wait=false >/dev/null
K label pod web-1 app- >/dev/null
wait_for 20 sh -c "kubectl --kubeconfig $KUBECONFIG_PATH get endpointslices -o yaml | grep -q 'terminating: true'" ||
  fail "web-2 never terminating"
expect "only a terminating endpoint left" "$(hosts_seen 10 default/client "$WEB:80")" "web-2 "

# service_external_xdp_test.sh: sluice_xdp_net ran in native XDP mode on both nodes' eth0, and
# the NodePort flows to the other node's pod were sent on by it (its own counter), not by TC.
if [[ " ${SLUICE_LAB_AGENT_ARGS:-} " == *" --lb_acceleration=native "* ]]; then
  for n in node1 node2; do
    link=$(ip -n "$NAME-$n" -d link show eth0)
    grep -qE '^ +prog/xdp id [0-9]+' <<<"$link" || fail "$n: no native XDP program on eth0: $link"
    status=$(ip netns exec "$NAME-$n" "$BUILD/agent/sluicectl" --bpffs_root="$DIR/$n/bpf" status)
    grep -qE 'eth0 +xdp \(native\) sluice_xdp_net, ingress sluice_from_net' <<<"$status" ||
      fail "$n: sluicectl status does not show sluice_xdp_net on eth0: $status"
    xdp_packets=$(awk '$1 == "net_xdp" {print $2}' <<<"$status")
    # 30 NodePort requests through each node, about half to the other node's pod, each a few
    # packets each way: far more than 20 if XDP really carries them.
    [ "${xdp_packets:-0}" -ge 20 ] || fail "$n: XDP forwarded ${xdp_packets:-no} packets: $status"
    metrics=$(lab exec node/"$n" -- curl -sf -m 5 http://127.0.0.1:9879/metrics) ||
      fail "$n: /metrics (service_external_xdp_test.sh serves it on 127.0.0.1:9879)"
    grep -q '^sluice_lb_acceleration_attached{mode="native"} 1$' <<<"$metrics" ||
      fail "$n: /metrics does not say native XDP: $(grep lb_acceleration <<<"$metrics")"
    grep -qE '^sluice_forward_packets_total\{direction="net_xdp"\} [1-9]' <<<"$metrics" ||
      fail "$n: /metrics net_xdp: $(grep net_xdp <<<"$metrics")"
    log "ok: $n: sluice_xdp_net in native mode forwarded $xdp_packets packets"
  done
fi
log "PASS"
