#!/usr/bin/env python3
"""The endpoint protocol's place in the include graph (docs/architecture.md, "A map of the code").

cni/protocol/ is a leaf: it includes abseil, nlohmann_json and itself only. The plugin's own code
(cni/ outside protocol/) and the agent both sit above it and never include each other: no file
under cni/ includes agent/ (but agent/base/, whose version.h the plugin prints), and no file under
agent/ includes cni/ (but cni/protocol/). Fails naming every include that breaks this.

Usage: layering_test.py SOURCE_DIR
"""
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def includes(root, folder):
    for path in sorted((root / folder).rglob("*")):
        if path.suffix in (".h", ".cc", ".hpp") and path.is_file():
            for target in INCLUDE.findall(path.read_text(errors="replace")):
                yield path.relative_to(root).as_posix(), target


def main():
    root = pathlib.Path(sys.argv[1])
    broken = []
    for source, target in includes(root, "cni/protocol"):
        if not target.startswith(("absl/", "nlohmann/", "cni/protocol/")):
            broken.append(f"{source} includes {target}: cni/protocol/ is a leaf")
    for source, target in includes(root, "cni"):
        if target.startswith("agent/") and not target.startswith("agent/base/"):
            broken.append(f"{source} includes {target}: the plugin does not include the agent")
    for source, target in includes(root, "agent"):
        if target.startswith("cni/") and not target.startswith("cni/protocol/"):
            broken.append(f"{source} includes {target}: the agent includes only cni/protocol/")
    # The check must be able to fail: the folders it reads exist and hold includes.
    if not any(True for _ in includes(root, "cni/protocol")):
        broken.append("no includes found under cni/protocol/: wrong SOURCE_DIR?")
    for line in broken:
        print(line)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
