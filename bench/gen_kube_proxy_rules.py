#!/usr/bin/env python3
"""kube-proxy's rule sets for N ClusterIP Services, for the side-by-side Service benchmarks.

Follows /work/shared/reference/kube-proxy-baselines.md section 7 (pkg/proxy/iptables/proxier.go
and pkg/proxy/nftables/proxier.go): KUBE-SERVICES -> KUBE-SVC-* -> KUBE-SEP-* with
`statistic --mode random --probability 1/(n-i)`, KUBE-MARK-MASQ / KUBE-POSTROUTING, the filter
table's KUBE-FORWARD / KUBE-FIREWALL, large-cluster mode (no comments on SEP rules and SVC->SEP
jumps past 1000 endpoints), no nfacct rules; and the nftables layout with the service-ips verdict
map, numgen random, per-service and per-endpoint chains.

The address plan is bench/lb_cluster.h's: Service i (0-based) is ns<i>/svc<i>:p80, ClusterIP
172.30.0.0 + i + 1, TCP 80; its E endpoints are 10.128.0.0 + i*E + j + 1 port 8080. The probed
Service is the last one (last rule in KUBE-SERVICES, last element added); --probed replaces its
endpoints with real servers.

usage: gen_kube_proxy_rules.py MODE --services N [--per-service E] [--probed IP,IP,...]
  MODE: iptables-jumps  jump rules kube-proxy ensures before its first sync (iptables-restore
                        --noflush input)
        iptables        the sync input (iptables-restore -w --noflush)
        nft             the nftables transaction (nft -f)
        single-dnat     one DNAT rule to the probed Service's first endpoint (iptables-restore)
        nodeport-iptables  one NodePort Service (--node-port, --proto, one --endpoint IP:PORT,
                        ClusterIP 172.30.0.1:80), jump rules included (iptables-restore, full)
        nodeport-nft    the same Service in the nftables layout (nft -f); --node-ip fills
                        nodeport-ips
"""
import argparse
import base64
import hashlib
import ipaddress
import sys

CLUSTER_IP_BASE = int(ipaddress.IPv4Address("172.30.0.0"))
BACKEND_BASE = int(ipaddress.IPv4Address("10.128.0.0"))
SERVICE_CIDR = "172.30.0.0/15"
CLUSTER_CIDR = "10.128.0.0/9"  # pods: kube-proxy's --cluster-cidr, exempt from masquerade
SERVICE_PORT = 80
BACKEND_PORT = 8080
LARGE_CLUSTER_ENDPOINTS = 1000


def ip(n):
    return str(ipaddress.IPv4Address(n))


def cluster_ip(i):
    return ip(CLUSTER_IP_BASE + i + 1)


def endpoints(i, per_service, n, probed):
    if i == n - 1 and probed:
        return probed
    return [ip(BACKEND_BASE + i * per_service + j + 1) for j in range(per_service)]


def b32(s):
    return base64.b32encode(hashlib.sha256(s.encode()).digest()).decode()


def svc_port_name(i):
    return f"ns{i}/svc{i}:p80"


def svc_chain(i):  # servicePortChainName
    return "KUBE-SVC-" + b32(svc_port_name(i) + "tcp")[:16]


def sep_chain(i, ep):  # servicePortEndpointChainName
    return "KUBE-SEP-" + b32(svc_port_name(i) + "tcp" + f"{ep}:{BACKEND_PORT}")[:16]


JUMPS = [  # iptablesJumpChains: table, chain, target, ctstate NEW, comment
    ("filter", "INPUT", "KUBE-PROXY-FIREWALL", True, "kubernetes load balancer firewall"),
    ("filter", "INPUT", "KUBE-NODEPORTS", False, "kubernetes health check service ports"),
    ("filter", "INPUT", "KUBE-EXTERNAL-SERVICES", True, "kubernetes externally-visible service portals"),
    ("filter", "FORWARD", "KUBE-PROXY-FIREWALL", True, "kubernetes load balancer firewall"),
    ("filter", "FORWARD", "KUBE-FORWARD", False, "kubernetes forwarding rules"),
    ("filter", "FORWARD", "KUBE-SERVICES", True, "kubernetes service portals"),
    ("filter", "FORWARD", "KUBE-EXTERNAL-SERVICES", True, "kubernetes externally-visible service portals"),
    ("filter", "OUTPUT", "KUBE-PROXY-FIREWALL", True, "kubernetes load balancer firewall"),
    ("filter", "OUTPUT", "KUBE-SERVICES", True, "kubernetes service portals"),
    ("nat", "OUTPUT", "KUBE-SERVICES", False, "kubernetes service portals"),
    ("nat", "PREROUTING", "KUBE-SERVICES", False, "kubernetes service portals"),
    ("nat", "POSTROUTING", "KUBE-POSTROUTING", False, "kubernetes postrouting rules"),
]
FIREWALL_JUMPS = [("filter", "INPUT", "KUBE-FIREWALL"), ("filter", "OUTPUT", "KUBE-FIREWALL")]


