#!/usr/bin/env bash
# The image `make image` built (helm/image/build.sh, ctest's image_build fixture), run by a real
# OCI runtime: podman 4.x with runc, in a container store of this run's own, loaded from the OCI
# archive BUILD_DIR/image/sluice-image.oci.tar.
#   1. The chart's image reference (rendered with Helm's engine, tests/helm/render) names the
#      loaded image: podman resolves the rendered reference to it, with the id the build printed.
#   2. Every binary the chart runs from the image answers --version with the version and commit
#      of the local build, so a shared library missing from the image fails here.
#   3. sluice-agent runs in the image as the DaemonSet runs it: its entrypoint, every capability
#      dropped but the chart's five (checked in /proc), host networking (the node namespace),
#      the node's bpffs, state, CNI and cgroup2 directories bind-mounted. It loads the datapath, answers /healthz
#      and /readyz on the node's loopback, installs the CNI plugin, and serves a pod ADDed through
#      sluice-cni from the host as a runtime would (endpoint map entry, reachable from the node);
#      `podman exec ... sluicectl status` works from inside the container, as from `kubectl exec`.
#
# podman's containers.conf, storage (overlay; vfs copies the whole image for every layer and
# container: 37 s to load the archive, 5-19 s a container), run and tmp directories are this
# run's own, under $ROOT/podman and $PODMAN_STORE; teardown removes all of it, on failure too.
source "$(dirname "$0")/lib.sh"
node_init

SRC=$(cd "$HERE/../.." && pwd)
ARCHIVE=$BUILD/image/sluice-image.oci.tar
RENDER=$BUILD/tests/helm/sluice-helm-render
PODMAN_STORE=/var/tmp/sluice-e2e-$T
CGROUP_PARENT=/sluice-e2e-$T
CGROUP2=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)
PODMAN_READY=

PODMAN=(env CONTAINERS_CONF="$ROOT/podman/containers.conf"
        podman --root "$PODMAN_STORE/storage" --runroot "$ROOT/podman/run" --storage-driver overlay)
pm() { "${PODMAN[@]}" "$@"; }

