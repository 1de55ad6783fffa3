#!/usr/bin/env bash
# NetworkPolicy end to end in a 2-node sluice-lab, after the upstream e2e model
# (test/e2e/network/netpol in kubernetes/kubernetes): namespaces x, y, z with pods a, b, c each,
# serving TCP and UDP on 80 and 81 (container ports named serve-80-tcp etc.) and 53 (for the DNS
# case), spread over both nodes, and one Service per pod (s-a, s-b, s-c in each namespace,
# selecting the pod by a label no policy uses). 53 cases; each applies its policies, computes the
# expected 9x9 reachability from its rules with a Reachability helper (never a hand-typed
# matrix), and probes every pod -> every pod until the observation equals the expectation (at
# most 10 s, the upstream rule); a failure prints both matrices. One lab serves every case.
#
# Probes go by pod IP in every case; the cases marked "+svc" below probe the same matrix through
# each destination's Service (ClusterIP) as well, in the same round: default deny ingress, pod
# selector, numeric port, egress to pods, policies deleted, pod deleted and recreated. Through a
# Service, a pod reaching itself (hairpin) is not judged, as upstream ignores loopback; by pod IP
# it always reaches itself (the packet never leaves its netns).
#
# Probes: one `sluice-lab probe --to A,B,...` per source pod and observation, every destination at
# once, so a matrix costs one 1 s timeout. SLUICE_NETPOL_CASES=core runs only the first 17 cases
# (for a twin that must save time); the default, and both CI scripts, run every case.
# (Names and labels are quoted: YAML 1.1 reads a bare y as true.)
set -euo pipefail
NAME=npc$$
# The agents' /metrics (node-local): the policy counters are checked after the cases.
export SLUICE_LAB_AGENT_ARGS="${SLUICE_LAB_AGENT_ARGS:-} --metrics_address=127.0.0.1:9879"
source "$(dirname "$0")/lib.sh"
lab_init
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
# Every pod serves TCP and UDP on 80, 81 and 53, each port named as the policies name it.
PORTS=serve-80-tcp=80/TCP,serve-81-tcp=81/TCP,serve-80-udp=80/UDP,serve-81-udp=81/UDP
PORTS+=,serve-53-tcp=53/TCP,serve-53-udp=53/UDP
{
  for ns in x y z; do
    for pod in a b c; do
      node=node1
      if [ "$pod" = b ]; then node=node2; fi
      pod_manifest "$pod" --namespace "$ns" --labels "pod=$pod,svc=$pod" --node "$node" \
        --ports "$PORTS"
      cat <<YAML
---
apiVersion: v1
kind: Service
metadata: {name: "s-$pod", namespace: "$ns"}
spec:
  selector: {svc: "$pod"}
  ports:
  - {name: t80, port: 80, targetPort: 80, protocol: TCP}
  - {name: t81, port: 81, targetPort: 81, protocol: TCP}
  - {name: u80, port: 80, targetPort: 80, protocol: UDP}
  - {name: u81, port: 81, targetPort: 81, protocol: UDP}
YAML
    done
  done
} | K apply --validate=false -f - >/dev/null || fail "apply pods and services"
for ns in x y z; do
  K wait -n "$ns" --for=condition=Ready pod/a pod/b pod/c --timeout=60s >/dev/null ||
    fail "pods of $ns not Ready: $(K get pods -n "$ns" -o yaml)"
done
log "9 pods Ready"


cat >"$WORK/netpol.py" <<'PY'
"""The cases: policies to apply, and the expected reachability built from their rules."""
import concurrent.futures, json, os, subprocess, sys, time

LAB, NAME, KCFG = sys.argv[1], sys.argv[2], sys.argv[3]
ONLY_CORE = os.environ.get("SLUICE_NETPOL_CASES", "all") == "core"
NSS, PODS = ["x", "y", "z"], ["a", "b", "c"]
ALL = [f"{n}/{p}" for n in NSS for p in PODS]

def kubectl(*args, stdin=None):
    r = subprocess.run(["kubectl", "--kubeconfig", KCFG, *args], input=stdin, text=True,
                       capture_output=True)
    if r.returncode != 0:
        raise SystemExit(f"kubectl {' '.join(args)}: {r.stderr}")
    return r.stdout

