#!/usr/bin/python3
"""Masquerade (NAT) map pressure for map_pressure_test.sh.

  nat_pressure.py server PORT     TCP echo on PORT (connections kept open), UDP sink on PORT+1;
                                  prints READY once both are bound
  nat_pressure.py client HOST PORT FLOWS
                                  opens an idle and an active TCP connection to HOST:PORT, checks
                                  both echo, keeps the active one busy (an echo every 20 ms)
                                  while it sends one UDP datagram from each of FLOWS new source
                                  ports to HOST:PORT+1, then tries the idle one again; prints one
                                  JSON line: {"active_echoes", "active_failures", "idle_before",
                                  "idle_after", "udp_sent"}
"""
import json
import socket
import socketserver
import sys
import threading
import time


class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while True:
            data = self.request.recv(4096)
            if not data:
                return
            self.request.sendall(data)


def server(port):
    socketserver.ThreadingTCPServer.allow_reuse_address = True
    socketserver.ThreadingTCPServer.daemon_threads = True
    tcp = socketserver.ThreadingTCPServer(("", port), Echo)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("", port + 1))
    threading.Thread(target=lambda: [udp.recv(2048) for _ in iter(int, 1)], daemon=True).start()
    print("READY", flush=True)
    tcp.serve_forever()


def echo(sock, msg):
    try:
        sock.sendall(msg)
        got = b""
        while len(got) < len(msg):
            chunk = sock.recv(4096)
            if not chunk:
                return "closed"
            got += chunk
        return "ok" if got == msg else "garbled"
    except socket.timeout:
        return "timeout"
    except OSError as e:
        return type(e).__name__


def client(host, port, flows):
    idle = socket.create_connection((host, port), timeout=3)
    active = socket.create_connection((host, port), timeout=3)
    out = {"idle_before": echo(idle, b"idle\n")}
    if echo(active, b"active\n") != "ok":
        print(json.dumps({"error": "the active connection does not echo"}))
        return
    stop = threading.Event()
    counts = {"active_echoes": 0, "active_failures": 0}

    def busy():
        while not stop.is_set():
            if echo(active, b"busy\n") == "ok":
                counts["active_echoes"] += 1
            else:
                counts["active_failures"] += 1
            time.sleep(0.02)  # the pace of the load, not a synchronisation

    t = threading.Thread(target=busy)
    t.start()
    sent = 0
    for _ in range(flows):
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.bind(("", 0))
        u.sendto(b"x", (host, port + 1))
        u.close()
        sent += 1
    time.sleep(0.5)  # the active flow keeps talking after the flood
    stop.set()
    t.join()
    out.update(counts)
    out["udp_sent"] = sent
    out["idle_after"] = echo(idle, b"idle again\n")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server(int(sys.argv[2]))
    else:
        client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
