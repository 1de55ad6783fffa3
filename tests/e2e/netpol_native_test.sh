#!/usr/bin/env bash
# netpol_test.sh (its core cases) once more with native routing (docs/routing.md): agents started with
# --routing_mode=native --auto_direct_node_routes, so the same checks run over routes to the
# peers' pod CIDRs and BPF FIB forwarding instead of the default VXLAN overlay (issue 11: Services
# and NetworkPolicy behave the same in both modes).
set -euo pipefail
export SLUICE_ROUTING_MODE=native
# The 17 core cases: the datapath paths that differ natively (FIB forwarding, delivery through
# the stack and sluice_to_pod) are all crossed by them; the full 53 run in tunnel mode.
export SLUICE_NETPOL_CASES=${SLUICE_NETPOL_CASES:-core}
export SLUICE_LAB_AGENT_ARGS="${SLUICE_LAB_AGENT_ARGS:-} --routing_mode=native --auto_direct_node_routes"
exec bash "$(dirname "$0")/netpol_test.sh" "$@"
