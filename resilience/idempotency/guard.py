"""`@idempotent`: a job delivered twice has its effect once and returns the first result.

The guard sits at `Stage.IDEMPOTENCY`, just inside the deadline, and holds only the flow:
claim the call's key (a succeeded record is REPLAYED, a live claim DEFERRED, another
fingerprint refused), run the body, record the result inside every lock and lease the call
holds, give the claim back on error. The records live in an `IdempotencyBackend`
(PostgreSQL unless given one) behind `backends.cached.CachedBackend`'s Redis fast path.
See docs/idempotency.md ("How a call goes").
"""

from __future__ import annotations

import inspect
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery.exceptions import Retry

from resilience.classify import is_retryable as classify
from resilience.config import configured
from resilience.connections import on_fork, translate_store_error
from resilience.errors import (
    ConfigurationError,
    IdempotencyKeyReused,
    NonJsonArguments,
    StorageError,
    StoreUnavailable,
    UnserializableResult,
)
from resilience.idempotency.backends import (
    IN_PROGRESS,
    SUCCEEDED,
    Claim,
    ClaimResult,
    IdempotencyBackend,
    Transaction,
)
from resilience.idempotency.backends.cached import CachedBackend, CacheHit, cached_backend
from resilience.idempotency.config import (
    DEFAULT_LEASE_SECONDS,
    LEASE_MARGIN_SECONDS,
    IdempotencyConfig,
)
from resilience.keys import GuardKey, KeyOption, KeySpec, canonical_arguments, revive
from resilience.outcomes import Outcome, Stop
from resilience.pipeline import Call, EnqueueGuard, EnqueueStage, Guard, Publish, Stage, attach
from resilience.store_down import StoreDown, store_failed
from resilience.stores import Stores, stores_for

if TYPE_CHECKING:
    from celery import Task

logger = logging.getLogger("resilience.idempotency")

GUARD_NAME = "idempotency"

#: How a guard finds its backend: one object, or one per task (the task's app's stores).
BackendOption = IdempotencyBackend | Callable[["Task"], IdempotencyBackend] | None


def is_retryable(exc: BaseException) -> bool:
    """Will Celery run this call again? Then the claim is released instead of failed.

    `celery.exceptions.Retry` (`task.retry`, `autoretry_for`, the retry guard) always is;
    otherwise the core's classifier decides. Either way the next delivery may claim again:
    the choice only changes what the record shows.
    """
    if isinstance(exc, Retry):
        return True
    if isinstance(exc, IdempotencyKeyReused | UnserializableResult):
        return False
    return classify(exc)


class _Owners:
    """Owner tokens, unique per claim: the fencing pair is (attempt, owner), so a deleted
    and recreated record (attempt back to 1) still fences out a holder from before the
    deletion. Host, pid and a random part (a pid is reused after a restart) once per
    process (a forked child draws its own), then a counter: no system call per claim."""

    def __init__(self) -> None:
        self.reset()
        on_fork(self.reset)

    def reset(self) -> None:
        self.prefix = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}:"
        self.counter = itertools.count(1)

    def token(self) -> str:
        return f"{self.prefix}{next(self.counter)}"


_owners = _Owners()


@dataclass(slots=True)
class _Taken:
    """What the guard keeps in its slot for one call."""

    key: GuardKey
    #: The claim held until it is completed, failed or released.
    claim: Claim | None = None
    #: The body's transaction (transactional mode) until committed or closed.
    transaction: Transaction | None = None


