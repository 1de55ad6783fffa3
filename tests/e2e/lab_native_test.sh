#!/usr/bin/env bash
# lab_test.sh once more with native routing (docs/routing.md): agents started with
# --routing_mode=native --auto_direct_node_routes, so pods on different nodes reach each other by
# routes to the peers' pod CIDRs (and BPF FIB forwarding) instead of the default VXLAN overlay.
# Every lab suite has such a *_native_test.sh twin; routing_native_test.sh covers native mode's
# cross-node matrix.
set -euo pipefail
export SLUICE_ROUTING_MODE=native
export SLUICE_LAB_AGENT_ARGS="${SLUICE_LAB_AGENT_ARGS:-} --routing_mode=native --auto_direct_node_routes"
exec bash "$(dirname "$0")/lab_test.sh" "$@"
