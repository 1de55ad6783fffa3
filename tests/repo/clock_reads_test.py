#!/usr/bin/env python3
"""Fails where the product code reads the time past the injected clock.

Everything in the agent, the loader and the maps layer that stamps, times, backs off or measures an
age reads the time through sluice::Clock (agent/base/clock.h), so that tests move time by hand
(agent/base/fake_clock.h) instead of sleeping. Waits that the kernel (poll(2)) or absl::Mutex
times run on the real clock whatever clock is injected; their deadlines are read in one place,
agent/base/deadline.h (WaitDeadline, WaitDeadlinePassed, PollTimeoutMs).

What is read: the tracked .h and .cc files under agent/ loader/ maps/ cni/ (comments stripped).
What fails: a call of absl::Now(), std::chrono's system_clock::now() or steady_clock::now(), or
absl::GetCurrentTimeNanos(), anywhere but:
- agent/base/clock.h (RealClock) and agent/base/deadline.h (the waits' deadlines);
- agent/lab/ (the fake cluster: not the product);
- cni/agent_client.cc (the CNI plugin, a separate short-lived binary that links nothing of the
  agent's base: its one deadline for the whole exchange with the agent).
The datapath's own clock (clock_gettime(CLOCK_MONOTONIC), which bpf_ktime_get_ns reads) is the
kernel's and is not counted here.

usage: clock_reads_test.py SOURCE_DIR
"""

import re
import subprocess
import sys

ALLOWED = {"agent/base/clock.h", "agent/base/deadline.h", "cni/agent_client.cc"}
ALLOWED_DIRS = ("agent/lab/",)
READ = re.compile(
    r"absl::Now\s*\(|(?:system_clock|steady_clock)::now\s*\(|absl::GetCurrentTimeNanos\s*\(")
COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')


def main(root):
    files = subprocess.run(["git", "-C", root, "ls-files", "agent", "loader", "maps", "cni"],
                           check=True, capture_output=True, text=True).stdout.split()
    checked, found = 0, []
    for path in files:
        if not path.endswith((".h", ".cc")) or path in ALLOWED or path.startswith(ALLOWED_DIRS):
            continue
        checked += 1
        with open(f"{root}/{path}", encoding="utf-8") as f:
            text = f.read()
        # Strings first (a "//" inside one is no comment), then comments; each replaced by blanks
        # of its own length's newlines so that line numbers stay right.
        keep_lines = lambda m: re.sub(r"[^\n]", " ", m.group(0))
        code = COMMENT.sub(keep_lines, STRING.sub(keep_lines, text))
        for m in READ.finditer(code):
            line = code.count("\n", 0, m.start()) + 1
            found.append(f"{path}:{line}: {text.splitlines()[line - 1].strip()}")
    print(f"clock_reads: {checked} files read")
    if checked == 0:
        print("FAIL: no files read (wrong SOURCE_DIR?)")
        return 1
    for f in found:
        print(f"FAIL: reads the time past sluice::Clock: {f}")
    if found:
        print("Take a `const Clock*` (agent/base/clock.h) for stamps and measurements, or "
              "WaitDeadline (agent/base/deadline.h) for a poll or absl::Mutex wait's deadline.")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
