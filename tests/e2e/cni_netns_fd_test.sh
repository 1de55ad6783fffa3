#!/usr/bin/env bash
# The pod's network namespace as the runtime sees it (issue 29, section 3): sluice-cni opens
# CNI_NETNS itself and passes the descriptor to the agent over the endpoint socket (SCM_RIGHTS),
# so a namespace bind-mounted in a mount namespace the agent cannot see (a runtime's private
# tmpfs, podman's /run/user/...) and /proc/PID/ns/net work for ADD, CHECK and DEL. A request
# whose descriptor is missing, undeclared, doubled or not a network namespace is refused with
# code 4, and the agent closes every descriptor it receives (its fd count is the same after 200
# requests). Also the CNI defects of section 4: ADD and DEL under another network name, CHECK of
# a lost reservation or record, start-up reconciliation of IPAM, a stalled ADD, long container
# IDs and a prevResult of an unknown version.
POD_CIDR=10.244.0.0/28   # .2 to .14
source "$(dirname "$0")/lib.sh"
node_init
HOLDER=
cleanup() {
  [ -n "$HOLDER" ] && kill "$HOLDER" 2>/dev/null
  [ -e "$ROOT/state/ipam/10.244.0.0_28/last_reserved.tmp" ] &&
    timeout 2 cat "$ROOT/state/ipam/10.244.0.0_28/last_reserved.tmp" >/dev/null 2>&1
  teardown
}
trap cleanup EXIT

expect_error() {
  local code
  code=$(echo "$2" | jget 'd["code"]') || fail "not a CNI error object: $2"
  [ "$code" = "$1" ] || fail "want error code $1, got: $2"
  log "ok: error $1: $(echo "$2" | jget 'd["msg"]')"
}

setup_node
AGENT_ARGS="${AGENT_ARGS:-} --metrics_address=127.0.0.1:9874"
start_agent

# --- 1. A namespace only the runtime's mount namespace holds -----------------------------------
# The "runtime": a private mount namespace with a tmpfs at $HIDDEN and a pod netns bind-mounted
# on $HIDDEN/pod in it. The node (and the agent, whose `ip netns exec` mount namespace is a copy
# of the node's) sees an empty directory there.
HIDDEN=$ROOT/hidden
mkdir -p "$HIDDEN"
unshare -m --propagation private sh -c "mount -t tmpfs cni-hidden '$HIDDEN' &&
  touch '$HIDDEN/pod' && unshare --net='$HIDDEN/pod' true && touch '$ROOT/hidden-ready' &&
  exec sleep 600" &
HOLDER=$!
wait_for 10 test -f "$ROOT/hidden-ready" || fail "the runtime's mount namespace did not come up"
[ -e "$HIDDEN/pod" ] && fail "the node sees the hidden namespace"
nsenter -t "$AGENT_PID" -m test -e "$HIDDEN/pod" && fail "the agent sees the hidden namespace"

# cni_in_runtime COMMAND CONTAINERID NETNS [EXTRA_CONF]: sluice-cni run inside that mount namespace.
cni_in_runtime() {
  netconf "${4:-}" | nsenter -t "$HOLDER" -m -- env -i CNI_COMMAND="$1" CNI_CONTAINERID="$2" \
    CNI_NETNS="$3" CNI_IFNAME=eth0 CNI_PATH="$ROOT/bin" \
    CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=$2" "$CNI"
}
in_hidden_pod() { nsenter -t "$HOLDER" -m -- nsenter --net="$HIDDEN/pod" "$@"; }

res=$(cni_in_runtime ADD hidden "$HIDDEN/pod") || fail "ADD of a namespace the agent cannot see: $res"
HADDR=$(echo "$res" | jget 'd["ips"][0]["address"].split("/")[0]')
[ "$(echo "$res" | jget 'd["interfaces"][1]["sandbox"]')" = "$HIDDEN/pod" ] ||
  fail "the result must name the runtime's path: $res"
in_hidden_pod ip -4 -o addr show eth0 | grep -q "$HADDR/32" || fail "hidden pod has no $HADDR/32"
[ "$(endpoint_field hidden netns)" = "$HIDDEN/pod" ] || fail "the record must keep the path"
log "ok: ADD of $HIDDEN/pod (invisible to the agent) -> $HADDR"
cni_in_runtime CHECK hidden "$HIDDEN/pod" ",\"prevResult\":$res" >/dev/null ||
  fail "CHECK of the hidden pod failed"