def iptables_jumps(out):
    for table in ("filter", "nat"):
        out.append(f"*{table}")
        chains = sorted({t for tb, _, t, _, _ in JUMPS if tb == table} |
                        {t for tb, _, t in FIREWALL_JUMPS if tb == table})
        out += [f":{c} - [0:0]" for c in chains]
        for tb, chain, target in FIREWALL_JUMPS:
            if tb == table:
                out.append(f"-I {chain} -j {target}")
        for tb, chain, target, new, comment in JUMPS:
            if tb == table:
                ct = "-m conntrack --ctstate NEW " if new else ""
                out.append(f'-I {chain} -m comment --comment "{comment}" {ct}-j {target}')
        out.append("COMMIT")


def jump_rules():
    """The jump rules as -A lines, in the order iptables_jumps' inserts (-I, each at the top)
    leave in the builtin chains."""
    jumps = {"filter": [], "nat": []}
    for tb, chain, target, new, comment in reversed(JUMPS):
        ct = "-m conntrack --ctstate NEW " if new else ""
        jumps[tb].append(f'-A {chain} -m comment --comment "{comment}" {ct}-j {target}')
    for tb, chain, target in FIREWALL_JUMPS:
        jumps[tb].append(f"-A {chain} -j {target}")
    return jumps


def iptables_filter_rules():
    """The filter table's fixed KUBE-FIREWALL / KUBE-FORWARD rules."""
    # (the nfacct ct_state_invalid_dropped_pkts rule is left out, as kube-proxy does without nfacct)
    return [
        '-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" '
        '-d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP',
        "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP",
        '-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" '
        '-m mark --mark 0x4000/0x4000 -j ACCEPT',
        '-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" '
        '-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT',
    ]


def iptables_sync(n, per_service, probed, out, with_jumps=False):
    """with_jumps: the jump rules and their chains go into the same input, for a restore without
    --noflush (iptables-nft 1.8.9's --noflush restore of tens of thousands of chains takes
    minutes; a full restore of the same rules takes seconds and yields the same ruleset)."""
    jumps = jump_rules() if with_jumps else {"filter": [], "nat": []}
    total_eps = sum(len(endpoints(i, per_service, n, probed)) for i in range(n))
    large = total_eps > LARGE_CLUSTER_ENDPOINTS
    out += ["*filter"]
    out += [f":{c} - [0:0]" for c in ("KUBE-NODEPORTS", "KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES",
                                      "KUBE-FIREWALL", "KUBE-FORWARD", "KUBE-PROXY-FIREWALL")]
    out += jumps["filter"]
    out += iptables_filter_rules()
    out.append("COMMIT")

    out.append("*nat")
    heads = [":KUBE-NODEPORTS - [0:0]", ":KUBE-SERVICES - [0:0]", ":KUBE-MARK-MASQ - [0:0]",
             ":KUBE-POSTROUTING - [0:0]"]
    chains, services, rules = [], [], []
    for i in range(n):
        name, cip, svc = svc_port_name(i), cluster_ip(i), svc_chain(i)
        eps = endpoints(i, per_service, n, probed)
        chains.append(f":{svc} - [0:0]")
        services.append(f'-A KUBE-SERVICES -m comment --comment "{name} cluster IP" -m tcp -p tcp '
                        f'-d {cip} --dport {SERVICE_PORT} -j {svc}')
        rules.append(f'-A {svc} -m comment --comment "{name} cluster IP" -m tcp -p tcp -d {cip} '
                     f'--dport {SERVICE_PORT} ! -s {CLUSTER_CIDR} -j KUBE-MARK-MASQ')
        for k, ep in enumerate(eps):
            sep = sep_chain(i, ep)
            chains.append(f":{sep} - [0:0]")
            comment = "" if large else f'-m comment --comment "{name} -> {ep}:{BACKEND_PORT}" '
            stat = ""
            if k < len(eps) - 1:
                stat = f"-m statistic --mode random --probability {1.0 / (len(eps) - k):0.10f} "
            rules.append(f"-A {svc} {comment}{stat}-j {sep}")
        for ep in eps:
            sep = sep_chain(i, ep)
            comment = "" if large else f"-m comment --comment {name} "
            rules.append(f"-A {sep} {comment}-s {ep} -j KUBE-MARK-MASQ")
            rules.append(f"-A {sep} {comment}-m tcp -p tcp -j DNAT --to-destination {ep}:{BACKEND_PORT}")
    out += heads + chains + jumps["nat"] + services
    out.append('-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must '
               'be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS')
    out.append("-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000")
    out.append("-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN")
    out.append("-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000")
    out.append('-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" '
               "-j MASQUERADE --random-fully")
    out += rules
    out.append("COMMIT")


