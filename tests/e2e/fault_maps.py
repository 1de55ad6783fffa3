"""Prints a node's programmed maps (pinned under BPFFS), normalised: one "map key => value" line per
entry, sorted, so two dumps are equal exactly when the maps hold the same entries. Only the maps
the agent writes from Kubernetes and CNI state (endpoints, node, LB, ipcache, policy, tunnel);
conntrack, NAT, affinity and counters are the datapath's own and change with traffic.

  fault_maps.py BPFFS [MAP...]
"""
import json, subprocess, sys

MAPS = ["sluice_ep4", "sluice_node", "sluice_nomasq4", "sluice_lb4_svc", "sluice_lb4_be",
        "sluice_lb4_rnat", "sluice_lb4_srcr", "sluice_ipcache4", "sluice_policy4",
        "sluice_policy_ep", "sluice_tunnel4"]
root, maps = sys.argv[1], sys.argv[2:] or MAPS
lines = []
for m in maps:
    out = subprocess.run(["bpftool", "-j", "map", "dump", "pinned", f"{root}/{m}"],
                         capture_output=True, text=True, check=True).stdout
    for e in json.loads(out or "[]"):
        f = e.get("formatted")
        key, value = (f["key"], f["value"]) if f else (e.get("key"), e.get("value"))
        lines.append(f"{m} {json.dumps(key, sort_keys=True)} => {json.dumps(value, sort_keys=True)}")
print("\n".join(sorted(lines)))
