#!/usr/bin/env python3
"""One restart of a lab node's agent, timed to its /readyz answering 200 (agent_ready_bench.sh).

Run inside the node's network namespace (the agent's health address is its loopback). ACTION:
  kill   SIGKILL through `sluice-lab agent kill`: the lab's supervisor starts the agent again
         after its restart delay, as a kubelet restarts a DaemonSet's pod. Timed from the kill.
  start  the agent was held down (`sluice-lab agent stop`); `sluice-lab agent start` lets the
         supervisor start it at once. Timed from the start: the agent's own start-up.
Prints one JSON line: {"action", "seconds" (restart -> 200), "down_seconds" (restart -> the old
agent gone, kill only)}. /readyz is polled every 10 ms, each poll a fresh connection.
usage: agent_ready_probe.py LAB_BINARY LAB_NAME NODE ACTION [HEALTH_URL] [TIMEOUT_S]
"""
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request


def ready(url):
    try:
        with urllib.request.urlopen(url, timeout=0.5) as r:
            return r.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def gone(pid):
    """Whether pid has exited (gone or a zombie: its sockets are closed either way)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    lab, name, node, action = sys.argv[1:5]
    url = sys.argv[5] if len(sys.argv) > 5 else "http://127.0.0.1:9879/readyz"
    timeout = float(sys.argv[6]) if len(sys.argv) > 6 else 120.0
    if action not in ("kill", "start"):
        sys.exit(f"agent_ready_probe: unknown action {action} (kill, start)")
    start = time.monotonic()
    out = subprocess.run([lab, "agent", action, "--name", name, "--node", node],
                         check=True, capture_output=True, text=True).stdout.strip()
    down = None
    if action == "kill":
        # "OLD_PID -> ?": the killed agent's socket may take a moment to go; a poll that reached
        # it would time the old agent.
        old = int(out.split()[0])
        while not gone(old):
            if time.monotonic() - start > timeout:
                sys.exit(f"agent_ready_probe: agent {old} still running {timeout} s after the kill")
            time.sleep(0.002)
        down = time.monotonic() - start
    while not ready(url):
        if time.monotonic() - start > timeout:
            sys.exit(f"agent_ready_probe: {node}'s agent not ready {timeout} s after {action}")
        time.sleep(0.01)
    seconds = time.monotonic() - start
    print(json.dumps({"action": action, "seconds": round(seconds, 3),
                      "down_seconds": None if down is None else round(down, 3)}))


if __name__ == "__main__":
    main()