def pod_ip(key):
    ns, p = key.split("/")
    return kubectl("get", "pod", p, "-n", ns, "-o", "jsonpath={.status.podIP}").strip()

IPS = {k: pod_ip(k) for k in ALL}
SVCS = {}
for k in ALL:
    ns, p = k.split("/")
    SVCS[k] = kubectl("get", "service", f"s-{p}", "-n", ns, "-o",
                      "jsonpath={.spec.clusterIP}").strip()
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
    def expect(self, frm, to, allowed):   # one pair
        self.m[(frm, to)] = allowed
        return self
    def loopback(self):                   # a pod reaches itself without leaving its netns
        for p in ALL: self.m[(p, p)] = True
        return self
    def via_service(self):
        """The same matrix through the destinations' Services; hairpin (f == t) not judged."""
        return {k: (None if k[0] == k[1] else v) for k, v in self.m.items()}

def ns_of(k): return k.split("/")[0]
def pod_of(k): return LABELS[k]["pod"]
def in_ns(ns): return lambda k: ns_of(k) == ns
def is_(*keys): return lambda k: k in keys

def probe_from(frm, hosts, port, proto):
    """One `sluice-lab probe` per source, probing every destination at once (a thread each), so
    a 9x9 matrix (x2 with Services) costs one timeout and 9 processes, not 81."""
    to = ",".join(f"{h}:{port}" for h in hosts)
    r = subprocess.run([LAB, "probe", "--name", NAME, "--from", frm, "--to", to, "--proto", proto,
                        "--timeout", "1"], capture_output=True, text=True)
    lines = r.stdout.split("\n")
    # probe exits 0 only when every target is CONNECTED; 3/4/5 (REFUSED/TIMEOUT/UNREACHABLE of
    # the first that is not) are answers too, anything else is a failed probe.
    if r.returncode not in (0, 3, 4, 5) or len(lines) < len(hosts):
        print(f"   probe from {frm} failed: {r.stderr.strip()}", flush=True)
        return [False] * len(hosts)
    return [line.endswith(" CONNECTED") for line in lines[:len(hosts)]]

def observe(port, proto, service):
    dsts = [IPS[t] for t in ALL] + ([SVCS[t] for t in ALL] if service else [])
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(ALL)) as ex:
        futs = {f: ex.submit(probe_from, f, dsts, port, proto) for f in ALL}
        got = {f: v.result() for f, v in futs.items()}
    by_ip = {(f, t): got[f][i] for f in ALL for i, t in enumerate(ALL)}
    by_svc = {(f, t): got[f][len(ALL) + i] for f in ALL for i, t in enumerate(ALL)} \
        if service else None
    return by_ip, by_svc

def show(m, want=None):
    def cell(k):
        if want is not None and want[k] is None: return "-"
        return "." if m[k] else "X"
    rows = ["        " + " ".join(f"{t:>4}" for t in ALL)]
    for f in ALL:
        rows.append(f"{f:>6}  " + " ".join(f"{cell((f, t)):>4}" for t in ALL))
    return "\n".join(rows)

def same(got, want):
    return all(w is None or got[k] == w for k, w in want.items())

def check(case, want, port=80, proto="tcp", service=False, wait=10):
    """Polls (upstream: up to 10 s) until the observation by pod IP, and through the Services
    when `service`, equals the expectation."""
    start = time.time()
    deadline, rounds = start + wait, 0
    want_svc = want.via_service() if service else None
    while True:
        by_ip, by_svc = observe(port, proto, service)
        rounds += 1
        if by_ip == want.m and (not service or same(by_svc, want_svc)):
            print(f"ok: {case} ({proto}/{port}{', by pod IP and Service' if service else ''}; "
                  f"{rounds} round(s), {time.time() - start:.1f} s)", flush=True)
            return True
        if time.time() > deadline:
            text = (f"FAIL: {case} ({proto}/{port}): '.' reaches, 'X' does not (rows: from)\n"
                    f"by pod IP, expected:\n{show(want.m)}\nobserved:\n{show(by_ip)}")
            if service:
                text += (f"\nthrough the Services, expected:\n{show(want.m, want_svc)}\n"
                         f"observed:\n{show(by_svc, want_svc)}")
            print(text, flush=True)
            return False