# Traffic: the node reaches the pod through its veth.
ip netns exec "$NODE" ping -c1 -W2 "$HADDR" >/dev/null || fail "node cannot reach the hidden pod"
in_hidden_pod ip addr del "$HADDR/32" dev eth0
out=$(cni_in_runtime CHECK hidden "$HIDDEN/pod" ",\"prevResult\":$res") &&
  fail "CHECK passed with the hidden pod's address removed"
expect_error 103 "$out"
cni_in_runtime DEL hidden "$HIDDEN/pod" >/dev/null || fail "DEL of the hidden pod"
[ -z "$(endpoint_field hidden ipv4)" ] || fail "the hidden pod's record survived DEL"
wait_for 5 sh -c "! nsenter -t $HOLDER -m -- nsenter --net=$HIDDEN/pod ip link show eth0" ||
  fail "the hidden pod's interface survived DEL"

# /proc/PID/ns/net of a process in its own network namespace.
unshare -n sleep 600 &
PROCPOD=$!
wait_for 5 sh -c "[ \"\$(readlink /proc/$PROCPOD/ns/net)\" != \"\$(readlink /proc/self/ns/net)\" ]" ||
  fail "no namespace for the /proc pod"
res=$(cni ADD procpod "/proc/$PROCPOD/ns/net") || fail "ADD of /proc/$PROCPOD/ns/net: $res"
cni CHECK procpod "/proc/$PROCPOD/ns/net" eth0 ",\"prevResult\":$res" >/dev/null ||
  fail "CHECK of /proc/$PROCPOD/ns/net"
cni DEL procpod "/proc/$PROCPOD/ns/net" >/dev/null || fail "DEL of the /proc pod"
kill "$PROCPOD"
log "ok: ADD, CHECK and DEL of /proc/PID/ns/net"

