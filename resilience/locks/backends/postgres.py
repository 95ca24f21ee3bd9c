"""PostgreSQL locks: session advisory locks, and the held-lock registry.

A session advisory lock belongs to one server backend and is freed the instant that backend
ends (the holder dies: no TTL to wait out). That holds only while the connection is the
holder's alone for the whole run: a lock session from `SESSION_POOL` (its own psycopg2
connection, never one of the shared SQLAlchemy pool, which could hand the backend to other
code or keep it alive after us), or the worker thread's own connection (`SharedSessionLock`,
whose release rides on the idempotency completion's commit). A transaction or statement
pooler would run the lock's statements on different backends: `AdvisorySession` refuses
one declared (`pool_mode`) or detected (the backend pid changes between statements; a
pooler with one idle server connection hides that, so declare it). The registry
(`resilience_held_locks`, one row per key) is informational; the truth is the lock itself.
See docs/locks.md ("Singleton: PostgreSQL session advisory lock").
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from resilience.connections import ProcessLocal, StoreBackend, on_fork, wrap_store_errors
from resilience.connections.postgres import (
    PG_SERVER_TCP,
    SYNCHRONOUS_COMMIT,
    HeldConnection,
    Lead,
    StatementRunner,
    connect,
    synchronous_commit,
)
from resilience.errors import (
    ConfigurationError,
    LockNotOwnedError,
    StorageError,
    StoreUnavailable,
)
from resilience.holders import Holder
from resilience.locks.backends import Claimant, Taken
from resilience.prepared import PreparedStatement

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

#: Pool modes of PgBouncer (and compatible poolers) that break session advisory locks.
UNSAFE_POOL_MODES = ("transaction", "statement")

#: The prefix of a lock session's `application_name`: `lock:<task id or label>`.
SESSION_PREFIX = "lock:"


def advisory_id(key: str) -> int:
    """The signed 64-bit advisory lock id of `key` (SHA-256 prefix; stable across processes)."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big", signed=True)


def lock_parts(lock_id: int) -> tuple[int, int]:
    """How pg_locks shows a bigint advisory id: (classid, objid) = (high, low) 32 bits."""
    unsigned = lock_id & 0xFFFFFFFFFFFFFFFF
    return unsigned >> 32, unsigned & 0xFFFFFFFF


def _session_holders(key: str, kind: str, execute: Callable[..., Any]) -> list[Holder]:
    """The sessions holding `key`'s advisory lock (`_SESSION_HOLDERS`, run by `execute`);
    each named by its task id (or label) if it is a lock session, else by its backend pid."""
    classid, objid = lock_parts(advisory_id(key))
    return [Holder(kind=kind, key=key,
                   owner=(name or "").removeprefix(SESSION_PREFIX) or f"backend {pid}",
                   held_seconds=round(float(age or 0), 3))
            for pid, name, age in execute(_SESSION_HOLDERS, {"classid": classid, "objid": objid})]


# -- SQL -------------------------------------------------------------------------------------
#: The server side of a lock session's keepalives (`PG_SERVER_TCP`): the server ends a
#: session whose holder vanished ~11 s after its last packet, freeing its locks. Returns
#: the backend pid last.
_SERVER_KEEPALIVES = PG_SERVER_TCP + ", pg_backend_pid()"
#: The same, for a session whose writes (the registry row) commit without waiting for
#: their WAL flush (`AdvisorySession(synchronous_commit=False)`).
_SERVER_KEEPALIVES_ASYNCHRONOUS = (
    PG_SERVER_TCP + ", set_config('synchronous_commit', 'off', false), pg_backend_pid()")

#: Sessions holding an advisory lock, by pg_locks' (classid, objid) of its id.
_SESSION_HOLDERS = """
    SELECT a.pid, a.application_name, extract(epoch FROM now() - a.backend_start) AS age
    FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted
      AND l.classid = %(classid)s AND l.objid = %(objid)s AND l.objsubid = 1
"""

#: Every advisory lock held now, as (classid, objid).
_HELD_ADVISORY = """
    SELECT classid::bigint, objid::bigint FROM pg_locks
    WHERE locktype = 'advisory' AND granted AND objsubid = 1
"""