applied = []
def apply(name, ns, spec):
    doc = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"name": name, "namespace": ns}, "spec": spec}
    kubectl("apply", "--validate=false", "-f", "-", stdin=json.dumps(doc))
    if (ns, name) not in applied: applied.append((ns, name))

def replace(name, ns, spec):  # an update in place (PUT), as upstream's UpdatePolicy
    doc = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"name": name, "namespace": ns}, "spec": spec}
    kubectl("replace", "--validate=false", "-f", "-", stdin=json.dumps(doc))

def reset():
    while applied:
        ns, name = applied.pop()
        kubectl("delete", "networkpolicy", name, "-n", ns)

def relabel(key, value):
    ns, pod = key.split("/")
    kubectl("label", "pod", pod, "-n", ns, f"pod={value}", "--overwrite")
    LABELS[key]["pod"] = value

def label_pod(key, label):  # "k=v" adds, "k-" removes
    ns, pod = key.split("/")
    kubectl("label", "pod", pod, "-n", ns, label, "--overwrite")

ok = True
def case(name, fn):
    global ok
    try:
        ok = fn(name) and ok
    finally:
        reset()

x_a = lambda k: k == "x/a"
any_ = lambda k: True
A = {"matchLabels": {"pod": "a"}}
NS_NAME = "kubernetes.io/metadata.name"
def ingress_only(sel, *rules):
    return {"podSelector": sel, "ingress": list(rules)}
def egress_only(sel, *rules):
    return {"podSelector": sel, "policyTypes": ["Egress"], "egress": list(rules)}
def from_(*peers, ports=None):
    r = {"from": list(peers)}
    if ports is not None: r["ports"] = ports
    return r
def to(*peers, ports=None):
    r = {"to": list(peers)}
    if ports is not None: r["ports"] = ports
    return r
def pods(**labels): return {"podSelector": {"matchLabels": labels}}
def nss(**labels): return {"namespaceSelector": {"matchLabels": labels}}
def ns_named(ns): return {"namespaceSelector": {"matchLabels": {NS_NAME: ns}}}
def deny_ns(r, ns, ingress=True, egress=False):
    for k in ALL:
        if ns_of(k) == ns:
            if ingress: r.ingress(k, False)
            if egress: r.egress(k, False)
    return r

# --- the first 17 (SLUICE_NETPOL_CASES=core) ---

def default_deny_ingress(n):  # +svc
    apply("deny", "x", {"podSelector": {}, "policyTypes": ["Ingress"]})
    r = Reachability()
    for t in ALL:
        if ns_of(t) == "x": r.ingress(t, False)
    return check(n, r.loopback(), service=True)

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

