#!/usr/bin/python3
"""A test server in the manner of agnhost netexec, for Sluice's end-to-end tests.

Serves TCP and UDP on one port. A request "hostname" is answered with --name, "clientip" with
the client's address and port as this server sees them, anything else is echoed back.
"""
import argparse
import socket
import socketserver
import struct
import threading

IP_PKTINFO = 8


def answer(name, data, peer):
    text = data.decode(errors="replace").strip()
    if text == "hostname":
        return name + "\n"
    if text == "clientip":
        return "%s:%d\n" % peer
    return data.decode(errors="replace")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--name", default=socket.gethostname())
    args = p.parse_args()

    class Tcp(socketserver.StreamRequestHandler):
        def handle(self):
            line = self.rfile.readline()
            self.wfile.write(answer(args.name, line, self.client_address[:2]).encode())

    def serve_udp():
        # Reply from the address the request was sent to (IP_PKTINFO), as a client expects of a
        # server on a host with several addresses.
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
        sock.bind(("0.0.0.0", args.port))
        while True:
            data, ancdata, _, peer = sock.recvmsg(65535, socket.CMSG_SPACE(12))
            pktinfo = [c for c in ancdata if c[0] == socket.IPPROTO_IP and c[1] == IP_PKTINFO]
            reply = answer(args.name, data, peer[:2]).encode()
            if pktinfo:
                # struct in_pktinfo {ifindex, spec_dst, addr}: answer with spec_dst = addr.
                info = pktinfo[0][2]
                out = struct.pack("i4s4s", 0, info[8:12], b"\0" * 4)
                sock.sendmsg([reply], [(socket.IPPROTO_IP, IP_PKTINFO, out)], 0, peer)
            else:
                sock.sendto(reply, peer)

    socketserver.ThreadingTCPServer.allow_reuse_address = True
    tcp = socketserver.ThreadingTCPServer(("0.0.0.0", args.port), Tcp)
    threading.Thread(target=serve_udp, daemon=True).start()
    tcp.serve_forever()


if __name__ == "__main__":
    main()
