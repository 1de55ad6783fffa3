"""Prints a node's programmed maps (pinned under BPFFS), normalised: one "map key => value" line per
entry, sorted, so two dumps are equal exactly when the maps hold the same entries. Only the maps
the agent writes from Kubernetes and CNI state (endpoints and their index, node, LB with the slot
records its masters name, ipcache, policy, tunnel); conntrack, NAT, affinity and counters are
the datapath's own and change with traffic.

  fault_maps.py BPFFS [MAP...]
"""
import ctypes, json, mmap, os, struct, subprocess, sys

MAPS = ["sluice_ep4", "sluice_ep4_slot", "sluice_node", "sluice_nomasq4", "sluice_lb4_svc",
        "sluice_lb4_be", "sluice_lb4_rnat", "sluice_lb4_srcr", "sluice_ipcache4", "sluice_policy4",
        "sluice_policy_ep", "sluice_tunnel4"]
# Slot arrays (maps/slot_array.h): an mmapable array whose all-zero slots are free. A bpftool
# dump would list every slot (1,048,576 by default, seconds); the used ones are read from the
# map's memory instead.
SLOT_ARRAYS = {"sluice_lb4_be", "sluice_policy_ep", "sluice_ep4_slot"}


def used_slots(path):
    """(index, 8 value bytes) of every used slot of the slot array pinned at path."""
    info = json.loads(subprocess.run(["bpftool", "-j", "map", "show", "pinned", path],
                                     capture_output=True, text=True, check=True).stdout)
    libc = ctypes.CDLL(None, use_errno=True)
    name = ctypes.create_string_buffer(path.encode())
    attr = struct.pack("=QII", ctypes.addressof(name), 0, 0) + bytes(108)  # BPF_OBJ_GET
    buf = ctypes.create_string_buffer(attr, len(attr))
    sys_bpf = {"x86_64": 321, "aarch64": 280}[os.uname().machine]
    fd = libc.syscall(sys_bpf, 7, buf, len(attr))  # BPF_OBJ_GET
    if fd < 0:
        sys.exit(f"open {path}: {os.strerror(ctypes.get_errno())}")
    try:
        size = info["max_entries"] * info["bytes_value"]
        size += -size % mmap.PAGESIZE
        with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ) as mem:
            data = mem[:info["max_entries"] * 8]
    finally:
        os.close(fd)
    return [(i // 8, data[i:i + 8]) for i in range(0, len(data), 8) if data[i:i + 8] != bytes(8)]


def slot_record(root, record):
    """The backend ids of slot record `record` of sluice_lb4_rec."""
    key = [str(b) for b in struct.pack("<I", record)]
    out = subprocess.run(["bpftool", "-j", "map", "lookup", "pinned", f"{root}/sluice_lb4_rec",
                          "key"] + key, capture_output=True, text=True, check=True).stdout
    e = json.loads(out)
    return e["formatted"]["value"]["backend_id"]


root, maps = sys.argv[1], sys.argv[2:] or MAPS
lines = []
for m in maps:
    if m in SLOT_ARRAYS:
        lines += [f"{m} {i} => {v.hex()}" for i, v in used_slots(f"{root}/{m}")]
        continue
    out = subprocess.run(["bpftool", "-j", "map", "dump", "pinned", f"{root}/{m}"],
                         capture_output=True, text=True, check=True).stdout
    for e in json.loads(out or "[]"):
        f = e.get("formatted")
        key, value = (f["key"], f["value"]) if f else (e.get("key"), e.get("value"))
        if m == "sluice_lb4_svc" and f and key["backend_slot"] == 0 and value["backend_id"]:
            # A master names a slot record (sluice_lb4_rec) by a number that changes whenever its
            # slots do: what counts is what the record holds, its slots 1..count.
            value = dict(value, backend_id=slot_record(root, value["backend_id"])[:value["count"]])
        lines.append(f"{m} {json.dumps(key, sort_keys=True)} => {json.dumps(value, sort_keys=True)}")
print("\n".join(sorted(lines)))
