#!/usr/bin/env python3
"""The lab's rooms stand on floors (agent/lab/CMakeLists.txt): a file in a room includes lab
headers only from its own room and the rooms below it, and no room includes the lab as a whole
(lab.h). Read from the source tree, so a new include that climbs up fails here, naming the file
and the line. A script, not a gtest: it reads text and has nothing to compile.

Usage: rooms_test.py SOURCE_DIR
"""
import pathlib
import re
import sys

# Bottom first. A room may include its own floor and those below it.
FLOORS = ["tools", "store", "network", "controllers", "apiserver", "workloads", "node"]
TOP = len(FLOORS)  # lab.{h,cc} and main.cc, in agent/lab/ itself
INCLUDE = re.compile(r'^#include "agent/lab/([^"]+)"')


def floor_of(relative):
    """The floor of a path relative to agent/lab/; None for a folder that is not a room."""
    parts = pathlib.PurePosixPath(relative).parts
    if len(parts) == 1:
        return TOP
    return FLOORS.index(parts[0]) if parts[0] in FLOORS else None


def main():
    lab = pathlib.Path(sys.argv[1]) / "agent" / "lab"
    climbs = []
    files = sorted(p for p in lab.rglob("*") if p.suffix in (".h", ".cc") and p.is_file())
    if len(files) < 40:
        climbs.append(f"only {len(files)} sources found under {lab}")
    for path in files:
        relative = path.relative_to(lab).as_posix()
        floor = floor_of(relative)
        if floor is None:
            climbs.append(f"{relative}: not in a room")
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            to = floor_of(m.group(1))
            if to is None or to > floor:
                climbs.append(f"{relative}:{number} includes {m.group(1)}")
    if climbs:
        print("lab rooms: includes that climb\n" + "\n".join(climbs))
        return 1
    print(f"lab rooms: {len(files)} files, every include on its floor or below")
    return 0


if __name__ == "__main__":
    sys.exit(main())
