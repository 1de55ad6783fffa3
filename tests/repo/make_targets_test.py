#!/usr/bin/env python3
"""`make demo` and `make test` are each complete on a fresh machine: each installs the packages
(`make deps`) and builds before it runs its job, so the README's set-up is those two commands.
Reads what make would run (`make -n`, which runs nothing) for each target and checks that the
package step and the build come before the job. Usage: make_targets_test.py SOURCE_DIR"""
import subprocess
import sys

src = sys.argv[1]
jobs = {"demo": "tests/e2e/demo.sh", "test": "ctest --test-dir"}
failed = 0
for target, job in jobs.items():
    # A build directory that does not exist: make must plan the configure step too.
    r = subprocess.run(["make", "-n", "-C", src, target, "BUILD=/nonexistent/sluice-build"],
                       capture_output=True, text=True)
    plan = r.stdout
    steps = {"deps": plan.find("dpkg-query"), "build": plan.find("cmake --build"),
             "job": plan.find(job)}
    if r.returncode != 0 or min(steps.values()) < 0 or \
            not steps["deps"] < steps["build"] < steps["job"]:
        print(f"FAIL make {target}: want deps, then the build, then `{job}`; "
              f"positions {steps}, rc {r.returncode}\n{plan}{r.stderr}")
        failed += 1
    else:
        print(f"ok   make {target}: deps, build, then {job}")
sys.exit(1 if failed else 0)
