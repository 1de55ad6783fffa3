#!/usr/bin/env python3
"""One version everywhere a release names it: the CMake project version (what every binary
prints), the chart's version and appVersion (helm/sluice/Chart.yaml), the top entry of
CHANGELOG.md, and the --version line of each built binary, which must also name a git commit.

usage: release_versions_test.py SOURCE_DIR BUILD_DIR
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from checklist import check, finish  # noqa: E402

source, build = sys.argv[1], sys.argv[2]


def read(path):
    return open(os.path.join(source, path)).read()


m = re.search(r"project\(sluice VERSION (\d+\.\d+\.\d+)", read("CMakeLists.txt"))
check("CMakeLists.txt names the project version", m is not None)
version = m.group(1) if m else "?"
chart = read("helm/sluice/Chart.yaml")
chart_version = re.search(r"^version:\s*\"?([^\"\s]+)", chart, re.M)
app_version = re.search(r"^appVersion:\s*\"?([^\"\s]+)", chart, re.M)
check("Chart.yaml version is the project version",
      chart_version is not None and chart_version.group(1) == version,
      chart_version.group(1) if chart_version else "missing")
check("Chart.yaml appVersion is the project version",
      app_version is not None and app_version.group(1) == version,
      app_version.group(1) if app_version else "missing")
top = re.search(r"^## (\S+)", read("CHANGELOG.md"), re.M)
check("CHANGELOG.md's top entry is the project version", top is not None and top.group(1) == version,
      top.group(1) if top else "no entry")

# Each binary the image carries answers --version with the version and a git commit (an
# abbreviated hash, possibly after a tag: `git describe`); "unknown" means none was embedded.
binaries = {"sluice-agent": "agent/sluice-agent", "sluicectl": "agent/sluicectl",
            "sluice-operator": "agent/sluice-operator", "sluice-cni": "cni/sluice-cni"}
env = {k: v for k, v in os.environ.items() if k != "CNI_COMMAND"}
for name, rel in binaries.items():
    path = os.path.join(build, rel)
    if not os.path.isfile(path):
        check(f"{name} is built", False, path)
        continue
    out = subprocess.run([path, "--version"], capture_output=True, text=True, env=env,
                         stdin=subprocess.DEVNULL, timeout=30).stdout.strip()
    check(f"{name} --version prints the project version", f"{name} {version} " in out + " ", out)
    check(f"{name} --version names a git commit",
          re.search(r"\(git (\S*-g)?[0-9a-f]{7,}(-dirty)?\)", out) is not None, out)

finish()
