#!/usr/bin/env bash
# routing_test.sh with native routing: agents started with --routing_mode=native
# --auto_direct_node_routes (routes to the peers' pod CIDRs, BPF FIB forwarding); the underlay
# then carries plain pod addresses and no VXLAN.
set -euo pipefail
export SLUICE_ROUTING_MODE=native
export SLUICE_LAB_AGENT_ARGS="${SLUICE_LAB_AGENT_ARGS:-} --routing_mode=native --auto_direct_node_routes"
exec bash "$(dirname "$0")/routing_test.sh" "$@"
