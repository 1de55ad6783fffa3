#!/usr/bin/python3
"""A bulk TCP transfer for routing_test.sh: `serve PORT READY_FILE` accepts one connection,
reads it to the end and answers with the byte count and SHA-256 of what it read; `send HOST PORT
BYTES` sends BYTES pseudo-random bytes, half-closes, and prints "OK" if the server's answer
matches what was sent (else what it answered)."""
import hashlib
import random
import socket
import sys


def serve(port, ready):
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", port))
    ls.listen(1)
    open(ready, "w").close()
    conn, _ = ls.accept()
    h, n = hashlib.sha256(), 0
    while True:
        chunk = conn.recv(1 << 16)
        if not chunk:
            break
        h.update(chunk)
        n += len(chunk)
    conn.sendall(("%d %s\n" % (n, h.hexdigest())).encode())
    conn.close()


def send(host, port, size):
    data = random.Random(11).randbytes(size)
    s = socket.create_connection((host, port), timeout=30)
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    answer = b""
    while not answer.endswith(b"\n"):
        chunk = s.recv(256)
        if not chunk:
            break
        answer += chunk
    want = "%d %s" % (size, hashlib.sha256(data).hexdigest())
    print("OK" if answer.decode().strip() == want else "GOT " + answer.decode().strip())


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]), sys.argv[3])
    else:
        send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