#: The registry upsert, written once for both kinds: one row per key, the newest holder
#: wins. It inserts the row of the `claim` CTE (`taken`, `token`) the caller puts before it.
_REGISTER = """
    INSERT INTO resilience_held_locks
        (key, kind, owner, task_id, task_name, hostname, pid, token, ttl_seconds, acquired_at)
    SELECT %(key)s::text, %(kind)s::text, %(owner)s::text, %(task_id)s::text,
           %(task_name)s::text, %(hostname)s::text, %(pid)s::int, claim.token,
           %(ttl_seconds)s::float8, now()
    FROM claim WHERE claim.taken
    ON CONFLICT (key) DO UPDATE SET kind = EXCLUDED.kind, owner = EXCLUDED.owner,
        task_id = EXCLUDED.task_id, task_name = EXCLUDED.task_name,
        hostname = EXCLUDED.hostname, pid = EXCLUDED.pid, token = EXCLUDED.token,
        ttl_seconds = EXCLUDED.ttl_seconds, acquired_at = now()
    RETURNING token
"""

#: A lock taken elsewhere (Redlock) with its token: register it.
_REGISTER_TAKEN = "WITH claim AS (SELECT true AS taken, %(token)s::bigint AS token)" + _REGISTER

#: One round trip: take the lock, name the session after the holder, register it with a
#: fresh fencing token. A volatile CTE runs once; the token is drawn only when taken.
_ACQUIRE_ADVISORY = PreparedStatement("resilience_singleton_acquire", f"""
    WITH attempt AS (SELECT pg_try_advisory_lock(%(id)s::bigint) AS taken),
    claim AS (
        SELECT taken, CASE WHEN taken THEN nextval('resilience_fencing_token_seq') END AS token
        FROM attempt
    ),
    named AS (
        SELECT set_config('application_name', %(name)s::text, false) FROM attempt WHERE taken
    ),
    registered AS ({_REGISTER})
    SELECT attempt.taken, (SELECT token FROM registered), (SELECT count(*) FROM named)
    FROM attempt
""")

#: The release's first part: the holder's registry row deleted.
_UNREGISTER = """
    WITH unregistered AS (
        DELETE FROM resilience_held_locks
        WHERE key = %(key)s::text AND owner = %(owner)s::text
    )
"""

#: One round trip: unregister, unlock, and clear the session's holder name.
_RELEASE_ADVISORY = PreparedStatement("resilience_singleton_release", _UNREGISTER + """\
    SELECT pg_advisory_unlock(%(id)s::bigint), set_config('application_name', 'lock:', false)
""")

#: A lock held on a thread's shared connection (`SharedSessionLock`), released at the
#: commit of the statement sent after this one in the same query string: the session lock
#: becomes a transaction lock of that query string's implicit transaction (taken at once:
#: this session holds it), so it is free the moment that statement commits, never before.
#: The unregistration commits with it too.
_HANDOFF_ADVISORY = PreparedStatement("resilience_singleton_handoff", _UNREGISTER + """\
    SELECT pg_advisory_unlock(%(id)s::bigint), set_config('application_name', '', false)
    FROM (SELECT pg_try_advisory_xact_lock(%(id)s::bigint) AS moved OFFSET 0) AS handoff
    WHERE handoff.moved
""")

#: `_RELEASE_ADVISORY` on a shared connection: its name back to none.
_RELEASE_SHARED = PreparedStatement("resilience_singleton_release_shared", _UNREGISTER + """\
    SELECT pg_advisory_unlock(%(id)s::bigint), set_config('application_name', '', false)
""")

#: What a shared connection's first acquisition sends before it: the server's end of its
#: keepalives (as a lock session's), and the release statements prepared (those the
#: session does not have yet: a failed first acquisition may have left them).
_SHARED_PREPARED = (_HANDOFF_ADVISORY, _RELEASE_SHARED)


def _shared_setup(connection: HeldConnection) -> str:
    return PG_SERVER_TCP + "; " + "".join(
        statement.prepare.replace("%", "%%") + "; " for statement in _SHARED_PREPARED
        if statement.name not in connection.prepared)


class _AlreadyHeld(Exception):
    """The shared connection already holds the key for this thread's caller."""


_OWNS = """
    SELECT pg_backend_pid(), EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'
        AND granted AND pid = pg_backend_pid() AND classid = %s AND objid = %s
        AND objsubid = 1)
"""

_SELECT_ROWS = """
    SELECT key, kind, owner, task_id, hostname, pid, token,
           extract(epoch FROM now() - acquired_at) AS age
    FROM resilience_held_locks WHERE """
_ROWS = _SELECT_ROWS + "kind = %(kind)s ORDER BY acquired_at\n"
_ROW = _SELECT_ROWS + "key = %(key)s\n"

_TERMINATE_HOLDERS = """
    SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'
    AND granted AND classid = %(classid)s AND objid = %(objid)s AND objsubid = 1
"""