def nft_hash_name(base):  # hashAndTruncate
    return b32(base)[:8] + "-" + base


def nft_base(out):
    """kube-proxy's nftables table, base chains, sets, maps and fixed rules (no Service)."""
    t = "ip kube-proxy"
    out.append(f'add table {t} {{ comment "rules for kube-proxy" ; }}')
    for chain, hook, prio in (("nat-prerouting", "type nat hook prerouting", -100),
                              ("nat-output", "type nat hook output", -100),
                              ("nat-postrouting", "type nat hook postrouting", 100),
                              ("filter-prerouting-pre-dnat", "type filter hook prerouting", -110),
                              ("filter-output-pre-dnat", "type filter hook output", -110),
                              ("filter-forward", "type filter hook forward", 0),
                              ("filter-input", "type filter hook input", 0),
                              ("filter-output", "type filter hook output", 0)):
        out.append(f"add chain {t} {chain} {{ {hook} priority {prio} ; }}")
    for chain in ("services", "masquerading", "mark-for-masquerade", "firewall-check",
                  "cluster-ips-check", "service-endpoints-check", "nodeport-endpoints-check",
                  "reject-chain"):
        out.append(f"add chain {t} {chain}")
    out.append(f'add set {t} cluster-ips {{ type ipv4_addr ; comment "Active ClusterIPs" ; }}')
    out.append(f'add set {t} nodeport-ips {{ type ipv4_addr ; comment "IPs that accept NodePort traffic" ; }}')
    for m, typ in (("service-ips", "ipv4_addr . inet_proto . inet_service"),
                   ("service-nodeports", "inet_proto . inet_service"),
                   ("firewall-ips", "ipv4_addr . inet_proto . inet_service"),
                   ("no-endpoint-services", "ipv4_addr . inet_proto . inet_service"),
                   ("no-endpoint-nodeports", "inet_proto . inet_service")):
        out.append(f"add map {t} {m} {{ type {typ} : verdict ; }}")
    out += [
        f"add rule {t} nat-prerouting jump services",
        f"add rule {t} nat-output jump services",
        f"add rule {t} nat-postrouting jump masquerading",
        f"add rule {t} filter-prerouting-pre-dnat ct state new jump firewall-check",
        f"add rule {t} filter-output-pre-dnat ct state new jump firewall-check",
        f"add rule {t} filter-forward ct state new jump service-endpoints-check",
        f"add rule {t} filter-forward ct state new jump cluster-ips-check",
        f"add rule {t} filter-input ct state new jump nodeport-endpoints-check",
        f"add rule {t} filter-input ct state new jump service-endpoints-check",
        f"add rule {t} filter-output ct state new jump service-endpoints-check",
        f"add rule {t} filter-output ct state new jump cluster-ips-check",
        f"add rule {t} services ip daddr . meta l4proto . th dport vmap @service-ips",
        f"add rule {t} services ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports",
        f"add rule {t} masquerading mark and 0x4000 == 0 return",
        f"add rule {t} masquerading mark set mark xor 0x4000",
        f"add rule {t} masquerading masquerade fully-random",
        f"add rule {t} mark-for-masquerade mark set mark or 0x4000",
        f"add rule {t} firewall-check ip daddr . meta l4proto . th dport vmap @firewall-ips",
        f"add rule {t} service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services",
        f"add rule {t} nodeport-endpoints-check ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports",
        f"add rule {t} cluster-ips-check ip daddr @cluster-ips reject",
        f"add rule {t} cluster-ips-check ip daddr {{ {SERVICE_CIDR} }} drop",
        f"add rule {t} reject-chain reject",
    ]


