"""PostgreSQL session advisory locks on a dedicated connection.

A session advisory lock belongs to one server backend and is freed the instant that
backend ends: when the holder process dies, the kernel closes its socket, PostgreSQL sees
EOF and drops the lock — no TTL to wait out, nothing left behind. That only holds when the
connection is the holder's alone for the whole run, hence `AdvisorySession` opens its own
psycopg2 connection (never one from the shared SQLAlchemy pool, which could hand the
backend to other code that unlocks, or keep it alive after we are gone).

PgBouncer in transaction (or statement) pooling mode breaks session locks: consecutive
statements may run on different backends, so the lock is taken on one and "checked" or
released on another. `AdvisorySession` refuses it:
  * declared: `pool_mode="transaction"` (or env `JOBS_PG_POOL_MODE=transaction`) → error;
  * detected: the backend pid must stay the same across statements at open and at every
    ownership check; a change means a pooler moved us → error / lost ownership.
A pooler with a single idle server connection can hide the pid change, so declare it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from dataclasses import dataclass
from typing import Any

from resilience.errors import ConfigurationError, LockNotOwnedError, StorageError
from resilience.prepared import PreparedStatement
from resilience.stores import wrap_store_errors

#: Pool modes of PgBouncer (and compatible poolers) that break session advisory locks.
UNSAFE_POOL_MODES = ("transaction", "statement")

#: The session holding an advisory lock, by pg_locks' (classid, objid) of its id.
HOLDER_SQL = """
    SELECT a.pid, a.application_name, extract(epoch FROM now() - a.backend_start) AS age
    FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted
      AND l.classid = :classid AND l.objid = :objid AND l.objsubid = 1
"""

_HOLDERS = """
    SELECT a.pid, a.application_name, a.backend_start, a.client_addr
    FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted
      AND l.classid = %s AND l.objid = %s AND l.objsubid = 1
"""


def advisory_id(key: str) -> int:
    """The signed 64-bit advisory lock id of `key` (SHA-256 prefix; stable across processes)."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big", signed=True)


def lock_parts(lock_id: int) -> tuple[int, int]:
    """How pg_locks shows a bigint advisory id: (classid, objid) = (high, low) 32 bits."""
    unsigned = lock_id & 0xFFFFFFFFFFFFFFFF
    return unsigned >> 32, unsigned & 0xFFFFFFFF


def connect_arguments(database_url: str) -> dict[str, Any]:
    """psycopg2 keyword arguments of a SQLAlchemy/libpq URL."""
    from sqlalchemy import make_url

    url = make_url(database_url)
    arguments: dict[str, Any] = {
        "host": url.host or "127.0.0.1",
        "port": url.port or 5432,
        "user": url.username or "postgres",
        "dbname": url.database or "postgres",
    }
    if url.password:
        arguments["password"] = url.password
    arguments.update({k: v for k, v in url.query.items() if isinstance(v, str)})
    return arguments


@dataclass
class AdvisoryHolder:
    """Who holds an advisory lock, as PostgreSQL itself reports it."""

    backend_pid: int
    application_name: str
    held_seconds: float

    @property
    def task_id(self) -> str | None:
        """The holder's task id, when the holder named its session `lock:<task id>`."""
        prefix = "lock:"
        if self.application_name.startswith(prefix):
            return self.application_name[len(prefix):] or None
        return None


