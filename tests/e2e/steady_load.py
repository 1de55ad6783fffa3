#!/usr/bin/python3
"""Traffic for steady_state_test.sh: many short flows at a steady pace beside a few long ones.

  steady_load.py server PORT...   TCP echo on each PORT (a connection is kept until its client
                                  closes it) and UDP echo on each PORT; prints READY once bound
  steady_load.py client SECONDS OUT STREAM...
                                  runs every STREAM until OUT.stop exists, or for 3 x SECONDS: a
                                  paced one (tcp, udp) for RATE x SECONDS flows, a long one as
                                  long as any paced one runs; then writes a JSON summary to OUT.
                                  OUT.started appears once every stream has had an answer
  steady_load.py hold HOST:PORT COUNT OUT
                                  opens COUNT TCP connections to HOST:PORT, 8 at a time (each
                                  checked with one echo; a failed one is tried again, for up to
                                  60 s), writes
                                  {"opened", "failed", "errors"} to OUT, waits for OUT.close,
                                  closes them all (FIN) and writes OUT.closed: {"closed": the
                                  time of the close (time.time())}
  steady_load.py reopen HOST:PORT IDLE
                                  a connection closed with RST, then a new one from the same
                                  port to HOST:PORT, echoed at once and after IDLE seconds idle:
                                  prints {"first", "second", "after_idle": "ok" or the error}
  steady_load.py reach HOST:PORT SINCE SECONDS
                                  a new connection every 0.5 s until one is echoed, up to SINCE +
                                  SECONDS: prints {"seconds" since SINCE (null: never), "tries"}

STREAM is NAME=KIND:HOST:PORT[:RATE]. KIND:
  tcp    a new connection per request, RATE a second (at most 8 at once): sends "hostname",
         reads the reply line (netexec answers and closes; the echo server answers and waits).
         Every third closes with RST (SO_LINGER 0), the others with FIN: the flows end both ways.
  udp    a new socket (a new flow) per datagram, RATE a second; the reply must come back
  long   one TCP connection for the whole run (to an echo server): a line every 200 ms must come
         back echoed; a broken connection is never reopened
  longudp one UDP socket for the whole run: a datagram every 200 ms must come back
Summary: {NAME: {"kind", "target", "total", "failures", "errors": [first 10], "seconds"}}.
"""
import asyncio
import json
import os
import socket
import struct
import sys
import time

TIMEOUT = 3.0  # seconds a connect, a reply or a datagram's answer may take


class Echo(asyncio.DatagramProtocol):
    def connection_made(self, transport):
        self.transport = transport

    def datagram_received(self, data, addr):
        self.transport.sendto(data, addr)


async def echo_tcp(reader, writer):
    try:
        while data := await reader.read(4096):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    writer.close()


async def serve(ports):
    loop = asyncio.get_running_loop()
    servers = []
    for port in ports:
        servers.append(await asyncio.start_server(echo_tcp, "0.0.0.0", port, backlog=1024,
                                                  reuse_address=True))
        await loop.create_datagram_endpoint(Echo, local_addr=("0.0.0.0", port))
    print("READY", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


OUT = None  # the client's summary file; OUT.stop stops it
STARTED = set()  # streams that have not had an answer yet


PACED_DONE = False  # a client's paced streams have made their flows: its long ones end too


def going(deadline):
    return (time.monotonic() < deadline and not PACED_DONE and
            not os.path.exists(OUT + ".stop"))


class Stream:
    def __init__(self, spec):
        self.name, rest = spec.split("=", 1)
        self.kind, self.host, port, *rate = rest.split(":")
        self.port = int(port)
        self.rate = float(rate[0]) if rate else 0
        self.total = self.failures = 0
        self.errors = []

    def record(self, ok, err=None):
        if ok and not self.total - self.failures:
            STARTED.discard(self.name)
            if not STARTED:
                open(OUT + ".started", "w").close()
        self.total += 1
        if not ok:
            self.failures += 1
            if len(self.errors) < 10:
                self.errors.append([round(time.time(), 2), err])

    def summary(self, seconds):
        return {"kind": self.kind, "target": f"{self.host}:{self.port}", "total": self.total,
                "failures": self.failures, "errors": self.errors, "seconds": round(seconds, 1)}


async def one_tcp(s, n):
    writer = None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(s.host, s.port), TIMEOUT)
        writer.write(b"hostname\n")
        line = await asyncio.wait_for(reader.readline(), TIMEOUT)
        if not line.strip():
            raise RuntimeError("empty reply")
        if n % 3 == 0:
            writer.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.record(True)
    except Exception as e:  # every failure is counted, whatever it was
        s.record(False, repr(e))
    finally:
        if writer is not None:
            writer.close()