def _verify(key: str, backend_pid: object, execute: Callable[..., Any],
            parts: tuple[int, int]) -> None:
    """Check, with `_OWNS` run by `execute` on the lock's session, that the session is alive,
    still on backend `backend_pid`, and holds the lock of pg_locks' `parts`.

    Raises:
        LockNotOwnedError: the session died (PostgreSQL restart, backend terminated) or
            moved to another backend, or the lock is not held.
    """
    try:
        rows = execute(_OWNS, parts)
    except StorageError as exc:
        raise LockNotOwnedError(
            f"singleton lock {key!r} lost: its PostgreSQL session is gone ({exc}); "
            "stopping before the task commits", key=key, cause=getattr(exc, "cause", repr(exc)),
        ) from exc
    pid, held = rows[0]
    if str(pid) != str(backend_pid):
        raise LockNotOwnedError(
            f"singleton lock {key!r} lost: the session moved from backend "
            f"{backend_pid} to {pid} (reconnect or transaction pooling)", key=key)
    if not held:
        raise LockNotOwnedError(f"singleton lock {key!r} is not held by this session", key=key)


def _unmoved(pid: object, backend_pid: object) -> None:
    """Raise LockNotOwnedError when a lock session's probe answered from another backend."""
    if str(pid) != str(backend_pid):
        raise LockNotOwnedError(
            f"the lock session moved from backend {backend_pid} to {pid} "
            "(reconnect or transaction pooling)", backend_pid=backend_pid)


