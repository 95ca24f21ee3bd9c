"""A TCP proxy for chaos tests, run as its own process: forwards every connection to an
upstream server (the test's broker Redis) until told otherwise.

    python tests/jobs/observe/freeze_proxy.py LISTEN_PORT UPSTREAM_HOST UPSTREAM_PORT

It prints `ready` once listening. SIGUSR1 freezes every connection open at that moment: its
sockets stay open, but no byte is forwarded either way again (a peer that went silent
without a reset, as after a NAT or load balancer drops a flow); connections made afterwards
are forwarded as before, so the broker stays reachable to anyone who connects anew. It
prints `frozen N` once done. SIGSTOP on the process is a whole-broker outage: nothing is
forwarded, and new connections are not served either (the kernel accepts them into the
listen backlog, and they hang); SIGCONT ends it.
"""

from __future__ import annotations

import contextlib
import selectors
import signal
import socket
import sys


def main(listen_port: int, upstream_host: str, upstream_port: int) -> None:
    selector = selectors.DefaultSelector()
    listener = socket.create_server(("127.0.0.1", listen_port), backlog=128)
    selector.register(listener, selectors.EVENT_READ, None)
    peers: dict[socket.socket, socket.socket] = {}
    frozen: list[socket.socket] = []  # kept open, never read or written again
    freeze_requested = [False]

    def request_freeze(*_: object) -> None:
        freeze_requested[0] = True

    signal.signal(signal.SIGUSR1, request_freeze)
    print("ready", flush=True)

    def close_pair(sock: socket.socket) -> None:
        other = peers.pop(sock, None)
        for one in (sock, other):
            if one is None:
                continue
            peers.pop(one, None)
            with contextlib.suppress(KeyError, ValueError):
                selector.unregister(one)
            one.close()

    while True:
        if freeze_requested[0]:
            freeze_requested[0] = False
            for sock in list(peers):
                selector.unregister(sock)
                frozen.append(sock)
            count = len(peers) // 2
            peers.clear()
            print(f"frozen {count}", flush=True)
        for key, _ in selector.select(timeout=0.05):
            sock = key.fileobj
            if sock is listener:
                client, _ = listener.accept()
                try:
                    upstream = socket.create_connection((upstream_host, upstream_port), 5)
                except OSError:
                    client.close()
                    continue
                peers[client], peers[upstream] = upstream, client
                selector.register(client, selectors.EVENT_READ, None)
                selector.register(upstream, selectors.EVENT_READ, None)
                continue
            if sock not in peers:  # frozen (or closed) since select returned
                continue
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                close_pair(sock)
                continue
            try:
                peers[sock].sendall(data)
            except OSError:
                close_pair(sock)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
