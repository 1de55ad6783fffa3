"""Continuous load for the fault proofs (agent_kill_test.sh): run inside a client pod's network
namespace until OUT.stop exists, then write a JSON summary to OUT.

  fault_load.py OUT NAME=KIND:HOST:PORT[:LO-HI][:pause=MS]...

KIND is tcp (a new connection per "hostname" request), udp (one datagram and its reply; a new
socket, so a new flow, every 20 requests) or long (one TCP connection opened at the start and
kept: a line every 100 ms must come back echoed; a broken connection is never reopened, it counts
as interrupted). OUT.started appears once every stream has had an answer.
LO-HI: the stream's sockets bind source ports from this range in turn (else the kernel picks).
pause=MS: the pause between two requests of a tcp or udp stream (default 4 ms for tcp, 10 ms for
udp). A tcp stream through the node's masquerade needs one: as fast as the machine goes, its
closed connections can hold more of the node's masquerade ports (--nat_port_range, held for
--ct_tcp_closing_timeout after the close) than there are, and the SYNs past that drop as
nat_no_port: a limit of the load, not of what it proves (docs/operating.md gives the rate).
Summary: {NAME: {"kind", "total", "failures", "errors": [[t, error]...first 20]}, ...}.
"""
import errno, json, os, socket, sys, threading, time

out = sys.argv[1]
streams = []
for arg in sys.argv[2:]:
    name, spec = arg.split("=", 1)
    kind, host, port, *rest = spec.split(":")
    lo, hi, pause = 0, -1, None
    for opt in rest:
        if opt.startswith("pause="):
            pause = int(opt[len("pause="):]) / 1000
        else:
            lo, hi = (int(x) for x in opt.split("-"))
    streams.append((name, kind, host, int(port), lo, hi, pause))
stop = threading.Event()
results = {}
started = set()
lock = threading.Lock()


def record(name, kind, ok, err=None):
    r = results[name]
    r["total"] += 1
    if ok:
        with lock:
            if name not in started:
                started.add(name)
                if len(started) == len(streams):
                    open(out + ".started", "w").close()
    else:
        r["failures"] += 1
        r["error_times"].append(round(time.time(), 2))
        if len(r["errors"]) < 20:
            r["errors"].append([round(time.time(), 3), err])


def source_ports(lo, hi):
    """Yields the source address to bind: ("", 0) (kernel's pick) or ports lo..hi in turn."""
    n = 0
    while True:
        yield ("", lo + n % (hi - lo + 1)) if hi >= lo else ("", 0)
        n += 1


def bound_tcp_socket(src):
    """A TCP socket bound to the next source port of the stream's range that is free here. A port
    its own earlier connection still holds in TIME_WAIT (the range wraps on a fast machine) is
    skipped: no connection was tried, so it is no failure of the datapath."""
    for _ in range(64):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(next(src))
            return s
        except OSError as e:
            s.close()
            if e.errno != errno.EADDRINUSE:
                raise
    raise OSError(errno.EADDRINUSE, "64 source ports in a row in use")


def tcp(name, host, port, lo, hi, pause=None):
    src = source_ports(lo, hi)
    while not stop.is_set():
        try:
            s = bound_tcp_socket(src)
            s.settimeout(3)
            s.connect((host, port))
            with s:
                s.sendall(b"hostname\n")
                data = b""
                while not data.endswith(b"\n"):
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    data += chunk
            if not data.strip():
                raise RuntimeError("empty reply")
            record(name, "tcp", True)
        except Exception as e:
            record(name, "tcp", False, repr(e))
        time.sleep(0.004 if pause is None else pause)


def udp(name, host, port, lo, hi, pause=None):
    s, n, src = None, 0, source_ports(lo, hi)
    while not stop.is_set():
        if n % 20 == 0:
            if s:
                s.close()
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(next(src))
            s.settimeout(2)
        n += 1
        try:
            s.sendto(b"hostname\n", (host, port))
            data, peer = s.recvfrom(4096)
            if peer != (host, port):
                raise RuntimeError(f"reply from {peer}")
            record(name, "udp", True)
        except Exception as e:
            record(name, "udp", False, repr(e))
        time.sleep(0.01 if pause is None else pause)


def long(name, host, port, lo, hi, pause=None):
    # The connection is made before the first kill; retried only until it first succeeds.
    deadline = time.time() + 30
    while True:
        try:
            s = socket.create_connection((host, port), timeout=3)
            break
        except Exception as e:
            if time.time() > deadline:
                record(name, "long", False, "never connected: " + repr(e))
                return
            time.sleep(0.2)
    f = s.makefile("rwb")
    seq = 0
    while not stop.is_set():
        seq += 1
        try:
            f.write(b"seq %d\n" % seq)
            f.flush()
            line = f.readline()
            if line != b"seq %d\n" % seq:
                raise RuntimeError(f"sent seq {seq}, got {line!r}")
            record(name, "long", True)
        except Exception as e:
            record(name, "long", False, repr(e))
            results[name]["interrupted"] = True
            return
        time.sleep(0.1)
    s.close()


threads = []
for name, kind, host, port, lo, hi, pause in streams:
    results[name] = {"kind": kind, "target": f"{host}:{port}", "total": 0, "failures": 0,
                     "errors": [], "error_times": [], "interrupted": False}
    fn = {"tcp": tcp, "udp": udp, "long": long}[kind]
    t = threading.Thread(target=fn, args=(name, host, port, lo, hi, pause), daemon=True)
    t.start()
    threads.append(t)
while not os.path.exists(out + ".stop"):
    time.sleep(0.1)
# A stream whose thread ended before the stop (an exception outside its loop's try, or a broken
# long-lived connection) is reported: it stopped making connections.
for (name, kind, *_), t in zip(streams, threads):
    results[name]["died"] = not t.is_alive()
stop.set()
for t in threads:
    t.join(10)
tmp = out + ".tmp"
with open(tmp, "w") as f:
    json.dump(results, f)
os.rename(tmp, out)