# -- the session -----------------------------------------------------------------------------
class AdvisorySession:
    """One dedicated PostgreSQL session that takes, checks and releases advisory locks.

    Args:
        database_url: the PostgreSQL URL (postgresql:// or postgresql+psycopg2://).
        label: shown as `application_name` (`lock:<label>`), so holders are identifiable.
        pool_mode: the pooler's mode if there is one (`Stores.locks_pool_mode`); None: none.
        connect_timeout_seconds: bound on connecting.
        synchronous_commit: False: the session's writes (registry rows) commit without
            waiting for their WAL flush, set in its first round trip; a statement that
            needs the flush says so itself (`execute_prepared(..., durable=True)`).

    Raises:
        ConfigurationError: a transaction/statement pooler is declared or detected.
        StoreUnavailable: PostgreSQL cannot be reached.
    """

    def __init__(self, database_url: str, *, label: str = "", pool_mode: str | None = None,
                 connect_timeout_seconds: float = 5, synchronous_commit: bool = True) -> None:
        mode = (pool_mode or "").strip().lower()
        if mode in UNSAFE_POOL_MODES:
            raise ConfigurationError(
                f"advisory locks need a session of their own, but the database is behind a "
                f"pooler in {mode} pooling mode (PgBouncer): the lock would be taken on one "
                "backend and checked or released on another. Set LOCKS_DATABASE_URL "
                "(Stores(locks_database_url=...)) to PostgreSQL reached directly, or point "
                "the singleton guard at a session-mode pool.", pool_mode=mode)
        #: One statement at a time: the watcher's probes and the holder's release may come
        #: from two threads, and a psycopg2 connection must not run two at once.
        self.lock = threading.Lock()
        # Our end: a vanished server (host crash, partition) is noticed in ~11 s, and a
        # statement sent into a partition fails after the user timeout instead of
        # retransmitting for ~15 minutes (`PG_CLIENT_TCP`).
        self.connection = connect(database_url, connect_timeout_seconds=connect_timeout_seconds,
                                  application_name=f"{SESSION_PREFIX}{label}")
        # One cursor and one error translation for every statement of the session (under
        # `lock`), rather than a new pair per statement.
        self._cursor = self.connection.cursor()
        self._translated = wrap_store_errors("advisory lock session")
        # The server's end (the one that holds the locks), set per session in the first
        # round trip: without it a holder cut off by a partition keeps its backend, and the
        # lock, for the kernel's default keepalive time (two hours).
        self.synchronous_commit = synchronous_commit
        self.backend_pid = self.execute(
            _SERVER_KEEPALIVES if synchronous_commit else _SERVER_KEEPALIVES_ASYNCHRONOUS)[0][-1]
        # Under transaction pooling, autocommit statements may land on other backends.
        if self.scalar("SELECT pg_backend_pid()") != self.backend_pid:
            self.close()
            raise ConfigurationError(
                "the PostgreSQL session moved between backends across statements: the "
                "database is behind a transaction-pooling proxy (PgBouncer "
                "pool_mode=transaction); session advisory locks cannot work there: set "
                "LOCKS_DATABASE_URL to PostgreSQL reached directly", pool_mode="transaction")
        self.held: set[int] = set()
        #: Names of the statements prepared on this session.
        self.prepared: set[str] = set()

    def execute(self, sql: str, parameters: Sequence[Any] | dict[str, Any] = ()) -> Any:
        """Run one statement on this session (autocommit); rows, or None without a result.

        Raises:
            StoreUnavailable: the session is gone.  StoreRejected, StorageError: the
                statement failed.
        """
        with self.lock, self._translated:
            cursor = self._cursor
            cursor.execute(sql, parameters)
            return cursor.fetchall() if cursor.description else None

    def execute_prepared(self, statement: PreparedStatement, parameters: dict[str, Any], *,
                         durable: bool = False) -> Any:
        """`execute` of a statement prepared once on this session (saves parse and plan);
        `durable`: it commits only once its WAL is flushed, on a session whose writes
        otherwise do not wait (`synchronous_commit=False`)."""
        prefix = SYNCHRONOUS_COMMIT if durable and not self.synchronous_commit else ""
        if statement.name not in self.prepared:
            try:  # PREPARE and the first EXECUTE in one round trip.
                rows = self.execute(prefix + statement.prepare_and_execute,
                                    statement.values(parameters))
                self.prepared.add(statement.name)
                return rows
            except StorageError as exc:
                # A PREPARE outlives its query string's failure: an earlier first EXECUTE
                # failed at run time after it. 42P05: duplicate_prepared_statement.
                if getattr(exc.__cause__, "pgcode", None) != "42P05":
                    raise
                self.prepared.add(statement.name)
        return self.execute(prefix + statement.execute, statement.values(parameters))

    def scalar(self, sql: str, parameters: Sequence[Any] = ()) -> Any:
        """The first column of the first row of one statement on this session."""
        return self.execute(sql, parameters)[0][0]

    def try_acquire(self, key: str) -> bool:
        """Take the advisory lock of `key` without waiting; False when another session has it."""
        lock_id = advisory_id(key)
        taken = bool(self.scalar("SELECT pg_try_advisory_lock(%s)", (lock_id,)))
        if taken:
            self.held.add(lock_id)
        return taken

    def verify(self, key: str) -> None:
        """Check the session is alive, unmoved, and still holds `key`'s lock (`_verify`)."""
        _verify(key, self.backend_pid, self.execute, lock_parts(advisory_id(key)))

    def probe(self) -> None:
        """One cheap statement proving the session is alive on the backend it started on
        (`SessionWatcher`'s probe). Not `pg_locks`: reading it takes every lock-manager
        partition lock, and a dedicated session loses its lock only by ending.

        Raises:
            StoreUnavailable, StorageError: the session is gone.
            LockNotOwnedError: it moved to another backend (a transaction pooler).
        """
        _unmoved(self.scalar("SELECT pg_backend_pid()"), self.backend_pid)

    def release(self, key: str) -> bool:
        """Release `key`'s lock; False when it was not held (or the session is gone)."""
        lock_id = advisory_id(key)
        self.held.discard(lock_id)
        try:
            return bool(self.scalar("SELECT pg_advisory_unlock(%s)", (lock_id,)))
        except StorageError:
            return False

    def holders(self, key: str, *, kind: str = "advisory") -> list[Holder]:
        """Sessions holding `key`'s lock; `owner` is the label they were opened with."""
        return _session_holders(key, kind, self.execute)

    def close(self) -> None:
        """Close the session; every lock it held is free when this returns.

        PostgreSQL frees a closed session's locks when its backend process ends, a moment
        after the client's close returns; unlocking first makes the release immediate for
        the next taker.
        """
        held, self.held = bool(self.held), set()
        # Closing a dead connection has nothing left to do.
        with contextlib.suppress(Exception):
            if held:
                with self.connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock_all()")
        with contextlib.suppress(Exception):
            self.connection.close()

    def __enter__(self) -> AdvisorySession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: Seconds a released lock session stays open for the process's next singleton before it
#: is closed (`app.conf.resilience_lock_session_idle_seconds`; 0: closed at release).
DEFAULT_IDLE_SECONDS = 5.0


