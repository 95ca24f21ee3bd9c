"""A TCP forwarder in its own process, so a test can take a store "down" without killing it.

    python proxy.py LISTEN_PORT TARGET_HOST TARGET_PORT

Why a proxy and not SIGKILL of the store itself: the session's Redis is also the broker and
the result backend, and PostgreSQL holds the test's own records; killing them would test
the broker and the harness, not the guards. Killing this process instead does what a
network partition or a store crash does to the guards: every open connection drops at once
(the kernel closes the sockets of the dead process on both sides, so PostgreSQL ends the
backends and frees their advisory locks) and new connections are refused until the proxy
starts again on the same port.

The file is also imported by the tests for `Proxy`, which starts, kills and restarts it;
the forwarding code uses the standard library only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

CHUNK = 65536


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        # One side ended: end both, as a dead store or a partition would.
        with contextlib.suppress(Exception):
            writer.close()


async def _serve(listen_port: int, target_host: str, target_port: int) -> None:
    async def handle(client_reader: asyncio.StreamReader,
                     client_writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                target_host, target_port)
        except OSError:
            client_writer.close()
            return
        for writer in (client_writer, upstream_writer):
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(_pipe(client_reader, upstream_writer),
                             _pipe(upstream_reader, client_writer))

    server = await asyncio.start_server(handle, "127.0.0.1", listen_port, reuse_address=True,
                                        backlog=512)
    async with server:
        await server.serve_forever()


class Proxy:
    """One forwarder process from 127.0.0.1:`listen_port` to `target_host`:`target_port`.

    `down()` SIGKILLs it (connections drop, connects are refused); `up()` starts it again on
    the same port and returns once it accepts connections.
    """

    def __init__(self, listen_port: int, target_host: str, target_port: int,
                 log_path: Path) -> None:
        self.listen_port = listen_port
        self.target_host = target_host
        self.target_port = target_port
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def up(self, timeout_seconds: float = 10.0) -> Proxy:
        if self.alive():
            return self
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, str(Path(__file__).resolve()), str(self.listen_port),
                   self.target_host, str(self.target_port)]
        deadline = time.monotonic() + timeout_seconds
        while True:
            with self.log_path.open("ab") as log:
                self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                start_new_session=True)
            while time.monotonic() < deadline and self.process.poll() is None:
                if _accepts(self.listen_port):
                    return self
                time.sleep(0.01)
            # Exited at start (the port was briefly not bindable) or never became ready.
            self.down()
            if time.monotonic() >= deadline:
                raise TimeoutError(f"proxy on port {self.listen_port} did not start; see "
                                   f"{self.log_path}")
            time.sleep(0.05)

    def down(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(5)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


if __name__ == "__main__":
    listen, host, target = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    asyncio.run(_serve(listen, host, target))
