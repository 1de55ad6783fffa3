#!/usr/bin/env bash
# Service load balancing (ClusterIP) end to end in a 2-node sluice-lab, with real TCP/UDP from a
# client pod:
#   - 3 backends over 2 nodes: >= 300 connections reach every backend, none below 15%;
#   - backends scaled 3 -> 10 -> 1 (pods created/deleted, the lab has no Deployments) while the
#     client connects in a loop: zero failed connections;
#   - a UDP Service whose only backend is replaced: the client's flow (one source port) moves to
#     the new backend at once, although the old pod still serves while terminating;
#   - a pod reaching a NodePort (externalTrafficPolicy: Cluster) on its own node's address and
#     the other node's, backend on the other node: answered, and the backend sees the pod's own
#     address (no masquerade; the return path works in both routing modes);
#   - the client node's agent restarted during continuous connections: none fails, and the
#     restarted agent keeps every id (sluicectl services prints the same maps).
# REJECT and NodePort checks live in their own script.
set -euo pipefail
NAME=sv$$
source "$(dirname "$0")/lib.sh"
lab_init
WORK=$(mktemp -d /tmp/sluice-service-test.XXXXXX)
KEEP_LOGS=/tmp/service_test-$NAME
# The clients still running stop before the lab goes.
before_down() {
  for f in scale udp restart; do touch "$WORK/$f.json.stop"; done 2>/dev/null || true
  for f in csum-dnat csum-revnat-tcp csum-revnat-udp; do touch "$WORK/$f.stop"; done 2>/dev/null || true
}

KUBECONFIG_PATH=$("$LAB" up --nodes 2 --name "$NAME") || fail "up"
log "lab $NAME up"

# The client: N connections (or until OUT.stop exists), one "hostname" request each; writes a
# JSON summary {total, failures, by_backend, errors, timeline} to OUT.
cat >"$WORK/client.py" <<'PY'
import collections, json, os, socket, sys, time
mode, host, port, out, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
seen, errors, timeline = collections.Counter(), [], []
udp = None
if mode == "udp":  # one socket, one source port: one conntrack flow for the whole stream
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("", 0))
    udp.settimeout(0.3)
n = 0
while (count and n < count) or (not count and not os.path.exists(out + ".stop")):
    n += 1
    t = time.time()
    try:
        if udp:
            udp.sendto(b"hostname\n", (host, port))
            data, src = udp.recvfrom(4096)
            if src != (host, port):  # replies must come from the frontend
                raise RuntimeError(f"reply from {src}: {data!r}")
        else:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.settimeout(1)  # replies come in well under a millisecond in the lab
                try:
                    s.connect((host, port))
                except Exception as e:  # name the source port: its conntrack entry tells why
                    raise RuntimeError(f"{e!r} from port {s.getsockname()[1]}")
                s.sendall(b"hostname\n")
                data = b""
                while not data.endswith(b"\n"):
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    data += chunk
        name = data.decode().strip()
        if not name:
            raise RuntimeError("empty reply")
        seen[name] += 1
        timeline.append([t, name])
        if not os.path.exists(out + ".started"):
            open(out + ".started", "w").close()
    except Exception as e:
        errors.append([t, repr(e)])
        timeline.append([t, None])
    time.sleep(0.05 if udp else 0.002)  # the stream's pace
tmp = out + ".tmp"
with open(tmp, "w") as f:
    json.dump({"total": n, "failures": len(errors), "by_backend": seen, "errors": errors,
               "timeline": timeline}, f)