class LockSessionPool:
    """The process's lock sessions that hold no lock, kept open `idle_seconds` for reuse
    (connecting costs ~3 ms, a lock and unlock ~0.2 ms); a reaper thread, running only while
    sessions are idle, closes them after that. Any thread may take an idle session; after a
    fork the parent's are forgotten, never closed (that would end the parent's backends).

    Its sessions commit without waiting for the WAL flush: they write only the registry row,
    whose loss in a crash is harmless (the crash freed every lock too); the row is UNLOGGED,
    so only the fencing sequence's WAL (one acquisition in 32) waited for a flush (~1 ms
    here). See `AdvisoryLockBackend.acquire` for the exception.
    """

    def __init__(self, idle_seconds: float | None = None) -> None:
        #: Seconds a released session stays open; 0 closes it at release.
        self.idle_seconds = DEFAULT_IDLE_SECONDS if idle_seconds is None else idle_seconds
        self._forked()
        on_fork(self._forked)

    def _forked(self) -> None:
        """No idle session and no reaper: at start, and in a forked child (the parent's
        sessions are forgotten)."""
        self._lock = threading.Lock()
        self._idle: list[tuple[float, str, AdvisorySession]] = []
        self._reaper: threading.Thread | None = None

    def take(self, database_url: str, pool_mode: str | None = None) -> AdvisorySession:
        """An idle session of `database_url` (the most recently released), else a new one.

        Raises:
            ConfigurationError: a transaction/statement pooler is declared or detected.
            StoreUnavailable: PostgreSQL cannot be reached.
        """
        with self._lock:
            for index in range(len(self._idle) - 1, -1, -1):
                if self._idle[index][1] == database_url:
                    session = self._idle.pop(index)[2]
                    if not session.connection.closed:
                        return session
        return AdvisorySession(database_url, label="", pool_mode=pool_mode,
                               synchronous_commit=False)

    def give_back(self, session: AdvisorySession, database_url: str) -> None:
        """Keep `session` for reuse, or close it: it holds a lock, failed, or reuse is off."""
        if session.held or session.connection.closed or self.idle_seconds <= 0:
            session.close()
            return
        with self._lock:
            self._idle.append((time.monotonic(), database_url, session))
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap, name="lock-session-reaper",
                                                daemon=True)
                self._reaper.start()

    def idle_count(self) -> int:
        """Sessions open now that hold no lock."""
        with self._lock:
            return len(self._idle)

    def close_idle(self, older_than_seconds: float = 0.0) -> int:
        """Close the idle sessions released more than `older_than_seconds` ago; how many."""
        cutoff = time.monotonic() - older_than_seconds
        with self._lock:
            expired = [entry for entry in self._idle if entry[0] <= cutoff]
            self._idle = [entry for entry in self._idle if entry[0] > cutoff]
        for _, _, session in expired:
            session.close()
        return len(expired)

    def _reap(self) -> None:
        """Close sessions idle past `idle_seconds`; exit once none is idle."""
        while True:
            time.sleep(max(0.05, min(self.idle_seconds, 1.0) / 2))
            self.close_idle(self.idle_seconds)
            with self._lock:
                if not self._idle:
                    self._reaper = None
                    return


#: The process's idle lock sessions.
SESSION_POOL = LockSessionPool()

#: Per thread: the lock sessions this thread took and has not given back (`in_use`), and
#: the last one taken (`session`); a forked child starts with none.
_SESSIONS = ProcessLocal()


def _in_use() -> list[AdvisorySession]:
    sessions: list[AdvisorySession] | None = getattr(_SESSIONS.local, "in_use", None)
    if sessions is None:
        sessions = _SESSIONS.local.in_use = []
    return sessions


def take_session(database_url: str, pool_mode: str | None = None) -> AdvisorySession:
    """A lock session for one acquisition on this thread (`LockSessionPool.take`)."""
    session = SESSION_POOL.take(database_url, pool_mode)
    _in_use().append(session)
    _SESSIONS.local.session = session
    return session


def give_back_session(session: AdvisorySession, database_url: str, *,
                      close: bool = False) -> None:
    """Return a session `take_session` gave this thread: kept idle a moment, or closed
    (`close=True`: it failed or its lock was lost)."""
    with contextlib.suppress(ValueError):
        _in_use().remove(session)
    if close:
        session.close()
    else:
        SESSION_POOL.give_back(session, database_url)


def discard_thread_session() -> None:
    """Close this thread's lock sessions (whatever they hold is freed) and the process's
    idle ones."""
    sessions = _in_use()
    _SESSIONS.local.in_use = []
    _SESSIONS.local.session = None
    for session in sessions:
        session.close()
    SESSION_POOL.close_idle()


