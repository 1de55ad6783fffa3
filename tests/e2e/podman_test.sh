#!/usr/bin/env bash
# A real container runtime on a Sluice network: podman 4.x (CNI backend, i.e. libcni) runs
# containers through a conflist chaining sluice, tuning and portmap. Two containers get pod
# addresses and talk to each other over the BPF datapath, one with the MAC `--mac-address` asked
# for (tuning set it; the agent followed); `podman run -p` is reachable at the node address from
# the node and from the internet namespace (portmap used sluice's prevResult); `podman rm -f`
# (CNI DEL) leaves no endpoint record, link, map entry, address or portmap rule behind.
#
# Where podman runs: the node is the namespace $NODE, and the agent creates host-side veths in it.
# podman runs with only its network namespace switched into $NODE (`nsenter --net`), so libcni
# and the chained plugins (portmap's iptables DNAT rules in particular) act on the node, and
# 10.99.0.2:HOSTPORT really is "the node's port". It does not use `ip netns exec`, which gives
# every podman invocation a private mount namespace of its own: the nsfs bind mount one
# `podman run` makes at /run/netns/netns-* would be invisible to the next invocation. The agent
# no longer minds where the runtime mounts it (sluice-cni opens CNI_NETNS where podman runs and
# passes the descriptor; tests/e2e/cni_netns_fd_test.sh runs the plugin in a mount namespace the
# agent cannot see).
#
# Everything podman owns lives under $ROOT: a private containers.conf (CONTAINERS_CONF), storage
# (--root/--runroot, vfs driver so there are no overlay mounts), tmp dir, file locks, event log,
# network config dir and a per-run cgroup parent; teardown removes all of it, on failure too.
source "$(dirname "$0")/lib.sh"
node_init

NET=sluicenet
IMAGE=localhost/sluice-e2e-busybox:$T
CGROUP_PARENT=/sluice-e2e-$T
HOSTPORT=18080
PODMAN_READY=

# podman with the private configuration, in the network namespace of the node.
PODMAN=(env CONTAINERS_CONF="$ROOT/podman/containers.conf" nsenter --net="/run/netns/$NODE"
        podman --root "$ROOT/podman/storage" --runroot "$ROOT/podman/run" --storage-driver vfs)
podman_node() { "${PODMAN[@]}" "$@"; }