os.rename(tmp, out)
PY
CLIENT_PIDS=()
start_client() {  # start_client MODE HOST PORT OUT: runs until stop_client OUT
  rm -f "$WORK/$4" "$WORK/$4.stop" "$WORK/$4.started"
  lab exec client -- python3 "$WORK/client.py" "$1" "$2" "$3" "$WORK/$4" 0 &
  CLIENT_PIDS+=($!)
  wait_for 30 test -f "$WORK/$4.started" || fail "client $4 got no answer"
}
stop_client() {  # stop_client OUT: stops it and waits for its summary
  touch "$WORK/$1.stop"
  wait_for 30 test -f "$WORK/$1" || fail "client $1 wrote no summary"
}
summary() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$WORK/$1" "$2"; }
# ct_of_failed OUT: node1's conntrack entries of the failed connections' source ports, and how
# many failures a stale entry explains: one whose backend is no longer any pod's address (a new
# SYN reusing the source port of a closed connection to a deleted backend).
ct_of_failed() {
  bpftool -j map dump pinned "$DIR/node1/bpf/sluice_ct4" >"$WORK/ct.json" 2>/dev/null || return 0
  K get pods -o jsonpath='{.items[*].status.podIP}' >"$WORK/pod-ips" || true
  python3 - "$WORK/$1" "$WORK/ct.json" "$WORK/pod-ips" <<'PY'
import ipaddress, json, re, socket, sys
d, ct = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
live = set(open(sys.argv[3]).read().split())
ports = {int(m.group(1)) for _, e in d["errors"] for m in [re.search(r"from port (\d+)", e)] if m}
stale = 0
for e in ct:
    f = e.get("formatted", {})
    k, v = f.get("key", {}), f.get("value", {})
    if k and socket.ntohs(k["sport"]) in ports and k["dir"] == 0:
        be = str(ipaddress.IPv4Address(socket.ntohl(v["backend_addr"])))
        gone = be not in live
        stale += gone
        print(f"conntrack of port {socket.ntohs(k['sport'])} -> backend {be} id {v['backend_id']}"
              + (" (no pod has that address any more: stale entry reused by a new SYN)" if gone else ""))
print(f"stale-conntrack failures: {stale}")
PY
}
expect_no_failures() {  # expect_no_failures OUT WHAT
  local total failures diag
  total=$(summary "$1" 'd["total"]'); failures=$(summary "$1" 'd["failures"]')
  if [ "$failures" != 0 ]; then
    diag=$(ct_of_failed "$1")
    # SLUICE_E2E_KNOWN_CT_REUSE=1 tolerates only failures a stale conntrack entry explains (a
    # datapath issue of its own: TCP entries outlive their connection and a new SYN reuses them).
    if [ "${SLUICE_E2E_KNOWN_CT_REUSE:-0}" = 1 ] &&
       [ "$(echo "$diag" | sed -n 's/^stale-conntrack failures: //p')" = "$failures" ]; then
      log "WARNING: $2: $failures of $total connections failed on stale conntrack entries:
$diag"
    else
      fail "$2: $failures of $total connections failed: $(summary "$1" 'd["errors"][:5]')
$diag"
    fi
  fi
  [ "$total" -ge 20 ] || fail "$2: only $total connections made"
  log "ok: $2: $total connections, $failures failed, by backend $(summary "$1" 'dict(d["by_backend"])')"
}

# backend_yaml POD NODE [APP]: a pod labelled app=APP (web) serving TCP and UDP 8080. The lab's
# kubelet reports it Ready once both are bound, so the Service never sends it a connection early.
backend_yaml() { pod_manifest "$1" --labels "app=${3:-web}" --node "$2" --ports 8080,8080/UDP; }
{
  cat <<'YAML'
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: dns}
spec:
  selector: {app: dns}
  ports: [{name: dns, port: 53, targetPort: 8080, protocol: UDP}]
YAML
  pod_manifest client --node node1
} | K apply --validate=false -f - >/dev/null || fail "apply"
K wait --for=condition=Ready pod/client --timeout=60s >/dev/null ||
  fail "client not Ready: $(K get pods -o yaml)"
