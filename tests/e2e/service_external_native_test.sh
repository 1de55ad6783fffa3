#!/usr/bin/env bash
# service_external_test.sh once more with native routing (docs/routing.md): agents started with
# --routing_mode=native --auto_direct_node_routes, so the same checks run over routes to the
# peers' pod CIDRs and BPF FIB forwarding instead of the default VXLAN overlay (issue 11: Services
# and NetworkPolicy behave the same in both modes).
set -euo pipefail
export SLUICE_ROUTING_MODE=native
export SLUICE_LAB_AGENT_ARGS="${SLUICE_LAB_AGENT_ARGS:-} --routing_mode=native --auto_direct_node_routes"
exec bash "$(dirname "$0")/service_external_test.sh" "$@"
