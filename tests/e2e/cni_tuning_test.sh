#!/usr/bin/env bash
# The reference `tuning` plugin (Debian's containernetworking-plugins) chained after sluice and
# setting the pod's MAC, called as libcni calls a conflist: ADD in order with each plugin's result
# as the next one's prevResult, CHECK and DEL (in reverse) with the chain's result. With no CHECK
# yet, the node reaches the pod (a kubelet probe), another pod reaches it, the pod's ping to its
# gateway (answered in BPF) comes back, and the endpoint map entry, the node's neighbour entry
# and the endpoint record carry the new MAC; CHECK with the chain's result passes. A MAC changed
# behind the chain's back (in the pod, or while the agent is down) is followed the same way, and
# CHECK with the stale result answers 103 naming both MACs.
source "$(dirname "$0")/lib.sh"
node_init
trap teardown EXIT
fail_logs() { echo "$ROOT/log/agent.log"; }
TUNING=/usr/lib/cni/tuning
[ -x "$TUNING" ] || fail "$TUNING missing (make deps installs containernetworking-plugins)"
# Debian's reference plugins (1.1.1) speak CNI up to 1.0.0, as libcni in podman 4.3 does: the
# chain's configuration says 1.0.0.
V=1.0.0
MAC1=02:5e:00:00:00:01   # tuning's
MAC2=02:5e:00:00:00:02   # set inside the pod, behind the chain's back
MAC3=02:5e:00:00:00:03   # set while the agent is down

setup_node
ln -s "$TUNING" "$ROOT/bin/tuning"
start_agent

