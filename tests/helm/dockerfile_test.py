#!/usr/bin/env python3
"""Checks helm/Dockerfile's structure (tests/e2e/image_test.sh runs the image `make image` builds
from it): a Debian bookworm build stage and runtime stage, the binaries taken from the build
stage or from `make image`'s context (helm/image/build.sh) through one stage, every COPY source
present (in the repository, built by the build stage and present in the local build, or staged by
build.sh), the runtime stage's packages providing every shared library the agent links, the
binaries the chart runs copied into the image, sluice-agent the entrypoint.

usage: dockerfile_test.py SOURCE_DIR BUILD_DIR
"""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from checklist import check, finish  # noqa: E402

source, build = sys.argv[1], sys.argv[2]
dockerfile = os.path.join(source, "helm", "Dockerfile")


# Instructions with their continuation lines joined, comments dropped.
text = re.sub(r"\\\n", " ", open(dockerfile).read())
instructions = []
for line in text.splitlines():
    line = line.strip()
    if line and not line.startswith("#"):
        op, _, rest = line.partition(" ")
        instructions.append((op.upper(), rest.strip()))

stages = []  # {name, image, instructions}
args = {}  # global ARGs (before the first FROM) and their defaults
for op, rest in instructions:
    if op == "FROM":
        m = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", rest, re.I)
        stages.append({"image": m.group(1) if m else rest, "name": m.group(2) if m else None, "ops": []})
    elif stages:
        stages[-1]["ops"].append((op, rest))
    elif op == "ARG":
        name, _, default = rest.partition("=")
        args[name] = default

check("every stage is named", all(s["name"] for s in stages))
by_name = {s["name"]: s for s in stages}
build_stage, runtime = stages[0], stages[-1]
for s in (build_stage, runtime):
    check(f"stage {s['name']} is Debian bookworm", re.fullmatch(r"debian:bookworm(-slim)?", s["image"]) is not None,
          s["image"])
# The binaries' stage is FROM ${BINARIES}: the build stage by default, `local` for make image.
binaries = next((s for s in stages if re.fullmatch(r"\$\{?BINARIES\}?", s["image"])), None)
check("a stage FROM ${BINARIES}", binaries is not None)
check("BINARIES defaults to the build stage", args.get("BINARIES") == build_stage["name"], str(args))
build_sh = open(os.path.join(source, "helm", "image", "build.sh")).read()
check("build.sh builds with BINARIES=local", "--build-arg BINARIES=local" in build_sh)
local = by_name.get("local")
check("a stage local (make image's binaries)", local is not None and local["image"] == "scratch",
      str(local and local["image"]))

def apt_packages(stage):
    pkgs = []
    for op, rest in stage["ops"]:
        if op == "RUN":
            for m in re.finditer(r"apt-get install ((?:\s*[-\w.+]+)+)", rest):
                pkgs += [p for p in m.group(1).split() if not p.startswith("-")]
    return pkgs


# The build stage installs what `make deps` installs (one list to keep true).
makefile = open(os.path.join(source, "Makefile")).read()
deps = set(re.search(r"DEB_PACKAGES := (.*?)\n\n", makefile, re.S).group(1).replace("\\", " ").split())
build_pkgs = apt_packages(build_stage)
check("build stage installs packages", len(build_pkgs) > 10)
missing = [p for p in build_pkgs if p not in deps]
check("build stage packages are in the Makefile's deps", not missing, " ".join(missing))

# What each stage leaves in /out: the build stage strips its binaries there, the local stage
# copies build.sh's stripped copies of the local build's.
built_targets = set()
out_from_build = {}  # /out/NAME -> path in the build directory
for op, rest in build_stage["ops"]:
    if op == "RUN":
        for m in re.finditer(r"ninja -C build ([\w\s-]+?)(?:&&|$)", rest):
            built_targets.update(m.group(1).split())
        for m in re.finditer(r"strip -o (/out/[\w-]+) build/(\S+)", rest):
            out_from_build[m.group(1)] = m.group(2)
out_from_local = set()
for op, rest in (local or {"ops": []})["ops"]:
    if op == "COPY":
        parts = rest.split()
        check(f"local: COPY {rest} into /out/", parts[-1] == "/out/")
        for src in parts[:-1]:
            check(f"local: build.sh stages {src} in the context", f'"$context/{src}"' in build_sh)
            out_from_local.add(f"/out/{src}")

