#!/usr/bin/env bash
# One node, three pods made through sluice-cni: TCP and UDP pod<->pod, pod<->node and
# pod->internet (masqueraded to the node address) over the real BPF datapath; DEL removes the
# link, the map entry and the address; an agent restart keeps traffic and state; 200 ADD/DEL
# cycles leave nothing behind.
source "$(dirname "$0")/lib.sh"
node_init
trap teardown EXIT

setup_node
start_agent
log "agent ready"

A=$(add_pod a); B=$(add_pod b); C=$(add_pod c)
log "pods a=$A b=$B c=$C"
for ip in "$A" "$B" "$C"; do
  case $ip in 10.244.0.*) ;; *) fail "pod address '$ip' is not from $POD_CIDR";; esac
  map_has_ip "$ip" || fail "no endpoint map entry for $ip"
done
[ "$A" != "$B" ] && [ "$B" != "$C" ] && [ "$A" != "$C" ] || fail "duplicate addresses"

# Nothing bridges the pods: no bridge device, and no iptables rule was added for them.
[ -z "$(ip -n "$NODE" -o link show type bridge)" ] || fail "a bridge exists on the node"

serve_clientip "$T-b" 8080
serve_clientip "$T-c" 8080
serve_clientip "$NODE" 7070
serve_clientip "$INET" 80

expect_from() {  # expect_from WHAT GOT WANT_IP
  case "$2" in "$3":*) log "ok: $1 seen from $2";; *) fail "$1: reply '$2', want source $3";; esac
}

expect_from "tcp a->b" "$(tcp_request "$T-a" "$B" 8080)" "$A"
expect_from "udp a->b" "$(udp_request "$T-a" "$B" 8080)" "$A"
expect_from "tcp a->c" "$(tcp_request "$T-a" "$C" 8080)" "$A"
expect_from "udp c->b" "$(udp_request "$T-c" "$B" 8080)" "$C"
expect_from "tcp pod->node" "$(tcp_request "$T-a" "$NODE_IP" 7070)" "$A"
expect_from "udp pod->node" "$(udp_request "$T-c" "$NODE_IP" 7070)" "$C"
got=$(tcp_request "$NODE" "$B" 8080); [ -n "$got" ] || fail "tcp node->pod: no reply"
log "ok: tcp node->pod answered ($got)"
got=$(udp_request "$NODE" "$C" 8080); [ -n "$got" ] || fail "udp node->pod: no reply"
log "ok: udp node->pod answered ($got)"
expect_from "tcp pod->internet (masqueraded)" "$(tcp_request "$T-a" $INTERNET_HOST 80)" $NODE_IP
expect_from "udp pod->internet (masqueraded)" "$(udp_request "$T-b" $INTERNET_HOST 80)" $NODE_IP
in_ns a ping -c1 -W2 "$B" >/dev/null || fail "ping a->b"
in_ns a ping -c1 -W2 $INTERNET_HOST >/dev/null || fail "ping a->internet (masqueraded echo)"
ip netns exec "$NODE" ping -c1 -W2 "$C" >/dev/null || fail "ping node->pod"
[ "$(map_count sluice_snat4)" -ge 3 ] || fail "masquerade state missing from sluice_snat4"
log "ok: ping pod->pod, pod->internet, node->pod"

# What the datapath holds, as an operator sees it.
ctl endpoints | grep -q "^$A " || fail "sluicectl endpoints does not list $A"
ctl nat | grep -q "$A:" || fail "sluicectl nat does not list a masqueraded flow of $A"
# A pod sending from an address it was not given is dropped, and the drop is counted by reason.
spoofed=$(drops spoofed_source)
in_ns a ip addr add 10.244.0.200/32 dev eth0
in_ns a ping -c1 -W1 -I 10.244.0.200 "$C" >/dev/null 2>&1 && fail "spoofed ping got through"
in_ns a ip addr del 10.244.0.200/32 dev eth0
[ "$(drops spoofed_source)" -gt "$spoofed" ] || fail "spoofed packet not counted: $(ctl drops)"
log "ok: spoofed source dropped and counted"

