"""`@singleton` and `@exclusive`: at most one run per key, across every worker.

    @app.task(tier="critical")
    @singleton(key="account:{account_id}", policy="skip")
    def rebuild(account_id): ...

    @app.task(tier="standard")
    @exclusive(key="{report}", ttl_seconds=30, policy="defer")
    def publish(report, fencing_token=None): ...

* singleton — a PostgreSQL session advisory lock on a dedicated connection (one per worker
  thread, used for nothing else, reused across runs): freed the instant the holder dies;
  lost sessions are caught by `call.checkpoint()`. Acquire and release are one round trip each.
* exclusive — Redlock over `REDLOCK_URLS` with a lease heartbeat and a fencing token from
  PostgreSQL, handed to the body as `fencing_token` when it takes that parameter.

Key: the task name plus the arguments bound to the signature (`f(1)` == `f(a=1)`), a
template, or a function (resilience.keys). When another run holds the key: `skip` returns
the outcome SKIPPED, `defer` republishes the message later without spending a retry.

Celery's own retry of the holder is never blocked by its own lock: the lock is released in
`on_error` before the retry message can run, and because `Task.retry()` publishes the retry
*before* raising, a run whose task id is the holder's waits up to `same_task_wait_seconds`
for its predecessor to let go instead of being skipped. A redelivery of a message whose
holder still runs (same task id) waits the same way and then defers — it never runs beside it.

When the lock store is down the guard fails closed by default (`on_store_down="fail_closed"`:
DEFERRED); `"fail_open"` runs the body unguarded, logs a warning and counts FAIL-OPEN. A
store that rejects the operation (`StoreRejected`) dead-letters the job.
"""

from __future__ import annotations

import inspect
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import text

from resilience.counters import count_call
from resilience.errors import (
    ConfigurationError,
    LockNotOwnedError,
    StorageError,
    StoreUnavailable,
)
from resilience.keys import GuardKey, KeyOption, KeySpec
from resilience.locks.advisory import HOLDER_SQL, AdvisorySession, advisory_id, lock_parts
from resilience.locks.fencing import FencingTokens
from resilience.locks.heartbeat import Heartbeat, HeartbeatConfig
from resilience.locks.redis_lock import Lease, validate_ttl
from resilience.locks.redlock import Redlock, RedlockConfig, require_node_count
from resilience.outcomes import Outcome, Stop
from resilience.pipeline import Call, EnqueueGuard, EnqueueStage, Guard, Publish, Stage, attach
from resilience.prepared import PreparedStatement
from resilience.store_down import StoreDown, resolve, store_failed
from resilience.stores import stores_for

if TYPE_CHECKING:
    from celery import Task

logger = logging.getLogger("resilience.locks")

POLICIES = ("skip", "defer")
#: The parameter name through which a body receives its fencing token.
FENCING_PARAMETER = "fencing_token"
#: The parameter name through which a body receives `call.checkpoint` (lease still held?).
CHECKPOINT_PARAMETER = "checkpoint"
INJECTED = (FENCING_PARAMETER, CHECKPOINT_PARAMETER)


@dataclass(frozen=True, kw_only=True)
class LockConfig:
    """Options shared by both guards.

    Args:
        policy: "skip" (outcome SKIPPED) or "defer" (republished later, no retry spent).
        defer_seconds: delay of a deferral.
        same_task_wait_seconds: how long a run of the holder's own task id (a retry or a
            redelivery) waits for the holder to let go before the policy applies.
        on_store_down: "fail_closed" (DEFERRED, the default) or "fail_open" (unguarded,
            counted FAIL-OPEN); see `resilience.store_down`.
        on_store_error: deprecated spelling of `on_store_down` ("defer", "run").
    """

    policy: str = "skip"
    defer_seconds: float = 1.0
    same_task_wait_seconds: float = 5.0
    on_store_down: StoreDown | str | None = None
    on_store_error: str | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigurationError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        object.__setattr__(self, "on_store_down", resolve(
            self.on_store_down, self.on_store_error, legacy_option="on_store_error",
            default=StoreDown.FAIL_CLOSED))
        if not self.defer_seconds > 0:
            raise ConfigurationError(f"defer_seconds must be > 0, got {self.defer_seconds}")
        if self.same_task_wait_seconds < 0:
            raise ConfigurationError(
                f"same_task_wait_seconds must be >= 0, got {self.same_task_wait_seconds}"
            )


