"""Prints the program arrays of a node's stages (docs/architecture.md, "Stages") as one JSON
document, for upgrade_stages_test.sh: the arrays pinned under BPFFS/stages/ and those that the
programs attached in the node's network namespace NETNS call, each as
{"id", "name", "size", "slots"} (slots: the indices that hold a program), sorted by id; and
the id of every map pinned by name at BPFFS's top (the state an upgrade carries over).

  stage_arrays.py BPFFS NETNS
  -> {"pinned": [...], "attached": [...], "attached_programs": N, "maps": {NAME: ID}}
"""
import json, os, subprocess, sys


def bpftool(*args, netns=None):
    cmd = ["bpftool", "-j", *args]
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def array(spec):
    """A program array given as ("pinned", path) or ("id", id)."""
    info = bpftool("map", "show", *spec)
    dump = bpftool("map", "dump", *spec)
    # From user space a program array answers its entries' program ids; bpftool prints the
    # slot's key and value as byte lists (or "key"/"value" numbers when it has the BTF).
    slots = []
    for e in dump:
        key = e.get("key")
        slots.append(int.from_bytes(bytes(int(b, 16) for b in key), "little")
                     if isinstance(key, list) else int(key))
    return {"id": info["id"], "name": info.get("name", ""), "size": info["max_entries"],
            "slots": sorted(slots)}


def main():
    root, netns = sys.argv[1], sys.argv[2]
    stages = os.path.join(root, "stages")
    pinned = [array(("pinned", os.path.join(stages, p)))
              for p in sorted(os.listdir(stages))] if os.path.isdir(stages) else []
    prog_ids = set()
    for hooks in bpftool("net", "show", netns=netns):
        for kind in ("tc", "xdp"):
            for h in hooks.get(kind, []):
                if "id" in h or "prog_id" in h:
                    prog_ids.add(h.get("prog_id", h.get("id")))
    attached = {}
    for pid in sorted(prog_ids):
        try:
            prog = bpftool("prog", "show", "id", str(pid))
        except subprocess.CalledProcessError:
            continue  # gone since
        for mid in prog.get("map_ids", []):
            if mid in attached:
                continue
            try:
                if bpftool("map", "show", "id", str(mid))["type"] == "prog_array":
                    attached[mid] = array(("id", str(mid)))
            except subprocess.CalledProcessError:
                continue
    maps = {}
    for p in sorted(os.listdir(root)):
        if os.path.isfile(os.path.join(root, p)):
            try:
                maps[p] = bpftool("map", "show", "pinned", os.path.join(root, p))["id"]
            except subprocess.CalledProcessError:
                maps[p] = None  # not a map
    print(json.dumps({"pinned": sorted(pinned, key=lambda a: a["id"]),
                      "attached": [attached[k] for k in sorted(attached)],
                      "attached_programs": len(prog_ids), "maps": maps}))


main()