def pod_selector(n):  # +svc
    apply("allow-b", "x", {"podSelector": {"matchLabels": {"pod": "a"}},
                           "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]})
    r = Reachability().ingress("x/a", False)
    r.peer(lambda f: ns_of(f) == "x" and pod_of(f) == "b", x_a, True)
    return check(n, r.loopback(), service=True)

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

def ports(n):  # +svc
    apply("port-81", "x", {"podSelector": {"matchLabels": {"pod": "a"}},
                           "ingress": [{"ports": [{"port": 81, "protocol": "TCP"}]}]})
    closed = Reachability().ingress("x/a", False).loopback()
    return check(n, closed, 80, service=True) & check(n, Reachability(), 81, service=True) & \
        check(n, closed, 81, "udp", service=True)

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

# --- the rest of the upstream cases, and the corners issue 10 names ---

def allow_ingress_for_target(n):  # "should enforce policy to allow ingress traffic for a target"
    apply("deny-all", "x", {"podSelector": {}, "ingress": []})
    apply("allow-all-to-a", "x", ingress_only(A, from_({"podSelector": {},
                                                        "namespaceSelector": {}})))
    r = deny_ns(Reachability(), "x").ingress("x/a", True)
    return check(n, r.loopback())

def from_all_namespaces(n):  # "... allow ingress traffic from pods in all namespaces"
    apply("allow-from-any-ns", "x", ingress_only(A, from_({"namespaceSelector": {}})))
    # Selected, but the rule allows every pod of every namespace, on every port and protocol.
    return check(n, Reachability()) & check(n, Reachability(), 81, "udp")

def pod_match_expressions_in(n):  # "... based on PodSelector with MatchExpressions"
    apply("x-a-from-b", "x", ingress_only(A, from_({"podSelector": {"matchExpressions": [
        {"key": "pod", "operator": "In", "values": ["b"]}]}})))
    r = Reachability().ingress("x/a", False).expect("x/b", "x/a", True)
    return check(n, r.loopback())

def ns_match_expressions_in(n):  # "... based on NamespaceSelector with MatchExpressions"
    apply("from-y", "x", ingress_only(A, from_({"namespaceSelector": {"matchExpressions": [
        {"key": NS_NAME, "operator": "In", "values": ["y"]}]}})))
    r = Reachability().ingress("x/a", False).peer(in_ns("y"), x_a, True)
    return check(n, r.loopback())

def multiple_pod_and_ns_selectors(n):  # "... Multiple PodSelectors and NamespaceSelectors"
    apply("not-x-pod-b-c", "x", ingress_only(A, from_({
        "namespaceSelector": {"matchExpressions": [
            {"key": NS_NAME, "operator": "NotIn", "values": ["x"]}]},
        "podSelector": {"matchExpressions": [
            {"key": "pod", "operator": "In", "values": ["b", "c"]}]}})))
    r = Reachability().ingress("x/a", False)
    r.peer(lambda f: ns_of(f) != "x" and pod_of(f) in ("b", "c"), x_a, True)
    return check(n, r.loopback())

def any_pod_selectors(n):  # "... based on any PodSelectors"
    apply("from-b-or-c", "x", ingress_only(A, from_(pods(pod="b"), pods(pod="c"))))
    r = Reachability().ingress("x/a", False).peer(is_("x/b", "x/c"), x_a, True)
    return check(n, r.loopback())

def pod_not_in(n):  # NotIn also matches pods without the key; nothing else from x/b
    apply("not-b", "x", ingress_only(A, from_({"podSelector": {"matchExpressions": [
        {"key": "pod", "operator": "NotIn", "values": ["b"]},
        {"key": "gone", "operator": "NotIn", "values": ["yes"]}]}})))
    r = Reachability().ingress("x/a", False).peer(lambda f: ns_of(f) == "x" and
                                                  pod_of(f) != "b", x_a, True)
    return check(n, r.loopback())

def exists_does_not_exist(n):  # matchExpressions Exists / DoesNotExist on namespace labels
    kubectl("label", "namespace", "z", "team=red", "--overwrite")
    try:
        apply("no-team", "x", ingress_only(A, from_({"namespaceSelector": {"matchExpressions": [
            {"key": "team", "operator": "DoesNotExist"}]}})))
        r = Reachability().ingress("x/a", False).peer(lambda f: ns_of(f) != "z", x_a, True)
        good = check(n + " (DoesNotExist team: x, y)", r.loopback())
        replace("no-team", "x", ingress_only(A, from_({"namespaceSelector": {
            "matchExpressions": [{"key": "team", "operator": "Exists"}]}})))
        r = Reachability().ingress("x/a", False).peer(in_ns("z"), x_a, True)
        return check(n + " (Exists team: z)", r.loopback()) and good
    finally:
        kubectl("label", "namespace", "z", "team-")

def named_port_namespace(n):  # "should allow ingress access on one named port"
    apply("allow-81", "x", ingress_only({}, {"ports": [{"port": "serve-81-tcp"}]}))
    return check(n, Reachability(), 81) & check(n, deny_ns(Reachability(), "x").loopback(), 80)

def named_port_from_namespace(n):  # "... ingress access from namespace on one named port"
    apply("y-on-80", "x", ingress_only(A, from_(ns_named("y"), ports=[
        {"port": "serve-80-tcp", "protocol": "TCP"}])))
    r = Reachability().ingress("x/a", False).peer(in_ns("y"), x_a, True)
    closed = Reachability().ingress("x/a", False)
    return check(n, r.loopback(), 80) & check(n, closed.loopback(), 81)

def egress_named_port(n):  # "should allow egress access on one named port"
    apply("egress-80", "x", egress_only({}, {"ports": [{"port": "serve-80-tcp"}]}))
    closed = Reachability()
    for f in ALL:
        if ns_of(f) == "x": closed.egress(f, False)
    # The name resolves against each destination's serve-80-tcp: TCP 80 only.
    return check(n, Reachability(), 80) & check(n, closed.loopback(), 81) & \
        check(n, closed, 80, "udp")

def updated_policy(n):  # "should enforce updated policy": allow-all, then ingress: []
    apply("mutate", "x", {"podSelector": {}, "ingress": [{}]})
    good = check(n + " (allow all)", Reachability(), 81)
    replace("mutate", "x", {"podSelector": {}, "ingress": []})
    return check(n + " (deny all)", deny_ns(Reachability(), "x").loopback(), 81) and good

def ingress_from_updated_pod(n):  # "should allow ingress access from updated pod" (gain)
    apply("from-updated", "x", ingress_only(A, from_(pods(pod="b", pod2="updated"))))
    good = check(n + " (before)", Reachability().ingress("x/a", False).loopback())
    label_pod("x/b", "pod2=updated")
    try:
        r = Reachability().ingress("x/a", False).expect("x/b", "x/a", True)
        return check(n + " (x/b labelled)", r.loopback()) and good
    finally:
        label_pod("x/b", "pod2-")

def pod_relabel_loses_access(n):  # the other direction: the allowed pod's label goes away
    apply("allow-b", "x", ingress_only(A, from_(pods(pod="b"))))
    r = Reachability().ingress("x/a", False).expect("x/b", "x/a", True)
    good = check(n + " (before)", r.loopback())
    relabel("x/b", "d")
    try:
        closed = Reachability().ingress("x/a", False).loopback()
        return check(n + " (x/b relabelled pod=d)", closed) and good
    finally:
        relabel("x/b", "b")

def namespace_relabel_loses_access(n):
    kubectl("label", "namespace", "y", "team=blue", "--overwrite")
    try:
        apply("from-blue", "x", ingress_only(A, from_(nss(team="blue"))))
        r = Reachability().ingress("x/a", False).peer(in_ns("y"), x_a, True)
        good = check(n + " (y is blue)", r.loopback())
        kubectl("label", "namespace", "y", "team-")
        closed = Reachability().ingress("x/a", False).loopback()
        return check(n + " (y's label removed)", closed) and good
    finally:
        kubectl("label", "namespace", "y", "team-")

def deny_other_namespaces(n):  # "should deny ingress from pods on other namespaces"
    apply("same-ns", "x", ingress_only({}, from_({"podSelector": {}})))
    r = Reachability().peer(lambda f: ns_of(f) != "x", in_ns("x"), False)
    return check(n, r)

def deny_ingress_updated_pod(n):  # "should deny ingress access to updated pod"
    apply("isolate", "x", {"podSelector": {"matchLabels": {"target": "isolated"}},
                           "policyTypes": ["Ingress"]})
    good = check(n + " (before)", Reachability())
    label_pod("x/a", "target=isolated")
    try:
        return check(n + " (x/a labelled)",
                     Reachability().ingress("x/a", False).loopback()) and good
    finally:
        label_pod("x/a", "target-")

def deny_egress_pod_selector(n):  # "should deny egress from pods based on PodSelector"
    apply("deny-egress-a", "x", egress_only(A))
    return check(n, Reachability().egress("x/a", False).loopback())

def ingress_and_egress_together(n):  # "should work with Ingress, Egress specified together"
    apply("both", "x", {"podSelector": A, "policyTypes": ["Egress", "Ingress"],
                        "ingress": [from_(pods(pod="b"))],
                        "egress": [{"ports": [{"port": 80}]}]})
    r80 = Reachability().ingress("x/a", False).expect("x/b", "x/a", True).loopback()
    r81 = Reachability().ingress("x/a", False).egress("x/a", False)
    r81.expect("x/b", "x/a", True).loopback()
    return check(n, r80, 80) & check(n, r81, 81)

def client_side_egress_deny(n):  # "... denying of egress traffic on the client side ..."
    apply("to-y-a", "x", egress_only(A, to({**ns_named("y"), **pods(pod="a")})))
    from_x_a = from_({**ns_named("x"), **pods(pod="a")})
    apply("y-a-from-x-a", "y", ingress_only(A, from_x_a))
    apply("y-b-from-x-a", "y", ingress_only({"matchLabels": {"pod": "b"}}, from_x_a))
    r = Reachability().egress("x/a", False).ingress("y/a", False).ingress("y/b", False)
    r.expect("x/a", "y/a", True)
    return check(n, r.loopback())

def egress_to_pod_in_namespace(n):  # "... egress ... different namespace ... Pod and NsSelector"
    apply("to-y-a", "x", egress_only(A, to({**ns_named("y"), **pods(pod="a")})))
    r = Reachability().egress("x/a", False).expect("x/a", "y/a", True)
    return check(n, r.loopback())

def egress_to_pods(n):  # +svc: egress to pods of the own namespace, checked after DNAT
    apply("to-b", "x", egress_only(A, to(pods(pod="b"))))
    r = Reachability().egress("x/a", False).expect("x/a", "x/b", True)
    return check(n, r.loopback(), service=True)

def tcp_only_any_port(n):  # "... allowing any port traffic to a server on a specific protocol"
    apply("tcp-only", "x", ingress_only(A, {"ports": [{"protocol": "TCP"}]}))
    closed = Reachability().ingress("x/a", False).loopback()
    return check(n, Reachability(), 80) & check(n, Reachability(), 81) & \
        check(n, closed, 80, "udp")

def udp_only(n):  # "should not allow access by TCP when a policy specifies only UDP"
    apply("udp-81", "x", ingress_only(A, {"ports": [{"port": 81, "protocol": "UDP"}]}))
    closed = Reachability().ingress("x/a", False).loopback()
    return check(n, closed, 81) & check(n, Reachability(), 81, "udp")

def sctp_not_tcp(n):  # "should not mistakenly treat 'protocol: SCTP' as 'protocol: TCP' ..."
    apply("deny", "x", {"podSelector": {}, "ingress": []})
    apply("sctp-81", "x", ingress_only(A, {"ports": [{"port": 81, "protocol": "SCTP"}]}))
    closed = deny_ns(Reachability(), "x").loopback()
    return check(n, closed, 81) & check(n, closed, 81, "udp")

def sctp_isolates(n):  # "should properly isolate pods that are selected by a policy allowing SCTP"
    apply("sctp-80", "x", ingress_only(A, {"ports": [{"port": 80, "protocol": "SCTP"}]}))
    closed = Reachability().ingress("x/a", False).loopback()
    return check(n, closed, 81) & check(n, closed, 80) & check(n, closed, 80, "udp")

def ingress_allow_all_precedence(n):  # "multiple ingress policies with ... allow-all ..."
    apply("port-80", "x", ingress_only({}, {"ports": [{"port": 80}]}))
    good = check(n + " (port 80 only)", deny_ns(Reachability(), "x").loopback(), 81)
    apply("allow-all", "x", ingress_only({}, {}))
    return check(n + " (and allow all)", Reachability(), 81) and good

def egress_allow_all_precedence(n):  # "multiple egress policies with ... allow-all ..."
    apply("port-80", "x", egress_only({}, {"ports": [{"port": 80}]}))
    r = Reachability().peer(in_ns("x"), any_, False).loopback()
    good = check(n + " (port 80 only)", r, 81)
    apply("allow-all", "x", egress_only({}, {}))
    return check(n + " (and allow all)", Reachability(), 81) and good

def policies_deleted(n):  # +svc: "should stop enforcing policies after they are deleted"
    apply("deny-all", "x", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]})
    good = check(n + " (deny all)", deny_ns(Reachability(), "x", egress=True).loopback(),
                 service=True)
    reset()
    return check(n + " (deleted)", Reachability(), service=True) and good