class IdempotencyGuard(Guard):
    """Claims the call's key, replays finished keys, defers live claims.

    Args:
        config: the options.
        backend: where records live: a backend, a callable returning one for the task, or
            None for PostgreSQL of the task's app (`backends.postgres.backend_for`).
    """

    name = GUARD_NAME
    stage = Stage.IDEMPOTENCY

    def __init__(self, config: IdempotencyConfig, backend: BackendOption = None) -> None:
        self.config = config
        self._backend = backend
        self._resolved: tuple[Stores, CachedBackend] | None = None
        self._task: Task | None = None
        self.task_name = ""
        self.spec: KeySpec | None = None
        #: The body declares `session` (transactional mode passes it the transaction's).
        self._passes_session = False
        self.lease_seconds = config.lease_seconds or DEFAULT_LEASE_SECONDS

    # -- setup ---------------------------------------------------------------------------
    def bind(self, task: Task) -> None:
        """Build the key spec on the task's signature and settle the lease length.

        Raises:
            ConfigurationError: a non-transactional lease shorter than the hard time limit.
        """
        self._task = task
        self.task_name = task.name
        self.spec = KeySpec(task.run, self.config.key)
        self._passes_session = _session_parameter(task.run) is not None
        time_limit = task.time_limit or task.app.conf.task_time_limit
        if self.config.lease_seconds is None:
            self.lease_seconds = (
                float(time_limit) + LEASE_MARGIN_SECONDS if time_limit else DEFAULT_LEASE_SECONDS)
        elif time_limit and not self.config.transactional and self.lease_seconds < time_limit:
            raise ConfigurationError(
                f"{task.name}: lease_seconds={self.lease_seconds:g} is shorter than the hard "
                f"time limit ({time_limit:g}s): a slow but live holder would be overtaken and "
                "the effect could happen twice; raise it or use transactional=True", task=task.name)

    @property
    def backend(self) -> CachedBackend:
        """The records' backend behind its Redis fast path, resolved on the task's first
        call (an app may be bound before its settings exist) and again only when the app's
        stores were replaced (`use_memory_stores()`): one identity check per use."""
        task = self._task
        assert task is not None, "guard used before bind()"
        stores = stores_for(task.app)
        resolved = self._resolved
        if resolved is not None and resolved[0] is stores:
            return resolved[1]
        config = self.config
        backend = cached_backend(
            stores, self._backend(task) if callable(self._backend) else self._backend,
            cache=config.cache, cache_ttl_seconds=config.cache_ttl_seconds,
            synchronous_commit=config.synchronous_commit, prepared=config.prepared_statements)
        self._resolved = (stores, backend)
        return backend

    def key_for(self, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> GuardKey:
        """The call's key and fingerprint.

        Raises:
            ArgumentsDoNotBind, NonJsonArguments, InvalidKey.
        """
        assert self.spec is not None, "guard used before bind()"
        return self.spec.build(self.task_name, args, kwargs)

    def call_key(self, call: Call) -> GuardKey:
        """The key of one execution: `key_for`, except that without an explicit key a job
        the outbox relay published keys on `outbox:<row id>` (its header), so a row
        published twice has one effect (resilience.outbox); a durable workflow step on
        `workflow:<workflow id>:<position>` (its compensation: `...:compensation`; from a
        step's second run on, `:<run>` appended)."""
        key = self.key_for(call.args, call.kwargs)
        if self.config.key is None:
            step = call.headers.workflow_step
            if step is not None:
                value = f"workflow:{step.workflow_id}:{step.position}"
                if step.compensation:
                    value += ":compensation"
                if step.run:  # a step retried by an operator really runs again
                    value += f":{step.run}"
                return GuardKey(key.namespace, value, key.fingerprint)
            row_id = call.headers.outbox_id
            if row_id is not None:
                return GuardKey(key.namespace, f"outbox:{row_id}", key.fingerprint)
        return key

    def _taken(self, call: Call) -> _Taken:
        taken: _Taken | None = call.slots.get(self)
        if taken is None:
            taken = call.slots[self] = _Taken(self.call_key(call))
        return taken

    # -- take: key, claim ------------------------------------------------------------------
    def prefetch(self, call: Call) -> None:
        self.backend.prefetch(call, self._taken(call).key)

    def before_run(self, call: Call) -> None:
        taken = self._taken(call)
        key = taken.key
        try:
            found = self.backend.claim(call, key, owner=_owners.token(),
                                       lease_seconds=self.lease_seconds,
                                       ttl_seconds=self.config.ttl_seconds)
        except StorageError as exc:
            self._store_down(call, taken, exc)
            if self.config.transactional:  # failing open: the body still gets its transaction
                self._begin(call, taken)
            return
        if found.claim is not None:
            taken.claim = found.claim
            if self.config.transactional:
                self._begin(call, taken)
            return
        if found.fingerprint != key.fingerprint:
            self._reused(call, key)
        if found.state == SUCCEEDED:
            self._replay(call, key, found)
        call.count(Outcome.DEFERRED, guard=GUARD_NAME)
        remaining = found.lease_remaining_seconds if found.state == IN_PROGRESS else None
        wait = min(self.config.poll_seconds, max(0.05, remaining or self.config.poll_seconds))
        raise _deferred(f"key {key.value!r} is being run by task {found.task_id}", wait,
                        key=key.value, holder_task_id=found.task_id, attempt=found.attempt,
                        state=found.state)

    def _reused(self, call: Call, key: GuardKey) -> None:
        call.count(Outcome.REJECTED, guard=GUARD_NAME)
        raise IdempotencyKeyReused(
            f"{self.task_name}: idempotency key {key.value!r} was already used with different "
            "arguments; use a new key for a new request (HTTP 422 semantics)",
            key=key.value, task=self.task_name)

    def _replay(self, call: Call, key: GuardKey, found: ClaimResult) -> None:
        call.count(Outcome.REPLAYED, guard=GUARD_NAME)
        source = "cache" if isinstance(found, CacheHit) else "database"
        raise Stop(
            Outcome.REPLAYED, guard=GUARD_NAME,
            reason=f"key {key.value!r} already succeeded in task {found.task_id}",
            result=revive(found.result),
            details={"key": key.value, "original_task_id": found.task_id, "source": source})

    def _store_down(self, call: Call, taken: _Taken, error: StorageError,
                    policy: StoreDown | None = None) -> None:
        """Apply the store-down policy (the configured one unless `policy`) to `error`."""
        store_failed(call, error, guard=GUARD_NAME, policy=policy or self.config.on_store_down,
                     retry_after_seconds=self.config.store_down_retry_seconds,
                     name=self.task_name, details={"key": taken.key.value})

    def _begin(self, call: Call, taken: _Taken) -> None:
        """Open the body's transaction and hand its session to the body; when none can be
        opened the claim is given back and the call DEFERRED."""
        try:
            taken.transaction = self.backend.begin()
        except Exception as exc:
            if isinstance(exc, ConfigurationError):
                self._give_back(taken)
                raise
            error = translate_store_error(exc, "idempotency store: open transaction")
            if isinstance(error, StoreUnavailable):
                self._release_later(taken, error)
            else:
                self._give_back(taken)
            raise _deferred(str(error), self.config.store_down_retry_seconds,
                            store_down=True) from exc
        if self._passes_session:
            call.inject["session"] = taken.transaction.session
        elif taken.transaction.session is not None:
            self._close(taken)
            self._give_back(taken)
            raise ConfigurationError(
                f"{self.task_name}: transactional=True writes through the SQLAlchemy session "
                "it passes; declare `session=None`, or use resilience.contrib.django",
                task=self.task_name)

    # -- commit (inside every lock and lease the call holds) -------------------------------
    def commit(self, call: Call, result: Any) -> None:
        """Record the result, with the body's writes in transactional mode, before any
        guard gives back: a lock released before this commit would let a second run read
        state without these writes (a lost update)."""
        taken: _Taken = call.kept(self)
        claim, key = taken.claim, taken.key
        try:
            # What Celery's JSON result backend carries (UUID, datetime, Decimal ... tagged),
            # so a result that the backend stores is one the record can replay.
            result_json = "null" if result is None else canonical_arguments(result)
        except NonJsonArguments as exc:
            self._close(taken)
            self._give_back(taken, f"UnserializableResult: {exc}")
            raise UnserializableResult(
                f"{self.task_name}: the result of an idempotent task must be what Celery's "
                f"JSON serializer carries, so it can be replayed; got {type(result).__name__}",
                key=key.value) from None
        if self.config.transactional:
            self._commit_transaction(call, taken, result_json)
            if claim is not None:
                self.backend.succeeded(call, key, result_json)
        elif claim is not None:
            try:
                done = self.backend.complete(call, key, claim, result_json,
                                             self.config.ttl_seconds)
            except StorageError as exc:
                # The effect happened; the record stays open until its lease ends.
                logger.error("idempotency completion of %s not recorded: %s", key.full, exc)
                call.count("UNRECORDED", guard=GUARD_NAME)
                return
            if not done:
                logger.warning("idempotency claim on %s was taken over before completion "
                               "(attempt %s)", key.full, claim.attempt)
                call.count("STALE", guard=GUARD_NAME)
                return
        # Committed: nothing is left to give back, whatever an outer guard does next.
        taken.claim = None

    def _commit_transaction(self, call: Call, taken: _Taken, result_json: str) -> None:
        """The body's writes and the record's completion commit as one, after proving every
        lock and lease is still owned; otherwise both roll back and the call is DEFERRED."""
        transaction, claim, key = taken.transaction, taken.claim, taken.key
        assert transaction is not None, "transactional call without a transaction"
        try:
            if not transaction.complete(claim, result_json, self.config.ttl_seconds):
                assert claim is not None
                raise self._rolled_back(
                    call, taken, "STALE",
                    f"claim on {key.value!r} was taken over (attempt {claim.attempt})",
                    attempt=claim.attempt, stale=True)
            try:
                call.checkpoint()
            except Exception as lost:
                raise self._rolled_back(
                    call, taken, "LOCK-LOST",
                    f"a lock or lease was lost before the commit ({lost})", lock_lost=True,
                ) from lost
            transaction.commit()
        except StorageError as error:
            self._close(taken)
            logger.warning("idempotent commit of %s failed: %s", key.full, error)
            # Rolled back (or unknown): a later delivery replays, or reclaims after the lease;
            # a write PostgreSQL rejects (too long, a constraint) is dead-lettered instead of
            # deferred forever. The body's writes are part of this commit, so "down" never
            # means "run unguarded" here.
            self._store_down(call, taken, error, StoreDown.FAIL_CLOSED)
        finally:
            self._close(taken)

    def _rolled_back(self, call: Call, taken: _Taken, counter: str, why: str,
                     **details: Any) -> Stop:
        """DEFERRED, counted under `counter`; the caller's `finally` rolls the writes back."""
        call.count(counter, guard=GUARD_NAME)
        return _deferred(f"{why}; this run's writes were rolled back", self.config.poll_seconds,
                         key=taken.key.value, **details)

    # -- give back -------------------------------------------------------------------------
    def on_error(self, call: Call, exc: BaseException) -> None:
        """Give the claim back; a transactional body whose database went away is DEFERRED.

        Its writes were rolled back with the transaction, so the job has had no effect:
        failing it would lose it (no retry policy) for what is only an outage.
        """
        taken: _Taken | None = call.kept(self)
        self._close(taken)
        outage = self.config.transactional and self.backend.unavailable(exc)
        if taken is not None and taken.claim is not None:
            if outage:
                self._release_later(taken, exc)
            elif is_retryable(exc):
                self._give_back(taken)
            else:
                self._give_back(taken, f"{type(exc).__name__}: {exc}")
        if outage:
            call.count(Outcome.DEFERRED, guard=GUARD_NAME)
            raise _deferred(f"the database went away under the transactional body "
                            f"({type(exc).__name__}); its writes were rolled back",
                            self.config.store_down_retry_seconds, store_down=True) from exc

    def after_run(self, call: Call, result: Any) -> None:
        """Nothing to give back: `commit` completed the claim and closed the transaction."""

    def on_stop(self, call: Call, stop: Stop) -> None:
        # An inner guard stopped the call (lock held, breaker open): the body did not run.
        taken: _Taken | None = call.kept(self)
        self._close(taken)
        if taken is not None:
            self._give_back(taken)

    def _release_later(self, taken: _Taken, error: BaseException) -> None:
        """Give the claim up while the store is unreachable: a daemon thread retries the
        release every second until the store answers or the lease ends (the claim statement
        takes the record over then anyway). Releasing here would first wait out the dead
        address's connect timeout (5 s) and fail. Fenced by (attempt, owner); see
        docs/idempotency.md ("Transactional mode").
        """
        claim, taken.claim = taken.claim, None
        if claim is None:
            return
        logger.info(
            "idempotency claim on %s:%s released once the store answers (attempt %s): the "
            "store is unreachable (%s)", claim.task_name, claim.key, claim.attempt,
            type(error).__name__)
        backend = self.backend
        give_up_at = time.monotonic() + self.lease_seconds

        def release_when_reachable() -> None:
            while time.monotonic() < give_up_at:
                try:
                    backend.release(claim)
                    return
                except StorageError:
                    time.sleep(1.0)

        threading.Thread(target=release_when_reachable, daemon=True,
                         name=f"idempotency-release:{claim.key}"[:60]).start()

    def _give_back(self, taken: _Taken, error: str | None = None) -> None:
        """Give the claim back: released for a retry, or with `error` recorded as failed."""
        claim, taken.claim = taken.claim, None
        if claim is None:
            return
        try:
            if error is None:
                self.backend.release(claim)
            else:
                self.backend.fail(claim, error, self.config.ttl_seconds)
        except StorageError as exc:
            # The lease ends on its own; only the record's view is late.
            logger.warning("idempotency %s not recorded: %s",
                           "release" if error is None else "fail", exc)

    @staticmethod
    def _close(taken: _Taken | None) -> None:
        """Roll back and close the body's transaction, if one is open."""
        if taken is not None and taken.transaction is not None:
            transaction, taken.transaction = taken.transaction, None
            transaction.close()


def _deferred(reason: str, retry_after_seconds: float, **details: Any) -> Stop:
    return Stop(Outcome.DEFERRED, guard=GUARD_NAME, reason=reason,
                retry_after_seconds=retry_after_seconds, details=details)


def _session_parameter(func: Callable[..., Any]) -> inspect.Parameter | None:
    """`func`'s `session` parameter if the transaction's session can be passed to it by
    name; None when it has none (or only a positional-only or variadic one)."""
    try:
        parameter = inspect.signature(func).parameters.get("session")
    except (TypeError, ValueError):
        return None
    if parameter is None or parameter.kind not in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                   inspect.Parameter.KEYWORD_ONLY):
        return None
    return parameter


