#!/usr/bin/env bash
# The agent as its DaemonSet probes and Prometheus see it, on a real node namespace: /healthz
# answers while /readyz says 503 and names the watches an unreachable apiserver keeps unlisted
# (and the CNI configuration, written only after the first sync);
# a static-mode agent is ready, and its /metrics scrape (after two CNI ADDs) parses with the
# reference parser and counts the endpoints, the CNI requests, the endpoint map's entries and
# every drop reason. sluicectl reads the running agent's configuration and status.
source "$(dirname "$0")/lib.sh"
node_init
trap teardown EXIT
CHECK=$(cd "$(dirname "$0")/.." && pwd)/support/prom_check.py

# http NS URL: prints "<status> <body>" of a GET inside the node namespace.
http() { ip netns exec "$NODE" curl -s -m 3 -w '\n%{http_code}' "$1" | tac | tr '\n' ' '; }
status_of() { http "$1" | awk '{print $1}'; }

setup_node

# 1. An apiserver that never answers: alive, not ready, and the reason names the watches.
cat >"$ROOT/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: dead
  cluster: {server: "https://127.0.0.1:1", certificate-authority: /etc/ssl/certs/ca-certificates.crt}
users:
- name: u
  user: {token: none}
contexts:
- name: dead
  context: {cluster: dead, user: u}
current-context: dead
KC
# Its conflist waits for the first Service and policy sync, which never comes.
AGENT_ARGS="--kubeconfig=$ROOT/kubeconfig" launch_agent
wait_for 10 sh -c "[ \"\$(ip netns exec $NODE curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:9879/healthz)\" = 200 ]" \
  || fail "/healthz not 200: $(http http://127.0.0.1:9879/healthz)"
# The datapath loads without Kubernetes; the watches never list.
wait_for 30 sh -c "ip netns exec $NODE curl -s http://127.0.0.1:9879/readyz | grep -q '^ok datapath'" \
  || fail "datapath never loaded: $(http http://127.0.0.1:9879/readyz)"
ready=$(http http://127.0.0.1:9879/readyz)
log "readyz with a dead apiserver: $ready"
case $ready in 503*) ;; *) fail "/readyz should be 503: $ready";; esac
for want in "ok datapath" "fail cni" "fail kubernetes: not listed yet: Service"; do
  case $ready in *"$want"*) ;; *) fail "/readyz lacks '$want': $ready";; esac
done
# The conflist would tell the kubelet pods can start here: not before the first sync.
[ ! -e "$ROOT/net.d/05-sluice.conflist" ] || fail "conflist written with the apiserver unreachable"
stop_agent

# 2. Static mode (no Kubernetes): ready; metrics on their own address.
AGENT_ARGS="--metrics_address=127.0.0.1:9962" start_agent
wait_for 10 sh -c "[ \"\$(ip netns exec $NODE curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:9879/readyz)\" = 200 ]" \
  || fail "/readyz not 200: $(http http://127.0.0.1:9879/readyz)"
log "ok: ready in static mode"
A=$(add_pod a); B=$(add_pod b)
# One counted drop: pod a sends from an address it was not given (spoofed_source).
ip -n "$T-a" addr add 10.244.0.250/32 dev eth0
in_ns a ping -c1 -W1 -I 10.244.0.250 "$NODE_IP" >/dev/null 2>&1 || true
# Forwarded traffic: b pings a (same node: sluice_from_pod redirects it straight into a).
in_ns b ping -c2 -W2 "$A" >/dev/null || fail "b cannot ping a ($A)"
[ "$(status_of http://127.0.0.1:9962/healthz)" = 404 ] || fail "probes leak onto the metrics address"

scrape=$ROOT/metrics.txt
ip netns exec "$NODE" curl -sf -m 3 http://127.0.0.1:9962/metrics >"$scrape" || fail "no /metrics"
"$CHECK" <"$scrape" >"$ROOT/families.txt" || { cat "$scrape"; fail "scrape does not parse"; }
log "scrape parsed: $(wc -l <"$ROOT/families.txt") families"
metric() { grep -E "^$1 " "$scrape" | awk '{print $2}'; }
[ "$(metric sluice_endpoints)" = 2 ] || fail "sluice_endpoints: $(metric sluice_endpoints)"
# The flow monitor runs (--monitor is on by default) and nobody observed: nothing lost.
[ "$(metric sluice_flow_events_lost_total)" = 0 ] || fail "sluice_flow_events_lost_total: $(metric sluice_flow_events_lost_total)"
[ "$(metric 'sluice_bpf_map_entries\{map_name="sluice_ep4"\}')" = 2 ] || fail "sluice_ep4 entries"
[ -n "$(metric 'sluice_bpf_map_capacity\{map_name="sluice_ct4"\}')" ] || fail "no ct4 capacity"
[ -n "$(metric sluice_datapath_conntrack_entries)" ] || fail "no conntrack entries"
adds=$(metric 'sluice_cni_request_duration_seconds_count\{command="ADD"\}')
[ "${adds:-0}" -ge 2 ] || fail "CNI ADD count: '$adds'"
# The spoofed ping left pod a: dropped by sluice_from_pod, an egress drop.
spoofed=$(metric 'sluice_drop_count_total\{reason="spoofed_source",direction="egress"\}')
[ "${spoofed:-0}" -ge 1 ] || fail "spoofed_source drops: '$spoofed'"
[ "$(metric 'sluice_drop_count_total\{reason="spoofed_source",direction="ingress"\}')" = 0 ] ||
  fail "spoofed_source counted as ingress"
