#!/usr/bin/env bash
# service_external_test.sh once more with NodePort acceleration (docs/services.md, "XDP
# acceleration"): agents started with --lb_acceleration=native and native routing (in tunnel mode
# a remote backend is reached through the VXLAN device, which XDP leaves to TC), so NodePort,
# ExternalIP and LoadBalancer IP flows to the other node's pod are translated and sent on at XDP,
# source ranges refused there; the script then checks that both nodes run sluice_xdp_net in
# native mode and that its forward counter (net_xdp) carried the NodePort flows, on sluicectl
# status and on /metrics.
set -euo pipefail
export SLUICE_ROUTING_MODE=native
export SLUICE_LAB_AGENT_ARGS="${SLUICE_LAB_AGENT_ARGS:-} --routing_mode=native --auto_direct_node_routes --lb_acceleration=native --metrics_address=127.0.0.1:9879"
exec bash "$(dirname "$0")/service_external_test.sh" "$@"
