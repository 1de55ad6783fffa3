#!/usr/bin/python3
"""TCP request/response latency for overlay_bench.sh: `serve PORT READY` answers every byte with
a byte (one connection); `run HOST PORT N` does N one-byte round trips after 200 of warm-up and
prints the mean and the 99th percentile in microseconds."""
import socket
import sys
import time


def serve(port, ready):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", port))
    ls.listen(1)
    open(ready, "w").close()
    c, _ = ls.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        b = c.recv(1)
        if not b:
            return
        c.sendall(b)


def run(host, port, n):
    s = socket.create_connection((host, port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtts = []
    for i in range(n + 200):
        t = time.perf_counter_ns()
        s.sendall(b"x")
        s.recv(1)
        if i >= 200:
            rtts.append(time.perf_counter_ns() - t)
    rtts.sort()
    print("%.1f %.1f" % (sum(rtts) / len(rtts) / 1000, rtts[int(len(rtts) * 0.99)] / 1000))


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]), sys.argv[3])
    else:
        run(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