podman_teardown() {
  set +e
  if [ -n "$PODMAN_READY" ]; then
    # With the agent still up, so CNI DEL reaches it; then whatever podman could not remove.
    podman_node rm -af -t 0 >/dev/null 2>&1
    podman_node rmi -af >/dev/null 2>&1
  fi
  # libcni's result cache is global (/var/lib/cni/results/NETWORK-CONTAINERID-IFNAME in podman
  # 4.3, not configurable); CNI DEL removes it, this covers a failed DEL.
  for id in $(cat "$ROOT/podman/ids" 2>/dev/null); do rm -f /var/lib/cni/results/"$NET-$id"-*; done
  for key in $(cat "$ROOT/podman/sandboxes" 2>/dev/null); do
    [ -e "$key" ] || continue
    umount "$key" 2>/dev/null; rm -f "$key"
  done
  # Any mount podman left under its directories (shm, netns bind mounts) would stop rm -rf.
  findmnt -rn -o TARGET | grep "^$ROOT/podman/" | sort -r | xargs -r -n1 umount -l 2>/dev/null
  for d in /sys/fs/cgroup/*"$CGROUP_PARENT"; do
    [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  teardown
}
trap podman_teardown EXIT

command -v podman >/dev/null && command -v runc >/dev/null && [ -x /usr/lib/cni/portmap ] &&
  [ -x /bin/busybox ] || fail "podman, runc, containernetworking-plugins and busybox-static are required"

setup_node
start_agent
log "agent ready"

# --- podman configuration, all private to this run -------------------------------------------
mkdir -p "$ROOT/podman"/{net.d,tmp,rootfs}
cat >"$ROOT/podman/containers.conf" <<EOF
[network]
network_backend = "cni"
cni_plugin_dirs = ["$ROOT/bin", "/usr/lib/cni"]
network_config_dir = "$ROOT/podman/net.d"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$ROOT/podman/events.log"
lock_type = "file"
tmp_dir = "$ROOT/podman/tmp"
image_copy_tmp_dir = "$ROOT/podman/tmp"
EOF
# libcni 1.1 inside podman 4.3 (and Debian's portmap 1.1.1) speak CNI up to 1.0.0.
cat >"$ROOT/podman/net.d/$NET.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$NET",
  "plugins": [
    {"type": "sluice", "socketPath": "$ROOT/sluice.sock"},
    {"type": "tuning", "capabilities": {"mac": true}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
PODMAN_READY=1
podman_node network ls --format '{{.Name}} {{.Driver}}' | grep -q "^$NET " ||
  fail "podman does not list the $NET network from $ROOT/podman/net.d"

# --- image: a busybox-static rootfs --------------------------------------------------------------
rootfs=$ROOT/podman/rootfs
mkdir -p "$rootfs"/{bin,etc,tmp,proc,sys,dev,www}
cp /bin/busybox "$rootfs/bin/busybox"
for applet in sh nc httpd wget ip hostname cat echo sleep; do ln -s busybox "$rootfs/bin/$applet"; done
tar -C "$rootfs" -cf "$ROOT/podman/rootfs.tar" .
podman_node import -q "$ROOT/podman/rootfs.tar" "$IMAGE" >/dev/null || fail "podman import"

# run_ctr NAME [PODMAN_RUN_ARGS...] IMAGE CMD...: a detached container on the Sluice network.
# Root here lacks CAP_SYS_RESOURCE, so a container's rlimits may not exceed the current hard
# limits: podman's defaults (nofile and nproc 1048576) and --ulimit host (which podman 4.3 turns
# into nofile 1048576) make runc fail with "error setting rlimit type 7: operation not permitted".
run_ctr() {
  local name=$1; shift
  local nofile; nofile=$(ulimit -Hn)
  podman_node run -d --name "$name" --hostname "$name" --network "$NET" --runtime runc \
    --cgroup-parent "$CGROUP_PARENT" --ulimit "nofile=$nofile:$nofile" --ulimit nproc=4096:4096 \
    "$@" >/dev/null || fail "podman run $name"
  podman_node inspect -f '{{.NetworkSettings.SandboxKey}}' "$name" >>"$ROOT/podman/sandboxes"
  podman_node inspect -f '{{.Id}}' "$name" >>"$ROOT/podman/ids"
}
ctr_ip() { podman_node inspect -f "{{(index .NetworkSettings.Networks \"$NET\").IPAddress}}" "$1"; }
# busybox-static's wget crashes (SIGSEGV) with -T here, so the host bounds each request instead.
ctr_get() { timeout 20 "${PODMAN[@]}" exec "$1" wget -qO- "$2"; }  # ctr_get CONTAINER URL
serving() { ctr_get "$1" "http://127.0.0.1:$2/" | grep -q .; }

# c1: web server answering its own name, published on the node's port $HOSTPORT, with the MAC
# `podman run --mac-address` asks for (tuning, chained after sluice, sets it).
C1_MAC=02:5e:00:00:00:c1
run_ctr c1 -p "$HOSTPORT:8080" --mac-address $C1_MAC "$IMAGE" \
  sh -c 'hostname >/www/index.html; exec httpd -f -p 8080 -h /www'
run_ctr c2 "$IMAGE" sleep 3600
C1=$(ctr_ip c1); C2=$(ctr_ip c2)
log "containers c1=$C1 c2=$C2"

# --- 1. addresses from the pod CIDR, seen the same by podman and inside the containers ----------
for c in c1 c2; do
  ip=$(ctr_ip $c)
  case $ip in 10.244.0.*) ;; *) fail "$c address '$ip' is not from $POD_CIDR";; esac
  podman_node exec $c ip -4 addr show dev eth0 | grep -q "inet $ip/" ||
    fail "$c: eth0 inside the container does not carry $ip"
  map_has_ip "$ip" || fail "$c: no endpoint map entry for $ip"
  cid=$(podman_node inspect -f '{{.Id}}' $c)
  hostif=$(endpoint_field "$cid" hostIfName)
  [ -n "$hostif" ] || fail "$c: the agent has no endpoint record for container $cid"
  ip -n "$NODE" link show "$hostif" >/dev/null || fail "$c: host veth $hostif not in the node"
done
[ "$C1" != "$C2" ] || fail "both containers got $C1"
podman_node exec c1 ip link show dev eth0 | grep -q "link/ether $C1_MAC " ||
  fail "c1's eth0 does not carry $C1_MAC from --mac-address"
wait_for 2 output_is $C1_MAC endpoint_field "$(podman_node inspect -f '{{.Id}}' c1)" mac ||
  fail "the agent did not follow c1's MAC $C1_MAC"
log "ok: c1 got $C1_MAC from --mac-address (chained tuning); the agent followed it"
log "ok: podman containers got pod addresses $C1 and $C2"

wait_for 20 serving c1 8080 || fail "httpd in c1 did not start"
got=$(ctr_get c2 "http://$C1:8080/") || fail "c2 -> c1:8080 failed"
[ "$got" = c1 ] || fail "c2 -> c1:8080 answered '$got', want c1"
log "ok: container c2 reached container c1 at $C1:8080"

# --- 2. podman run -p: portmap chained after sluice ----------------------------------------------
ip netns exec "$NODE" iptables -t nat -S | grep -q -- "--dport $HOSTPORT .*$C1:8080" ||
  fail "portmap installed no DNAT rule for $HOSTPORT -> $C1:8080 in the node namespace"
got=$(ip netns exec "$NODE" curl -sS --max-time 5 "http://$NODE_IP:$HOSTPORT/") ||
  fail "node -> $NODE_IP:$HOSTPORT failed"
[ "$got" = c1 ] || fail "node -> $NODE_IP:$HOSTPORT answered '$got', want c1"
log "ok: published port reachable from the node at $NODE_IP:$HOSTPORT"
got=$(ip netns exec "$INET" curl -sS --max-time 5 "http://$NODE_IP:$HOSTPORT/") ||
  fail "internet -> $NODE_IP:$HOSTPORT failed"
[ "$got" = c1 ] || fail "internet -> $NODE_IP:$HOSTPORT answered '$got', want c1"
log "ok: published port reachable from the internet namespace at $NODE_IP:$HOSTPORT"

# --- 3. podman rm -f: CNI DEL through libcni cleans up everything --------------------------------
sandboxes=$(cat "$ROOT/podman/sandboxes")
podman_node rm -f -t 0 c1 c2 >/dev/null || fail "podman rm -f"
[ -z "$(podman_node ps -aq)" ] || fail "containers survived podman rm -f"
[ -z "$(ls -A "$ROOT/state/endpoints")" ] ||
  fail "endpoint records survived podman rm: $(ls "$ROOT/state/endpoints")"
wait_for 5 no_sluice_links "$NODE" || fail "slc (Sluice pod) links survived podman rm"
for ip in "$C1" "$C2"; do
  map_has_ip "$ip" && fail "endpoint map entry $ip survived podman rm"
  find "$ROOT/state" -name "$ip" | grep -q . && fail "address $ip still allocated"
done
ip netns exec "$NODE" iptables -t nat -S | grep -q -- "--dport $HOSTPORT " &&
  fail "portmap DNAT rule for $HOSTPORT survived podman rm"
for key in $sandboxes; do [ -e "$key" ] && fail "container netns $key survived podman rm"; done
log "ok: podman rm -f removed endpoints, links, map entries, addresses and port mappings"

# The network keeps working after the cleanup: a new container gets an address and goes cleanly.
run_ctr c3 "$IMAGE" sleep 3600
case $(ctr_ip c3) in 10.244.0.*) ;; *) fail "c3 got no pod address after the cleanup";; esac
podman_node rm -f -t 0 c3 >/dev/null || fail "podman rm -f c3"
[ -z "$(ls -A "$ROOT/state/endpoints")" ] || fail "endpoint record of c3 survived podman rm"
log "ok: a new container after the cleanup ran and was removed cleanly"
echo "podman_test: PASS"