image_teardown() {
  set +e
  if [ -n "$PODMAN_READY" ]; then
    pm rm -af -t 0 >/dev/null 2>&1
    pm rmi -af >/dev/null 2>&1
  fi
  findmnt -rn -o TARGET | grep -E "^($ROOT/podman|$PODMAN_STORE)/" | sort -r | xargs -r -n1 umount -l 2>/dev/null
  for d in /sys/fs/cgroup/*"$CGROUP_PARENT"; do
    [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  rm -rf "$PODMAN_STORE"
  teardown
}
trap image_teardown EXIT

command -v podman >/dev/null && command -v runc >/dev/null || fail "podman and runc are required"
[ -f "$ARCHIVE" ] || fail "$ARCHIVE missing (make image, or ctest -R image_build)"
[ -x "$RENDER" ] || fail "$RENDER missing (ctest -R helm_render_build builds it)"
[ -n "$CGROUP2" ] || fail "no cgroup2 mount"

mkdir -p "$ROOT/podman"/{run,tmp} "$PODMAN_STORE"
cat >"$ROOT/podman/containers.conf" <<EOF
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$ROOT/podman/events.log"
lock_type = "file"
tmp_dir = "$ROOT/podman/tmp"
image_copy_tmp_dir = "$ROOT/podman/tmp"
EOF
PODMAN_READY=1

# podman run with rlimits within this machine's hard limits (runc cannot raise them: podman's
# defaults fail with "error setting rlimit type 7"), in this run's cgroup parent.
nofile=$(ulimit -Hn)
RUN=(run --runtime runc --cgroup-parent "$CGROUP_PARENT" --ulimit "nofile=$nofile:$nofile"
     --ulimit nproc=4096:4096)

# --- 1. the chart's reference is the image the build made ---------------------------------------
start=$SECONDS
pm load -q -i "$ARCHIVE" >/dev/null || fail "podman load -i $ARCHIVE"
log "loaded $ARCHIVE ($(( $(stat -c %s "$ARCHIVE") / 1000000 )) MB) in $(( SECONDS - start ))s"
"$RENDER" -chart "$SRC/helm/sluice" -name sluice -namespace kube-system >"$ROOT/chart.yaml" ||
  fail "render the chart"
refs=$(sed -n 's/^ *image: *"\{0,1\}\([^" ]*\)"\{0,1\}$/\1/p' "$ROOT/chart.yaml" | sort -u)
[ "$(wc -l <<<"$refs")" = 1 ] && [ -n "$refs" ] || fail "the chart names images '$refs', want one"
IMAGE=$refs
id=$(pm image inspect --format '{{.Id}}' "$IMAGE") ||
  fail "the chart's image $IMAGE is not the loaded archive's: $(pm images)"
expect "image id of the chart's $IMAGE" "sha256:$id" "$(cat "$BUILD/image/id")"

# --- 2. every binary the chart runs answers --version -------------------------------------------
# One container runs all four (sluice-cni with CNI_COMMAND unset, as on the node's command line).
BINARIES="sluice-agent sluicectl sluice-operator sluice-cni"
want=$(for bin in $BINARIES; do
  case $bin in sluice-cni) "$BUILD/cni/$bin" --version ;; *) "$BUILD/agent/$bin" --version ;; esac
done)
# The entrypoint first, as docs/operating.md shows it.
got=$(pm "${RUN[@]}" --rm --network none "$IMAGE" --version 2>&1) || fail "$IMAGE --version: $got"
expect "$IMAGE --version (the entrypoint)" "$got" "$("$BUILD/agent/sluice-agent" --version)"
got=$(pm "${RUN[@]}" --rm --network none --entrypoint /bin/sh "$IMAGE" \
  -ec 'for b; do "/usr/local/bin/$b" --version; done' versions $BINARIES 2>&1) ||
  fail "--version in the image: $got"
[ "$got" = "$want" ] || fail "--version in the image: got '$got', want '$want'"
log "ok: --version in the image: $(tr '\n' ';' <<<"$got")"

# --- 3. the agent in the image, as the DaemonSet runs it -----------------------------------------
setup_node
cp -L "$ROOT/bin/loopback" "$ROOT/bin/loopback.real" && mv -f "$ROOT/bin/loopback.real" "$ROOT/bin/loopback"
mkdir -p "$ROOT/run"
pm "${RUN[@]}" -d --name sluice-agent --network "ns:/run/netns/$NODE" \
  --cap-drop all --cap-add BPF,NET_ADMIN,PERFMON,SYS_RESOURCE,SYS_ADMIN \
  -v "$ROOT/bpf:$ROOT/bpf" -v "$ROOT/state:$ROOT/state" -v "$ROOT/run:$ROOT/run" \
  -v "$ROOT/net.d:$ROOT/net.d" -v "$ROOT/bin:$ROOT/bin" -v "$CGROUP2:/run/sluice/cgroupv2" \
  "$IMAGE" --pod_cidr="$POD_CIDR" --native_device=eth0 --bpffs_root="$ROOT/bpf" \
  --state_dir="$ROOT/state" --socket="$ROOT/run/sluice.sock" --cni_conf_dir="$ROOT/net.d" \
  --cni_bin_dir="$ROOT/bin" --cgroup_root=/run/sluice/cgroupv2 >/dev/null ||
  fail "podman run the agent"
agent_logs() { pm logs sluice-agent 2>&1 | tail -"$LOG_TAIL"; }
healthz() { ip netns exec "$NODE" curl -sf -o /dev/null "http://127.0.0.1:9879/$1"; }
wait_for 60 healthz healthz || fail "the agent in the image does not answer /healthz: $(agent_logs)"
wait_for 30 healthz readyz || fail "the agent in the image is not ready: $(agent_logs)"
log "ok: the agent in the image answers /healthz and /readyz on the node's loopback"
# runc applied the capabilities: the agent (the container's pid 1) holds the chart's five and
# no other, less those this machine's own bounding set lacks (here SYS_RESOURCE).
chart_caps=$(( (1 << 39) | (1 << 12) | (1 << 38) | (1 << 24) | (1 << 21) ))  # BPF NET_ADMIN PERFMON SYS_RESOURCE SYS_ADMIN
host_bnd=$(sed -n 's/^CapBnd:\t*//p' /proc/self/status)
want=$(printf '%016x' $(( chart_caps & 0x$host_bnd )))
caps=$(pm exec sluice-agent cat /proc/1/status | sed -n 's/^\(CapEff\|CapBnd\):\t*//p' | sort -u)
expect "the agent's effective and bounding capabilities" "$caps" "$want"
[ -f "$ROOT/net.d/05-sluice.conflist" ] || fail "no conflist installed: $(agent_logs)"
cmp -s "$ROOT/bin/sluice" "$BUILD/image/context/sluice-cni" ||
  fail "the agent did not install the image's sluice-cni into the CNI bin dir"

# A pod through the plugin the agent installed, from the host, as the runtime calls it: CNI ADD
# over the socket the container shares with the node.
CNI=$ROOT/bin/sluice
netconf() {
  printf '{"cniVersion":"1.1.0","name":"sluice","type":"sluice","socketPath":"%s"}' "$ROOT/run/sluice.sock"
}
ip=$(add_pod p1)
[ -n "$ip" ] || fail "CNI ADD through the image's agent gave no address: $(agent_logs)"
map_has_ip "$ip" || fail "no sluice_ep4 entry for $ip"
ip netns exec "$NODE" ping -c1 -W2 "$ip" >/dev/null || fail "node -> pod $ip: no answer"
log "ok: pod $ip ADDed through the agent in the image, in sluice_ep4, answering the node"

st=$(pm exec sluice-agent sluicectl --bpffs_root="$ROOT/bpf" --state_dir="$ROOT/state" status) ||
  fail "sluicectl status inside the container: $st"
for want in "Agent:                 up, " "Ready:                 yes" "Endpoints:             1"; do
  case $st in *"$want"*) ;; *) fail "sluicectl status in the container lacks '$want': $st";; esac
done
log "ok: sluicectl status from inside the agent's container"
del_pod p1 || fail "CNI DEL p1"
pm stop -t 10 sluice-agent >/dev/null || fail "podman stop the agent"
echo "image_test: PASS"