WEB=$(K get svc web -o jsonpath='{.spec.clusterIP}')
DNS=$(K get svc dns -o jsonpath='{.spec.clusterIP}')
[ -n "$WEB" ] && [ -n "$DNS" ] || fail "no ClusterIPs"
log "web=$WEB dns=$DNS"
# add_backends POD:NODE[:APP]...: creates the pods and waits for their Ready condition.
add_backends() {
  local spec pod node app pods=()
  for spec in "$@"; do
    IFS=: read -r pod node app <<<"$spec"
    backend_yaml "$pod" "$node" "${app:-web}"
  done | K apply --validate=false -f - >/dev/null || fail "apply backends $*"
  for spec in "$@"; do pods+=("${spec%%:*}"); done
  K wait --for=condition=Ready $(printf 'pod/%s ' "${pods[@]}") --timeout=30s >/dev/null ||
    fail "backends not Ready: $*"
}
add_backends web-1:node1 web-2:node2 web-3:node2 dns-a:node2:dns
# The agent programs the Services once it has listed everything: wait for all 3 backends.
backends_of() {  # backends_of NODE VIP PORT: slot count of the frontend in NODE's maps
  "$SLUICECTL" --bpffs_root="$DIR/$1/bpf" services | awk -v f="$2:$3" '$1 == f {print $6}'
}
wait_for 30 output_is 3 backends_of node1 "$WEB" 80 ||
  fail "node1 does not program web with 3 backends: $("$SLUICECTL" --bpffs_root="$DIR/node1/bpf" services)"

# Each phase's client takes source ports from its own range, so a phase never reuses a tuple an
# earlier phase left in conntrack (that is the scale phase's subject, not the restart's).
client_ports() { lab exec client -- sysctl -qw net.ipv4.ip_local_port_range="$1 $2"; }
client_ports 10000 39999

# 1. Distribution, with the checksums of what Sluice translated checked where it arrives: the
# DNATed packets in web-1 (balanced from the client on the same node), the reverse-translated
# replies in the client (TCP from the 3 backends, UDP from dns-a on node2). Pods' packets carry
# partial checksums over veths, which no receiver here would verify.
# start_csum POD PORT NAME / csum_ok NAME: csum_capture.py in POD's namespace, then its verdict.
start_csum() {
  rm -f "$WORK/$3".{ready,stop,json}
  lab exec "$1" -- python3 "$HERE/csum_capture.py" --port "$2" --ready "$WORK/$3.ready" \
    --stop "$WORK/$3.stop" --out "$WORK/$3.json" &
  CLIENT_PIDS+=($!)
  wait_for 30 test -f "$WORK/$3.ready" || fail "csum_capture in $1 did not start"
}
csum_ok() {
  touch "$WORK/$1.stop"
  wait_for 30 test -f "$WORK/$1.json" || fail "csum_capture $1 wrote nothing"
  log "checksums, $1: $(cat "$WORK/$1.json")"
  [ "$(summary "$1.json" 'd["partial_bad"] + d["full_bad"]')" = 0 ] &&
    [ "$(summary "$1.json" 'd["partial_ok"] + d["full_ok"]')" -gt 0 ]
}
start_csum web-1 8080 csum-dnat
start_csum client 80 csum-revnat-tcp
start_csum client 53 csum-revnat-udp
lab exec client -- python3 "$WORK/client.py" tcp "$WEB" 80 "$WORK/spread.json" 300 ||
  fail "client"
lab exec client -- python3 "$WORK/client.py" udp "$DNS" 53 "$WORK/csum-udp.json" 20 ||
  fail "udp client"
csum_ok csum-dnat || fail "DNATed packets in web-1 with a wrong L4 checksum"
csum_ok csum-revnat-tcp || fail "reverse-translated TCP replies with a wrong L4 checksum"
csum_ok csum-revnat-udp || fail "reverse-translated UDP replies with a wrong L4 checksum"
[ "$(summary csum-dnat.json 'd["partial_ok"]')" -gt 0 ] ||
  fail "no partial checksum among web-1's DNATed packets: the inline update went untested"
log "ok: translated TCP and UDP packets arrive with right L4 checksums (partial ones included)"
[ "$(summary spread.json 'd["failures"]')" = 0 ] || fail "spread: $(summary spread.json 'd["errors"][:5]')"
python3 - "$WORK/spread.json" <<'PY' || fail "uneven spread"
import json, sys
d = json.load(open(sys.argv[1]))
seen = d["by_backend"]
print("spread over 300 connections:", dict(seen), file=sys.stderr)
assert set(seen) == {"web-1", "web-2", "web-3"}, seen
assert min(seen.values()) >= 0.15 * d["total"], seen
PY
log "ok: 300 connections reach web-1, web-2 and web-3, each >= 15%"