# tuning CMD ID NETNS PREV: the chain's second plugin, as libcni runs it.
tuning() {
  printf '{"cniVersion":"%s","name":"sluice","type":"tuning","mac":"%s","prevResult":%s}' \
    $V "$MAC1" "$4" |
    env -i CNI_COMMAND="$1" CNI_CONTAINERID="$2" CNI_NETNS="$3" CNI_IFNAME=eth0 \
      CNI_PATH="$ROOT/bin" "$ROOT/bin/tuning"
}
chained() { CNI_VERSION=$V cni "$@"; }  # sluice, the chain's first plugin
# What the node and the datapath hold for the pod at ADDR: the permanent neighbour entry's MAC and
# the MAC in sluice_ep4 (the one the datapath writes on packets it delivers to the pod).
neigh_mac() { ip -n "$NODE" neigh show "$1" | awk '/PERMANENT/ {for (i = 1; i < NF; i++) if ($i == "lladdr") print $(i + 1)}'; }
map_mac() {
  bpftool -j map lookup pinned "$ROOT/bpf/sluice_ep4" key $(printf '0x%02x ' ${1//./ }) |
    jget '":".join("%02x" % int(b, 0) if isinstance(b, str) else "%02x" % b for b in d["formatted"]["value"]["mac"])'
}
# probe ADDR: a node -> pod TCP exchange whose SYN gets no retransmission (the first comes at 1 s).
probe() { echo clientip | ip netns exec "$NODE" socat -T2 - "TCP:$1:8080,connect-timeout=0.9"; }
pod_mac() { in_ns "$1" cat /sys/class/net/eth0/address; }
# follows ADDR MAC: every copy Sluice keeps of the pod's MAC is MAC.
follows() { [ "$(neigh_mac "$1")" = "$2" ] && [ "$(map_mac "$1")" = "$2" ]; }

P1=/var/run/netns/$T-p1
ip netns add "$T-p1"
ip -n "$T-p1" link set lo up
res1=$(chained ADD p1 "$P1") || fail "sluice ADD: $res1"
ADDR=$(echo "$res1" | jget 'd["ips"][0]["address"].split("/")[0]')
res=$(tuning ADD p1 "$P1" "$res1") || fail "tuning ADD: $res"
expect "pod MAC after tuning" "$(pod_mac p1)" $MAC1
[ "$(echo "$res" | jget '[i["mac"] for i in d["interfaces"] if i["name"] == "eth0"][0]')" = $MAC1 ] ||
  fail "tuning's result does not carry $MAC1: $res"
serve_clientip "$T-p1" 8080

# No CHECK has run: the agent heard the pod's link change. A node -> pod connection right away
# (a kubelet probe) gets through; its SYN must not wait for a retransmission.
probe "$ADDR" >/dev/null || fail "node -> pod after tuning set the MAC"
wait_for 1 follows "$ADDR" $MAC1 ||
  fail "not followed: neighbour $(neigh_mac "$ADDR"), map $(map_mac "$ADDR"), want $MAC1"
expect "endpoint record's MAC" "$(endpoint_field p1 mac)" $MAC1
ADDR2=$(add_pod p2)
reply=$(tcp_request "$T-p2" "$ADDR" 8080)
expect "pod -> pod (same node) reaches the pod with its new MAC" "${reply%%:*}" "$ADDR2"
# The gateway's echo reply, written in BPF, is addressed to the pod's MAC too.
in_ns p1 ping -c1 -W1 "$GATEWAY" >/dev/null || fail "pod -> gateway ping after tuning set the MAC"
chained CHECK p1 "$P1" eth0 ",\"prevResult\":$res" >/dev/null || fail "sluice CHECK with tuning's result"
tuning CHECK p1 "$P1" "$res" >/dev/null || fail "tuning CHECK"
log "ok: chained tuning set $MAC1; node and pods reach the pod; CHECK passes"

# Behind the chain's back: followed, and CHECK with the chain's (now stale) result says so.
t0=$(date +%s%N)
in_ns p1 ip link set eth0 address $MAC2
wait_for 2 follows "$ADDR" $MAC2 || fail "in-pod MAC change not followed: $(neigh_mac "$ADDR")"
# How long the agent took: its log line's time against the change's (`ip` started at t0).
at=$(sed -n "s/^\[\([^]]*\)\].*changed its MAC .* -> $MAC2;.*/\1/p" "$ROOT/log/agent.log")
log "ok: followed $(($(date -d "$at" +%s%3N) - t0 / 1000000)) ms after \`ip link set\` started"
probe "$ADDR" >/dev/null || fail "node -> pod after an in-pod change"
out=$(chained CHECK p1 "$P1" eth0 ",\"prevResult\":$res") && fail "CHECK passed with a stale MAC"
expect "CHECK code" "$(echo "$out" | jget 'd["code"]')" 103
echo "$out" | grep -q "eth0 has MAC $MAC2, prevResult says $MAC1" || fail "CHECK message: $out"
log "ok: in-pod change followed; CHECK: $(echo "$out" | jget 'd["msg"]')"

# While the agent is down: the restarted agent writes the pod's MAC before it serves.
stop_agent
in_ns p1 ip link set eth0 address $MAC3
start_agent
follows "$ADDR" $MAC3 || fail "restart did not follow $MAC3: $(neigh_mac "$ADDR") $(map_mac "$ADDR")"
probe "$ADDR" >/dev/null || fail "node -> pod after a restart"
expect "endpoint record's MAC after restart" "$(endpoint_field p1 mac)" $MAC3

# DEL in reverse order: tuning puts the MAC it found back (followed too), then sluice removes all.
tuning DEL p1 "$P1" "$res" >/dev/null || fail "tuning DEL"
chained DEL p1 "$P1" eth0 ",\"prevResult\":$res" >/dev/null || fail "sluice DEL"
[ -z "$(endpoint_field p1 ipv4)" ] || fail "p1's record survived DEL"
map_has_ip "$ADDR" && fail "p1's map entry survived DEL"
[ -z "$(ip -n "$NODE" neigh show "$ADDR")" ] || fail "p1's neighbour entry survived DEL"
grep -q "changed its MAC" "$ROOT/log/agent.log" || fail "the agent logged no MAC change"
log "PASS"