# -- the registry ----------------------------------------------------------------------------
class HeldLockRegistry(StoreBackend):
    """The `resilience_held_locks` table: one row per held key, for holder reports.

    Args:
        engine: returns the process's SQLAlchemy engine (`Stores.engine`).
    """

    store_operation = "held-lock registry"

    def __init__(self, engine: Callable[[], Engine]) -> None:
        self._engine = engine

    def _rows(self, sql: str, parameters: dict[str, Any], *, write: bool = False) -> list[Any]:
        with self._engine().begin() if write else self._engine().connect() as connection:
            result = connection.exec_driver_sql(sql, parameters)
            return list(result) if result.returns_rows else []

    def register(self, key: str, *, kind: str, owner: str, claimant: Claimant,
                 token: int | None, ttl_seconds: float | None) -> None:
        """Record `owner` as the holder of `key` (replacing a row a dead holder left)."""
        self._rows(_REGISTER_TAKEN, {"key": key, "kind": kind, "owner": owner, "token": token,
                                     "ttl_seconds": ttl_seconds, **_claimant_fields(claimant)},
                   write=True)

    def unregister(self, key: str, owner: str) -> None:
        """Delete `key`'s row if `owner` still holds it there."""
        self._rows("DELETE FROM resilience_held_locks WHERE key = %(key)s AND owner = %(owner)s",
                   {"key": key, "owner": owner}, write=True)

    def remove(self, key: str) -> int:
        """Delete `key`'s row whoever holds it (admin); the rows deleted."""
        return len(self._rows("DELETE FROM resilience_held_locks WHERE key = %(key)s RETURNING key",
                              {"key": key}, write=True))

    def holder(self, key: str) -> Holder | None:
        """The registered holder of `key`, or None."""
        rows = self._rows(_ROW, {"key": key})
        return _holder(rows[0]) if rows else None

    def holders(self, kind: str, alive: Callable[[str, str], bool]) -> list[Holder]:
        """Every row of `kind`, oldest first; `alive(key, owner)` checks the lock itself."""
        return [_holder(row, alive=alive(row.key, row.owner))
                for row in self._rows(_ROWS, {"kind": kind})]


def _claimant_fields(claimant: Claimant) -> dict[str, Any]:
    return {"task_id": claimant.task_id, "task_name": claimant.task_name,
            "hostname": socket.gethostname(), "pid": os.getpid()}


def _holder(row: Any, *, alive: bool = True) -> Holder:
    return Holder(kind=row.kind, key=row.key, owner=row.task_id or f"{row.hostname}:{row.pid}",
                  token=row.token, held_seconds=round(float(row.age or 0), 3), alive=alive)


# -- the backend -----------------------------------------------------------------------------
class SharedSessionLock:
    """A lock held on this thread's shared connection (`AdvisoryLockBackend` with
    `statements`): `Taken.handle`."""

    __slots__ = ("connection", "lead", "lock_id", "released")

    def __init__(self, connection: HeldConnection, lock_id: int) -> None:
        self.connection = connection
        self.lock_id = lock_id
        #: The release waiting to ride on the call's last commit (`hand_off`).
        self.lead: Lead | None = None
        #: Released with that commit.
        self.released = False

    @property
    def backend_pid(self) -> int:
        """The PostgreSQL backend holding the lock."""
        return int(self.connection.driver.get_backend_pid())

    def withdraw(self) -> Lead | None:
        """Take the waiting release back from the connection; the lead, if it was sent."""
        lead, self.lead = self.lead, None
        if lead is not None and not lead.sent:
            with contextlib.suppress(ValueError):
                self.connection.leads.remove(lead)
            return None
        return lead


