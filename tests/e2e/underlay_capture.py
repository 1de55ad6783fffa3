#!/usr/bin/python3
"""Counts what crosses a lab's underlay, for routing_test.sh (no tcpdump needed).

Run inside the underlay namespace. Captures every frame of every interface there with an
AF_PACKET socket, touches --ready once capturing, and on SIGTERM prints one JSON line:
  frames         IPv4 frames seen
  vxlan          UDP datagrams to --port (VXLAN) between any addresses
  vxlan_inner    of those, carrying an inner IPv4 packet with a --pods address
  pod_addressed  frames whose (outer) IPv4 source or destination is in --pods
Each frame is usually seen twice (on the node's bridge port and on the bridge); the counts are
for comparing with zero.
"""
import argparse
import ipaddress
import json
import signal
import socket
import struct
import sys

ETH_P_ALL = 0x0003
ETH_P_IP = 0x0800


def ipv4(frame, off):
    """(src, dst, proto, payload offset) of the IPv4 header at off, or None."""
    if len(frame) < off + 20 or frame[off] >> 4 != 4:
        return None
    ihl = (frame[off] & 0x0F) * 4
    proto = frame[off + 9]
    src = ipaddress.IPv4Address(frame[off + 12:off + 16])
    dst = ipaddress.IPv4Address(frame[off + 16:off + 20])
    return src, dst, proto, off + ihl


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=8472)
    p.add_argument("--pods", default="10.244.0.0/16")
    p.add_argument("--ready", required=True)
    args = p.parse_args()
    pods = ipaddress.ip_network(args.pods)
    counts = {"frames": 0, "vxlan": 0, "vxlan_inner": 0, "pod_addressed": 0}
    done = []
    signal.signal(signal.SIGTERM, lambda *_: done.append(1))

    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.settimeout(0.2)
    open(args.ready, "w").close()
    while not done:
        try:
            frame = s.recv(65536)
        except socket.timeout:
            continue
        except InterruptedError:
            continue
        if len(frame) < 14 or struct.unpack("!H", frame[12:14])[0] != ETH_P_IP:
            continue
        outer = ipv4(frame, 14)
        if outer is None:
            continue
        src, dst, proto, l4 = outer
        counts["frames"] += 1
        if src in pods or dst in pods:
            counts["pod_addressed"] += 1
        if proto == socket.IPPROTO_UDP and len(frame) >= l4 + 8:
            if struct.unpack("!H", frame[l4 + 2:l4 + 4])[0] == args.port:
                counts["vxlan"] += 1
                # UDP (8) + VXLAN (8) + inner Ethernet (14)
                inner = ipv4(frame, l4 + 8 + 8 + 14)
                if inner and (inner[0] in pods or inner[1] in pods):
                    counts["vxlan_inner"] += 1
    print(json.dumps(counts))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
