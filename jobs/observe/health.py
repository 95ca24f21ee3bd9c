"""Health: liveness (this worker's main loop runs) apart from readiness (its stores answer),
each a list of `Check`s; the worker's cached readiness file and its stall mark live beside
its heartbeat file. See docs/observe.md (Health) and docs/kubernetes.md (probes)."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobs.observe.snapshot import missing_migrations, one_line
from resilience.stores import stores_for

if TYPE_CHECKING:
    from celery import Celery

logger = logging.getLogger("jobs.observe.health")

#: Default `--max-age` of `jobs health live --local` (the worker beats every second).
DEFAULT_MAX_AGE_SECONDS = 30.0
#: Seconds between a worker's readiness checks.
READY_CHECK_INTERVAL_SECONDS = 10.0
#: Default `--max-age` of `jobs health ready --local`: a few missed checks (a check may
#: wait on a store's timeouts) before the file counts as stale.
DEFAULT_READY_MAX_AGE_SECONDS = 45.0


def heartbeat_path(node: str) -> Path:
    """The heartbeat file of worker `node` (e.g. `critical@host`) on this host."""
    return Path(tempfile.gettempdir()) / "jobs-heartbeat" / node.replace(os.sep, "_")


def stalled_path(node: str) -> Path:
    """The mark the consumption watchdog leaves while worker `node` is stalled."""
    return heartbeat_path(f"{node}.stalled")


def readiness_path(node: str) -> Path:
    """The readiness file of worker `node`, next to its heartbeat file."""
    return heartbeat_path(f"{node}.ready")


def heartbeat_age(node: str) -> float | None:
    """Seconds since worker `node` last beat on this host, or None without a heartbeat file."""
    try:
        return max(0.0, time.time() - heartbeat_path(node).stat().st_mtime)
    except FileNotFoundError:
        return None


class Periodic:
    """A daemon thread calling `tick()` every `interval_seconds` until `stop()`."""

    def __init__(self, name: str, interval_seconds: float, tick: Callable[[], Any]) -> None:
        self.name, self.interval_seconds, self.tick = name, interval_seconds, tick
        self.stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, *, at_once: bool = False) -> None:
        self.stopped.clear()
        self._thread = threading.Thread(target=self._run, args=(at_once,), name=self.name,
                                        daemon=True)
        self._thread.start()

    def stop(self, join_seconds: float = 0.0) -> None:
        self.stopped.set()
        if self._thread is not None and join_seconds:
            self._thread.join(join_seconds)
        self._thread = None

    def _run(self, at_once: bool) -> None:
        if at_once:
            self.tick()
        while not self.stopped.wait(self.interval_seconds):
            self.tick()


@dataclass(frozen=True)
class Check:
    """One health probe: what was checked, whether it passed, and why not."""

    name: str
    ok: bool
    detail: str = ""


def liveness(app: Celery, node: str, *, timeout_seconds: float = 5.0) -> list[Check]:
    """Does worker `node` (e.g. `critical@host`) answer a ping within the timeout?"""
    try:
        replies = app.control.ping(destination=[node], timeout=timeout_seconds) or []
    except Exception as exc:  # noqa: BLE001 - any failure means: no answer
        return [Check(f"ping {node}", False, one_line(exc))]
    answered = any(node in reply for reply in replies)
    return [Check(f"ping {node}", answered,
                  "pong" if answered else f"no reply within {timeout_seconds:g}s")]


def local_liveness(node: str, *, max_age_seconds: float) -> list[Check]:
    """Did worker `node`, on this host, beat within `max_age_seconds`, and is it not marked
    stalled by its consumption watchdog?"""
    name = f"heartbeat {node}"
    age = heartbeat_age(node)
    if age is None:
        return [Check(name, False, f"no heartbeat file {heartbeat_path(node)}: no worker "
                                   "of that name runs on this host (or it has not started)")]
    checks = [Check(name, age <= max_age_seconds,
                    f"last beat {age:.1f}s ago (max {max_age_seconds:g}s)")]
    try:
        stalled = stalled_path(node).read_text().strip()
    except FileNotFoundError:
        return checks
    except OSError as exc:
        stalled = f"unreadable stall mark: {type(exc).__name__}"
    return [*checks, Check(f"consumption {node}", False, stalled or "stalled")]


def _passes(name: str, probe: Callable[[], Any], detail: str) -> Check:
    """Check `name`: passed with `detail` when `probe()` returns, failed with its error."""
    try:
        probe()
    except Exception as exc:  # noqa: BLE001 - any failure fails the check
        return Check(name, False, one_line(exc))
    return Check(name, True, detail)


def ping_redis(client: Any) -> Check:
    """`client`'s Redis answers PING (the `redis` check, on any client)."""
    return _passes("redis", client.ping, "PONG")