# 2. Scale 3 -> 10 -> 1 under continuous connections.
start_client tcp "$WEB" 80 scale.json
add_backends $(for i in $(seq 4 10); do echo "web-$i:node$((i % 2 + 1))"; done)
wait_for 30 output_is 10 backends_of node1 "$WEB" 80 || fail "web not at 10 backends"
log "scaled up to 10"
K delete pod $(for i in $(seq 2 10); do echo web-$i; done) --grace-period=2 --wait=false >/dev/null
wait_for 30 output_is 1 backends_of node1 "$WEB" 80 || fail "web not down to 1 backend"
wait_for 60 sh -c "[ \$(kubectl --kubeconfig $KUBECONFIG_PATH get pods -o name | grep -c pod/web-) = 1 ]" ||
  fail "scaled-down pods not gone"
log "scaled down to 1"
stop_client scale.json
expect_no_failures scale.json "scale 3 -> 10 -> 1"
[ "$(summary scale.json 'len(d["by_backend"])')" -ge 10 ] ||
  fail "the client did not see the scaled-up backends: $(summary scale.json 'dict(d["by_backend"])')"
# After the last delete only web-1 answers.
lab exec client -- python3 "$WORK/client.py" tcp "$WEB" 80 "$WORK/after.json" 30 || fail "client"
[ "$(summary after.json 'list(d["by_backend"])')" = "['web-1']" ] ||
  fail "after scale-down: $(summary after.json 'dict(d["by_backend"])')"

# 3. UDP: the only backend is replaced; the old one keeps serving while terminating (30s grace),
# yet the client's flow moves to the new one as soon as the old leaves the Service.
start_client udp "$DNS" 53 udp.json
add_backends dns-b:node1:dns
wait_for 30 output_is 2 backends_of node1 "$DNS" 53 || fail "dns not at 2 backends"
SWITCH=$(date +%s.%N)
K delete pod dns-a --grace-period=30 --wait=false >/dev/null
wait_for 30 output_is 1 backends_of node1 "$DNS" 53 || fail "dns-a not removed from dns"
# The stream is observed for 2s past the removal (a measurement window, not a synchronisation).
sleep 2
stop_client udp.json
python3 - "$WORK/udp.json" "$SWITCH" <<'PY' || fail "UDP flow did not move to the new backend"
import json, sys
d, switch = json.load(open(sys.argv[1])), float(sys.argv[2])
tl = d["timeline"]
runs = []  # (first t relative to the delete, name, count)
for t, n in tl:
    if runs and runs[-1][1] == n:
        runs[-1][2] += 1
    else:
        runs.append([round(t - switch, 2), n, 1])
print("UDP stream (t from the delete, reply, datagrams):", runs, file=sys.stderr)
print("first errors:", d["errors"][:5], file=sys.stderr)
before = [n for t, n in tl if t < switch]
assert before and all(n == "dns-a" for n in before if n), ("before the switch", before[-5:])
after = [(t, n) for t, n in tl if t >= switch]
first_b = next((t for t, n in after if n == "dns-b"), None)
assert first_b is not None, ("never reached dns-b", after[-5:])
late_a = [t for t, n in after if n == "dns-a" and t > first_b]
assert not late_a, ("went back to dns-a", len(late_a))
lost = [t for t, n in after if n is None]
print(f"UDP flow moved {first_b - switch:.2f}s after the delete; {len(lost)} datagrams unanswered",
      file=sys.stderr)
assert first_b - switch < 3.0 and len(lost) <= 5, (first_b - switch, len(lost))
PY
log "ok: UDP flow moved from dns-a to dns-b at once"

