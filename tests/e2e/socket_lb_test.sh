#!/usr/bin/env bash
# Socket-level load balancing end to end in a 2-node sluice-lab: processes on a node (not in a
# pod) reach ClusterIP Services through the cgroup programs of their node's agent.
#   - TCP from node1 reaches backends on both nodes; getpeername() shows the ClusterIP;
#   - UDP from node2 gets its reply from the ClusterIP:port it sent to;
#   - a connected UDP socket of node2 is closed when its backend goes, and reconnects elsewhere;
#   - a Service without endpoints, and a port the ClusterIP does not define, refuse at once;
#   - every agent attached once, through links pinned in its own bpffs, all on the cgroup2 root;
#   - node1's agent stopped: its programs stay and keep translating; restarted: the same links
#     run the new programs (updated in place, no second attachment);
#   - `down` leaves no program attached.
set -euo pipefail
NAME=sl$$
source "$(dirname "$0")/lib.sh"
lab_init
WORK=$(mktemp -d /tmp/sluice-socket-lb-test.XXXXXX)
HOOKS="connect4 sendmsg4 recvmsg4 getpeername4"

CG2=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)
[ -n "$CG2" ] || fail "no cgroup2 mount"
cgroup_progs() { bpftool cgroup tree "$CG2"; }
# link_prog NODE HOOK: the program id in NODE's pinned link for HOOK.
link_prog() {
  bpftool link show pinned "$DIR/$1/bpf/links/sluice_sock_$2" 2>/dev/null |
    sed -n 's/.* cgroup  *prog \([0-9]*\).*/\1/p'
}
link_id() {
  bpftool link show pinned "$DIR/$1/bpf/links/sluice_sock_$2" 2>/dev/null | sed -n 's/^\([0-9]*\): .*/\1/p'
}

KUBECONFIG_PATH=$("$LAB" up --nodes 2 --name "$NAME") || fail "up"
log "lab $NAME up"

{
  pod_manifest a --labels app=web --node node1 --ports 8080,8080/UDP
  pod_manifest c --labels app=web --node node2 --ports 8080,8080/UDP
  cat <<'YAML'
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: 8080, protocol: TCP}
  - {name: dns, port: 53, targetPort: 8080, protocol: UDP}
---
apiVersion: v1
kind: Service
metadata: {name: empty}
spec:
  selector: {app: nothing}
  ports:
  - {name: http, port: 80, targetPort: 8080}
YAML
} | K apply --validate=false -f - >/dev/null || fail "apply"
K wait --for=condition=Ready pod/a pod/c --timeout=60s >/dev/null ||
  fail "pods not Ready: $(K get pods -o yaml)"
WEB=$(K get svc web -o jsonpath='{.spec.clusterIP}')
EMPTY=$(K get svc empty -o jsonpath='{.spec.clusterIP}')
[ -n "$WEB" ] && [ -n "$EMPTY" ] || fail "no ClusterIPs"
log "web=$WEB empty=$EMPTY"

# Each agent attached its four programs once, through links pinned in its own bpffs.
for n in node1 node2; do
  for hook in $HOOKS; do
    prog=$(link_prog "$n" "$hook")
    [ -n "$prog" ] || fail "$n: no socket-LB link for $hook"
    grep -q "^ *$prog " <<<"$(cgroup_progs)" || fail "$n: $hook program $prog not on $CG2"
  done
done
log "ok: both agents' socket-LB links pinned and attached to $CG2"

# The agents program the Services once they have listed everything.
wait_for 30 sh -c "[ \"\$($LAB request --name $NAME --from node/node1 --to $WEB:80 --data hostname --timeout 1)\" = a ] ||
                   [ \"\$($LAB request --name $NAME --from node/node1 --to $WEB:80 --data hostname --timeout 1)\" = c ]" ||
  fail "node1 cannot reach web at $WEB:80"
seen=$(for _ in $(seq 20); do lab request --from node/node1 --to "$WEB:80" --data hostname; done |
  sort -u | tr '\n' ' ')
expect "20 TCP requests node1 -> web reach" "$seen" "a c "
peer=$(lab exec node/node1 -- python3 -c "
import socket
s = socket.create_connection(('$WEB', 80), timeout=5)
print('%s:%d' % s.getpeername())")
expect "getpeername() on node1" "$peer" "$WEB:80"
got=$(lab exec node/node2 -- python3 -c "
import socket
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(5)
u.sendto(b'hostname', ('$WEB', 53))
data, src = u.recvfrom(100)
print('%s %s:%d' % (data.decode().strip(), src[0], src[1]))")
case $got in
  "a $WEB:53" | "c $WEB:53") log "ok: UDP node2 -> web answered from the ClusterIP ($got)" ;;
  *) fail "UDP node2 -> web: got '$got'" ;;
esac
# A connected UDP socket of node2 stays on its backend: when that backend goes, node2's agent
# closes the socket (its send() runs no hook that could move it), the application's next call
# fails (send: EDESTADDRREQ, recv: ECONNABORTED), and a new connect() reaches the backend that is
# left. (Before, the socket kept sending to the deleted pod.)
lab exec node/node2 -- python3 -c "
import errno, socket, sys, time
def connect():
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(0.5)
    u.connect(('$WEB', 53))
    return u
u = connect()
u.send(b'hostname')
print('first', u.recv(100).decode().strip(), flush=True)
start = time.time()
while time.time() - start < 30:
    try:
        u.send(b'hostname')
        u.recv(100)
    except socket.timeout:
        continue
    except OSError as e:
        # Closed: send() finds the socket no longer connected, recv() gets the abort.
        if e.errno not in (errno.ECONNABORTED, errno.EDESTADDRREQ):
            time.sleep(0.1)
            continue
        print('aborted after %.1f s (%s)' % (time.time() - start, errno.errorcode[e.errno]), flush=True)
        u = connect()
        u.send(b'hostname')
        print('then', u.recv(100).decode().strip(), flush=True)
        sys.exit(0)
    time.sleep(0.1)
print('never aborted', flush=True)" >"$WORK/udp-connected.out" 2>&1 &
UDP_CLIENT=$!
wait_for 10 grep -q '^first ' "$WORK/udp-connected.out" || fail "connected UDP node2 -> web: $(cat "$WORK/udp-connected.out")"
FIRST=$(awk '/^first / {print $2}' "$WORK/udp-connected.out")
case $FIRST in a) LEFT=c ;; c) LEFT=a ;; *) fail "connected UDP answered by '$FIRST'" ;; esac
K delete pod "$FIRST" --wait=false >/dev/null || fail "delete pod $FIRST"
wait "$UDP_CLIENT" || true
grep -q '^aborted after' "$WORK/udp-connected.out" || fail "the connected UDP socket was not closed when $FIRST went: $(cat "$WORK/udp-connected.out")"
expect "connected UDP after reconnecting" "$(awk '/^then / {print $2}' "$WORK/udp-connected.out")" "$LEFT"
log "ok: connected UDP socket of node2 on $FIRST closed when it went ($(grep '^aborted' "$WORK/udp-connected.out")), reconnected to $LEFT"
expect "node1 -> Service without endpoints" \
  "$(lab probe --from node/node1 --to "$EMPTY:80" --timeout 2)" REFUSED