def egress_cidr(n):  # "should allow egress access to server in CIDR block"
    apply("to-y-b", "x", egress_only(A, to({"ipBlock": {"cidr": IPS["y/b"] + "/32"}})))
    r = Reachability().egress("x/a", False).expect("x/a", "y/b", True)
    return check(n, r.loopback())

def cidr_and_except_overlap(n):  # "... IP overlapping both IPBlock.CIDR and IPBlock.Except ..."
    ip = IPS["x/b"]
    big = f"{int(ip.split('.')[0]) & 0xF0}.0.0.0/4"
    apply("cidr", "x", egress_only(A, to({"ipBlock": {"cidr": big, "except": [ip + "/32"]}})))
    good = check(n + " (/4 except x/b)", Reachability().expect("x/a", "x/b", False))
    replace("cidr", "x", egress_only(A, to({"ipBlock": {"cidr": ip + "/32"}})))
    r = Reachability().egress("x/a", False).expect("x/a", "x/b", True)
    return check(n + " (x/b/32)", r.loopback()) and good

def ingress_egress_independent(n):  # "... ingress and egress policies can be controlled ..."
    apply("egress-all", "x", egress_only(A, {}))
    good = check(n + " (egress allow-all)", Reachability())
    apply("deny-ingress", "x", {"podSelector": A, "policyTypes": ["Ingress"]})
    return check(n + " (and ingress denied)",
                 Reachability().ingress("x/a", False).loopback()) and good

