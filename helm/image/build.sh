#!/usr/bin/env bash
# Builds the Sluice image (`make image`) with buildah from helm/Dockerfile: on the local Debian
# bases (`make image-bases`; nothing is pulled, --pull-never), with the binaries of the local
# build, stripped, as the only build context (BINARIES=local: the Dockerfile's compile stage is
# skipped). Stores it under the name the chart's values give it (image.repository, tag the
# chart's appVersion) and writes it as an OCI archive, BUILD_DIR/image/sluice-image.oci.tar,
# which the tests load into a container store of their own.
#
# Reproducible: every file and the image's dates are SOURCE_DATE_EPOCH (helm/image/epoch), apt's
# and dpkg's run-to-run files are removed in the Dockerfile, and the runtime stage's full package
# list must equal helm/image/packages/runtime.list (a mirror that moved on fails the build with
# the difference, as base.sh does for the bases). The same binaries give the same image id.
# SLUICE_PACKAGES_MOVED=warn (the test suite's image_build) prints the difference as a warning and
# keeps the image: a Debian security update must not turn an unrelated CI run red.
#
# RUN steps go through runc with rlimits within the hard limits: crun refuses this machine's
# hybrid cgroup hierarchy, and the runtimes' default rlimits exceed what root may set here
# (docs/operating.md, "The image and its Debian bases").
#
# usage: helm/image/build.sh BUILD_DIR [--no-cache] [--update-list]
#   --no-cache     build every step again (the reproducibility check: the same image id)
#   --update-list  write helm/image/packages/runtime.list from what the mirror gives now
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
source_dir=$(cd "$here/../.." && pwd)
build=${1:?usage: build.sh BUILD_DIR [--no-cache] [--update-list]}
shift
cache=(--layers)
update=0
for a in "$@"; do
  case $a in
    --no-cache) cache=(--layers --no-cache) ;;
    --update-list) update=1 ;;
    *) echo "build.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done
build=$(cd "$build" && pwd)

epoch=$(cat "$here/epoch")
# The reference the chart renders by default: image.repository and the chart's appVersion.
repository=$(sed -n '/^image:/,/^[^ ]/s/^  repository: *\([^ #]*\).*/\1/p' "$source_dir/helm/sluice/values.yaml")
tag=$(sed -n 's/^appVersion: *"\{0,1\}\([^" ]*\)"\{0,1\}.*/\1/p' "$source_dir/helm/sluice/Chart.yaml")
[ -n "$repository" ] && [ -n "$tag" ] || { echo "build.sh: no image.repository or appVersion in the chart" >&2; exit 1; }
image=$repository:$tag

out=$build/image
context=$out/context
rm -rf "$context"
mkdir -p "$context"
strip -o "$context/sluice-agent" "$build/agent/sluice-agent"
strip -o "$context/sluicectl" "$build/agent/sluicectl"
strip -o "$context/sluice-operator" "$build/agent/sluice-operator"
strip -o "$context/sluice-cni" "$build/cni/sluice-cni"

start=$(date +%s)
# The image the name held before, removed once the new one is stored, with the layers of its
# binaries that no other image uses (the cached package layer stays): rebuilds do not pile up.
previous=$(buildah inspect --type image --format '{{.FromImageID}}' "$image" 2>/dev/null || true)
# (nproc as tests/e2e/podman_test.sh sets it: runc failed to set the machine's own hard limit.)
nofile=$(ulimit -Hn)
[ "$nofile" = unlimited ] && nofile=1048576
buildah bud --quiet "${cache[@]}" --pull-never --runtime runc --network host \
  --ulimit "nofile=$nofile:$nofile" --ulimit nproc=4096:4096 \
  --timestamp "$epoch" --identity-label=false \
  --build-arg BINARIES=local --build-arg SOURCE_DATE_EPOCH="$epoch" \
  -f "$source_dir/helm/Dockerfile" -t "$image" "$context" >/dev/null
id=$(buildah inspect --type image --format '{{.FromImageID}}' "$image")
if [ -n "$previous" ] && [ "$previous" != "$id" ]; then
  podman rmi "$previous" >/dev/null 2>&1 || true
fi
# The local stage's image (the binaries, cached by --layers) is of no use once the image is built;
# buildah 1.28 leaves a working container of it behind for the `FROM ${BINARIES}` stage.
for stage in $(podman images -a -q --filter label=sluice.stage=local); do
  buildah containers -q --filter "ancestor=$stage" | xargs -r buildah rm >/dev/null 2>&1 || true
  podman rmi "$stage" >/dev/null 2>&1 || true
done

# The runtime stage's packages, read from the image's dpkg database.
ctr=$(buildah from --pull-never "$image")
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
mnt=$(buildah mount "$ctr")
dpkg-query --admindir="$mnt/var/lib/dpkg" -W -f='${Package} ${Version}\n' | LC_ALL=C sort >"$out/runtime.list"
buildah rm "$ctr" >/dev/null
trap - EXIT
if [ "$update" = 1 ]; then
  cp "$out/runtime.list" "$here/packages/runtime.list"
  echo "$image: wrote helm/image/packages/runtime.list ($(wc -l <"$out/runtime.list") packages)"
elif ! diff -u "$here/packages/runtime.list" "$out/runtime.list"; then
  if [ "${SLUICE_PACKAGES_MOVED:-}" != warn ]; then
    buildah rmi "$image" >/dev/null 2>&1 || true
    echo "$image: the image's packages differ from helm/image/packages/runtime.list (above);" \
         "refusing it. Check the change and run build.sh --update-list to take it." >&2
    exit 1
  fi
  echo "WARNING: $image: the image's packages differ from helm/image/packages/runtime.list" \
       "(above); kept anyway (SLUICE_PACKAGES_MOVED=warn). Review them and run" \
       "build.sh --update-list." >&2
fi

archive=$out/sluice-image.oci.tar
rm -f "$archive"
buildah push --quiet "$image" "oci-archive:$archive:$image" >/dev/null
size=$(podman image inspect --format '{{.Size}}' "$image")
echo "sha256:$id" >"$out/id"
echo "$image: built in $(( $(date +%s) - start ))s, image id sha256:$id," \
     "$(( size / 1000000 )) MB ($size bytes) unpacked"
# The manifest's digest (what a registry would show; its layers compressed as a push does). The
# archive file itself differs from run to run: its tar entries carry the time of the push.
manifest=$(tar -xOf "$archive" index.json | sed -n 's/.*"digest":"\(sha256:[0-9a-f]*\)".*/\1/p')
echo "$image: OCI archive $archive, $(( $(stat -c %s "$archive") / 1000000 )) MB, manifest $manifest"