class IdempotencyKeyGuard(EnqueueGuard):
    """Builds the idempotency key at enqueue time, so a bad key fails in the producer."""

    name = "idempotency-key"
    stage = EnqueueStage.VALIDATE

    def __init__(self, guard: IdempotencyGuard) -> None:
        self.guard = guard

    def bind(self, task: Task) -> None:
        if self.guard.spec is None:
            self.guard.bind(task)

    def before_publish(self, publish: Publish) -> None:
        self.guard.key_for(publish.args, publish.kwargs)


def idempotent(key: KeyOption | IdempotencyConfig = None, /, *, backend: BackendOption = None,
               **overrides: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Make a task idempotent: one effect and one result per key within `ttl_seconds`.

    Place it under `@app.task(...)`. `key` is the key option, or an `IdempotencyConfig`
    (then `overrides` replace its fields: see `IdempotencyConfig`); `backend` replaces
    PostgreSQL of the app's stores (see `IdempotencyGuard`).

    Raises:
        ConfigurationError: bad or unknown options, a key template naming a missing
            argument, or `transactional=True` on a function whose `session` parameter has
            a default other than None or is positional-only / variadic.
    """
    base = key if isinstance(key, IdempotencyConfig) else None
    if base is None and key is not None:
        if "key" in overrides:
            raise ConfigurationError("idempotent: key given twice", option="key")
        overrides["key"] = key
    config = configured(IdempotencyConfig, base, overrides, where="idempotent")

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        KeySpec(func, config.key)  # a template naming a missing argument fails here
        # In transactional mode a body may declare no `session` (Django: the ORM writes are
        # in the transaction; the SQLAlchemy case is refused at the first call); one that
        # does must take it by name, defaulting to None.
        if config.transactional and "session" in inspect.signature(func).parameters:
            parameter = _session_parameter(func)
            if parameter is None or parameter.default is not None:
                raise ConfigurationError(
                    f"{func.__name__}: transactional=True gives the body a SQLAlchemy session; "
                    "declare its parameter as `session: Session | None = None`",
                    function=func.__name__)
        guard = IdempotencyGuard(config, backend)
        attach(func, guard)
        attach(func, IdempotencyKeyGuard(guard))
        return func

    return decorate