@dataclass(frozen=True, kw_only=True)
class SingletonConfig(LockConfig):
    """Options of `@singleton`.

    Args:
        database_url: PostgreSQL of the advisory locks; None: the app's store.
        pool_mode: declared pooler mode ("transaction" is refused); None: `JOBS_PG_POOL_MODE`.
    """

    database_url: str | None = None
    pool_mode: str | None = None


@dataclass(frozen=True, kw_only=True)
class ExclusiveConfig(LockConfig):
    """Options of `@exclusive`.

    Args:
        ttl_seconds: lease length; renewed by the heartbeat while the body runs.
        heartbeat: renew the lease in the background (off: the TTL must cover the time limit).
        renew_fraction, max_extensions: heartbeat cadence and cap.
        nodes: Redlock node URLs; None: env `REDLOCK_URLS` at first use, then the app's store.
        retry_count, retry_delay_seconds, clock_drift_factor: Redlock attempts and drift.
        fencing: mint a fencing token per acquisition (PostgreSQL sequence).
    """

    ttl_seconds: float = 60.0
    heartbeat: bool = True
    renew_fraction: float = 1 / 3
    max_extensions: int = 100
    nodes: tuple[str, ...] | None = None
    retry_count: int = 1
    retry_delay_seconds: float = 0.05
    clock_drift_factor: float = 0.01
    fencing: bool = True
    heartbeat_options: HeartbeatConfig = field(init=False)
    redlock_options: RedlockConfig = field(init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        validate_ttl(self.ttl_seconds)
        if self.nodes is not None:
            if isinstance(self.nodes, str):
                object.__setattr__(self, "nodes", tuple(_split_urls(self.nodes)))
            else:
                object.__setattr__(self, "nodes", tuple(self.nodes))
            require_node_count(len(self.nodes))
        object.__setattr__(self, "heartbeat_options", HeartbeatConfig(
            renew_fraction=self.renew_fraction, max_extensions=self.max_extensions))
        object.__setattr__(self, "redlock_options", RedlockConfig(
            retry_count=self.retry_count, retry_delay_seconds=self.retry_delay_seconds,
            clock_drift_factor=self.clock_drift_factor))

    @property
    def longest_hold_seconds(self) -> float:
        """The longest a run can keep the lease: the TTL plus every capped renewal."""
        if not self.heartbeat:
            return self.ttl_seconds
        return self.ttl_seconds * (1 + self.max_extensions * self.renew_fraction)


def _split_urls(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


# -- the shared shape of both guards ---------------------------------------------------------
@dataclass
class Holding:
    """What a guard took for one call, kept in its slot of the call until given back."""

    key: GuardKey
    release: Callable[[], bool]
    check: Callable[[], None]
    heartbeat: Heartbeat | None = None
    unregister: Callable[[], None] | None = None


class LockGuard(Guard):
    """Common flow: build key → acquire → (same task? wait) → skip/defer with holder info."""

    stage: ClassVar[Stage] = Stage.EXCLUSIVITY
    kind: ClassVar[str] = "lock"

    def __init__(self, func: Callable[..., Any], key: KeyOption, options: LockConfig) -> None:
        self.func = func
        self.keys = KeySpec(func, key)
        self.options = options
        self.task: Task | None = None
        parameters = inspect.signature(func).parameters
        self.injects_token = FENCING_PARAMETER in parameters
        self.injects_checkpoint = CHECKPOINT_PARAMETER in parameters
        self.sleep: Callable[[float], None] = time.sleep

    def bind(self, task: Task) -> None:
        self.task = task
        # A bound task's `run` hides `self`; keys bind to the signature callers use.
        self.keys = KeySpec(task.run, self.keys.key)

    def describe(self, task: Task | None = None) -> dict[str, Any]:
        return {"key": self.keys.key, **super().describe(task)}

    def key_for(self, task_name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> GuardKey:
        """The lock key of one call (injected parameters are never part of it)."""
        kwargs = {k: v for k, v in kwargs.items() if k not in INJECTED}
        return self.keys.build(task_name, tuple(args), kwargs)

    # hooks -------------------------------------------------------------------------------
    def before_run(self, call: Call) -> None:
        key = self.key_for(call.task.name, call.args, call.kwargs)
        try:
            holding, token = self._try_acquire(call, key)
            if holding is None and self._holder_is_same_task(call, key):
                holding, token = self._wait_for_predecessor(call, key)
        except StorageError as exc:
            self._store_failed(call, key, exc)
            return
        if holding is None:
            self._refuse(call, key)
        call.keep(self, holding)
        call.checks.append(holding.check)
        if self.injects_token and token is not None:
            call.inject[FENCING_PARAMETER] = token
        if self.injects_checkpoint:
            call.inject[CHECKPOINT_PARAMETER] = call.checkpoint

    def on_error(self, call: Call, exc: BaseException) -> None:
        # Released before Celery's retry message can run, so the retry is not blocked.
        self.release(call)
        if isinstance(exc, LockNotOwnedError):
            # The body stopped at checkpoint(): the hold was lost before it finished. The job
            # did not complete; it runs again later instead of failing for good.
            raise Stop(
                Outcome.DEFERRED, guard=self.name,
                reason=f"{self.kind} lock lost while the job ran ({exc}); run again later",
                retry_after_seconds=self.options.defer_seconds,
                details={"lock_lost": True},
            ) from exc

    # steps -------------------------------------------------------------------------------
    def _wait_for_predecessor(self, call: Call, key: GuardKey) -> tuple[Holding | None, Any]:
        deadline = time.monotonic() + self.options.same_task_wait_seconds
        while time.monotonic() < deadline:
            self.sleep(0.1)
            holding, token = self._try_acquire(call, key)
            if holding is not None:
                return holding, token
        return None, None

    def _refuse(self, call: Call, key: GuardKey) -> None:
        holder = self._holder_details(key)
        outcome = Outcome.SKIPPED if self.options.policy == "skip" else Outcome.DEFERRED
        count_call(call, outcome.value, guard=self.name)
        raise Stop(
            outcome,
            guard=self.name,
            reason=f"{self.kind} lock {key.full!r} is held by another run",
            retry_after_seconds=self.options.defer_seconds if outcome is Outcome.DEFERRED
            else None,
            details={"key": key.full, **holder},
        )

    def _store_failed(self, call: Call, key: GuardKey, exc: StorageError) -> None:
        store_failed(call, exc, guard=self.name, policy=self.options.on_store_down,
                     retry_after_seconds=self.options.defer_seconds, name=call.task.name,
                     details={"key": key.full, "error": type(exc).__name__})

    def release(self, call: Call) -> None:
        holding: Holding | None = call.take_back(self)
        if holding is None:
            return
        if holding.heartbeat is not None:
            holding.heartbeat.stop()
        try:
            released = holding.release()
        except StorageError as exc:
            released = False
            logger.warning("%s: release of %s failed: %s", self.name, holding.key.full, exc)
        if holding.unregister is not None:
            try:
                holding.unregister()
            except Exception as exc:  # noqa: BLE001 - the registry is informational
                logger.warning("%s: registry cleanup of %s failed: %s",
                               self.name, holding.key.full, exc)
        if not released:
            logger.warning("%s: lock %s was no longer held at release", self.name,
                           holding.key.full)
            count_call(call, "LOCK-LOST", guard=self.name)

    # per-kind ----------------------------------------------------------------------------
    def _try_acquire(self, call: Call, key: GuardKey) -> tuple[Holding | None, Any]:
        raise NotImplementedError

    def _holder_is_same_task(self, call: Call, key: GuardKey) -> bool:
        holder = self._holder_details(key).get("holder_task_id")
        return holder is not None and holder == call.task_id

    def _holder_details(self, key: GuardKey) -> dict[str, Any]:
        raise NotImplementedError


class SingletonGuard(LockGuard):
    """At most one run per key, on a PostgreSQL session advisory lock."""

    name: ClassVar[str] = "singleton"
    kind: ClassVar[str] = "singleton"

    def __init__(self, func: Callable[..., Any], key: KeyOption,
                 options: SingletonConfig) -> None:
        super().__init__(func, key, options)
        self.options: SingletonConfig = options

    def _database_url(self, call: Call) -> str:
        return self.options.database_url or stores_for(call.task.app).database_url

    def _session(self, call: Call) -> AdvisorySession:
        """This thread's dedicated advisory-lock session, opened once and reused.

        Dedicated means no other code ever runs on it: it is not from the shared pool, and
        it serves only this thread's singleton locks (a prefork child runs one task at a
        time). Reusing it saves a connection per run (about 4 ms); it still dies with the
        process, which frees every lock it holds. A session that failed is discarded.
        """
        url = self._database_url(call)
        cached = getattr(_SESSIONS, "session", None)
        if cached is not None:
            pid, cached_url, session = cached
            if pid == os.getpid() and cached_url == url and not session.connection.closed:
                return session
        session = AdvisorySession(url, label="", pool_mode=self.options.pool_mode)
        _SESSIONS.session = (os.getpid(), url, session)
        return session

    @staticmethod
    def _discard_session() -> None:
        cached = getattr(_SESSIONS, "session", None)
        _SESSIONS.session = None
        if cached is not None:
            cached[2].close()

    def _try_acquire(self, call: Call, key: GuardKey) -> tuple[Holding | None, Any]:
        session = self._session(call)
        lock_id = advisory_id(key.full)
        if lock_id in session.held:
            # Session locks are re-entrant; a second take by the same thread (an inline
            # caller-runs call of the same key) must see the key as held.
            return None, None
        parameters = {
            "id": lock_id, "key": key.full, "owner": str(session.backend_pid),
            "name": f"lock:{call.task_id or ''}"[:63], "task_id": call.task_id,
            "task_name": call.task.name, "host": socket.gethostname(), "pid": os.getpid(),
        }
        for fresh in (False, True):
            try:
                taken, token, _ = session.execute_prepared(_ACQUIRE_SINGLETON, parameters)[0]
                break
            except StorageError as exc:
                self._discard_session()
                # The thread's idle session may have died since its last run (PostgreSQL
                # restarted, an idle timeout): if it held nothing, a fresh one tries at once.
                if fresh or session.held or not isinstance(exc, StoreUnavailable):
                    raise
                session = self._session(call)
                parameters["owner"] = str(session.backend_pid)
        owner = parameters["owner"]
        if not taken:
            return None, None
        session.held.add(lock_id)

        def release() -> bool:
            session.held.discard(lock_id)
            try:
                return bool(session.execute_prepared(
                    _RELEASE_SINGLETON, {"id": lock_id, "key": key.full, "owner": owner}
                )[0][0])
            except StorageError:
                self._discard_session()
                return False

        def check() -> None:
            try:
                session.verify(key.full)
            except Exception:
                self._discard_session()
                raise

        return Holding(key=key, release=release, check=check), token

    def _holder_details(self, key: GuardKey) -> dict[str, Any]:
        # PostgreSQL itself knows the holder: its session is named `lock:<task id>`.
        assert self.task is not None
        classid, objid = lock_parts(advisory_id(key.full))
        try:
            with stores_for(self.task.app).engine().connect() as connection:
                row = connection.execute(text(HOLDER_SQL), {"classid": classid,
                                                            "objid": objid}).first()
        except Exception:  # noqa: BLE001 - holder details are informational
            return {}
        if row is None:
            return {}
        name = row.application_name or ""
        return {"holder_task_id": name.removeprefix("lock:") or None,
                "holder_backend_pid": row.pid, "held_seconds": round(float(row.age or 0), 3)}


class ExclusiveGuard(LockGuard):
    """At most one holder per key on Redlock, with lease heartbeat and fencing tokens."""

    name: ClassVar[str] = "exclusive"
    kind: ClassVar[str] = "exclusive"

    def __init__(self, func: Callable[..., Any], key: KeyOption,
                 options: ExclusiveConfig) -> None:
        super().__init__(func, key, options)
        self.options: ExclusiveConfig = options
        self._redlock: tuple[int, tuple[str, ...], Redlock] | None = None
        self._lock = threading.Lock()

    def bind(self, task: Task) -> None:
        super().bind(task)
        time_limit = getattr(task, "time_limit", None)
        if time_limit and self.options.longest_hold_seconds < float(time_limit):
            raise ConfigurationError(
                f"{task.name}: exclusive lease can last at most "
                f"{self.options.longest_hold_seconds:g}s (ttl_seconds with heartbeat renewals) "
                f"but the task's time limit is {time_limit}s: the lock would expire while the "
                "body still runs; raise ttl_seconds or max_extensions",
                task=task.name,
            )

    def node_urls(self, app: Any) -> tuple[str, ...]:
        """Redlock nodes: the option, else env REDLOCK_URLS now, else the app's stores."""
        if self.options.nodes:
            return self.options.nodes
        from_env = _split_urls(os.environ.get("REDLOCK_URLS", ""))
        return tuple(from_env or stores_for(app).redlock_urls)

    def redlock(self, app: Any) -> Redlock:
        """This process's Redlock for the configured nodes (rebuilt after fork or change)."""
        urls = self.node_urls(app)
        cached = self._redlock
        if cached is None or cached[0] != os.getpid() or cached[1] != urls:
            with self._lock:
                lock = Redlock.from_urls(urls, check=False, options=self.options.redlock_options)
                self._redlock = cached = (os.getpid(), urls, lock)
        return cached[2]

    def _try_acquire(self, call: Call, key: GuardKey) -> tuple[Holding | None, Any]:
        app = call.task.app
        redlock = self.redlock(app)
        lease = redlock.acquire(key.full, ttl_seconds=self.options.ttl_seconds)
        if lease is None:
            return None, None
        stores = stores_for(app)
        try:
            if self.options.fencing:
                lease.fencing_token = FencingTokens(stores.engine()).mint(key.full)
                if not lease.valid():
                    # Minted after the lease ran out: a later holder may hold a smaller
                    # token, so this one must not be used (see fencing.py's timeline).
                    redlock.release(lease)
                    return None, None
            _register_exclusive(stores.engine(), key, lease, call)
        except BaseException:
            redlock.release(lease)
            raise
        heartbeat = Heartbeat(lease, redlock.extend, self.options.heartbeat_options)
        if self.options.heartbeat:
            heartbeat.start()

        def unregister() -> None:
            with stores.engine().begin() as connection:
                connection.execute(text(_UNREGISTER_SA), {"key": key.full, "owner": lease.owner})

        return (Holding(key=key, release=lambda: redlock.release(lease), check=heartbeat.check,
                        heartbeat=heartbeat, unregister=unregister), lease.fencing_token)

    def _holder_details(self, key: GuardKey) -> dict[str, Any]:
        assert self.task is not None
        try:
            with stores_for(self.task.app).engine().connect() as connection:
                row = connection.execute(
                    text("SELECT task_id, token, extract(epoch FROM now() - acquired_at) "
                         "FROM resilience_held_locks WHERE key = :key"), {"key": key.full}
                ).first()
        except Exception:  # noqa: BLE001 - holder details are informational
            return {}
        if row is None:
            return {}
        return {"holder_task_id": row[0], "holder_token": row[1],
                "held_seconds": round(float(row[2] or 0), 3)}


#: One round trip: take the lock, name the session after the holder, register it with a
#: fresh fencing token. A volatile CTE runs once; the INSERT runs only when taken.
_ACQUIRE_SINGLETON = PreparedStatement("resilience_singleton_acquire", """
    WITH attempt AS (SELECT pg_try_advisory_lock(%(id)s::bigint) AS taken),
    named AS (
        SELECT set_config('application_name', %(name)s::text, false) FROM attempt WHERE taken
    ),
    registered AS (
        INSERT INTO resilience_held_locks
            (key, kind, owner, task_id, task_name, hostname, pid, token, ttl_seconds,
             acquired_at)
        SELECT %(key)s::text, 'singleton', %(owner)s::text, %(task_id)s::text,
               %(task_name)s::text, %(host)s::text, %(pid)s::int,
               nextval('resilience_fencing_token_seq'), NULL, now()
        FROM attempt WHERE taken
        ON CONFLICT (key) DO UPDATE SET kind = EXCLUDED.kind, owner = EXCLUDED.owner,
            task_id = EXCLUDED.task_id, task_name = EXCLUDED.task_name,
            hostname = EXCLUDED.hostname, pid = EXCLUDED.pid, token = EXCLUDED.token,
            ttl_seconds = EXCLUDED.ttl_seconds, acquired_at = now()
        RETURNING token
    )
    SELECT attempt.taken, (SELECT token FROM registered), (SELECT count(*) FROM named)
    FROM attempt
""")

#: One round trip: unregister, unlock, and clear the session's holder name.
_RELEASE_SINGLETON = PreparedStatement("resilience_singleton_release", """
    WITH unregistered AS (
        DELETE FROM resilience_held_locks
        WHERE key = %(key)s::text AND owner = %(owner)s::text
    )
    SELECT pg_advisory_unlock(%(id)s::bigint), set_config('application_name', 'lock:', false)
""")

_SESSIONS = threading.local()

_UNREGISTER_SA = "DELETE FROM resilience_held_locks WHERE key = :key AND owner = :owner"


_REGISTER_SA = """
    INSERT INTO resilience_held_locks
        (key, kind, owner, task_id, task_name, hostname, pid, token, ttl_seconds, acquired_at)
    VALUES (:key, 'exclusive', :owner, :task_id, :task_name, :hostname, :pid, :token, :ttl,
            now())
    ON CONFLICT (key) DO UPDATE SET kind = EXCLUDED.kind, owner = EXCLUDED.owner,
        task_id = EXCLUDED.task_id, task_name = EXCLUDED.task_name,
        hostname = EXCLUDED.hostname, pid = EXCLUDED.pid, token = EXCLUDED.token,
        ttl_seconds = EXCLUDED.ttl_seconds, acquired_at = now()
"""


def _register_exclusive(engine: Any, key: GuardKey, lease: Lease, call: Call) -> None:
    """Record the holder for `jobs locks list` and holder details (informational)."""
    with engine.begin() as connection:
        connection.execute(text(_REGISTER_SA), {
            "key": key.full, "owner": lease.owner, "task_id": call.task_id,
            "task_name": call.task.name, "hostname": socket.gethostname(),
            "pid": os.getpid(), "token": lease.fencing_token, "ttl": lease.ttl_seconds,
        })


# -- enqueue-side key check ----------------------------------------------------------------------
class LockKeyGuard(EnqueueGuard):
    """Builds the lock key in the producer, so a bad key fails at enqueue, not in the worker."""

    name: ClassVar[str] = "lock-key"
    stage: ClassVar[EnqueueStage] = EnqueueStage.VALIDATE

    def __init__(self, guard: LockGuard) -> None:
        self.guard = guard

    def before_publish(self, publish: Publish) -> None:
        self.guard.key_for(publish.task.name, publish.args, publish.kwargs)


# -- decorators ------------------------------------------------------------------------------------
def singleton(
    key: KeyOption = None,
    *,
    policy: str = "skip",
    defer_seconds: float = 1.0,
    same_task_wait_seconds: float = 5.0,
    on_store_down: StoreDown | str = StoreDown.FAIL_CLOSED,
    on_store_error: str | None = None,
    database_url: str | None = None,
    pool_mode: str | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """At most one run per key at a time, on a PostgreSQL advisory lock (see module doc).

    Raises:
        ConfigurationError: a bad policy, delay or key template (at definition time).
    """
    options = SingletonConfig(
        policy=policy, defer_seconds=defer_seconds,
        same_task_wait_seconds=same_task_wait_seconds, on_store_down=on_store_down,
        on_store_error=on_store_error, database_url=database_url, pool_mode=pool_mode,
    )

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        guard = SingletonGuard(func, key, options)
        attach(func, LockKeyGuard(guard))
        return attach(func, guard)

    return decorate


def exclusive(
    key: KeyOption = None,
    *,
    ttl_seconds: float = 60.0,
    policy: str = "skip",
    defer_seconds: float = 1.0,
    same_task_wait_seconds: float = 5.0,
    on_store_down: StoreDown | str = StoreDown.FAIL_CLOSED,
    on_store_error: str | None = None,
    heartbeat: bool = True,
    renew_fraction: float = 1 / 3,
    max_extensions: int = 100,
    nodes: Sequence[str] | str | None = None,
    retry_count: int = 1,
    retry_delay_seconds: float = 0.05,
    clock_drift_factor: float = 0.01,
    fencing: bool = True,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """At most one holder per key on Redlock, with heartbeat and fencing (see module doc).

    Raises:
        ConfigurationError: TTL <= 0, fewer than 3 nodes, a bad policy or key template.
    """
    options = ExclusiveConfig(
        ttl_seconds=ttl_seconds, policy=policy, defer_seconds=defer_seconds,
        same_task_wait_seconds=same_task_wait_seconds, on_store_down=on_store_down,
        on_store_error=on_store_error, heartbeat=heartbeat, renew_fraction=renew_fraction,
        max_extensions=max_extensions,
        nodes=tuple(_split_urls(nodes)) if isinstance(nodes, str) else
        (tuple(nodes) if nodes is not None else None),
        retry_count=retry_count, retry_delay_seconds=retry_delay_seconds,
        clock_drift_factor=clock_drift_factor, fencing=fencing,
    )

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        guard = ExclusiveGuard(func, key, options)
        attach(func, LockKeyGuard(guard))
        return attach(func, guard)

    return decorate


LockOptions = LockConfig  # deprecated alias, removed in the next release
SingletonOptions = SingletonConfig  # deprecated alias, removed in the next release
ExclusiveOptions = ExclusiveConfig  # deprecated alias, removed in the next release
LockKeyCheck = LockKeyGuard  # deprecated alias, removed in the next release