# The node's masquerade ports stay out of the pods' way: the pod's own port is visible inside.
got=$(tcp_request "$T-a" $INTERNET_HOST 80); port=${got##*:}
[ "$port" -ge 61000 ] || fail "masquerade port $port outside the configured range"

# DEL: link, map entry, address and record all go; a second DEL is fine.
hostif=$(endpoint_field b hostIfName)
[ "$(endpoint_field b podName)" = b ] && [ "$(endpoint_field b podNamespace)" = default ] ||
  fail "K8S_POD_NAMESPACE/K8S_POD_NAME not recorded on the endpoint"
[ -n "$hostif" ] || fail "no endpoint record for b"
ip -n "$NODE" link show "$hostif" >/dev/null || fail "host veth $hostif missing before DEL"
del_pod b || fail "DEL b"
link_not_up "$NODE" "$hostif" || fail "host veth $hostif still up after DEL answered"
ip -n "$NODE" route show "$B" | grep -q . && fail "route to $B survived DEL"
wait_for 5 link_absent "$NODE" "$hostif" || fail "host veth $hostif survived DEL"
in_ns b ip link show eth0 >/dev/null 2>&1 && fail "pod side of b survived DEL"
map_has_ip "$B" && fail "endpoint map entry $B survived DEL"
find "$ROOT/state" -name "$B" | grep -q . && fail "address $B still allocated"
del_pod b || fail "second DEL b"
[ "$(tcp_request "$T-a" "$B" 8080 2>/dev/null)" = "" ] || fail "deleted pod b still answers"
log "ok: DEL cleaned up b"

# Restart: a long-lived connection keeps flowing, state and pins survive.
in_ns c socat TCP-LISTEN:9999,reuseaddr EXEC:cat &
wait_for 5 ip netns exec "$T-c" sh -c "ss -ltn | grep -q ':9999 '" || fail "echo server did not start"
coproc LONG { ip netns exec "$T-a" socat -T30 - "TCP:$C:9999"; }
echo before >&"${LONG[1]}"; read -r -t 5 line <&"${LONG[0]}" || fail "long connection: no echo"
[ "$line" = before ] || fail "long connection echoed '$line'"
stop_agent
echo while-down >&"${LONG[1]}"; read -r -t 5 line <&"${LONG[0]}" || fail "connection broke while the agent was down"
expect_from "tcp a->c with the agent down" "$(tcp_request "$T-a" "$C" 8080)" "$A"
start_agent
echo after >&"${LONG[1]}"; read -r -t 5 line <&"${LONG[0]}" || fail "connection broke across the agent restart"
[ "$line" = after ] || fail "long connection echoed '$line' after restart"
map_has_ip "$A" && map_has_ip "$C" || fail "endpoint entries lost across restart"
expect_from "tcp a->c after restart" "$(tcp_request "$T-a" "$C" 8080)" "$A"
D=$(add_pod d)
[ "$D" != "$A" ] && [ "$D" != "$C" ] || fail "address $D handed out twice after restart"
del_pod d
log "ok: restart kept connections, entries and allocations"

# 200 ADD/DEL cycles leave no address, map entry, link or file behind.
count_state() {
  wait_for 10 no_sluice_links_down "$NODE" || true
  echo "links=$(ip -n "$NODE" -o link show | grep -c ' slc')" \
       "ep4=$(map_count sluice_ep4)" \
       "files=$(find "$ROOT/state" -type f | wc -l)"
}
before=$(count_state)
for i in $(seq 1 200); do
  ip netns add "$T-cyc"
  cni ADD "cyc$i" "/var/run/netns/$T-cyc" >/dev/null || fail "cycle $i ADD"
  cni DEL "cyc$i" "/var/run/netns/$T-cyc" >/dev/null || fail "cycle $i DEL"
  ip netns del "$T-cyc"
done
after=$(count_state)
[ "$before" = "$after" ] || fail "200 ADD/DEL cycles leaked: before '$before' after '$after'"
log "ok: 200 ADD/DEL cycles, state unchanged ($after)"
# ADD and DEL of different pods run side by side: 16 at once get 16 distinct addresses, and
# their DELs leave the node as it was.
for i in $(seq 1 16); do ip netns add "$T-par$i"; done
export ROOT CNI T
export -f cni netconf
seq 1 16 | xargs -P16 -I{} bash -c 'cni ADD par{} "/var/run/netns/$T-par{}" >"$ROOT/log/par{}.json"' ||
  fail "parallel ADD"
distinct=$(for i in $(seq 1 16); do jget 'd["ips"][0]["address"]' <"$ROOT/log/par$i.json"; done |
           sort -u | wc -l)
[ "$distinct" = 16 ] || fail "16 parallel ADDs gave $distinct distinct addresses"
seq 1 16 | xargs -P16 -I{} bash -c 'cni DEL par{} "/var/run/netns/$T-par{}" >/dev/null' ||
  fail "parallel DEL"
for i in $(seq 1 16); do ip netns del "$T-par$i"; done
[ "$(count_state)" = "$after" ] || fail "parallel ADD/DEL leaked: '$(count_state)' vs '$after'"
log "ok: 16 parallel ADDs and DELs"
echo "pod_network_test: PASS"