class AdvisorySession:
    """One dedicated PostgreSQL session that takes, checks and releases advisory locks.

    Args:
        database_url: the PostgreSQL URL (postgresql:// or postgresql+psycopg2://).
        label: shown as `application_name` (`lock:<label>`), so holders are identifiable.
        pool_mode: the pooler's mode if there is one; None reads `JOBS_PG_POOL_MODE`.
        connect_timeout_seconds: bound on connecting.

    Raises:
        ConfigurationError: a transaction/statement pooler is declared or detected.
        StoreUnavailable: PostgreSQL cannot be reached.
    """

    def __init__(
        self,
        database_url: str,
        *,
        label: str = "",
        pool_mode: str | None = None,
        connect_timeout_seconds: float = 5,
    ) -> None:
        mode = (pool_mode or os.environ.get("JOBS_PG_POOL_MODE") or "").strip().lower()
        if mode in UNSAFE_POOL_MODES:
            raise ConfigurationError(
                f"advisory locks need a session of their own, but the database is behind a "
                f"pooler in {mode} pooling mode (PgBouncer): the lock would be taken on one "
                "backend and checked or released on another. Point the singleton guard at "
                "PostgreSQL directly or at a session-mode pool.",
                pool_mode=mode,
            )
        import psycopg2

        with wrap_store_errors("advisory lock session"):
            self.connection = psycopg2.connect(
                **connect_arguments(database_url),
                application_name=f"lock:{label}"[:63],
                connect_timeout=max(1, int(connect_timeout_seconds)),
                # Detect a vanished peer (host crash, cable) within ~11 s, not hours.
                keepalives=1, keepalives_idle=5, keepalives_interval=2, keepalives_count=3,
            )
        self.connection.autocommit = True
        self.backend_pid = self.scalar("SELECT pg_backend_pid()")
        # Under transaction pooling, autocommit statements may land on other backends.
        for _ in range(2):
            if self.scalar("SELECT pg_backend_pid()") != self.backend_pid:
                self.close()
                raise ConfigurationError(
                    "the PostgreSQL session moved between backends across statements: the "
                    "database is behind a transaction-pooling proxy (PgBouncer "
                    "pool_mode=transaction); session advisory locks cannot work there",
                    pool_mode="transaction",
                )
        self.held: set[int] = set()
        #: Names of the statements prepared on this session.
        self.prepared: set[str] = set()

    def execute(self, sql: str, parameters: tuple[Any, ...] | dict[str, Any] = ()) -> Any:
        """Run one statement on this session (autocommit); rows, or None without a result.

        Raises:
            StoreUnavailable: the session is gone.  StoreRejected, StorageError: the
                statement failed.
        """
        with wrap_store_errors("advisory lock session"), self.connection.cursor() as cursor:
            cursor.execute(sql, parameters)
            return cursor.fetchall() if cursor.description else None

    def execute_prepared(self, statement: PreparedStatement, parameters: dict[str, Any]) -> Any:
        """`execute` of a statement prepared once on this session (saves parse and plan)."""
        if statement.name not in self.prepared:
            self.execute(statement.prepare)
            self.prepared.add(statement.name)
        return self.execute(statement.execute, statement.values(parameters))

    def scalar(self, sql: str, parameters: tuple[Any, ...] = ()) -> Any:
        """The first column of the first row of one statement on this session."""
        return self.execute(sql, parameters)[0][0]

    def try_acquire(self, key: str) -> bool:
        """Take the advisory lock of `key` without waiting; False when another session has it."""
        lock_id = advisory_id(key)
        taken = bool(self.scalar("SELECT pg_try_advisory_lock(%s)", (lock_id,)))
        if taken:
            self.held.add(lock_id)
        return taken

    def owns(self, key: str) -> bool:
        """True when this session still holds `key`'s lock on the backend it started on."""
        try:
            self.verify(key)
        except LockNotOwnedError:
            return False
        return True

    def verify(self, key: str) -> None:
        """Check the session is alive, unmoved, and still holds `key`'s lock.

        Raises:
            LockNotOwnedError: the session died (PostgreSQL restart, backend terminated) or
                moved to another backend, or the lock is not held.
        """
        lock_id = advisory_id(key)
        classid, objid = lock_parts(lock_id)
        try:
            rows = self.execute(
                "SELECT pg_backend_pid(), EXISTS (SELECT 1 FROM pg_locks WHERE locktype = "
                "'advisory' AND granted AND pid = pg_backend_pid() AND classid = %s AND "
                "objid = %s AND objsubid = 1)",
                (classid, objid),
            )
        except StorageError as exc:
            raise LockNotOwnedError(
                f"singleton lock {key!r} lost: its PostgreSQL session is gone ({exc}); "
                "stopping before the task commits",
                key=key, cause=getattr(exc, "cause", repr(exc)),
            ) from exc
        pid, held = rows[0]
        if pid != self.backend_pid:
            raise LockNotOwnedError(
                f"singleton lock {key!r} lost: the session moved from backend "
                f"{self.backend_pid} to {pid} (reconnect or transaction pooling)",
                key=key,
            )
        if not held:
            raise LockNotOwnedError(f"singleton lock {key!r} is not held by this session",
                                    key=key)

    def release(self, key: str) -> bool:
        """Release `key`'s lock; False when it was not held (or the session is gone)."""
        lock_id = advisory_id(key)
        self.held.discard(lock_id)
        try:
            return bool(self.scalar("SELECT pg_advisory_unlock(%s)", (lock_id,)))
        except StorageError:
            return False

    def holders(self, key: str) -> list[AdvisoryHolder]:
        """Sessions holding `key`'s lock, with their application names (holder task ids)."""
        classid, objid = lock_parts(advisory_id(key))
        rows = self.execute(_HOLDERS, (classid, objid))
        now = time.time()
        return [
            AdvisoryHolder(backend_pid=pid, application_name=name or "",
                           held_seconds=max(0.0, now - started.timestamp()) if started else 0.0)
            for pid, name, started, _ in rows
        ]

    def close(self) -> None:
        """Close the session; PostgreSQL frees every lock it held."""
        self.held.clear()
        # Closing a dead connection has nothing left to do.
        with contextlib.suppress(Exception):
            self.connection.close()

    def __enter__(self) -> AdvisorySession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