def check_postgres(app: Celery) -> list[Check]:
    """PostgreSQL answers, and the applied migrations are every head of the code's scripts."""
    stores = stores_for(app)
    try:
        connection = stores.engine().raw_connection()
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
                missing, _ = missing_migrations(cursor, stores.database_url)
        finally:
            connection.close()
    except Exception as exc:  # noqa: BLE001
        return [Check("postgres", False, one_line(exc)),
                Check("migrations", False, "database unreachable")]
    return [
        Check("postgres", True, "SELECT 1"),
        Check("migrations", not missing,
              "all heads applied" if not missing else f"not applied: {', '.join(missing)}"),
    ]


def readiness(app: Celery, broker_connected: Callable[[], bool] | None = None) -> list[Check]:
    """Redis, the broker and PostgreSQL reachable; migrations applied. A worker checks on its
    pooled clients, and sees the broker as its consumer does (`broker_connected`)."""
    if broker_connected is None:  # the broker accepts a connection
        def connect() -> None:
            with app.connection_for_write() as connection:  # released when it fails too
                connection.ensure_connection(max_retries=1, timeout=3)

        broker = _passes("broker", connect, "connected")
    elif broker_connected():
        broker = Check("broker", True, "consumer connected")
    else:
        broker = Check("broker", False, "consumer not consuming (connecting or reconnecting)")
    return [_passes("redis", lambda: stores_for(app).redis().ping(), "PONG"), broker,
            *check_postgres(app)]


# -- cached readiness ---------------------------------------------------------------------
def write_readiness(path: Path, checks: list[Check]) -> None:
    """Record `checks` atomically (write, then rename): a probe never reads half a file, and
    the file's modification time is when they ran."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    partial.write_text(json.dumps([asdict(check) for check in checks]))
    os.replace(partial, path)


def local_readiness(node: str, *, max_age_seconds: float = DEFAULT_READY_MAX_AGE_SECONDS,
                    path: Path | None = None) -> list[Check]:
    """Worker `node`'s last recorded readiness: its checks, plus one saying whether the
    record is fresh (within `max_age_seconds`). No store is contacted."""
    path = path or readiness_path(node)
    name = f"readiness {node}"
    try:
        age = max(0.0, time.time() - path.stat().st_mtime)
        checks = [Check(**check) for check in json.loads(path.read_text())]
    except FileNotFoundError:
        return [Check(name, False, f"no readiness file {path}: no worker of that name runs "
                                   "on this host (or it has not checked yet)")]
    except (OSError, ValueError, TypeError) as exc:
        return [Check(name, False, f"unreadable readiness file {path}: {type(exc).__name__}")]
    fresh = Check(name, age <= max_age_seconds,
                  f"last check {age:.1f}s ago (max {max_age_seconds:g}s)"
                  + ("" if age <= max_age_seconds else ": the worker stopped checking"))
    return [fresh, *checks]


class ReadinessRecorder:
    """Runs `check` every `interval_seconds` in a thread and records the result in `path`
    (`readiness_path(node)`); `check` is `readiness` bound to the worker."""

    def __init__(self, path: Path, check: Callable[[], list[Check]],
                 interval_seconds: float = READY_CHECK_INTERVAL_SECONDS) -> None:
        self.path, self.check = path, check
        self._thread = Periodic("jobs-readiness", interval_seconds, self.refresh)

    def refresh(self) -> None:
        """Run the checks once and record them; a failing check is a result, not an error."""
        try:
            checks = self.check()
        except Exception as exc:  # noqa: BLE001 - an unexpected failure is "not ready"
            checks = [Check("readiness", False, one_line(exc))]
        if self._thread.stopped.is_set():  # stopping: leave no file behind
            return
        try:
            write_readiness(self.path, checks)
        except OSError as exc:
            logger.warning("readiness file %s cannot be written (%s): `jobs health ready "
                           "--local` will fail", self.path, exc)

    def start(self) -> None:
        """Start checking (first check at once, in the thread)."""
        self._thread.start(at_once=True)

    def stop(self) -> None:
        """Stop checking and remove the file: a stopped worker is not ready."""
        self._thread.stop(join_seconds=1.0)
        self.path.unlink(missing_ok=True)
