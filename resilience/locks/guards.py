"""`@singleton` and `@exclusive`: at most one run per key, across every worker.

    @app.task(tier="critical")
    @singleton(key="account:{account_id}", policy="skip")
    def rebuild(account_id): ...

* singleton — a PostgreSQL session advisory lock, freed the instant the holder dies, held on
  the worker thread's own connection (its release riding on the idempotency completion) or
  on a lock session (`backends/postgres.py`); a `SessionWatcher` probes it while the body
  runs, so `checkpoint()` and a transactional commit refuse once it is lost (watcher.py).
* exclusive — Redlock with a lease heartbeat and a fencing token from PostgreSQL, handed to
  the body as `fencing_token` when it takes that parameter (`backends/redlock.py`).

This module is the flow only (the stores are behind `LockBackend`): the key, `skip` or
`defer` when another run holds it, a retry or redelivery of the holder waiting
`same_task_wait_seconds` for its predecessor, the store-down policy. See docs/locks.md.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, cast

from resilience.config import configured
from resilience.errors import ConfigurationError, LockNotOwnedError, StorageError
from resilience.holders import Holder
from resilience.keys import GuardKey, KeyOption, KeySpec
from resilience.locks.backends import Claimant, LockBackend, SessionLockBackend, Taken
from resilience.locks.backends.memory import MemoryLockBackend
from resilience.locks.backends.postgres import SESSION_POOL, AdvisoryLockBackend, HeldLockRegistry
from resilience.locks.backends.redlock import Redlock, RedlockBackend
from resilience.locks.config import (
    ExclusiveConfig,
    LockConfig,
    SingletonConfig,
)
from resilience.locks.fencing import FencingTokens
from resilience.locks.heartbeat import Heartbeat
from resilience.locks.watcher import SessionWatcher
from resilience.outcomes import Outcome, Stop
from resilience.pipeline import Call, EnqueueGuard, EnqueueStage, Guard, Publish, Stage, attach
from resilience.store_down import store_failed
from resilience.stores import stores_for

if TYPE_CHECKING:
    from celery import Task

    from resilience.stores import Stores

logger = logging.getLogger("resilience.locks")

#: The parameter name through which a body receives its fencing token.
FENCING_PARAMETER = "fencing_token"
#: The parameter name through which a body receives `call.checkpoint` (lease still held?).
CHECKPOINT_PARAMETER = "checkpoint"
INJECTED = (FENCING_PARAMETER, CHECKPOINT_PARAMETER)

__all__ = ["ExclusiveConfig", "ExclusiveGuard", "Hold", "LockConfig", "LockGuard", "LockKeyGuard",
           "SingletonConfig", "SingletonGuard", "exclusive", "singleton"]


@dataclass
class Hold:
    """What a lock guard took for one call, kept in its slot of the call until given back."""

    key: GuardKey
    taken: Taken
    backend: LockBackend
    heartbeat: Heartbeat | None = None
    #: Probes a session lock's session while the body runs (`@singleton`).
    watcher: SessionWatcher | None = None

    def check(self) -> None:
        """Raise LockNotOwnedError when the lock was lost (registered in `call.checks`).

        A watched session is checked through its watcher (a fresh probe, waited for at
        most until the watcher's bound); otherwise the backend checks the lock itself.
        """
        if self.heartbeat is not None:
            self.heartbeat.check()
        if self.watcher is not None:
            self.watcher.check()
            return
        self.backend.check(self.taken)


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

    def backend(self, task: Task) -> LockBackend:
        """The store of this guard's locks for `task`'s app (built from the app's stores)."""
        raise NotImplementedError

    def key_of(self, call: Call) -> GuardKey | None:
        """The lock key of `call`; None: this call takes no lock (a subclass keyed by a
        message header takes one only when the header is there)."""
        return self.key_for(call.task.name, call.args, call.kwargs)

    def policy_of(self, call: Call) -> str:
        """The policy (skip or defer) of `call` when another run holds its key."""
        return self.options.policy

    # hooks -------------------------------------------------------------------------------
    def before_run(self, call: Call) -> None:
        key = self.key_of(call)
        if key is None:
            return
        try:
            backend = self.backend(call.task)
            hold = self._try_acquire(backend, call, key)
            holder = None if hold is not None else self._holder(backend, key)
            if holder is not None and call.task_id is not None and holder.owner == call.task_id:
                hold = self._wait_for_predecessor(backend, call, key)
                holder = None if hold is not None else self._holder(backend, key)
        except StorageError as exc:
            self._store_failed(call, key, exc)
            return
        if hold is None:
            self._refuse(call, key, holder)
        call.keep(self, hold)
        call.checks.append(hold.check)
        if self.injects_token and hold.taken.token is not None:
            call.inject[FENCING_PARAMETER] = hold.taken.token
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
                retry_after_seconds=self.options.defer_seconds, details={"lock_lost": True},
            ) from exc

    def release(self, call: Call) -> None:
        hold: Hold | None = call.take_back(self)
        if hold is None:
            return
        if hold.heartbeat is not None:
            hold.heartbeat.stop()
        if hold.watcher is not None:
            idle = hold.watcher.stop()
            if hold.watcher.lost() or not idle:
                # Lost, or a probe still waits on the session (a partition): give the
                # session up without a statement rather than wait out its TCP timeout.
                logger.warning("%s: lock %s lost while the job ran: %s", self.name,
                               hold.key.full, hold.watcher.lost_reason or "probe unanswered")
                call.count("LOCK-LOST", guard=self.name)
                cast(SessionLockBackend, hold.backend).abandon(hold.taken)
                return
        try:
            hold.backend.release(hold.taken)
        except (LockNotOwnedError, StorageError) as exc:
            logger.warning("%s: lock %s was no longer held at release: %s", self.name,
                           hold.key.full, exc)
            call.count("LOCK-LOST", guard=self.name)

    # steps -------------------------------------------------------------------------------
    def _try_acquire(self, backend: LockBackend, call: Call, key: GuardKey) -> Hold | None:
        asked_at = time.monotonic()
        taken = backend.acquire(key.full, Claimant(task_id=call.task_id,
                                                   task_name=call.task.name,
                                                   fenced=self.injects_token))
        if taken is None:
            return None
        return Hold(key=key, taken=taken, backend=backend,
                    heartbeat=self._heartbeat(backend, taken),
                    watcher=self._watcher(backend, taken, asked_at))

    def _heartbeat(self, backend: LockBackend, taken: Taken) -> Heartbeat | None:
        """The heartbeat renewing `taken`'s lease, for guards whose locks expire."""
        return None

    def _watcher(self, backend: LockBackend, taken: Taken,
                 asked_at: float) -> SessionWatcher | None:
        """The watcher probing `taken`'s session, for guards whose locks live in one."""
        return None

    def _wait_for_predecessor(self, backend: LockBackend, call: Call,
                              key: GuardKey) -> Hold | None:
        deadline = time.monotonic() + self.options.same_task_wait_seconds
        while time.monotonic() < deadline:
            self.sleep(0.1)
            hold = self._try_acquire(backend, call, key)
            if hold is not None:
                return hold
        return None

    def _holder(self, backend: LockBackend, key: GuardKey) -> Holder | None:
        try:
            return backend.holder(key.full)
        except Exception:  # noqa: BLE001 - holder details are informational
            return None

    def _refuse(self, call: Call, key: GuardKey, holder: Holder | None) -> None:
        details: dict[str, Any] = {"key": key.full}
        if holder is not None:
            details["holder_task_id"] = holder.owner
            if holder.token is not None:
                details["holder_token"] = holder.token
            details["held_seconds"] = holder.held_seconds
        outcome = Outcome.SKIPPED if self.policy_of(call) == "skip" else Outcome.DEFERRED
        call.count(outcome, guard=self.name)
        raise Stop(
            outcome, guard=self.name,
            reason=f"{self.kind} lock {key.full!r} is held by another run",
            retry_after_seconds=self.options.defer_seconds if outcome is Outcome.DEFERRED
            else None, details=details)

    def _store_failed(self, call: Call, key: GuardKey, exc: StorageError) -> None:
        store_failed(call, exc, guard=self.name, policy=self.options.on_store_down,
                     retry_after_seconds=self.options.defer_seconds, name=call.task.name,
                     details={"key": key.full, "error": type(exc).__name__})


class SingletonGuard(LockGuard):
    """At most one run per key on a PostgreSQL session advisory lock."""

    name: ClassVar[str] = "singleton"
    kind: ClassVar[str] = "singleton"
    options: SingletonConfig

    def commit(self, call: Call, result: Any) -> None:
        """Let the release ride on the call's last commit when the lock is held on the
        thread's shared connection (`AdvisoryLockBackend.hand_off`): freed at that commit,
        which comes after every other; `release` still gives it back otherwise."""
        hold: Hold | None = call.kept(self)
        if hold is not None:
            hand_off = getattr(hold.backend, "hand_off", None)
            if hand_off is not None:
                hand_off(hold.taken)

    def _watcher(self, backend: LockBackend, taken: Taken,
                 asked_at: float) -> SessionWatcher | None:
        """A started `SessionWatcher` on the held session (advisory backends only: the
        in-memory one has no session), unless `probe_seconds` turns it off."""
        # A `SessionLockBackend` is one that can probe (a runtime Protocol check would walk
        # every member of the Protocol at each call).
        if not self.options.watched or not hasattr(backend, "probe"):
            return None
        return SessionWatcher(
            taken.key, lambda: backend.probe(taken),
            period_seconds=self.options.probe_seconds or 0.0,
            timeout_seconds=self.options.probe_timeout_seconds, answered_at=asked_at,
            token=taken.token).start()

    def backend(self, task: Task) -> LockBackend:
        """Advisory locks on the option's database, else on the app's direct lock URL
        (`Stores.locks_database_url`); registry and holder reports on the pooled engine.
        The app's `resilience_lock_session_idle_seconds` is read when it is built (once per
        process), not at every call."""
        def build(stores: Stores) -> LockBackend:
            idle = task.app.conf.get("resilience_lock_session_idle_seconds")
            if idle is not None:
                SESSION_POOL.idle_seconds = float(idle)
            if self.options.database_url:
                return AdvisoryLockBackend(self.options.database_url, engine=stores.guard_engine,
                                           pool_mode=self.options.pool_mode)
            pool_mode = self.options.pool_mode or stores.locks_pool_mode
            # The locks' database is the statements' one, reached directly: hold each lock
            # on the worker thread's own connection (no lock session; the release rides
            # on the idempotency completion).
            shared = (stores.locks_database_url == stores.database_url
                      and (pool_mode or "none").strip().lower() == "none")
            return AdvisoryLockBackend(
                stores.locks_database_url, engine=stores.guard_engine, pool_mode=pool_mode,
                statements=stores.statements() if shared else None)

        stores = stores_for(task.app)
        return stores.backend("singleton", build,
                              memory=lambda: MemoryLockBackend("singleton", stores),
                              variant=(self.options.database_url, self.options.pool_mode))


class ExclusiveGuard(LockGuard):
    """At most one holder per key on Redlock, with lease heartbeat and fencing tokens."""

    name: ClassVar[str] = "exclusive"
    kind: ClassVar[str] = "exclusive"
    options: ExclusiveConfig

    def bind(self, task: Task) -> None:
        super().bind(task)
        time_limit = getattr(task, "time_limit", None)
        if time_limit and self.options.longest_hold_seconds < float(time_limit):
            raise ConfigurationError(
                f"{task.name}: exclusive lease can last at most "
                f"{self.options.longest_hold_seconds:g}s (ttl_seconds with heartbeat renewals) "
                f"but the task's time limit is {time_limit}s: the lock would expire while the "
                "body still runs; raise ttl_seconds or max_extensions", task=task.name)

    def backend(self, task: Task) -> LockBackend:
        """This process's Redlock backend for the nodes (rebuilt after fork or change);
        with in-memory stores, a lease of `ttl_seconds` in memory."""
        stores = stores_for(task.app)
        shared = stores.backend("exclusive", lambda real: self._redlock_backend(real),
                                memory=lambda: MemoryLockBackend("exclusive", stores),
                                variant=self)
        if isinstance(shared, MemoryLockBackend):
            return shared.leased(self.options.ttl_seconds, fencing=self.options.fencing)
        return shared

    def _redlock_backend(self, stores: Stores) -> LockBackend:
        """Built once per process by `Stores.backend` (keyed by this guard)."""
        return RedlockBackend(
            Redlock.from_urls(self.options.nodes or tuple(stores.redlock_urls), check=False,
                              options=self.options.redlock_options),
            registry=HeldLockRegistry(stores.guard_engine),
            tokens=FencingTokens(stores.guard_engine()) if self.options.fencing else None,
            ttl_seconds=self.options.ttl_seconds)

    def _heartbeat(self, backend: LockBackend, taken: Taken) -> Heartbeat | None:
        if taken.lease is None:
            return None
        heartbeat = Heartbeat(taken.lease, lambda _lease: backend.extend(taken),
                              self.options.heartbeat_options)
        if self.options.heartbeat:
            heartbeat.start()
        return heartbeat


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
def _decorator(guard_class: type[LockGuard], config_class: type[Any], key: Any,
               overrides: dict[str, Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Attach `guard_class` (and its enqueue key check) built from `key` and `overrides`;
    `key` is the key option (as keyword too), or a config (then the key comes from
    `overrides` only)."""
    overrides = dict(overrides)
    config = key if isinstance(key, LockConfig) else None
    if config is not None or "key" in overrides:
        key = overrides.pop("key", None)
    options = configured(config_class, config, overrides, where=guard_class.kind)

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        guard = guard_class(func, key, options)
        attach(func, LockKeyGuard(guard))
        return attach(func, guard)

    return decorate


def singleton(
    key: KeyOption | SingletonConfig = None, /, **overrides: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """At most one run per key at a time, on a PostgreSQL advisory lock (docs/locks.md).

    `key` is the key option (as keyword too), or a `SingletonConfig`; `overrides` replace
    its fields (options, defaults and meaning: `SingletonConfig`).

    Raises:
        ConfigurationError: an unknown option, a bad policy, delay or key template (at
            definition time).
    """
    return _decorator(SingletonGuard, SingletonConfig, key, overrides)


def exclusive(
    key: KeyOption | ExclusiveConfig = None, /, **overrides: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """At most one holder per key on Redlock, with heartbeat and fencing (docs/locks.md).

    `key` is the key option (as keyword too), or an `ExclusiveConfig`; `overrides` replace
    its fields (options, defaults and meaning: `ExclusiveConfig`).

    Raises:
        ConfigurationError: an unknown option, TTL <= 0, fewer than 3 nodes, a bad policy
            or key template.
    """
    return _decorator(ExclusiveGuard, ExclusiveConfig, key, overrides)