class AdvisoryLockBackend(StoreBackend):
    """`@singleton`'s store: session advisory locks, one session from `SESSION_POOL` per
    lock held. With `statements`, the lock is held on the worker thread's own connection
    instead (as dedicated as a lock session) and its release rides on the idempotency
    completion (`hand_off`): the lock is freed at the completion's commit.

    Args:
        database_url: the PostgreSQL of the locks, reached directly (`Stores.locks_database_url`).
        engine: returns the SQLAlchemy engine for holder reports and the registry (may be
            a transaction pooler in front of the same database).
        pool_mode: the declared pooler mode in front of `database_url` (see `AdvisorySession`).
        statements: hold the locks on this runner's per-thread connections (its URL must be
            `database_url`, with no pooler in between); None: lock sessions.
    """

    kind = "singleton"
    store_operation = "advisory locks"

    def __init__(self, database_url: str, *, engine: Callable[[], Engine],
                 pool_mode: str | None = None,
                 statements: StatementRunner | None = None) -> None:
        self.database_url = database_url
        self.engine = engine
        self.pool_mode = pool_mode
        self.registry = HeldLockRegistry(engine)
        self.statements = statements

    def acquire(self, key: str, claimant: Claimant) -> Taken | None:
        """One round trip on a lock session: lock, name the session, register.

        The commit waits for its WAL flush only when the body receives the fencing token
        (`claimant.fenced`): a token used before its WAL is on disk could be handed out
        again after a crash (docs/locks.md). A token no body receives is informational.
        """
        lock_id = advisory_id(key)
        if any(lock_id in held.held for held in _in_use()):
            # Session locks are re-entrant; a second take by the same thread (an inline
            # caller-runs call of the same key) must see the key as held.
            return None
        parameters = {
            "id": lock_id, "key": key, "kind": self.kind, "owner": "",
            "name": f"{SESSION_PREFIX}{claimant.task_id or ''}"[:63], "ttl_seconds": None,
            **_claimant_fields(claimant)}
        if self.statements is not None:
            return self._acquire_shared(lock_id, parameters, claimant)
        for fresh in (False, True):
            session = take_session(self.database_url, self.pool_mode)
            parameters["owner"] = str(session.backend_pid)
            try:
                taken, token, _ = session.execute_prepared(
                    _ACQUIRE_ADVISORY, parameters, durable=claimant.fenced)[0]
                break
            except StorageError as exc:
                give_back_session(session, self.database_url, close=True)
                # An idle session may have died since its last run (PostgreSQL restarted,
                # an idle timeout): it held nothing, so a new one tries at once.
                if fresh or not isinstance(exc, StoreUnavailable):
                    raise
                SESSION_POOL.close_idle()  # died with it, most likely
        if not taken:
            give_back_session(session, self.database_url)
            return None
        session.held.add(lock_id)
        return Taken(key=key, owner=parameters["owner"], token=token, handle=session)

    def _acquire_shared(self, lock_id: int, parameters: dict[str, Any],
                        claimant: Claimant) -> Taken | None:
        """`acquire` on this thread's shared connection; its first acquisition also bounds
        the server's end of the connection (`PG_SERVER_TCP`) and prepares the release, in
        the same round trip."""
        assert self.statements is not None
        used: list[HeldConnection] = []

        def session_setup(connection: HeldConnection) -> tuple[str, Callable[[], None] | None]:
            # Each try learns its connection: the owner is its backend (one reconnect may
            # replace the connection between tries).
            used.append(connection)
            if connection.locks and lock_id in connection.locks:
                raise _AlreadyHeld
            parameters["owner"] = str(connection.driver.get_backend_pid())
            text = synchronous_commit(connection)[0] if claimant.fenced else ""
            if "lock_session" in connection.settings:
                return text, None

            def settled() -> None:
                connection.settings["lock_session"] = True
                connection.prepared.update(statement.name for statement in _SHARED_PREPARED)

            return _shared_setup(connection) + text, settled

        try:
            taken, token, _ = self.statements.run(
                _ACQUIRE_ADVISORY, parameters, "advisory locks: acquire", named=False,
                prefix=session_setup)[0]
        except _AlreadyHeld:
            return None  # re-entrant on this session: held by this thread's caller
        if not taken:
            return None
        connection = used[-1]
        connection.locks.add(lock_id)
        return Taken(key=parameters["key"], owner=parameters["owner"], token=token,
                     handle=SharedSessionLock(connection, lock_id))

    def hand_off(self, taken: Taken) -> None:
        """Let the release ride on the call's last commit on this session (the idempotency
        completion: `StatementRunner.run(..., lead=True)`), freed at that commit; when no
        such commit comes, `release` sends it alone. Lock sessions: nothing to do."""
        handle = taken.handle
        if not isinstance(handle, SharedSessionLock) or handle.lead is not None:
            return
        connection = handle.connection
        if connection.driver.closed:
            return
        text = connection.render(_HANDOFF_ADVISORY, {
            "id": handle.lock_id, "key": taken.key, "owner": taken.owner})

        def settled() -> None:
            handle.released = True
            connection.locks.discard(handle.lock_id)

        handle.lead = Lead(text, settled)
        connection.leads.append(handle.lead)

    def check(self, taken: Taken) -> None:
        """The session is alive, unmoved and still holds the lock (one statement)."""
        handle = taken.handle
        try:
            if isinstance(handle, SharedSessionLock):
                _verify(taken.key, taken.owner, handle.connection.execute_here,
                        lock_parts(handle.lock_id))
            else:
                handle.verify(taken.key)
        except Exception:
            self._drop(handle)
            raise

    def _drop(self, handle: AdvisorySession | SharedSessionLock) -> None:
        """Give up a session whose lock is lost or in doubt: a lock session is closed; a
        shared connection leaves the thread, whose next statement opens another (closed in
        the background)."""
        if isinstance(handle, AdvisorySession):
            give_back_session(handle, self.database_url, close=True)
            return
        handle.withdraw()
        handle.connection.locks.discard(handle.lock_id)
        assert self.statements is not None
        self.statements.discard(handle.connection)

    def extend(self, taken: Taken) -> bool:
        """A session lock does not expire: held while its session lives."""
        return True

    def release(self, taken: Taken) -> None:
        """Unregister, unlock and clear the session's name in one round trip; the session
        goes back to the pool (closed after `SESSION_POOL.idle_seconds` unused). A lock on
        a shared connection that rode on the call's commit (`hand_off`) is released already.
        """
        handle = taken.handle
        shared = isinstance(handle, SharedSessionLock)
        if shared and handle.released:
            return
        lock_id = handle.lock_id if shared else advisory_id(taken.key)  # no second hash
        parameters = {"id": lock_id, "key": taken.key, "owner": taken.owner}
        failed_handoff = False
        try:
            if shared:
                # A handoff sent with a statement that failed: its unlock may have run
                # already (an unlock is not transactional), so "not held" is no loss then.
                failed_handoff = handle.withdraw() is not None
                handle.connection.locks.discard(lock_id)
                released = handle.connection.execute_here(_RELEASE_SHARED, parameters)[0][0]
            else:
                handle.held.discard(lock_id)
                released = handle.execute_prepared(_RELEASE_ADVISORY, parameters)[0][0]
        except StorageError as exc:
            # The session is gone, and its lock with it.
            self._drop(handle)
            raise LockNotOwnedError(
                f"singleton lock {taken.key!r} lost at release: its session is gone ({exc})",
                key=taken.key) from exc
        if not released and not failed_handoff:
            self._drop(handle)
            raise LockNotOwnedError(f"singleton lock {taken.key!r} was no longer held at "
                                    "release", key=taken.key)
        if isinstance(handle, AdvisorySession):
            give_back_session(handle, self.database_url)

    def probe(self, taken: Taken) -> None:
        """One cheap statement on `taken`'s session (`AdvisorySession.probe`), run by the
        singleton's `SessionWatcher` while the body runs."""
        handle = taken.handle
        if isinstance(handle, SharedSessionLock):
            _unmoved(handle.connection.execute_here("SELECT pg_backend_pid()")[0][0], taken.owner)
        else:
            handle.probe()

    def abandon(self, taken: Taken) -> None:
        """Give up a lock known lost, without a statement: the session leaves this thread
        and is closed in the background, since a probe stuck in a partition may still hold
        it (until the TCP user timeout). Its registry row is left to the next holder."""
        if isinstance(taken.handle, SharedSessionLock):
            self._drop(taken.handle)
            return
        session: AdvisorySession = taken.handle
        session.held.discard(advisory_id(taken.key))
        with contextlib.suppress(ValueError):
            _in_use().remove(session)
        threading.Thread(target=session.close, name="lock-session-close", daemon=True).start()

    def holder(self, key: str) -> Holder | None:
        """The session holding `key`, as PostgreSQL itself reports it (its name: the task)."""
        found = advisory_holders(self.engine, key, kind=self.kind)
        return found[0] if found else None

    def holders(self) -> list[Holder]:
        """Every registered singleton, alive while its advisory lock is held."""
        with self.engine().connect() as connection:
            held = {(int(classid), int(objid))
                    for classid, objid in connection.exec_driver_sql(_HELD_ADVISORY)}
        return self.registry.holders(
            self.kind, lambda key, _owner: lock_parts(advisory_id(key)) in held)

    def terminate_holders(self, key: str) -> int:
        """End every session holding `key`'s lock (admin), which frees it; sessions ended."""
        classid, objid = lock_parts(advisory_id(key))
        with self.engine().begin() as connection:
            return len(connection.exec_driver_sql(
                _TERMINATE_HOLDERS, {"classid": classid, "objid": objid}).all())


def advisory_holders(engine: Callable[[], Engine], key: str, *,
                     kind: str = "singleton") -> list[Holder]:
    """Sessions holding `key`'s advisory lock, read on a pooled connection."""
    with wrap_store_errors("advisory locks"), engine().connect() as connection:
        return _session_holders(key, kind, lambda *statement: connection.exec_driver_sql(
            *statement).all())