def egress_ns_not_in(n):  # "... NamespaceSelector with MatchExpressions using default ns label"
    apply("not-y", "x", egress_only(A, to({"namespaceSelector": {"matchExpressions": [
        {"key": NS_NAME, "operator": "NotIn", "values": ["y"]}]}})))
    return check(n, Reachability().peer(x_a, in_ns("y"), False))

def udp_pod_and_ns(n):  # UDP: "... only from a pod in a different namespace ... Pod and NsSelector"
    apply("from-y-a", "x", ingress_only(A, from_({**ns_named("y"), **pods(pod="a")})))
    r = Reachability().ingress("x/a", False).expect("y/a", "x/a", True).loopback()
    return check(n, r, 80, "udp") & check(n, r, 80)

def egress_deny_all_but_dns(n):  # egress deny-all with DNS (53 UDP/TCP to anywhere) allowed
    apply("dns-only", "x", egress_only({}, {"ports": [{"port": 53, "protocol": "UDP"},
                                                      {"port": 53, "protocol": "TCP"}]}))
    closed = Reachability()
    for f in ALL:
        if ns_of(f) == "x": closed.egress(f, False)
    return check(n, Reachability(), 53, "udp") & check(n, Reachability(), 53) & \
        check(n, closed.loopback(), 80) & check(n, closed.loopback(), 80, "udp")