# 3b. A pod reaching a NodePort (externalTrafficPolicy: Cluster) whose backend is on the other
# node, through its own node's address and the other node's: kube-proxy masquerades such a flow
# to the node address; Sluice translates it at the client pod's own hook and keeps the pod's
# address (docs/operating.md). The backend sees the client pod's address, and its replies find
# their way back to be reverse-translated: over the overlay, and over native routes
# (service_native_test.sh runs this script with --routing_mode=native).
K apply --validate=false -f - >/dev/null <<'YAML' || fail "apply np"
apiVersion: v1
kind: Service
metadata: {name: np}
spec:
  type: NodePort
  externalTrafficPolicy: Cluster
  selector: {app: np}
  ports: [{name: http, port: 80, targetPort: 8080}]
YAML
add_backends np-1:node2:np
NP=$(K get svc np -o jsonpath='{.spec.ports[0].nodePort}')
CLIENT_IP=$(K get pod client -o jsonpath='{.status.podIP}')
node_address() { K get node "$1" -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}'; }
NODE1_IP=$(node_address node1)
NODE2_IP=$(node_address node2)
np_answer() { lab request --from default/client --to "$1:$NP" --data "$2" --timeout 2; }
for node_ip in "$NODE1_IP" "$NODE2_IP"; do
  wait_for 30 output_is np-1 np_answer "$node_ip" hostname ||
    fail "pod -> $node_ip:$NP (NodePort, backend on node2) does not answer: $(np_answer "$node_ip" hostname 2>&1)"
  seen=$(np_answer "$node_ip" clientip)  # address:port, as the backend's socket sees it
  [ "${seen%:*}" = "$CLIENT_IP" ] ||
    fail "pod -> $node_ip:$NP: the backend saw $seen, not the client pod $CLIENT_IP"
done
log "ok: pod -> NodePort on node1 and node2, backend on node2: answered, the backend sees the pod's own address ($CLIENT_IP)"

# 4. Restart the client node's agent during continuous connections.
add_backends web-2:node2
wait_for 30 output_is 2 backends_of node1 "$WEB" 80 || fail "web not at 2 backends"
BEFORE=$("$SLUICECTL" --bpffs_root="$DIR/node1/bpf" services)
AGENT_PID=$(python3 -c 'import json,sys; print([n["agentPid"] for n in json.load(open(sys.argv[1]))["nodes"] if n["name"] == "node1"][0])' "$DIR/status.json")
mapfile -d '' AGENT_ARGV <"/proc/$AGENT_PID/cmdline"
NODE1_NETNS=$(python3 -c 'import json,sys; print([n["netns"] for n in json.load(open(sys.argv[1]))["nodes"] if n["name"] == "node1"][0])' "$DIR/status.json")
client_ports 40000 60999
start_client tcp "$WEB" 80 restart.json
# Held down: the lab would otherwise restart it itself (as a DaemonSet would).
lab agent stop --node node1 >/dev/null || fail "stop node1's agent"
wait_for 20 sh -c "! kill -0 $AGENT_PID" || fail "agent did not stop"
log "node1's agent stopped"
# Same command line, now ours to stop.
ip netns exec "$NODE1_NETNS" "${AGENT_ARGV[@]}" >"$WORK/agent-restarted.log" 2>&1 &
RESTARTED_AGENT=$!
disown "$RESTARTED_AGENT"
wait_for 60 grep -q "Services programmed after the first full sync" "$WORK/agent-restarted.log" ||
  fail "restarted agent did not program the Services"
log "node1's agent restarted"
# Keep connecting a moment after the resync.
lab exec client -- python3 "$WORK/client.py" tcp "$WEB" 80 "$WORK/post.json" 50 || fail "client"
stop_client restart.json
expect_no_failures restart.json "agent restart"
AFTER=$("$SLUICECTL" --bpffs_root="$DIR/node1/bpf" services)
[ "$BEFORE" = "$AFTER" ] || fail "maps changed across the restart:
--- before
$BEFORE
--- after
$AFTER"
log "ok: the restarted agent kept every id and slot"
echo "service_test: PASS"
