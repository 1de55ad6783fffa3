#!/usr/bin/env bash
# Builds the two Debian bases helm/Dockerfile starts from, debian:bookworm (the build stage) and
# debian:bookworm-slim (the runtime stage), from Debian's own packages with mmdebstrap, and stores
# them as local images under those names. No registry is involved.
#
# Reproducible: both are made with SOURCE_DATE_EPOCH from helm/image/epoch, and each base's full
# package list (name and version) must equal helm/image/packages/<base>.list; a mirror that moved
# on fails the build with the difference instead of giving another image (with
# SLUICE_PACKAGES_MOVED=warn, as the test suite runs it, the difference is a warning). A base
# already stored is reused only when its label sluice.base-key, a hash of every input (this
# script, the epoch, the package list, the mirror lines), matches: a stale image under the same
# name is rebuilt.
#
# usage: helm/image/base.sh [--update-lists] [bookworm|bookworm-slim ...]
#   --update-lists  write the package lists from what the mirror gives now (after a point release)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
update=0
bases=()
for a in "$@"; do
  case $a in
    --update-lists) update=1 ;;
    bookworm | bookworm-slim) bases+=("$a") ;;
    *) echo "base.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done
[ ${#bases[@]} -gt 0 ] || bases=(bookworm bookworm-slim)

epoch=$(cat "$here/epoch")
mirror=${SLUICE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${SLUICE_DEBIAN_SECURITY:-http://deb.debian.org/debian-security}
sources=("deb $mirror bookworm main" "deb $mirror bookworm-updates main"
         "deb $security bookworm-security main")
# What debian:bookworm-slim leaves out: documentation other than copyright files, manual pages,
# info pages and translations. dpkg keeps the rules (/etc/dpkg/dpkg.cfg.d), so the packages the
# Dockerfile installs on top are trimmed the same way.
slim_opts=(--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
           --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/groff/*'
           --dpkgopt='path-exclude=/usr/share/info/*' --dpkgopt='path-exclude=/usr/share/locale/*'
           --dpkgopt='path-include=/usr/share/locale/locale.alias'
           --dpkgopt='path-exclude=/usr/share/lintian/*')

work=$(mktemp -d /var/tmp/sluice-base.XXXXXX)
trap 'rm -rf "$work"' EXIT

for base in "${bases[@]}"; do
  list="$here/packages/$base.list"
  key=$( { cat "$0" "$here/epoch"; cat "$list" 2>/dev/null || true; printf '%s\n' "${sources[@]}"
           echo "$base"; } | sha256sum | cut -c1-16)
  have=$(buildah inspect --type image --format '{{index .ImageAnnotations "sluice.base-key"}}' \
           "debian:$base" 2>/dev/null || true)
  if [ "$update" = 0 ] && [ "$have" = "$key" ]; then
    echo "debian:$base: up to date (sluice.base-key $key)"
    continue
  fi
  opts=()
  [ "$base" = bookworm-slim ] && opts=("${slim_opts[@]}")
  echo "debian:$base: mmdebstrap (SOURCE_DATE_EPOCH=$epoch)"
  start=$(date +%s)
  # The list of installed packages is written next to the tarball by a customize hook, so the
  # check below reads the root file system that was really packed.
  SOURCE_DATE_EPOCH=$epoch nice mmdebstrap --mode=root --variant=apt --format=tar --quiet \
    "${opts[@]}" --hook-dir=/usr/share/mmdebstrap/hooks/eatmydata \
    --customize-hook="chroot \"\$1\" dpkg-query -W -f='\${Package} \${Version}\n' | LC_ALL=C sort > $work/$base.list" \
    bookworm "$work/$base.tar" "${sources[@]}"
  echo "debian:$base: mmdebstrap took $(( $(date +%s) - start ))s, $(du -m "$work/$base.tar" | cut -f1) MB," \
       "tarball sha256 $(sha256sum "$work/$base.tar" | cut -c1-16)"
  if [ "$update" = 1 ]; then
    mkdir -p "$here/packages"
    cp "$work/$base.list" "$list"
    echo "debian:$base: wrote $list ($(wc -l < "$list") packages); run again to build from it"
    continue
  elif ! diff -u "$list" "$work/$base.list"; then
    if [ "${SLUICE_PACKAGES_MOVED:-}" != warn ]; then
      echo "debian:$base: the mirror's packages differ from $list (above); refusing to build" \
           "another image. Check the change and run base.sh --update-lists to take it." >&2
      exit 1
    fi
    echo "WARNING: debian:$base: the mirror's packages differ from $list (above); building from" \
         "them anyway (SLUICE_PACKAGES_MOVED=warn). Review them and run base.sh --update-lists." >&2
  fi
  # One layer: the tarball's files with their SOURCE_DATE_EPOCH times, committed with the same
  # time, so the same tarball gives the same image digest.
  printf 'FROM scratch\nADD %s.tar /\nCMD ["bash"]\n' "$base" > "$work/Containerfile.$base"
  nice buildah bud --quiet --timestamp "$epoch" --identity-label=false \
    --annotation "sluice.base-key=$key" -f "$work/Containerfile.$base" -t "debian:$base" "$work" >/dev/null
  echo "debian:$base: stored, image $(buildah inspect --type image --format '{{.FromImageDigest}}' "debian:$base")"
done