async def one_udp(s):
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setblocking(False)
    try:
        sock.connect((s.host, s.port))
        await loop.sock_sendall(sock, b"hostname\n")
        if not await asyncio.wait_for(loop.sock_recv(sock, 4096), TIMEOUT):
            raise RuntimeError("empty reply")
        s.record(True)
    except Exception as e:
        s.record(False, repr(e))
    finally:
        sock.close()


async def paced(s, count, deadline, one):
    """Starts one() RATE times a second, COUNT times (or until the deadline), at most 8 running at
    once: a machine too slow for the pace makes as many flows in more time."""
    running = set()
    start, n = time.monotonic(), 0
    while n < count and going(deadline):
        n += 1
        if len(running) >= 8:
            await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        task = asyncio.create_task(one(s, n))
        running.add(task)
        task.add_done_callback(running.discard)
        # The pace of the load, not a synchronisation.
        await asyncio.sleep(max(0.0, start + n / s.rate - time.monotonic()))
    if running:
        await asyncio.wait(running)


async def long_tcp(s, deadline):
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(s.host, s.port), TIMEOUT)
    except Exception as e:
        s.record(False, "never connected: " + repr(e))
        return
    seq = 0
    while going(deadline):
        seq += 1
        try:
            writer.write(b"seq %d\n" % seq)
            line = await asyncio.wait_for(reader.readline(), TIMEOUT)
            if line != b"seq %d\n" % seq:
                raise RuntimeError(f"sent seq {seq}, got {line!r}")
            s.record(True)
        except Exception as e:
            s.record(False, "broken: " + repr(e))
            return
        await asyncio.sleep(0.2)
    writer.close()


async def long_udp(s, deadline):
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        sock.connect((s.host, s.port))
        seq = 0
        while going(deadline):
            seq += 1
            try:
                await loop.sock_sendall(sock, b"seq %d" % seq)
                # A late answer to an earlier datagram is skipped, not taken for this one.
                while (got := await asyncio.wait_for(loop.sock_recv(sock, 4096), TIMEOUT)) != \
                        b"seq %d" % seq:
                    if not got.startswith(b"seq "):
                        raise RuntimeError(f"got {got!r}")
                s.record(True)
            except Exception as e:
                s.record(False, repr(e))
            await asyncio.sleep(0.2)


async def client(seconds, out, specs):
    global OUT
    OUT = out
    streams = [Stream(spec) for spec in specs]
    STARTED.update(s.name for s in streams)
    start = time.monotonic()
    deadline = start + 3 * seconds
    paced_jobs, long_jobs = [], []
    for s in streams:
        if s.kind == "tcp":
            paced_jobs.append(paced(s, int(s.rate * seconds), deadline, one_tcp))
        elif s.kind == "udp":
            paced_jobs.append(paced(s, int(s.rate * seconds), deadline, lambda s, n: one_udp(s)))
        elif s.kind == "long":
            long_jobs.append(long_tcp(s, deadline))
        elif s.kind == "longudp":
            long_jobs.append(long_udp(s, deadline))
        else:
            raise SystemExit(f"unknown stream kind {s.kind}")

    async def all_paced():
        global PACED_DONE
        await asyncio.gather(*paced_jobs)
        PACED_DONE = bool(paced_jobs)

    await asyncio.gather(all_paced(), *long_jobs)
    elapsed = time.monotonic() - start
    write_json(out, {s.name: s.summary(elapsed) for s in streams})