def nft_rules(n, per_service, probed, out):
    t = "ip kube-proxy"
    nft_base(out)
    elements = []
    for i in range(n):
        cip = cluster_ip(i)
        base = f"ns{i}/svc{i}/tcp/p80"
        svc = "service-" + nft_hash_name(base)
        eps = endpoints(i, per_service, n, probed)
        ep_chains = []
        for ep in eps:
            epc = "endpoint-" + nft_hash_name(f"{base}__{ep}/{BACKEND_PORT}")
            ep_chains.append(epc)
            out.append(f"add chain {t} {epc}")
            out.append(f"add rule {t} {epc} ip saddr {ep} jump mark-for-masquerade")
            out.append(f"add rule {t} {epc} meta l4proto tcp dnat to {ep}:{BACKEND_PORT}")
        out.append(f"add chain {t} {svc}")
        out.append(f"add rule {t} {svc} ip daddr {cip} ip saddr != {CLUSTER_CIDR} jump mark-for-masquerade")
        vmap = " , ".join(f"{k} : goto {c}" for k, c in enumerate(ep_chains))
        out.append(f"add rule {t} {svc} numgen random mod {len(ep_chains)} vmap {{ {vmap} }}")
        elements.append(f"add element {t} cluster-ips {{ {cip} }}")
        elements.append(f"add element {t} service-ips {{ {cip} . tcp . {SERVICE_PORT} : goto {svc} }}")
    out += elements


NODEPORT_NAME = "ns0/np0:p80"  # the one NodePort Service of the nodeport-* modes
NODEPORT_CLUSTER_IP = "172.30.0.1"


def nodeport_iptables(a, out):
    """kube-proxy's iptables rules for one NodePort Service (externalTrafficPolicy Cluster) with
    one endpoint, jump rules included (a full iptables-restore): KUBE-SERVICES -> (ClusterIP rule,
    then the last rule) KUBE-NODEPORTS -> KUBE-EXT-* (KUBE-MARK-MASQ, then KUBE-SVC-*) -> KUBE-SEP-*
    DNAT; KUBE-POSTROUTING masquerades what was marked."""
    name, proto, cip = NODEPORT_NAME, a.proto, NODEPORT_CLUSTER_IP
    ep, ep_port = a.endpoint.split(":")
    h = b32(name + proto)[:16]
    svc, ext = "KUBE-SVC-" + h, "KUBE-EXT-" + h
    sep = "KUBE-SEP-" + b32(name + proto + f"{ep}:{ep_port}")[:16]
    jumps = jump_rules()
    out += ["*filter"]
    out += [f":{c} - [0:0]" for c in ("KUBE-NODEPORTS", "KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES",
                                      "KUBE-FIREWALL", "KUBE-FORWARD", "KUBE-PROXY-FIREWALL")]
    out += jumps["filter"] + iptables_filter_rules() + ["COMMIT", "*nat"]
    out += [f":{c} - [0:0]" for c in ("KUBE-NODEPORTS", "KUBE-SERVICES", "KUBE-MARK-MASQ",
                                      "KUBE-POSTROUTING", ext, sep, svc)]
    out += jumps["nat"]
    out += [
        f'-A KUBE-SERVICES -m comment --comment "{name} cluster IP" -m {proto} -p {proto} '
        f"-d {cip} --dport {SERVICE_PORT} -j {svc}",
        '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be '
        'the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS',
        f"-A KUBE-NODEPORTS -m comment --comment {name} -m {proto} -p {proto} "
        f"--dport {a.node_port} -j {ext}",
        f'-A {ext} -m comment --comment "masquerade traffic for {name} external destinations" '
        "-j KUBE-MARK-MASQ",
        f"-A {ext} -j {svc}",
        "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000",
        "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
        "-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000",
        '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" '
        "-j MASQUERADE --random-fully",
        f'-A {svc} -m comment --comment "{name} cluster IP" -m {proto} -p {proto} -d {cip} '
        f"--dport {SERVICE_PORT} ! -s {CLUSTER_CIDR} -j KUBE-MARK-MASQ",
        f'-A {svc} -m comment --comment "{name} -> {ep}:{ep_port}" -j {sep}',
        f"-A {sep} -m comment --comment {name} -s {ep} -j KUBE-MARK-MASQ",
        f"-A {sep} -m comment --comment {name} -m {proto} -p {proto} -j DNAT "
        f"--to-destination {ep}:{ep_port}",
        "COMMIT",
    ]