expect "node1 -> port web does not define" \
  "$(lab probe --from node/node1 --to "$WEB:81" --timeout 2)" REFUSED

# Stop node1's agent: the pinned links keep its programs attached and translating.
OLD_PROGS=""
for hook in $HOOKS; do OLD_PROGS="$OLD_PROGS $(link_prog node1 "$hook")"; done
OLD_LINK=$(link_id node1 connect4)
AGENT_PID=$(python3 -c 'import json,sys; print([n["agentPid"] for n in json.load(open(sys.argv[1]))["nodes"] if n["name"] == "node1"][0])' "$DIR/status.json")
NODE1_NETNS=$(python3 -c 'import json,sys; print([n["netns"] for n in json.load(open(sys.argv[1]))["nodes"] if n["name"] == "node1"][0])' "$DIR/status.json")
mapfile -d '' AGENT_ARGV <"/proc/$AGENT_PID/cmdline"
# Held down: the lab would otherwise restart it itself (as a DaemonSet would).
lab agent stop --node node1 >/dev/null || fail "stop node1's agent"
wait_for 20 sh -c "! kill -0 $AGENT_PID" || fail "agent did not stop"
for prog in $OLD_PROGS; do
  grep -q "^ *$prog " <<<"$(cgroup_progs)" || fail "program $prog detached with the agent"
done
got=$(lab request --from node/node1 --to "$WEB:80" --data hostname)
case $got in a | c) log "ok: node1 -> web while its agent is down ($got)" ;;
  *) fail "node1 -> web while its agent is down: '$got'" ;; esac

# Restart it (same command line, now ours to stop): the same links, new programs, one each.
ip netns exec "$NODE1_NETNS" "${AGENT_ARGV[@]}" >"$WORK/agent-restarted.log" 2>&1 &
RESTARTED_AGENT=$!
wait_for 60 grep -q "socket LB attached" "$WORK/agent-restarted.log" ||
  fail "restarted agent did not attach socket LB"
expect "node1's connect4 link after the restart" "$(link_id node1 connect4)" "$OLD_LINK"
NEW_PROGS=""
for hook in $HOOKS; do NEW_PROGS="$NEW_PROGS $(link_prog node1 "$hook")"; done
[ "$NEW_PROGS" != "$OLD_PROGS" ] || fail "the restarted agent's programs are not in the links"
tree=$(cgroup_progs)
for prog in $OLD_PROGS; do
  grep -q "^ *$prog " <<<"$tree" && fail "old program $prog still attached after the restart"
done
for prog in $NEW_PROGS; do
  grep -q "^ *$prog " <<<"$tree" || fail "new program $prog not attached"
done
log "ok: restarted agent swapped its programs in place ($OLD_PROGS ->$NEW_PROGS)"
wait_for 30 sh -c "$LAB request --name $NAME --from node/node1 --to $WEB:80 --data hostname --timeout 1 | grep -qx '[ac]'" ||
  fail "node1 -> web after the restart"

# down: every node's bpffs goes, and with it every link.
ALL_PROGS="$NEW_PROGS"
for hook in $HOOKS; do ALL_PROGS="$ALL_PROGS $(link_prog node2 "$hook")"; done
"$LAB" down --name "$NAME" || fail "down"
stop_restarted_agent
trap - EXIT
rm -rf "$WORK"
for prog in $ALL_PROGS; do
  wait_for 10 sh -c "! bpftool cgroup tree $CG2 | grep '^ *$prog '" ||
    fail "program $prog still attached after down: $(cgroup_progs)"
done
log "ok: down left no socket-LB program attached"
echo "socket_lb_test: PASS"