# b's echo requests (and its ARP for the gateway) and a's replies: forwarded by sluice_from_pod.
fwd=$(metric 'sluice_forward_packets_total\{direction="pod_egress"\}')
[ "${fwd:-0}" -ge 4 ] || fail "sluice_forward_packets_total pod_egress: '$fwd'"
fwd_bytes=$(metric 'sluice_forward_bytes_total\{direction="pod_egress"\}')
[ "${fwd_bytes:-0}" -ge $((4 * 98)) ] || fail "sluice_forward_bytes_total pod_egress: '$fwd_bytes'"
log "ok: endpoints 2, sluice_ep4 2 entries, $adds ADDs"

# 3. sluicectl against the running agent, then against the maps alone once it is down.
sctl() { ip netns exec "$NODE" "$SLUICECTL" --bpffs_root="$ROOT/bpf" --state_dir="$ROOT/state" "$@"; }
st=$(sctl status) || fail "sluicectl status: $st"
echo "$st" >&2
for want in "Agent:                 up, 0.1.0" "Ready:                 yes" \
            "IPAM:                  2/253 allocated from 10.244.0.0/24" \
            "Endpoints:             2" "ingress sluice_from_net" "ingress sluice_from_pod" \
            "Recent drops:" "spoofed_source" "Flow events:"; do
  case $st in *"$want"*) ;; *) fail "status lacks '$want'";; esac
done
[ "$(sctl -o json status | jget 'd["endpoints"]')" = 2 ] || fail "status -o json"
sctl config | grep -qx -- "--metrics_address=127.0.0.1:9962" || fail "config lacks the flag"
sctl version | grep -q "^sluice-agent 0.1.0" || fail "version lacks the agent's"
[ "$(sctl -o json endpoints | jget 'sorted(e["pod"] for e in d)')" = "['default/a', 'default/b']" ] \
  || fail "endpoints -o json: $(sctl -o json endpoints)"
[ "$(sctl -o json --pod=default/b endpoints | jget '[e["pod"] for e in d]')" = "['default/b']" ] \
  || fail "endpoints --pod: $(sctl --pod=default/b endpoints)"
for c in nat services identities "ct list"; do
  sctl -o json $c | jget 'type(d).__name__' | grep -qx list || fail "$c -o json is no list"
done
[ "$(sctl -o json drops | jget 'sorted(d)')" = "['policy_denied_by_endpoint', 'reasons']" ] ||
  fail "drops -o json: $(sctl -o json drops)"
[ "$(sctl -o json status | jget 'sorted(d["flowEvents"])')" = \
  "['emitted', 'lostRateLimit', 'lostRingFull']" ] || fail "status -o json lacks flowEvents"
stop_agent
st=$(sctl status) || fail "sluicectl status with the agent down: $st"
for want in "Agent:                 down" "Endpoints:             2" "ingress sluice_from_pod"; do
  case $st in *"$want"*) ;; *) fail "status (agent down) lacks '$want': $st";; esac
done
log "ok: sluicectl status, config, version, -o json; status with the agent down"

# 4. DEL answers with the pod's veth down; the agent's link reaper deletes it and counts it.
AGENT_ARGS="--metrics_address=127.0.0.1:9962" start_agent
hostif=$(endpoint_field b hostIfName)
del_pod b || fail "DEL b"
wait_for 5 link_absent "$NODE" "$hostif" || fail "host veth $hostif of b not deleted"
# (The counter moves just after the link goes: poll the scrape.)
reaped() {
  ip netns exec "$NODE" curl -sf -m 3 http://127.0.0.1:9962/metrics >"$scrape" &&
    [ "$(metric 'sluice_endpoint_veth_deletes_total\{result="deleted"\}')" = 1 ]
}
wait_for 5 reaped || fail "veth deletes: $(grep sluice_endpoint_veth "$scrape")"
[ "$(metric sluice_endpoint_veths_pending_delete)" = 0 ] || fail "veths pending after the delete"
[ "$(metric 'sluice_endpoint_veth_deletes_total\{result="failed"\}')" = 0 ] || fail "a failed delete"
log "ok: DEL's veth deleted by the reaper and counted"