def nodeport_nft(a, out):
    """kube-proxy's nftables rules for the same Service: services' `ip daddr @nodeport-ips` rule
    -> service-nodeports verdict map -> external-* (mark-for-masquerade, goto service-*) ->
    endpoint-* dnat; masquerading masquerades what was marked."""
    t, proto, cip = "ip kube-proxy", a.proto, NODEPORT_CLUSTER_IP
    ep, ep_port = a.endpoint.split(":")
    nft_base(out)
    base = f"ns0/np0/{proto}/p80"
    svc, ext = "service-" + nft_hash_name(base), "external-" + nft_hash_name(base)
    epc = "endpoint-" + nft_hash_name(f"{base}__{ep}/{ep_port}")
    out += [
        f"add chain {t} {epc}",
        f"add rule {t} {epc} ip saddr {ep} jump mark-for-masquerade",
        f"add rule {t} {epc} meta l4proto {proto} dnat to {ep}:{ep_port}",
        f"add chain {t} {svc}",
        f"add rule {t} {svc} ip daddr {cip} ip saddr != {CLUSTER_CIDR} jump mark-for-masquerade",
        f"add rule {t} {svc} numgen random mod 1 vmap {{ 0 : goto {epc} }}",
        f"add chain {t} {ext}",
        f'add rule {t} {ext} jump mark-for-masquerade comment "masquerade traffic from external sources"',
        f"add rule {t} {ext} goto {svc}",
        f"add element {t} cluster-ips {{ {cip} }}",
        f"add element {t} service-ips {{ {cip} . {proto} . {SERVICE_PORT} : goto {svc} }}",
        f"add element {t} nodeport-ips {{ {a.node_ip} }}",
        f"add element {t} service-nodeports {{ {proto} . {a.node_port} : goto {ext} }}",
    ]


def single_dnat(n, per_service, probed, out):
    ep = endpoints(n - 1, per_service, n, probed)[0]
    out += ["*nat",
            f"-A PREROUTING -d {cluster_ip(n - 1)} -p tcp -m tcp --dport {SERVICE_PORT} "
            f"-j DNAT --to-destination {ep}:{BACKEND_PORT}",
            "COMMIT"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["iptables-jumps", "iptables", "nft", "single-dnat",
                                    "nodeport-iptables", "nodeport-nft"])
    p.add_argument("--services", type=int, default=1)
    p.add_argument("--per-service", type=int, default=3)
    p.add_argument("--probed", default="")
    p.add_argument("--with-jumps", action="store_true",
                   help="iptables: include the jump rules, for a restore without --noflush")
    p.add_argument("--node-ip", default="10.99.0.2", help="nodeport-*: the node's address")
    p.add_argument("--node-port", type=int, default=30080, help="nodeport-*: the NodePort")
    p.add_argument("--proto", default="udp", choices=["tcp", "udp"], help="nodeport-*")
    p.add_argument("--endpoint", default="10.99.1.5:8080", help="nodeport-*: the one endpoint")
    a = p.parse_args()
    probed = [x for x in a.probed.split(",") if x]
    out = []
    if a.mode == "iptables-jumps":
        iptables_jumps(out)
    elif a.mode == "iptables":
        iptables_sync(a.services, a.per_service, probed, out, a.with_jumps)
    elif a.mode == "nft":
        nft_rules(a.services, a.per_service, probed, out)
    elif a.mode == "nodeport-iptables":
        nodeport_iptables(a, out)
    elif a.mode == "nodeport-nft":
        nodeport_nft(a, out)
    else:
        single_dnat(a.services, a.per_service, probed, out)
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