destinations = {}
for s in stages:
    for op, rest in s["ops"]:
        if op != "COPY" or s is local:
            continue
        parts = rest.split()
        flags = [p for p in parts if p.startswith("--")]
        srcs, dest = [p for p in parts if not p.startswith("--")][:-1], parts[-1]
        from_stage = next((f.split("=", 1)[1] for f in flags if f.startswith("--from=")), None)
        for src in srcs:
            if from_stage is None:
                check(f"COPY {src}: in the repository", os.path.exists(os.path.join(source, src)))
                continue
            check(f"COPY --from={from_stage} {src}: an earlier stage",
                  from_stage in [x["name"] for x in stages[:stages.index(s)]])
            check(f"COPY --from={from_stage} {src}: the binaries' stage", from_stage == (binaries or {}).get("name"))
            rel = out_from_build.get(src, "")
            check(f"COPY --from={from_stage} {src}: built by the build stage ({rel})",
                  os.path.basename(rel) in built_targets)
            check(f"COPY --from={from_stage} {src}: in the local stage", src in out_from_local)
            check(f"COPY --from={from_stage} {src}: present in the local build",
                  os.path.isfile(os.path.join(build, rel)), os.path.join(build, rel))
            if s is runtime:
                destinations[dest] = os.path.basename(src)

entry = [rest for op, rest in runtime["ops"] if op == "ENTRYPOINT"]
check("one ENTRYPOINT in the runtime stage", len(entry) == 1)
if entry:
    argv = json.loads(entry[0])
    check("ENTRYPOINT (exec form) is sluice-agent", os.path.basename(argv[0]) == "sluice-agent", entry[0])
    check("ENTRYPOINT binary is copied into the image", argv[0] in destinations, argv[0])

# The chart runs these paths of the image: each must be copied there.
chart_paths = set()
for root, _, files in os.walk(os.path.join(source, "helm", "sluice", "templates")):
    for f in files:
        text = open(os.path.join(root, f)).read()
        chart_paths.update(re.findall(r"/usr/local/bin/[\w-]+", text))
        # A bare command (command: [sluice-operator]) is found on PATH: /usr/local/bin.
        chart_paths.update(f"/usr/local/bin/{c}" for c in re.findall(r"command: \[([\w-]+)[\],]", text))
check("the chart names image paths", len(chart_paths) > 0)
for p in sorted(chart_paths):
    check(f"the chart's {p} is in the image", p in destinations)
check("sluice-cni is linked statically (it runs on the node)",
      "-DSLUICE_STATIC_CNI=ON" in " ".join(r for o, r in build_stage["ops"] if o == "RUN") and
      "SLUICE_STATIC_CNI" in open(os.path.join(source, "cni", "CMakeLists.txt")).read())

# Every shared library the agent needs comes from a runtime package (or the slim base image).
BASE = {"libc6", "libgcc-s1", "libstdc++6", "zlib1g"}
runtime_pkgs = set(apt_packages(runtime)) | BASE
agent = os.path.join(build, "agent", "sluice-agent")
needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]",
                    subprocess.run(["readelf", "-d", agent], capture_output=True, text=True).stdout)
resolved = dict(re.findall(r"^\s*(\S+) => (\S+)", subprocess.run(["ldd", agent], capture_output=True,
                                                                  text=True).stdout, re.M))
check("the agent links shared libraries", len(needed) > 5, str(needed))
# One dpkg -S for all of them (each call reads the whole package database).
paths = {lib: resolved[lib] for lib in needed if lib in resolved}
candidates = sorted({p for path in paths.values() for p in (path, os.path.realpath(path))})
owners = {}
for line in subprocess.run(["dpkg", "-S"] + candidates, capture_output=True, text=True).stdout.splitlines():
    pkg, _, path = line.partition(": ")
    owners[path] = pkg.split(":")[0]
for lib in needed:
    path = paths.get(lib)
    owner = path and (owners.get(os.path.realpath(path)) or owners.get(path))
    check(f"{lib} comes from a runtime package ({owner})", owner in runtime_pkgs)
check("util-linux (nsenter for the mount init containers) is installed", "util-linux" in runtime_pkgs)

finish()
