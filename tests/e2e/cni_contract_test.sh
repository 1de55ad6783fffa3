#!/usr/bin/env bash
# The CNI 1.1.0 contract of sluice-cni against the real agent: ADD, CHECK, DEL, GC, STATUS and
# VERSION as a runtime calls them, the spec's error codes, DEL idempotency (repeated, never
# added, netns gone, after an agent restart), prevResult chaining and address exhaustion.
POD_CIDR=10.244.0.0/29   # 5 pod addresses: .2 to .6 (.1 is the gateway)
source "$(dirname "$0")/lib.sh"
node_init
trap teardown EXIT

# expect_error CODE OUTPUT: the plugin printed a CNI error object with CODE.
expect_error() {
  local code
  code=$(echo "$2" | jget 'd["code"]') || fail "not a CNI error object: $2"
  [ "$code" = "$1" ] || fail "want error code $1, got: $2"
  log "ok: error $1: $(echo "$2" | jget 'd["msg"]')"
}
newns() { ip netns add "$T-$1"; echo "/var/run/netns/$T-$1"; }

setup_node
start_agent

# VERSION needs no agent and no configuration.
out=$(env -i CNI_COMMAND=VERSION "$CNI" </dev/null)
echo "$out" | jget '"1.1.0" in d["supportedVersions"] and "0.4.0" in d["supportedVersions"]' |
  grep -q True || fail "VERSION: $out"
cni_status || fail "STATUS on a ready agent"

# ADD: the result names both veth ends, the /32 address on the pod interface and the gateway.
P1=$(newns p1)
res=$(cni ADD p1 "$P1") || fail "ADD p1: $res"
[ "$(echo "$res" | jget 'd["cniVersion"]')" = 1.1.0 ] || fail "result version: $res"
[ "$(echo "$res" | jget 'd["interfaces"][d["ips"][0]["interface"]]["sandbox"]')" = "$P1" ] ||
  fail "ips[0] must point at the pod interface: $res"
[ "$(echo "$res" | jget 'd["ips"][0]["gateway"]')" = 10.244.0.1 ] || fail "gateway: $res"
[ "$(echo "$res" | jget 'd["routes"][0]["dst"]')" = 0.0.0.0/0 ] || fail "default route: $res"
[ "$(echo "$res" | jget '"version" in d["ips"][0]')" = False ] || fail "1.x ips carry no version"
ADDR=$(echo "$res" | jget 'd["ips"][0]["address"].split("/")[0]')
in_ns p1 ip -4 -o addr show eth0 | grep -q "$ADDR/32" || fail "pod has no $ADDR/32"
in_ns p1 ip route show default | grep -q 'via 10.244.0.1 dev eth0' || fail "pod default route"
log "ok: ADD p1 -> $ADDR"

# CHECK with the ADD result as prevResult passes. ADD again of the same attachment (the retry a
# code 11 invites) answers with the same result; another container's ADD of eth0 there is 101.
prev=",\"prevResult\":$res"
cni CHECK p1 "$P1" eth0 "$prev" >/dev/null || fail "CHECK of a healthy endpoint failed"
again=$(cni ADD p1 "$P1") || fail "retried ADD of p1/eth0 failed: $again"
[ "$(echo "$again" | jget 'd["ips"][0]["address"]')" = "$ADDR/32" ] || fail "retried ADD: $again"
out=$(cni ADD p1-other "$P1") && fail "ADD of an existing eth0 by another container succeeded"
expect_error 101 "$out"
# The node's own namespace is never a pod's.
out=$(cni ADD p-node /proc/self/ns/net) && fail "ADD into the node's netns succeeded"
expect_error 4 "$out"
# A second interface in the same pod is a new attachment.
res2=$(cni ADD p1 "$P1" net1) || fail "ADD net1: $res2"
in_ns p1 ip link show net1 >/dev/null || fail "net1 missing"
cni DEL p1 "$P1" net1 >/dev/null || fail "DEL net1"
# CHECK notices a broken pod.
in_ns p1 ip addr del "$ADDR/32" dev eth0
out=$(cni CHECK p1 "$P1" eth0 "$prev") && fail "CHECK passed with the address removed"
expect_error 103 "$out"

# Older result versions: ips carry "version".
P2=$(newns p2)
res=$(CNI_VERSION=0.4.0 cni ADD p2 "$P2") || fail "ADD 0.4.0: $res"
[ "$(echo "$res" | jget 'd["cniVersion"] + "/" + d["ips"][0]["version"]')" = 0.4.0/4 ] ||
  fail "0.4.0 result: $res"

# prevResult from an earlier plugin in the chain is kept, and our ip points past its interfaces.
P3=$(newns p3)
chain=',"prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":"up0"}],"ips":[{"address":"192.0.2.5/24","interface":0}]}'
res=$(cni ADD p3 "$P3" eth0 "$chain") || fail "ADD with prevResult: $res"
[ "$(echo "$res" | jget 'd["interfaces"][0]["name"] + " " + d["ips"][0]["address"]')" = "up0 192.0.2.5/24" ] ||
  fail "prevResult not kept: $res"
