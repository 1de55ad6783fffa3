#!/usr/bin/env bash
# A PNG of the service map page (--ui_address, docs/observe.md) as headless Chromium draws it.
#   tests/e2e/ui_screenshot.sh URL OUT.png [NETNS]
# NETNS: the network namespace the agent's page listens in (a lab node: <lab>-node1); without
# it, this namespace. observe_test.sh calls it when SLUICE_UI_SCREENSHOT names a file:
#   SLUICE_UI_SCREENSHOT=/tmp/map.png bash tests/e2e/observe_test.sh build
set -euo pipefail
URL=${1:?usage: $0 URL OUT.png [NETNS]}
OUT=${2:?usage: $0 URL OUT.png [NETNS]}
NETNS=${3:-}
PROFILE=$(mktemp -d /tmp/sluice-ui-shot.XXXXXX)
trap 'rm -rf "$PROFILE"' EXIT
run=()
[ -z "$NETNS" ] || run=(ip netns exec "$NETNS")
"${run[@]}" chromium --headless --no-sandbox --disable-gpu --no-first-run --hide-scrollbars \
  --user-data-dir="$PROFILE" --window-size=1000,720 --virtual-time-budget=6000 \
  --screenshot="$(realpath -m "$OUT")" "$URL" >/dev/null 2>"$PROFILE/err" ||
  { cat "$PROFILE/err" >&2; exit 1; }
echo "$OUT"
