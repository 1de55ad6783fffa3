"""A line echo server for long-lived connections (the fault proofs): fault_echo.py PORT."""
import socket, sys, threading

ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("0.0.0.0", int(sys.argv[1])))
ls.listen(64)


def serve(c):
    with c:
        f = c.makefile("rwb")
        for line in f:
            f.write(line)
            f.flush()


while True:
    c, _ = ls.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
