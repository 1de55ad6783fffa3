#!/usr/bin/env bash
# NetworkPolicy end to end in a 2-node sluice-lab, after the upstream e2e model
# (test/e2e/network/netpol in kubernetes/kubernetes): namespaces x, y, z with pods a, b, c each,
# serving TCP and UDP on 80 and 81 (container ports named serve-80-tcp etc.), spread over both
# nodes. 17 cases; each applies its policies, computes the expected 9x9 reachability from its
# rules with a Reachability helper (never a hand-typed matrix), and probes every pod -> every pod
# by pod IP until the observation equals the expectation (at most 10 s, the upstream rule); a
# failure prints both matrices. One lab serves every case. (Names and labels are quoted: YAML 1.1
# reads a bare y as true.)
set -euo pipefail
NAME=policy2np$$
source "$(dirname "$0")/lablib.sh"
WORK=$(mktemp -d /tmp/sluice-netpol-test.XXXXXX)
KEEP_LOGS=/tmp/netpol_test-$NAME

KUBECONFIG_PATH=$("$LAB" up --nodes 2 --name "$NAME") || fail "up"
log "lab $NAME up"

{
  for ns in x y z; do
    cat <<YAML
---
apiVersion: v1
kind: Namespace
metadata: {name: "$ns", labels: {ns: "$ns"}}
YAML
  done
} | K apply --validate=false -f - >/dev/null || fail "apply namespaces"
{
  for ns in x y z; do
    for pod in a b c; do
      node=node1
      if [ "$pod" = b ]; then node=node2; fi
      cat <<YAML
---
apiVersion: v1
kind: Pod
metadata: {name: "$pod", namespace: "$ns", labels: {pod: "$pod"}}
spec:
  nodeName: $node
  containers:
  - name: c
    image: netexec
    ports:
    - {name: serve-80-tcp, containerPort: 80, protocol: TCP}
    - {name: serve-81-tcp, containerPort: 81, protocol: TCP}
    - {name: serve-80-udp, containerPort: 80, protocol: UDP}
    - {name: serve-81-udp, containerPort: 81, protocol: UDP}
YAML
    done
  done
} | K apply --validate=false -f - >/dev/null || fail "apply pods"
for ns in x y z; do
  K wait -n "$ns" --for=condition=Ready pod/a pod/b pod/c --timeout=60s >/dev/null ||
    fail "pods of $ns not Ready: $(K get pods -n "$ns" -o yaml)"
done
log "9 pods Ready"

cat >"$WORK/netpol.py" <<'PY'
"""The cases: policies to apply, and the expected reachability built from their rules."""
import concurrent.futures, json, subprocess, sys, time

LAB, NAME, KCFG = sys.argv[1], sys.argv[2], sys.argv[3]
NSS, PODS = ["x", "y", "z"], ["a", "b", "c"]
ALL = [f"{n}/{p}" for n in NSS for p in PODS]

def kubectl(*args, stdin=None):
    r = subprocess.run(["kubectl", "--kubeconfig", KCFG, *args], input=stdin, text=True,
                       capture_output=True)
    if r.returncode != 0:
        raise SystemExit(f"kubectl {' '.join(args)}: {r.stderr}")
    return r.stdout

IPS = {}
for ns in NSS:
    for p in PODS:
        IPS[f"{ns}/{p}"] = kubectl("get", "pod", p, "-n", ns, "-o",
                                   "jsonpath={.status.podIP}").strip()
LABELS = {k: {"pod": k.split("/")[1]} for k in ALL}

class Reachability:
    """Like upstream's: every (from, to) starts at `default`; Expect* narrow it."""
    def __init__(self, default=True):
        self.m = {(f, t): default for f in ALL for t in ALL}
    def ingress(self, to, allowed):       # every source into `to`
        for f in ALL: self.m[(f, to)] = allowed
        return self
    def egress(self, frm, allowed):       # `frm` to every destination
        for t in ALL: self.m[(frm, t)] = allowed
        return self
    def peer(self, frm, to, allowed):     # predicates on "ns/pod"
        for f in ALL:
            for t in ALL:
                if frm(f) and to(t): self.m[(f, t)] = allowed
        return self
    def loopback(self):                   # a pod reaches itself without leaving its netns
        for p in ALL: self.m[(p, p)] = True
        return self

def ns_of(k): return k.split("/")[0]
def pod_of(k): return LABELS[k]["pod"]

def probe(frm, to, port, proto):
    r = subprocess.run([LAB, "probe", "--name", NAME, "--from", frm, "--to",
                        f"{IPS[to]}:{port}", "--proto", proto, "--timeout", "1"],
                       capture_output=True, text=True)
    return r.stdout.strip() == "CONNECTED"

def observe(port, proto):
    with concurrent.futures.ThreadPoolExecutor(max_workers=27) as ex:
        futs = {(f, t): ex.submit(probe, f, t, port, proto) for f in ALL for t in ALL}
        return {k: v.result() for k, v in futs.items()}

