# Shared by the end-to-end tests that run a sluice-lab (lab_test.sh, service_test.sh,
# service_external_test.sh, socket_lb_test.sh); tests/e2e/lib.sh is the hand-built node of the
# other scripts. Sourced with the script's arguments (BUILD_DIR) once NAME, the lab's name (unique
# per run), is set. Gives BUILD, LAB, SLUICECTL and DIR (the lab's directory); log, fail,
# wait_for, lab, K (kubectl on the lab's KUBECONFIG_PATH) and expect; and an EXIT trap that takes
# the lab down, stops the agent a script restarted itself (RESTARTED_AGENT) and removes $WORK.
set -euo pipefail
BUILD=${1:?usage: $0 BUILD_DIR}
BUILD=$(cd "$BUILD" && pwd)
LAB=$BUILD/agent/lab/sluice-lab
SLUICECTL=$BUILD/agent/sluicectl
DIR=/run/sluice-lab/${NAME:?set NAME before sourcing lablib.sh}
WORK=${WORK:-}
RESTARTED_AGENT=
LOG_TAIL=20  # lines of each log fail shows
KEEP_LOGS=   # a directory: fail also copies the logs there, to outlive the lab

log() { echo "[$(date +%T)] $*" >&2; }
# The logs fail shows: every node's agent, and the agent a script restarted itself. A script may
# redefine it.
fail_logs() {
  local f
  for f in "$DIR"/node*/log/agent.log ${WORK:+"$WORK/agent-restarted.log"}; do
    if [ -f "$f" ]; then echo "$f"; fi
  done
}
fail() {
  echo "FAIL: $*" >&2
  local f
  for f in $(fail_logs); do
    if [ -n "$KEEP_LOGS" ]; then
      mkdir -p "$KEEP_LOGS"
      cp "$f" "$KEEP_LOGS/$(basename "$(dirname "$(dirname "$f")")")-$(basename "$f")"
      echo "--- $f (kept in $KEEP_LOGS)" >&2
    else
      echo "--- $f" >&2
    fi
    tail -"$LOG_TAIL" "$f" >&2
  done
  exit 1
}
# Conditions on a command's output for wait_for, read afresh at every poll (a "$(...)" among
# wait_for's arguments is expanded once, before the first poll, and would be polled unchanged):
# wait_for 30 output_is 2 backends_of node1 80; wait_for 20 output_gt 5 reconciles.
output_is() { local want=$1; shift; [ "$("$@")" = "$want" ]; }
output_gt() { local n=$1; shift; [ "$("$@")" -gt "$n" ]; }
wait_for() {  # wait_for SECONDS CMD...: polls CMD until it succeeds
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.1
  done
}
expect() {  # expect WHAT GOT WANT
  [ "$2" = "$3" ] || fail "$1: got '$2', want '$3'"
  log "ok: $1 -> $2"
}

lab() { local cmd=$1; shift; "$LAB" "$cmd" --name "$NAME" "$@"; }
K() { kubectl --kubeconfig "$KUBECONFIG_PATH" "$@"; }

# Stops the agent a script started in place of a lab's (our child, or disowned).
stop_restarted_agent() {
  if [ -n "$RESTARTED_AGENT" ]; then
    kill -TERM "$RESTARTED_AGENT" 2>/dev/null || true
    wait_for 15 sh -c "! kill -0 $RESTARTED_AGENT" || kill -KILL "$RESTARTED_AGENT" 2>/dev/null || true
    wait "$RESTARTED_AGENT" 2>/dev/null || true
    RESTARTED_AGENT=
  fi
}
# Run first on exit; a script redefines it to stop what it started itself.
before_down() { :; }
cleanup() {
  before_down
  # The lab's pods go first (their CNI DEL needs the agents), then an agent we started.
  "$LAB" down --name "$NAME" >/dev/null 2>&1 || true
  stop_restarted_agent
  if [ -n "$WORK" ]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT
