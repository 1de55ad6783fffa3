"""Apiserver faults during changes (issue 9), driven against a running sluice-lab: for each fault
kind, ROUNDS times, inject the fault and change Services and EndpointSlices around it (create one,
re-point one's endpoints, delete one), then time how long until the node's pinned maps (read with
`sluicectl services`, straight from the maps) match the API state the test wrote. Prints one line
per fault kind with p50 and max, and fails when any convergence exceeds BOUND seconds.

  fault_converge.py LAB_NAME SLUICECTL BPFFS KUBECONFIG ROUNDS BOUND

The Services are selector-less (their EndpointSlices are the test's), with fixed ClusterIPs in
10.96.200.0/24 and backends 10.244.200.0/24 that need not exist: only what is programmed counts.
"""
import json, os, re, statistics, subprocess, sys, time

lab, sluicectl, bpffs, kubeconfig = sys.argv[1:5]
rounds, bound = int(sys.argv[5]), float(sys.argv[6])
here = os.path.dirname(os.path.abspath(__file__))
lab_bin = os.path.join(os.path.dirname(sluicectl), "lab", "sluice-lab")


def sh(*argv, input=None, check=True):
    r = subprocess.run(argv, input=input, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{argv}: {r.returncode}: {r.stdout} {r.stderr}")
    return r.stdout


def kubectl(*args, input=None, check=True):
    # Retries while the apiserver is away (go-away) or stalled: the change must land.
    deadline = time.time() + 30
    while True:
        r = subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "--request-timeout=20s", *args],
                           input=input, capture_output=True, text=True)
        if r.returncode == 0 or not check:
            return r.stdout
        if time.time() > deadline:
            raise RuntimeError(f"kubectl {args}: {r.stderr}")
        time.sleep(0.1)


def fault(action, *flags):
    sh(lab_bin, "fault", "--name", lab, action, *flags)


def service_yaml(n, endpoints):
    eps = "\n".join(f"- addresses: [{a}]\n  conditions: {{ready: true}}" for a in endpoints)
    return f"""---
apiVersion: v1
kind: Service
metadata: {{name: f-{n}}}
spec:
  clusterIP: 10.96.200.{n}
  ports: [{{name: http, port: 80, targetPort: 8080}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: f-{n}-1
  labels: {{kubernetes.io/service-name: f-{n}}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints:
{eps}
"""


def programmed():
    """{frontend "IP:80": sorted backend "IP:PORT" list} for the 10.96.200.0/24 frontends."""
    out = sh(sluicectl, f"--bpffs_root={bpffs}", "services")
    got, cur = {}, None
    for line in out.splitlines():
        m = re.match(r"^(10\.96\.200\.\d+:\d+)\s+tcp\s", line)
        if m:
            cur = m.group(1)
            got[cur] = []
            continue
        if not line.startswith((" ", "\t")):
            cur = None
            continue
        m = re.search(r"slot \d+\s+backend \d+\s+(\S+)", line)
        if m and cur:
            got[cur].append(m.group(1))
    return {k: sorted(v) for k, v in got.items()}


def wait_converged(want, t0):
    deadline = t0 + max(bound * 4, 30)
    while True:
        got = programmed()
        if got == want:
            return time.time() - t0
        if time.time() > deadline:
            raise RuntimeError(f"not converged after {time.time() - t0:.1f} s:\n want {want}\n got {got}")
        time.sleep(0.02)


state = {}  # n -> endpoints


def want():
    return {f"10.96.200.{n}:80": sorted(f"{a}:8080" for a in eps) for n, eps in state.items()}


def change(serial):
    """Creates f-serial, re-points f-(serial-1), deletes f-(serial-3): one apply, one delete."""
    docs = []
    state[serial] = [f"10.244.200.{(serial * 3 + i) % 250 + 1}" for i in range(serial % 3 + 1)]
    docs.append(service_yaml(serial, state[serial]))
    if serial - 1 in state:
        state[serial - 1] = [f"10.244.200.{(serial * 7 + i) % 250 + 1}" for i in range(2)]
        docs.append(service_yaml(serial - 1, state[serial - 1]))
    kubectl("apply", "--validate=false", "-f", "-", input="".join(docs))
    if serial - 3 in state:
        del state[serial - 3]
        kubectl("delete", "service", f"f-{serial - 3}", "--wait=false")
        kubectl("delete", "endpointslice", f"f-{serial - 3}-1", "--wait=false")


# Each kind: what to do before the change, and after it (the change then lands around the fault).
KINDS = {
    # Open watches are cut in the middle of the next event's bytes (the change's).
    "cut-mid-event": (lambda: fault("cut-watches", "--mid_event", "--at_next_event"), None),
    # The watches are frozen, the history is dropped, then they are cut: every re-watch, from a
    # compacted resourceVersion, gets 410 Gone once, and the agent relists. (Answering the next N
    # watches with 410 gave the quicker kinds two in a row, the second after their fresh list,
    # which the agent backs off from as from any server that keeps answering 410.)
    "410-gone": (lambda: (fault("freeze-watches"), fault("compact"), fault("cut-watches")), None),
    # Cut, and every request of the next 2 s (the agent's re-watch, our change) is held.
    "stall": (lambda: (fault("cut-watches"), fault("stall", "--seconds", "2")), None),
    # Right after the change the apiserver closes its listener and every stream for 2 s.
    "go-away": (None, lambda: fault("go-away", "--seconds", "2")),
    # Right after the change the watch history is dropped: running watches get ERROR 410.
    "compact": (None, lambda: fault("compact")),
}

# Every watch open before a fault: the agent's (6 resources), as it is now.
watches = json.loads(kubectl("get", "--raw", "/lab/faults"))["openWatches"]
serial = 0
# A first Service, converged without a fault: the baseline.
serial += 1
change(serial)
base = wait_converged(want(), time.time())
results = {"no-fault": [base]}
for kind, (before, after) in KINDS.items():
    results[kind] = []
    for r in range(rounds):
        serial += 1
        if before:
            before()
        change(serial)
        t0 = time.time()  # the API holds the new state from here
        if after:
            after()
        results[kind].append(wait_converged(want(), t0))
        # Let the agent's watches settle before the next fault (a fault on a fresh re-watch is
        # another kind of test): the maps already match, wait for the watches to be open again.
        deadline = time.time() + 10
        while time.time() < deadline:
            r = subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "get", "--raw", "/lab/faults"],
                               capture_output=True, text=True)
            if r.returncode == 0 and json.loads(r.stdout).get("openWatches", 0) >= watches:
                break
            time.sleep(0.05)
worst = 0.0
for kind, ts in results.items():
    worst = max(worst, max(ts))
    print(f"convergence {kind:14s} n={len(ts):3d} p50={statistics.median(ts):.2f}s max={max(ts):.2f}s")
if worst > bound:
    print(f"FAIL: a convergence took {worst:.2f} s > {bound} s", file=sys.stderr)
    sys.exit(1)