def show(m):
    rows = ["        " + " ".join(f"{t:>4}" for t in ALL)]
    for f in ALL:
        rows.append(f"{f:>6}  " + " ".join(f"{'.' if m[(f, t)] else 'X':>4}" for t in ALL))
    return "\n".join(rows)

def check(case, want, port=80, proto="tcp"):
    deadline = time.time() + 10
    while True:
        got = observe(port, proto)
        if got == want.m:
            print(f"ok: {case} ({proto}/{port})", flush=True)
            return True
        if time.time() > deadline:
            print(f"FAIL: {case} ({proto}/{port}): '.' reaches, 'X' does not (rows: from)\n"
                  f"expected:\n{show(want.m)}\nobserved:\n{show(got)}", flush=True)
            return False

applied = []
def apply(name, ns, spec):
    doc = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"name": name, "namespace": ns}, "spec": spec}
    kubectl("apply", "--validate=false", "-f", "-", stdin=json.dumps(doc))
    if (ns, name) not in applied: applied.append((ns, name))

def reset():
    while applied:
        ns, name = applied.pop()
        kubectl("delete", "networkpolicy", name, "-n", ns)

def relabel(key, value):
    ns, pod = key.split("/")
    kubectl("label", "pod", pod, "-n", ns, f"pod={value}", "--overwrite")
    LABELS[key]["pod"] = value

ok = True
def case(name, fn):
    global ok
    try:
        ok = fn(name) and ok
    finally:
        reset()

x_a = lambda k: k == "x/a"
any_ = lambda k: True

def default_deny_ingress(n):
    apply("deny", "x", {"podSelector": {}, "policyTypes": ["Ingress"]})
    r = Reachability()
    for t in ALL:
        if ns_of(t) == "x": r.ingress(t, False)
    return check(n, r.loopback())

def default_deny_egress(n):
    apply("deny", "x", {"podSelector": {}, "policyTypes": ["Egress"]})
    r = Reachability()
    for f in ALL:
        if ns_of(f) == "x": r.egress(f, False)
    return check(n, r.loopback())

def allow_all_after_deny(n):
    apply("deny", "x", {"podSelector": {}, "policyTypes": ["Ingress"]})
    apply("allow-all", "x", {"podSelector": {}, "ingress": [{}]})
    return check(n, Reachability())

def pod_selector(n):
    apply("allow-b", "x", {"podSelector": {"matchLabels": {"pod": "a"}},
                           "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]})
    r = Reachability().ingress("x/a", False)
    r.peer(lambda f: ns_of(f) == "x" and pod_of(f) == "b", x_a, True)
    return check(n, r.loopback())

def namespace_selector(n):
    apply("allow-y", "x", {"podSelector": {"matchLabels": {"pod": "a"}},
                           "ingress": [{"from": [{"namespaceSelector":
                                                  {"matchLabels": {"ns": "y"}}}]}]})
    r = Reachability().ingress("x/a", False)
    r.peer(lambda f: ns_of(f) == "y", x_a, True)
    return check(n, r.loopback())

def ns_and_pod(n):
    apply("and", "x", {"podSelector": {"matchLabels": {"pod": "a"}},
                       "ingress": [{"from": [{
                           "namespaceSelector": {"matchExpressions": [
                               {"key": "ns", "operator": "In", "values": ["y", "z"]}]},
                           "podSelector": {"matchLabels": {"pod": "b"}}}]}]})
    r = Reachability().ingress("x/a", False)
    r.peer(lambda f: ns_of(f) in ("y", "z") and pod_of(f) == "b", x_a, True)
    return check(n, r.loopback())

def ns_or_pod(n):
    apply("or", "x", {"podSelector": {"matchLabels": {"pod": "a"}},
                      "ingress": [{"from": [
                          {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "y"}}},
                          {"podSelector": {"matchLabels": {"pod": "c"}}}]}]})
    r = Reachability().ingress("x/a", False)
    r.peer(lambda f: ns_of(f) == "y" or (ns_of(f) == "x" and pod_of(f) == "c"), x_a, True)
    return check(n, r.loopback())

def ports(n):
    apply("port-81", "x", {"podSelector": {"matchLabels": {"pod": "a"}},
                           "ingress": [{"ports": [{"port": 81, "protocol": "TCP"}]}]})
    closed = Reachability().ingress("x/a", False).loopback()
    return check(n, closed, 80) & check(n, Reachability(), 81) & \
        check(n, closed, 81, "udp")

def named_port(n):
    apply("named", "x", {"podSelector": {"matchLabels": {"pod": "a"}},
                         "ingress": [{"ports": [{"port": "serve-81-udp", "protocol": "UDP"}]}]})
    closed = Reachability().ingress("x/a", False).loopback()
    return check(n, Reachability(), 81, "udp") & check(n, closed, 80, "udp") & \
        check(n, closed, 81)

