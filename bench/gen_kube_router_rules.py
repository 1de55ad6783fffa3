#!/usr/bin/env python3
"""kube-router's iptables + ipset layout of NetworkPolicy, for the policy_conn_bench.sh baseline.

The same policy Sluice enforces in that benchmark: one NetworkPolicy in namespace `pb` selecting
the server pod, with N ingress rules, each admitting the pods of one podSelector (one peer pod
here) on TCP 8080; the client pod's rule is the last one. kube-router (pkg/controllers/netpol,
iptables mode) renders that as:

  ipsets (`ipset restore`, all `hash:ip family inet hashsize 1024 maxelem 65536 timeout 0`):
    KUBE-DST-<hash>         the policy's target pods (the server)
    KUBE-SRC-<hash>         one per (policy, ingress rule): the pods its podSelector matches
  filter table (`iptables-restore --noflush`):
    INPUT / FORWARD / OUTPUT   -j KUBE-ROUTER-INPUT / -FORWARD / -OUTPUT (first rule)
    KUBE-ROUTER-FORWARD        -d <pod> -j KUBE-POD-FW-<hash>  (routed traffic to the pod)
    KUBE-ROUTER-OUTPUT         -d <pod> -j KUBE-POD-FW-<hash>  (hairpin through the node)
    KUBE-POD-FW-<hash>         ctstate RELATED,ESTABLISHED ACCEPT; addrtype --src-type LOCAL
                               ACCEPT (the node, kubelet probes); -j KUBE-NWPLCY-<hash> for
                               every policy selecting the pod; NFLOG (rate limited) and REJECT
                               what no policy marked; reset the mark
    KUBE-NWPLCY-<hash>         per rule and port: -m set --match-set KUBE-SRC src -m set
                               --match-set KUBE-DST dst -p tcp --dport P -j MARK 0x10000, and
                               the same match with -m mark 0x10000 -j RETURN

Left out, as they do not apply to this topology: the `-m physdev --physdev-is-bridged` jumps
(pods behind a bridge; here pods are routed over veths) and the egress (-s <pod>) jumps (the
policy is ingress only). Names are kube-router's prefixes with a hash of our own.

usage: gen_kube_router_rules.py ipset|iptables --rules N --client IP --server IP
"""
import argparse
import base64
import hashlib
import ipaddress
import sys

NS = "pb"
POLICY = "pb-allow"
SERVER = "server"
PORT = 8080
PEER_BASE = ipaddress.IPv4Address("10.128.0.0")  # the peers of the other rules


def digest(*parts):
    h = hashlib.sha256("".join(parts).encode()).digest()
    return base64.b32encode(h).decode()[:16]


def src_set(rule):
    return "KUBE-SRC-" + digest(NS, POLICY, "ingressrule", str(rule), "pod")


DST_SET = "KUBE-DST-" + digest(NS, POLICY, "dst")
POD_FW = "KUBE-POD-FW-" + digest(NS, SERVER, "1")
POLICY_CHAIN = "KUBE-NWPLCY-" + digest(NS, POLICY, "1")


def peer(rule, n, client):
    return client if rule == n - 1 else str(PEER_BASE + rule + 1)


def ipset(a, out):
    opts = "hash:ip family inet hashsize 1024 maxelem 65536 timeout 0"
    out.write(f"create {DST_SET} {opts}\n")
    out.write(f"add {DST_SET} {a.server} timeout 0\n")
    for r in range(a.rules):
        name = src_set(r)
        out.write(f"create {name} {opts}\n")
        out.write(f"add {name} {peer(r, a.rules, a.client)} timeout 0\n")


def iptables(a, out):
    w = out.write
    w("*filter\n")
    for c in ("KUBE-ROUTER-INPUT", "KUBE-ROUTER-FORWARD", "KUBE-ROUTER-OUTPUT", POD_FW,
              POLICY_CHAIN):
        w(f":{c} - [0:0]\n")
    for hook in ("INPUT", "FORWARD", "OUTPUT"):
        w(f'-I {hook} 1 -m comment --comment "kube-router netpol - {digest(hook)}" '
          f"-j KUBE-ROUTER-{hook}\n")
    jump = (f'-m comment --comment "rule to jump traffic destined to POD name:{SERVER} '
            f'namespace: {NS} to chain {POD_FW}" -d {a.server} -j {POD_FW}')
    w(f"-A KUBE-ROUTER-FORWARD {jump}\n")
    w(f"-A KUBE-ROUTER-OUTPUT {jump}\n")
    fw = f"-A {POD_FW}"
    w(f'{fw} -m comment --comment "rule for stateful firewall for pod" '
      "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n")
    w(f'{fw} -m comment --comment "rule to permit the traffic traffic to pods when source is '
      f"the pod's local node\" -m addrtype --src-type LOCAL -d {a.server} -j ACCEPT\n")
    w(f'{fw} -m comment --comment "run through nw policy {POLICY}" -j {POLICY_CHAIN}\n')
    w(f'{fw} -m comment --comment "rule to log dropped traffic POD name:{SERVER} namespace: '
      f'{NS}" -m mark ! --mark 0x10000/0x10000 -j NFLOG --nflog-group 100 -m limit --limit '
      "10/minute --limit-burst 10\n")
    w(f'{fw} -m comment --comment "rule to REJECT traffic destined for POD name:{SERVER} '
      f'namespace: {NS}" -m mark ! --mark 0x10000/0x10000 -j REJECT\n')
    w(f"{fw} -j MARK --set-mark 0/0x10000\n")
    comment = (f'-m comment --comment "rule to ACCEPT traffic from source pods to dest pods '
               f'selected by policy name {POLICY} namespace {NS}"')
    for r in range(a.rules):
        match = (f"-A {POLICY_CHAIN} {comment} -m set --match-set {src_set(r)} src "
                 f"-m set --match-set {DST_SET} dst -p tcp --dport {PORT}")
        w(f"{match} -j MARK --set-xmark 0x10000/0x10000\n")
        w(f"{match} -m mark --mark 0x10000/0x10000 -j RETURN\n")
    w("COMMIT\n")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["ipset", "iptables"])
    p.add_argument("--rules", type=int, required=True)
    p.add_argument("--client", required=True)
    p.add_argument("--server", required=True)
    a = p.parse_args()
    if a.rules < 1 or a.rules > 60000:
        sys.exit("gen_kube_router_rules.py: --rules in 1..60000")
    (ipset if a.what == "ipset" else iptables)(a, sys.stdout)


if __name__ == "__main__":
    main()