# --- 2. Hostile descriptors, and none leaks ------------------------------------------------------
P1=$(ip netns add "$T-p1" && echo "/var/run/netns/$T-p1")
res1=$(cni ADD p1 "$P1") || fail "ADD p1: $res1"
# raw_request SPEC: a client that sends the endpoint request itself, with the descriptors SPEC
# names: "none", "netns" (p1's), "null" (/dev/null), "two" (p1's twice); prints the reply's code.
raw_request() {
  /usr/bin/python3 - "$ROOT/sluice.sock" "$P1" "$1" "$2" "$(netconf)" <<'PY'
import array, json, os, socket, sys
path, netns, spec, command, conf = sys.argv[1:]
req = {"command": command, "containerID": "p1", "netns": netns, "ifName": "eth0", "args": "",
       "config": json.loads(conf)}
fds = {"none": [], "netns": [os.open(netns, os.O_RDONLY)], "null": [os.open("/dev/null", os.O_RDONLY)],
       "two": [os.open(netns, os.O_RDONLY), os.open(netns, os.O_RDONLY)]}[spec.split(":")[0]]
if spec.endswith(":declared"):
    req["netnsFd"] = True
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(path)
data = json.dumps(req).encode()
anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
s.sendmsg([data], anc)
s.shutdown(socket.SHUT_WR)
reply = b""
while chunk := s.recv(65536):
    reply += chunk
r = json.loads(reply)
print(0 if r.get("ok") else r.get("code"))
PY
}
agent_fds() { ls "/proc/$AGENT_PID/fd" | wc -l; }
expect_code() {  # expect_code WANT SPEC COMMAND
  local got; got=$(raw_request "$2" "$3") || fail "raw $3 with $2 descriptor(s) failed"
  [ "$got" = "$1" ] || fail "$3 with descriptors \"$2\": want code $1, got $got"
}
expect_code 0 netns:declared CHECK
expect_code 4 none:declared CHECK        # declares a descriptor, sends none
expect_code 4 netns CHECK                # sends one it does not declare
expect_code 4 null:declared CHECK        # /dev/null is no network namespace
expect_code 4 two:declared CHECK         # one namespace, two descriptors
expect_code 4 netns:declared DEL         # DEL takes no namespace
expect_code 4 null:declared ADD
expect_code 0 none CHECK                 # an older plugin: the agent opens the path, as before
log "ok: missing, undeclared, doubled and non-namespace descriptors are code 4"
grep -q "declares the descriptor of CNI_NETNS" "$ROOT/log/agent.log" || fail "refusal not logged"
sample() {  # sample METRIC: its value on the agent's /metrics (0 when absent)
  local out
  out=$(ip netns exec "$NODE" curl -sf -m 2 http://127.0.0.1:9874/metrics) || return 1
  awk -v m="$1" '$1 == m {v = $2} END {print v + 0}' <<<"$out"
}
BAD_NETNS=$(sample 'sluice_endpoint_requests_refused_total{reason="bad_netns"}')
[ "$BAD_NETNS" -ge 3 ] || fail "sluice_endpoint_requests_refused_total{reason=\"bad_netns\"} is $BAD_NETNS, want the refusals above counted"
PATHS=$(sample 'sluice_endpoint_netns_paths_opened_total')
[ "$PATHS" -ge 1 ] || fail "sluice_endpoint_netns_paths_opened_total is $PATHS after an older plugin's CHECK"
log "ok: refusals counted on /metrics (bad_netns $BAD_NETNS, paths opened for older plugins $PATHS)"
# Bytes that are no request: the server answers them (and the doubled descriptors above) before
# the endpoint service sees anything, and counts them apart.
/usr/bin/python3 - "$ROOT/sluice.sock" <<'PY' || fail "garbage request: no reply"
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(b"{\"command\": [not json")
s.shutdown(socket.SHUT_WR)
reply = b""
while chunk := s.recv(65536):
    reply += chunk
assert json.loads(reply).get("ok") is not True, reply
PY
BAD_REQUEST=$(sample 'sluice_endpoint_api_requests_refused_total{reason="bad_request"}')
BAD_FDS=$(sample 'sluice_endpoint_api_requests_refused_total{reason="bad_fds"}')
[ "$BAD_REQUEST" -ge 1 ] || fail "sluice_endpoint_api_requests_refused_total{reason=\"bad_request\"} is $BAD_REQUEST after a request that is no JSON"
[ "$BAD_FDS" -ge 1 ] || fail "sluice_endpoint_api_requests_refused_total{reason=\"bad_fds\"} is $BAD_FDS after a request with two descriptors"
log "ok: the server's own refusals counted on /metrics (bad_request $BAD_REQUEST, bad_fds $BAD_FDS)"

before=$(agent_fds)
for i in $(seq 1 25); do
  for spec in netns:declared none:declared netns null:declared two:declared; do
    raw_request "$spec" CHECK >/dev/null || fail "raw CHECK $spec"
  done
  raw_request netns:declared DEL >/dev/null 2>&1 || true
  cni CHECK p1 "$P1" eth0 ",\"prevResult\":$res1" >/dev/null || fail "CHECK p1 ($i)"
  raw_request netns:declared ADD >/dev/null || fail "raw ADD p1 ($i)"  # the retried ADD
done
wait_for 10 sh -c "[ \$(ls /proc/$AGENT_PID/fd | wc -l) -le $before ]" ||
  fail "the agent holds $(agent_fds) descriptors after 200 requests, $before before"
log "ok: $before descriptors before and $(agent_fds) after 200 requests with descriptors"

# --- 3. Another network name for a live attachment ---------------------------------------------
netconf_named() {
  printf '{"cniVersion":"1.1.0","name":"%s","type":"sluice","socketPath":"%s"%s}' "$1" \
    "$ROOT/sluice.sock" "${2:-}"
}
cni_named() {  # cni_named NETWORK COMMAND CONTAINERID NETNS
  netconf_named "$1" | env -i CNI_COMMAND="$2" CNI_CONTAINERID="$3" CNI_NETNS="$4" \
    CNI_IFNAME=eth0 CNI_PATH="$ROOT/bin" CNI_ARGS="K8S_POD_NAME=$3" "$CNI"
}
ADDR1=$(echo "$res1" | jget 'd["ips"][0]["address"].split("/")[0]')
out=$(cni_named other ADD p1 "$P1") && fail "ADD of p1/eth0 under another network name succeeded: $out"
expect_error 101 "$out"
in_ns p1 ip -4 -o addr show eth0 | grep -q "$ADDR1/32" || fail "the live pod was re-addressed"
[ "$(endpoint_field p1 networkName)" = sluice ] || fail "the record changed network"
out=$(cni_named other CHECK p1 "$P1") && fail "CHECK under another network name passed"
expect_error 3 "$out"
cni_named other DEL p1 "$P1" >/dev/null || fail "DEL under another network name must succeed (nothing of it)"
[ "$(endpoint_field p1 ipv4)" = "$ADDR1" ] || fail "DEL under another network name removed the pod"
in_ns p1 ip -4 -o addr show eth0 | grep -q "$ADDR1/32" || fail "DEL under another network name touched the pod"
cni CHECK p1 "$P1" eth0 ",\"prevResult\":$res1" >/dev/null || fail "p1 broken after the other network's requests"
log "ok: ADD under another network name is 101 and leaves the pod; its DEL leaves it too"

# --- 4. CHECK of a lost reservation or record; IPAM reconciled at start-up ----------------------
IPAMDIR=$ROOT/state/ipam/10.244.0.0_28
[ -f "$IPAMDIR/$ADDR1" ] || fail "no reservation file for $ADDR1"
rm "$IPAMDIR/$ADDR1"
out=$(cni CHECK p1 "$P1" eth0 ",\"prevResult\":$res1") && fail "CHECK passed with the reservation file gone"
expect_error 103 "$out"
echo "$out" | grep -q "reservation" || fail "CHECK must name the reservation: $out"
# The agent restarts with the file still gone: the live pod keeps its address.
stop_agent
start_agent
[ -f "$IPAMDIR/$ADDR1" ] || fail "start-up did not reserve the live pod's $ADDR1 again"
P2=$(ip netns add "$T-p2" && echo "/var/run/netns/$T-p2")
res2=$(cni ADD p2 "$P2") || fail "ADD p2: $res2"
ADDR2=$(echo "$res2" | jget 'd["ips"][0]["address"].split("/")[0]')
[ "$ADDR2" != "$ADDR1" ] || fail "two pods share $ADDR1"
cni CHECK p1 "$P1" eth0 ",\"prevResult\":$res1" >/dev/null || fail "CHECK p1 after the restart"
log "ok: a live pod's lost reservation is held again at start-up ($ADDR1; the next pod got $ADDR2)"
REC=$(ls "$ROOT"/state/endpoints/p2-eth0.json)
mv "$REC" "$ROOT/p2-record"
out=$(cni CHECK p2 "$P2" eth0 ",\"prevResult\":$res2") && fail "CHECK passed with the endpoint record gone"
expect_error 103 "$out"
mv "$ROOT/p2-record" "$REC"
cni CHECK p2 "$P2" eth0 ",\"prevResult\":$res2" >/dev/null || fail "CHECK p2 with its record back"
log "ok: CHECK fails when the endpoint record is gone"

# --- 5. A stalled ADD holds up only itself -------------------------------------------------------
# A FIFO where IPAM writes its cursor: the next ADD blocks writing it, holding whatever it holds.
reservations() { ls "$IPAMDIR" | grep -c '^10\.'; }
held=$(reservations)
mkfifo "$IPAMDIR/last_reserved.tmp"
P3=$(ip netns add "$T-p3" && echo "/var/run/netns/$T-p3")
(cni ADD p3 "$P3" > "$ROOT/p3.out") &
STALLED=$!
wait_for 10 output_gt "$held" reservations || fail "the stalled ADD did not reach its cursor write"
# within SECONDS CMD...: CMD answers, successfully, within SECONDS.
within() {
  local limit=$1; shift
  local start=$SECONDS
  rm -f "$ROOT/within.rc"
  ( "$@" >/dev/null; echo $? > "$ROOT/within.rc" ) &
  wait_for "$limit" test -s "$ROOT/within.rc" || fail "$* waited over $limit s for a stalled ADD"
  [ "$(cat "$ROOT/within.rc")" = 0 ] || fail "$* failed while an ADD was stalled"
  log "ok: $* answered in $((SECONDS - start)) s while an ADD was stalled"
}
within 5 cni_status
within 5 cni CHECK p1 "$P1" eth0 ",\"prevResult\":$res1"
within 5 cni DEL p2 "$P2"
kill -0 "$STALLED" 2>/dev/null || fail "the ADD was not stalled"
timeout 5 cat "$IPAMDIR/last_reserved.tmp" >/dev/null   # a reader: the stalled write completes
wait "$STALLED" || fail "the stalled ADD failed once released: $(cat "$ROOT/p3.out")"
log "ok: STATUS, CHECK and DEL answered at once while an ADD was stalled"

# --- 6. Long container IDs, prevResult versions ----------------------------------------------
long=$(printf 'c%.0s' $(seq 1 242))
out=$(cni ADD "$long" "$P2") && fail "ADD with a 242-character container ID succeeded"
expect_error 4 "$out"
echo "$out" | grep -q CNI_CONTAINERID || fail "msg must name CNI_CONTAINERID: $out"
fits=$(printf 'c%.0s' $(seq 1 241))
P4=$(ip netns add "$T-p4" && echo "/var/run/netns/$T-p4")
res4=$(cni ADD "$fits" "$P4") || fail "ADD with a 241-character container ID: $res4"
cni DEL "$fits" "$P4" >/dev/null || fail "DEL of the 241-character container ID"
out=$(cni CHECK p1 "$P1" eth0 ',"prevResult":{"cniVersion":"9.9.9","ips":[]}') &&
  fail "CHECK accepted a prevResult of version 9.9.9"
expect_error 1 "$out"
echo "cni_netns_fd_test: PASS"