def end_port(n):
    apply("range", "x", {"podSelector": {"matchLabels": {"pod": "a"}},
                         "egress": [{"ports": [{"port": 81, "endPort": 82}]}],
                         "policyTypes": ["Egress"]})
    closed = Reachability().egress("x/a", False).loopback()
    return check(n, closed, 80) & check(n, Reachability(), 81)

def ip_block_except(n):
    apply("cidr", "x", {"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"],
                        "egress": [{"to": [{"ipBlock": {"cidr": "10.244.0.0/16",
                                                        "except": [IPS["y/b"] + "/32"]}}]}]})
    r = Reachability().peer(x_a, lambda t: t == "y/b", False)
    return check(n, r.loopback())

def update_in_place(n):
    allow = lambda who: {"podSelector": {"matchLabels": {"pod": "a"}},
                         "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": who}}}]}]}
    apply("allow", "x", allow("b"))
    r = Reachability().ingress("x/a", False).loopback()
    r.peer(lambda f: f == "x/b", x_a, True)
    good = check(n + " (before)", r)
    apply("allow", "x", allow("c"))
    r = Reachability().ingress("x/a", False).loopback()
    r.peer(lambda f: f == "x/c", x_a, True)
    return check(n + " (after)", r) and good

def default_deny_all(n):
    apply("deny", "x", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]})
    r = Reachability()
    for k in ALL:
        if ns_of(k) == "x":
            r.ingress(k, False)
            r.egress(k, False)
    return check(n, r.loopback())

def stacked(n):  # two policies selecting one pod: the union of their allows
    apply("allow-b", "x", {"podSelector": {"matchLabels": {"pod": "a"}},
                           "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]})
    apply("allow-y", "x", {"podSelector": {"matchLabels": {"pod": "a"}},
                           "ingress": [{"from": [{"namespaceSelector":
                                                  {"matchLabels": {"ns": "y"}}}]}]})
    r = Reachability().ingress("x/a", False)
    r.peer(lambda f: f == "x/b" or ns_of(f) == "y", x_a, True)
    return check(n, r.loopback())

def egress_to_namespace(n):
    apply("to-y", "x", {"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"],
                        "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]})
    r = Reachability().egress("x/a", False)
    r.peer(x_a, lambda t: ns_of(t) == "y", True)
    return check(n, r.loopback())

def namespace_relabel(n):
    apply("from-blue", "x", {"podSelector": {"matchLabels": {"pod": "a"}},
                             "ingress": [{"from": [{"namespaceSelector":
                                                    {"matchLabels": {"team": "blue"}}}]}]})
    closed = Reachability().ingress("x/a", False).loopback()
    good = check(n + " (no namespace is blue)", closed)
    kubectl("label", "namespace", "y", "team=blue", "--overwrite")
    try:
        r = Reachability().ingress("x/a", False).loopback()
        r.peer(lambda f: ns_of(f) == "y", x_a, True)
        return check(n + " (y relabelled blue)", r) and good
    finally:
        kubectl("label", "namespace", "y", "team-")

def pod_relabel(n):
    apply("allow-b", "x", {"podSelector": {"matchLabels": {"pod": "a"}},
                           "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]})
    relabel("x/c", "b")
    try:
        r = Reachability().ingress("x/a", False).loopback()
        r.peer(lambda f: ns_of(f) == "x" and pod_of(f) == "b", x_a, True)
        return check(n, r)
    finally:
        relabel("x/c", "c")

for name, fn in [("default deny ingress", default_deny_ingress),
                 ("default deny egress", default_deny_egress),
                 ("default deny ingress and egress", default_deny_all),
                 ("allow all after default deny", allow_all_after_deny),
                 ("pod selector", pod_selector),
                 ("namespace selector", namespace_selector),
                 ("namespace AND pod selector", ns_and_pod),
                 ("namespace OR pod selector", ns_or_pod),
                 ("stacked policies (union)", stacked),
                 ("egress to a namespace", egress_to_namespace),
                 ("numeric port", ports),
                 ("named port", named_port),
                 ("endPort", end_port),
                 ("ipBlock with except", ip_block_except),
                 ("policy updated in place", update_in_place),
                 ("pod relabelled", pod_relabel),
                 ("namespace relabelled", namespace_relabel)]:
    case(name, fn)
# With every policy gone, everything reaches everything again.
ok = check("no policy left", Reachability()) and ok
sys.exit(0 if ok else 1)
PY
start=$SECONDS
python3 "$WORK/netpol.py" "$LAB" "$NAME" "$KUBECONFIG_PATH" || fail "netpol cases"
log "ok: every netpol case in $((SECONDS - start)) s"
"$SLUICECTL" --bpffs_root="$DIR/node1/bpf" drops | grep policy_denied >&2 || true