[ "$(echo "$res" | jget 'd["interfaces"][d["ips"][1]["interface"]]["name"]')" = eth0 ] ||
  fail "our ip must index our interface: $res"
log "ok: results for 1.1.0, 0.4.0 and after a prevResult"

# Exhaustion: .2-.6 hold five pods; the sixth ADD fails clearly and STATUS says not available.
P4=$(newns p4); P5=$(newns p5); P6=$(newns p6)
cni ADD p4 "$P4" >/dev/null || fail "ADD p4"
cni ADD p5 "$P5" >/dev/null || fail "ADD p5"
out=$(cni ADD p6 "$P6") && fail "ADD beyond the pod CIDR succeeded: $out"
expect_error 102 "$out"
in_ns p6 ip link show eth0 >/dev/null 2>&1 && fail "a failed ADD left an interface behind"
out=$(cni_status) && fail "STATUS ok with no free address"
expect_error 50 "$out"

# DEL: repeated, never added, netns already gone.
cni DEL p1 "$P1" >/dev/null || fail "DEL p1"
cni DEL p1 "$P1" >/dev/null || fail "repeated DEL p1"
cni DEL never-added "$P1" >/dev/null || fail "DEL of a container never added"
cni_status || fail "STATUS not ok after an address was freed"
ip netns del "$T-p4"
cni DEL p4 "" >/dev/null || fail "DEL with the netns gone (empty CNI_NETNS)"
[ -z "$(endpoint_field p4 ipv4)" ] || fail "p4's record survived DEL"
res=$(cni ADD p6 "$P6") || fail "ADD p6 after DELs freed addresses: $res"
log "ok: DEL idempotent; freed addresses are reused"

# GC: every attachment of this network absent from cni.dev/valid-attachments goes.
valid=',"cni.dev/valid-attachments":[{"containerID":"p2","ifname":"eth0"},{"containerID":"p6","ifname":"eth0"}]'
netconf "$valid" | env -i CNI_COMMAND=GC CNI_PATH="$ROOT/bin" "$CNI" || fail "GC"
for gone in p3 p5; do
  [ -z "$(endpoint_field $gone ipv4)" ] || fail "GC left $gone"
  wait_for 5 link_absent "$T-$gone" eth0 || fail "GC left $gone's interface"
done
[ -n "$(endpoint_field p2 ipv4)" ] && [ -n "$(endpoint_field p6 ipv4)" ] || fail "GC removed a valid attachment"
[ "$(ls "$ROOT"/state/ipam/*/ | grep -c '^10\.')" = 2 ] || fail "GC did not free the addresses"
log "ok: GC removed p3 and p5, kept p2 and p6"

# The agent away: ADD says try again later, STATUS not available; DEL works after a restart.
stop_agent
out=$(cni ADD p5 "$P5") && fail "ADD with no agent succeeded"
expect_error 11 "$out"
out=$(cni_status) && fail "STATUS with no agent succeeded"
expect_error 50 "$out"
start_agent
cni DEL p2 "$P2" >/dev/null || fail "DEL after agent restart"
[ -z "$(endpoint_field p2 ipv4)" ] || fail "p2 survived DEL after restart"
wait_for 5 link_absent "$T-p2" eth0 || fail "p2's interface survived DEL after restart"

# Bad input: the spec's codes.
out=$(netconf | env -i CNI_COMMAND=ADD CNI_NETNS="$P5" CNI_IFNAME=eth0 CNI_PATH=/x "$CNI") && fail "ADD without CNI_CONTAINERID"
expect_error 4 "$out"; echo "$out" | grep -q CNI_CONTAINERID || fail "msg must name CNI_CONTAINERID"
out=$(echo '{not json' | env -i CNI_COMMAND=ADD CNI_CONTAINERID=x CNI_NETNS="$P5" CNI_IFNAME=eth0 CNI_PATH=/x "$CNI") && fail "bad JSON accepted"
expect_error 6 "$out"
out=$(CNI_VERSION=9.9.9 cni ADD p5 "$P5") && fail "unknown version accepted"
expect_error 1 "$out"
out=$(cni ADD p5 "$P5" eth0 ',"ipam":{"type":"host-local"}') && fail "ipam accepted"
expect_error 2 "$out"
out=$(echo '{"cniVersion":"1.1.0","name":"sluice","type":"bridge"}' | env -i CNI_COMMAND=ADD CNI_CONTAINERID=x CNI_NETNS="$P5" CNI_IFNAME=eth0 CNI_PATH=/x "$CNI") && fail "wrong type accepted"
expect_error 7 "$out"
echo "cni_contract_test: PASS"