def pod_recreated(n):  # +svc: a pod deleted and created again with the same labels (a new IP)
    apply("allow-b", "x", ingress_only(A, from_(pods(pod="b"))))
    r = Reachability().ingress("x/a", False).expect("x/b", "x/a", True).loopback()
    good = check(n + " (before)", r, service=True)
    old = json.loads(kubectl("get", "pod", "b", "-n", "x", "-o", "json"))
    kubectl("delete", "pod", "b", "-n", "x", "--wait=true")
    doc = {"apiVersion": "v1", "kind": "Pod", "spec": old["spec"],
           "metadata": {k: old["metadata"][k] for k in ("name", "namespace", "labels")}}
    kubectl("apply", "--validate=false", "-f", "-", stdin=json.dumps(doc))
    kubectl("wait", "-n", "x", "--for=condition=Ready", "pod/b", "--timeout=30s")
    before, IPS["x/b"] = IPS["x/b"], pod_ip("x/b")
    print(f"   x/b was {before}, is now {IPS['x/b']}", flush=True)
    if before == IPS["x/b"]:
        print(f"FAIL: {n}: the recreated pod kept its address", flush=True)
        good = False
    return check(n + " (recreated)", r, service=True) and good

CORE = [("default deny ingress", default_deny_ingress),
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
        ("namespace relabelled", namespace_relabel)]
