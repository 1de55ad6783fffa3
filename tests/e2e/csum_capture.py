#!/usr/bin/python3
"""Checks the L4 checksums of the TCP/UDP packets a pod receives, for service_test.sh.

Run inside a pod's namespace. Captures what arrives there (AF_PACKET with PACKET_AUXDATA, not
what the pod sends) to or from --port, touches --ready once capturing, and when --stop exists
writes one JSON line to --out:
  partial_ok / partial_bad  packets whose checksum the kernel has not completed yet
                            (CHECKSUM_PARTIAL: the field holds the pseudo header sum, which a
                            device or the stack completes later); ok when completing it gives
                            the checksum of the packet as it is now (its translated addresses)
  full_ok / full_bad        packets with a complete checksum, verified over the pseudo header
  bad                       the first few bad packets, described
A packet Sluice translated on the way carries the address it was rewritten to in its pseudo
header: a wrong incremental update shows here, while the receiving stack would accept a partial
checksum without looking at it.
"""
import argparse
import json
import os
import socket
import struct
import time

ETH_P_ALL = 0x0003
ETH_P_IP = 0x0800
SOL_PACKET = 263
PACKET_AUXDATA = 8
PACKET_OUTGOING = 4
TP_STATUS_CSUMNOTREADY = 1 << 3


def ones_sum(data):
    """The 16-bit one's complement sum of data (odd length padded), not complemented."""
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def check(frame, partial):
    """(ok, description) for the TCP/UDP packet in frame, or None when it is no such packet."""
    if len(frame) < 34 or struct.unpack("!H", frame[12:14])[0] != ETH_P_IP:
        return None
    ip = frame[14:]
    ihl = (ip[0] & 0x0F) * 4
    total_len = struct.unpack("!H", ip[2:4])[0]
    proto = ip[9]
    if proto not in (socket.IPPROTO_TCP, socket.IPPROTO_UDP):
        return None
    if struct.unpack("!H", ip[6:8])[0] & 0x3FFF:
        return None  # a fragment: its checksum covers the whole datagram
    seg = bytearray(ip[ihl:total_len])
    field = 16 if proto == socket.IPPROTO_TCP else 6
    if len(seg) < field + 2:
        return None
    sport, dport = struct.unpack("!HH", seg[0:4])
    pseudo = ip[12:20] + struct.pack("!BBH", 0, proto, len(seg))
    csum = struct.unpack("!H", seg[field:field + 2])[0]
    what = "%s %s:%d -> %s:%d csum 0x%04x%s" % (
        "tcp" if proto == socket.IPPROTO_TCP else "udp",
        socket.inet_ntoa(ip[12:16]), sport, socket.inet_ntoa(ip[16:20]), dport, csum,
        " (partial)" if partial else "")
    if proto == socket.IPPROTO_UDP and csum == 0 and not partial:
        return True, what  # no checksum
    seg[field:field + 2] = b"\0\0"
    want = ones_sum(bytes(pseudo) + bytes(seg))  # what the complete checksum must cancel
    if partial:
        # Completing: the sum from the L4 header on, the seed in the field, complemented. It is
        # right when it equals the checksum computed afresh (0 and 0xffff are the same number).
        seg[field:field + 2] = struct.pack("!H", csum)
        completed = 0xFFFF ^ ones_sum(bytes(seg))
        return (completed % 0xFFFF) == ((0xFFFF ^ want) % 0xFFFF), what
    return ((want + csum) % 0xFFFF) == 0, what


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True, help="source or destination port")
    p.add_argument("--ready", required=True)
    p.add_argument("--stop", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    counts = {"partial_ok": 0, "partial_bad": 0, "full_ok": 0, "full_bad": 0, "bad": []}

    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
    s.settimeout(0.1)
    open(args.ready, "w").close()
    deadline = time.monotonic() + 600
    while not os.path.exists(args.stop) and time.monotonic() < deadline:
        try:
            frame, anc, _, addr = s.recvmsg(65536, socket.CMSG_SPACE(20))
        except (socket.timeout, InterruptedError):
            continue
        if addr[2] == PACKET_OUTGOING:
            continue
        status = 0
        for level, kind, data in anc:
            if level == SOL_PACKET and kind == PACKET_AUXDATA and len(data) >= 4:
                status = struct.unpack("I", data[:4])[0]
        partial = bool(status & TP_STATUS_CSUMNOTREADY)
        got = check(frame, partial)
        if got is None:
            continue
        ok, what = got
        sport, dport = struct.unpack("!HH", frame[14 + (frame[14] & 0x0F) * 4:][:4])
        if args.port not in (sport, dport):
            continue
        key = ("partial_" if partial else "full_") + ("ok" if ok else "bad")
        counts[key] += 1
        if not ok and len(counts["bad"]) < 5:
            counts["bad"].append(what)
    with open(args.out, "w") as f:
        f.write(json.dumps(counts) + "\n")


if __name__ == "__main__":
    main()