async def hold(target, count, out):
    host, port = target.rsplit(":", 1)
    conns, errors, failed = [], [], 0
    # A connect that found no free port is tried again (its SYN was dropped) until COUNT are open,
    # 8 at a time.
    deadline = time.monotonic() + 60
    pending = count

    async def opener():
        nonlocal pending, failed
        while pending > 0 and time.monotonic() < deadline:
            pending -= 1
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, int(port)), TIMEOUT)
                writer.write(b"hold\n")
                if await asyncio.wait_for(reader.readline(), TIMEOUT) != b"hold\n":
                    raise RuntimeError("no echo")
                conns.append((reader, writer))
            except Exception as e:
                pending += 1
                failed += 1
                if len(errors) < 10:
                    errors.append(repr(e))

    await asyncio.gather(*(opener() for _ in range(8)))
    write_json(out, {"opened": len(conns), "failed": failed, "errors": errors})
    while not os.path.exists(out + ".close"):
        await asyncio.sleep(0.05)
    for _, writer in conns:
        writer.write_eof()
    closed = time.time()
    # The echo server answers each FIN with its own.
    await asyncio.gather(*(asyncio.wait_for(r.read(), TIMEOUT) for r, _ in conns),
                         return_exceptions=True)
    for _, writer in conns:
        writer.close()
    write_json(out + ".closed", {"closed": closed, "settled": time.time()})


async def reach(target, since, seconds):
    """Fresh connections (0.5 s each) until one is answered: prints the seconds since SINCE."""
    host, port = target.rsplit(":", 1)
    tries, last = 0, None
    while time.time() < since + seconds:
        tries += 1
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 0.5)
            writer.write(b"reach\n")
            if await asyncio.wait_for(reader.readline(), TIMEOUT) == b"reach\n":
                writer.close()
                print(json.dumps({"seconds": round(time.time() - since, 2), "tries": tries}))
                return
            writer.close()
        except Exception as e:
            last = repr(e)
    print(json.dumps({"seconds": None, "tries": tries, "error": last}))


async def reopen(target, idle):
    """A connection closed with RST, then one from the same address and port to the same target
    (its conntrack entries and masquerade mapping are closing when its SYN comes): it must echo
    at once and again after IDLE seconds, past the closing timeout. Prints {"first", "second",
    "after_idle", "port"}."""
    host, port = target.rsplit(":", 1)
    out = {}
    local = None
    for step in ("first", "second"):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("", local or 0))
        local = sock.getsockname()[1]
        sock.setblocking(False)
        try:
            await asyncio.wait_for(asyncio.get_running_loop().sock_connect(
                sock, (host, int(port))), TIMEOUT)
            reader, writer = await asyncio.open_connection(sock=sock)
            writer.write(b"%s\n" % step.encode())
            got = await asyncio.wait_for(reader.readline(), TIMEOUT)
            out[step] = "ok" if got == b"%s\n" % step.encode() else repr(got)
        except Exception as e:
            out[step] = repr(e)
            sock.close()
            break
        if step == "first":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.close()
            continue
        await asyncio.sleep(idle)  # the idle time the entries must outlive: what is tested
        try:
            writer.write(b"again\n")
            got = await asyncio.wait_for(reader.readline(), TIMEOUT)
            out["after_idle"] = "ok" if got == b"again\n" else repr(got)
        except Exception as e:
            out["after_idle"] = repr(e)
        writer.close()
    out["port"] = local
    print(json.dumps(out), flush=True)


def write_json(path, value):
    with open(path + ".tmp", "w") as f:
        json.dump(value, f)
    os.rename(path + ".tmp", path)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        asyncio.run(serve([int(p) for p in sys.argv[2:]]))
    elif sys.argv[1] == "client":
        asyncio.run(client(float(sys.argv[2]), sys.argv[3], sys.argv[4:]))
    elif sys.argv[1] == "hold":
        asyncio.run(hold(sys.argv[2], int(sys.argv[3]), sys.argv[4]))
    elif sys.argv[1] == "reopen":
        asyncio.run(reopen(sys.argv[2], float(sys.argv[3])))
    elif sys.argv[1] == "reach":
        asyncio.run(reach(sys.argv[2], float(sys.argv[3]), float(sys.argv[4])))
    else:
        raise SystemExit(__doc__)