MORE = [("ingress allowed for a target", allow_ingress_for_target),
        ("ingress from pods in all namespaces", from_all_namespaces),
        ("pod selector matchExpressions In", pod_match_expressions_in),
        ("namespace selector matchExpressions In (metadata.name)", ns_match_expressions_in),
        ("multiple pod and namespace selectors (NotIn, In)", multiple_pod_and_ns_selectors),
        ("any of several pod selectors", any_pod_selectors),
        ("pod selector matchExpressions NotIn", pod_not_in),
        ("namespace selector Exists / DoesNotExist", exists_does_not_exist),
        ("ingress on one named port, whole namespace", named_port_namespace),
        ("ingress from a namespace on one named port", named_port_from_namespace),
        ("egress on one named port", egress_named_port),
        ("policy updated: allow all -> deny all", updated_policy),
        ("ingress from an updated pod (gains a label)", ingress_from_updated_pod),
        ("pod relabelled away (loses access)", pod_relabel_loses_access),
        ("namespace label removed (loses access)", namespace_relabel_loses_access),
        ("deny ingress from other namespaces", deny_other_namespaces),
        ("deny ingress to an updated pod", deny_ingress_updated_pod),
        ("deny egress by pod selector", deny_egress_pod_selector),
        ("ingress and egress on the same pod", ingress_and_egress_together),
        ("egress denied on the client side, allowed by the server", client_side_egress_deny),
        ("egress to a pod in another namespace (pod AND namespace)", egress_to_pod_in_namespace),
        ("egress to pods", egress_to_pods),
        ("TCP only, any port", tcp_only_any_port),
        ("UDP only: no TCP", udp_only),
        ("SCTP only: no TCP or UDP", sctp_not_tcp),
        ("SCTP only still isolates", sctp_isolates),
        ("ingress allow-all over a port policy", ingress_allow_all_precedence),
        ("egress allow-all over a port policy", egress_allow_all_precedence),
        ("policies deleted: traffic reopens", policies_deleted),
        ("egress to a CIDR", egress_cidr),
        ("ipBlock CIDR and except overlap, then a /32", cidr_and_except_overlap),
        ("ingress and egress controlled independently", ingress_egress_independent),
        ("egress namespace NotIn (metadata.name)", egress_ns_not_in),
        ("UDP: pod AND namespace selector", udp_pod_and_ns),
        ("egress deny all but DNS", egress_deny_all_but_dns),
        ("pod deleted and recreated (new IP)", pod_recreated)]

# Every pod reaches every pod, by IP and through the Services, before any case (the Services'
# endpoints may still be on their way to the agents: a readiness wait, not a case).
ok = check("no policy yet", Reachability(), service=True, wait=30)
cases = CORE if ONLY_CORE else CORE + MORE
for name, fn in cases:
    case(name, fn)
# With every policy gone, everything reaches everything again.
ok = check("no policy left", Reachability(), service=True) and ok
print(f"{len(cases)} cases", flush=True)
sys.exit(0 if ok else 1)
PY
start=$SECONDS
python3 "$WORK/netpol.py" "$LAB" "$NAME" "$KUBECONFIG_PATH" || fail "netpol cases"
log "ok: every netpol case in $((SECONDS - start)) s"
# What the agent did is on /metrics: translations applied, allow entries written and deleted,
# identities numbered; status-only Pod updates counted as skipped (a sample, maybe 0).
metrics=$("$LAB" exec --name "$NAME" node/node1 -- curl -sf -m 5 http://127.0.0.1:9879/metrics) ||
  fail "node1's /metrics"
sample() { awk -v n="$1" '$1 == n {v = $2} END {print v + 0}' <<<"$metrics"; }
for m in sluice_policy_applies_total 'sluice_policy_map_writes_total{op="allow_upsert"}' \
         'sluice_policy_map_writes_total{op="allow_delete"}' sluice_policy_identities; do
  v=$(sample "$m")
  awk -v v="$v" 'BEGIN {exit !(v > 0)}' || fail "$m is $v after the netpol cases"
done
grep -q '^sluice_policy_skipped_updates_total ' <<<"$metrics" || fail "no sluice_policy_skipped_updates_total"
log "ok: policy metrics: applies $(sample sluice_policy_applies_total), identities $(sample sluice_policy_identities), skipped updates $(sample sluice_policy_skipped_updates_total)"
"$SLUICECTL" --bpffs_root="$DIR/node1/bpf" drops | grep policy_denied >&2 || true
