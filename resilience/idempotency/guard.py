"""`@idempotent`: a job delivered twice has its effect once and returns the first result.

The guard sits at `Stage.IDEMPOTENCY`, just inside the deadline. Per call:

1. build the key (task name + key template/function or all bound arguments) and the
   fingerprint of all bound arguments;
2. Redis fast path: a cached succeeded record with the same fingerprint -> REPLAYED;
3. claim in PostgreSQL (one statement): claimed -> run the body; a succeeded record ->
   REPLAYED; a live claim of another holder -> DEFERRED; another fingerprint ->
   `IdempotencyKeyReused` (the task fails, never retried);
4. after the body: record the result (in the body's transaction in transactional mode),
   cache it in Redis; on error: release the claim when the error will be retried, record
   it failed otherwise. Failures are not cached: the next delivery may claim again.
"""

from __future__ import annotations

import inspect
import logging
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from resilience.counters import count_call
from resilience.errors import (
    ConfigurationError,
    IdempotencyKeyReused,
    NonJsonArguments,
    StorageError,
    UnserializableResult,
)
from resilience.idempotency.cache import ResultCache
from resilience.idempotency.models import IN_PROGRESS, SUCCEEDED
from resilience.idempotency.store import Holder, PostgresStore, store_for, wrap_database_error
from resilience.keys import GuardKey, KeyOption, KeySpec, canonical_json
from resilience.outcomes import Outcome, Stop
from resilience.pipeline import Call, EnqueueGuard, EnqueueStage, Guard, Publish, Stage, attach
from resilience.store_down import StoreDown, store_down_policy, store_failed
from resilience.stores import stores_for

if TYPE_CHECKING:
    from celery import Task

logger = logging.getLogger("resilience.idempotency")

GUARD_NAME = "idempotency"
#: Seconds added to the task's hard time limit for the default lease.
LEASE_MARGIN_SECONDS = 30.0
#: Default lease when the task has no hard time limit.
DEFAULT_LEASE_SECONDS = 300.0


def is_retryable(exc: BaseException) -> bool:
    """Will Celery run this call again? Then the claim is released instead of failed.

    `celery.exceptions.Retry` (raised by `task.retry`, `autoretry_for` or the retry guard,
    which sits inside this one) always is. Otherwise the retry package's classifier decides;
    either way the next delivery with the same arguments may claim again, so the choice only
    changes what the record shows (an open claim or a failure with its error).
    """
    from celery.exceptions import Retry

    if isinstance(exc, Retry):
        return True
    if isinstance(exc, IdempotencyKeyReused | UnserializableResult):
        return False
    try:
        from resilience.retry.classify import is_retryable as classify
    except ImportError:  # the retry package is optional
        return False
    return classify(exc)


@dataclass(frozen=True, kw_only=True)
class IdempotencyConfig:
    """Options of `@idempotent`.

    Args:
        key: None (all bound arguments), a template like ``"transfer:{transfer_id}"``, or
            a callable receiving the bound arguments as keywords.
        ttl_seconds: how long a finished record (and its cached result) is kept and replayed.
        lease_seconds: how long a claim holds before another delivery may take it over;
            None = the task's hard time limit + 30 s. Non-transactional tasks must not
            lease for less than the hard time limit (a live holder would be overtaken).
        transactional: the body receives `session` (SQLAlchemy); its writes and the
            record's completion commit in one transaction.
        on_store_down: PostgreSQL unreachable at claim time: "fail_closed" (DEFERRED,
            the default) or "fail_open" (run unguarded, warn, count FAIL-OPEN); see
            `resilience.store_down`. A store that rejects the claim dead-letters the job.
        store_down_retry_seconds: deferral delay when the store is down.
        poll_seconds: longest deferral while another holder's claim is live.
        cache: use the Redis fast path for finished keys.
        synchronous_commit: wait for PostgreSQL's WAL flush on the claim and (outside
            transactional mode) the completion. Off by default: it halves their latency,
            and a PostgreSQL *crash* may then forget the last ~0.6 s of records, which can
            re-run a non-transactional body (the same exposure as a worker crash between
            effect and record). Transactional mode's completion commits with the body's
            writes and is always durable.
        prepared_statements: prepare the claim/completion statements once per connection
            (saves PostgreSQL's parse and plan per call); turn off behind PgBouncer in
            transaction mode before 1.21, which does not keep them.
    """

    key: KeyOption = None
    ttl_seconds: float = 86400.0
    lease_seconds: float | None = None
    transactional: bool = False
    on_store_down: StoreDown | str = StoreDown.FAIL_CLOSED
    store_down_retry_seconds: float = 5.0
    poll_seconds: float = 1.0
    cache: bool = True
    synchronous_commit: bool = False
    prepared_statements: bool = True

    def __post_init__(self) -> None:
        if not self.ttl_seconds > 0:
            raise ConfigurationError(f"ttl_seconds must be > 0, got {self.ttl_seconds!r}")
        if self.lease_seconds is not None and not self.lease_seconds > 0:
            raise ConfigurationError(f"lease_seconds must be > 0, got {self.lease_seconds!r}")
        object.__setattr__(self, "on_store_down", store_down_policy(self.on_store_down))
        if not self.store_down_retry_seconds > 0 or not self.poll_seconds > 0:
            raise ConfigurationError("store_down_retry_seconds and poll_seconds must be > 0")
        if self.key is not None and not isinstance(self.key, str) and not callable(self.key):
            raise ConfigurationError(
                f"key must be None, a template string or a callable, not {type(self.key)}"
            )


def _owner_token() -> str:
    # Unique per claim: the fencing pair is (attempt, owner), so a deleted-and-recreated
    # record (attempt back to 1) still fences out a holder from before the deletion.
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


class IdempotencyGuard(Guard):
    """Claims the call's key in PostgreSQL, replays finished keys, defers live claims."""

    name = GUARD_NAME
    stage = Stage.IDEMPOTENCY

    def __init__(self, config: IdempotencyConfig) -> None:
        self.config = config
        self.task_name = ""
        self.tier: str | None = None
        self.spec: KeySpec | None = None
        self.lease_seconds = config.lease_seconds or DEFAULT_LEASE_SECONDS
        self._store_factory: Callable[[], PostgresStore] | None = None

    # -- setup ---------------------------------------------------------------------------
    def bind(self, task: Task) -> None:
        """Build the key spec on the task's signature and settle the lease length.

        Raises:
            ConfigurationError: a non-transactional lease shorter than the hard time limit.
        """
        self.task_name = task.name
        self.tier = getattr(task, "tier", None)
        self.spec = KeySpec(task.run, self.config.key)
        time_limit = task.time_limit or task.app.conf.task_time_limit
        if self.config.lease_seconds is None:
            self.lease_seconds = (
                float(time_limit) + LEASE_MARGIN_SECONDS if time_limit else DEFAULT_LEASE_SECONDS
            )
        elif time_limit and not self.config.transactional and self.lease_seconds < time_limit:
            raise ConfigurationError(
                f"{task.name}: lease_seconds={self.lease_seconds:g} is shorter than the hard "
                f"time limit ({time_limit:g}s): a slow but live holder would be overtaken and "
                "the effect could happen twice; raise it or use transactional=True",
                task=task.name,
            )

    def key_for(self, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> GuardKey:
        """The call's key and fingerprint.

        Raises:
            ArgumentsDoNotBind, NonJsonArguments, InvalidKey.
        """
        assert self.spec is not None, "guard used before bind()"
        return self.spec.build(self.task_name, args, kwargs)

    def _stores(self, call: Call) -> Any:
        return stores_for(call.task.app)

    def store(self, call: Call) -> PostgresStore:
        return store_for(
            self._stores(call),
            synchronous_commit=self.config.synchronous_commit,
            prepared=self.config.prepared_statements,
        )

    def _cache(self, call: Call) -> ResultCache:
        return ResultCache(self._stores(call).redis())

    def _count(self, call: Call, outcome: str) -> None:
        count_call(call, outcome, guard=GUARD_NAME, name=self.task_name)

    # -- before ----------------------------------------------------------------------------
    def prefetch(self, call: Call) -> None:
        if not self.config.cache:
            return
        key = self.key_for(call.args, call.kwargs)
        state: dict[str, Any] = {"key": key}
        call.keep(self, state)
        cache = self._cache(call)
        cache.get_later(call.reads, self.task_name, key.value,
                        lambda cached: state.__setitem__("cached", cached))

    def before_run(self, call: Call) -> None:
        state: dict[str, Any] = call.kept(self) or {}
        key = state.get("key") or self.key_for(call.args, call.kwargs)
        state["key"] = key
        call.keep(self, state)
        if self.config.cache:
            if "cached" in state:
                cached = state.pop("cached")
            else:
                cached = self._cache(call).get(self.task_name, key.value)
            if cached is not None:
                if cached.fingerprint != key.fingerprint:
                    self._reused(call, key)
                self._replay(call, key, cached.result, cached.task_id, source="cache")

        owner = _owner_token()
        try:
            claim = self.store(call).claim(
                task_name=self.task_name,
                key=key.value,
                fingerprint=key.fingerprint,
                owner=owner,
                task_id=call.task_id,
                lease_seconds=self.lease_seconds,
                ttl_seconds=self.config.ttl_seconds,
            )
        except StorageError as exc:
            self._store_down(call, key, exc)
            return
        if claim.claimed:
            state["holder"] = Holder(
                task_name=self.task_name, key=key.value, attempt=claim.attempt, owner=owner
            )
            if self.config.transactional:
                self._open_transaction(call, state)
            return
        if claim.fingerprint != key.fingerprint:
            self._reused(call, key)
        if claim.state == SUCCEEDED:
            self._replay(call, key, claim.result, claim.task_id, source="database",
                         ttl_seconds=claim.expires_in_seconds)
        self._count(call, Outcome.DEFERRED.value)
        remaining = claim.lease_remaining_seconds if claim.state == IN_PROGRESS else None
        wait = min(self.config.poll_seconds, max(0.05, remaining or self.config.poll_seconds))
        raise Stop(
            Outcome.DEFERRED,
            guard=GUARD_NAME,
            reason=f"key {key.value!r} is being run by task {claim.task_id}",
            retry_after_seconds=wait,
            details={"key": key.value, "holder_task_id": claim.task_id,
                     "attempt": claim.attempt, "state": claim.state},
        )

    def _reused(self, call: Call, key: GuardKey) -> None:
        self._count(call, Outcome.REJECTED.value)
        raise IdempotencyKeyReused(
            f"{self.task_name}: idempotency key {key.value!r} was already used with different "
            "arguments; use a new key for a new request (HTTP 422 semantics)",
            key=key.value,
            task=self.task_name,
        )

    def _replay(
        self, call: Call, key: GuardKey, result: Any, task_id: str | None, *, source: str,
        ttl_seconds: float = 0.0,
    ) -> None:
        self._count(call, Outcome.REPLAYED.value)
        if source == "database" and self.config.cache and ttl_seconds > 0:
            # Warm the fast path so the next duplicate costs one Redis round trip.
            cache = self._cache(call)
            cache.put_later(
                call.writes, self.task_name, key.value,
                fingerprint=key.fingerprint, result_json=canonical_json(result),
                task_id=task_id, ttl_seconds=ttl_seconds,
            )
        raise Stop(
            Outcome.REPLAYED,
            guard=GUARD_NAME,
            reason=f"key {key.value!r} already succeeded in task {task_id}",
            result=result,
            details={"key": key.value, "original_task_id": task_id, "source": source},
        )

    def _store_down(self, call: Call, key: GuardKey, exc: StorageError) -> None:
        store_failed(call, exc, guard=GUARD_NAME, policy=self.config.on_store_down,
                     retry_after_seconds=self.config.store_down_retry_seconds,
                     name=self.task_name, details={"key": key.value})
        if self.config.transactional:
            self._open_transaction(call, call.kept(self))

    def _open_transaction(self, call: Call, state: dict[str, Any]) -> None:
        from sqlalchemy.orm import Session

        try:
            connection = self._stores(call).engine().connect()
            transaction = connection.begin()
        except Exception as exc:
            holder = state.pop("holder", None)
            if holder is not None:
                self._quietly(call, lambda: self.store(call).release(holder), "release")
            error = wrap_database_error(exc, "open transaction")
            raise Stop(
                Outcome.DEFERRED, guard=GUARD_NAME, reason=str(error),
                retry_after_seconds=self.config.store_down_retry_seconds,
                details={"store_down": True},
            ) from exc
        # rollback_only: the body's session.commit() only flushes into this transaction;
        # the guard commits it together with the record's completion.
        session = Session(bind=connection, join_transaction_mode="rollback_only",
                          expire_on_commit=False)
        state.update(connection=connection, transaction=transaction, session=session)
        call.inject["session"] = session

    # -- commit (inside every lock and lease the call holds) ---------------------------------
    def commit(self, call: Call, result: Any) -> None:
        """Record the result, with the body's writes in transactional mode, before any
        guard gives back: a lock released before this commit would let a second run read
        state without these writes (a lost update)."""
        state = call.kept(self) or {}
        holder: Holder | None = state.get("holder")
        key: GuardKey = state["key"]
        try:
            result_json = canonical_json(result)
        except NonJsonArguments as exc:
            self._close_transaction(state, commit=False)
            message = f"UnserializableResult: {exc}"
            if holder is not None:
                self._quietly(call, lambda: self.store(call).fail(
                    holder, message, self.config.ttl_seconds), "fail")
            raise UnserializableResult(
                f"{self.task_name}: the result of an idempotent task must be JSON so it can "
                f"be replayed; got {type(result).__name__}",
                key=key.value,
            ) from None
        if self.config.transactional:
            self._commit_with_record(call, state, holder, result_json)
        elif holder is not None:
            try:
                done = self.store(call).complete(holder, result_json, self.config.ttl_seconds)
            except StorageError as exc:
                # The effect happened; the record stays open until its lease ends.
                logger.error("idempotency completion of %s not recorded: %s", key.full, exc)
                self._count(call, "UNRECORDED")
                return
            if not done:
                logger.warning("idempotency claim on %s was taken over before completion "
                               "(attempt %s)", key.full, holder.attempt)
                self._count(call, "STALE")
                return
        # Committed: nothing is left to give back, whatever an outer guard does next.
        state.pop("holder", None)
        if holder is not None and self.config.cache:
            cache = self._cache(call)
            cache.put_later(
                call.writes, self.task_name, key.value,
                fingerprint=key.fingerprint, result_json=result_json, task_id=call.task_id,
                ttl_seconds=self.config.ttl_seconds,
            )

    def _commit_with_record(
        self, call: Call, state: dict[str, Any], holder: Holder | None, result_json: str
    ) -> None:
        from sqlalchemy.exc import DBAPIError

        key: GuardKey = state["key"]
        session = state["session"]
        connection = state["connection"]
        try:
            session.flush()
            if holder is not None and not self.store(call).complete_in(
                connection, holder, result_json, self.config.ttl_seconds
            ):
                raise self._rolled_back(
                    call, state, "STALE", {"attempt": holder.attempt, "stale": True},
                    f"claim on {key.value!r} was taken over (attempt {holder.attempt})")
            try:
                # The commit must happen while every lock and lease is owned: prove it.
                call.checkpoint()
            except Exception as lost:
                raise self._rolled_back(
                    call, state, "LOCK-LOST", {"lock_lost": True},
                    f"a lock or lease was lost before the commit ({lost})") from lost
            state["transaction"].commit()
        except DBAPIError as exc:
            self._close_transaction(state, commit=False)
            error = wrap_database_error(exc, "commit")
            logger.warning("idempotent commit of %s failed: %s", key.full, error)
            # Rolled back (or unknown): a later delivery replays, or reclaims after the lease;
            # a write PostgreSQL rejects (too long, a constraint) is dead-lettered instead of
            # deferred forever. The body's writes are part of this commit, so "down" never
            # means "run unguarded" here.
            store_failed(call, error, guard=GUARD_NAME, policy=StoreDown.FAIL_CLOSED,
                         retry_after_seconds=self.config.store_down_retry_seconds,
                         name=self.task_name, details={"key": key.value})
        finally:
            self._close_transaction(state, commit=False)

    def _rolled_back(self, call: Call, state: dict[str, Any], counter: str,
                     details: dict[str, Any], why: str) -> Stop:
        """Roll this run's writes back and say so: DEFERRED, counted under `counter`."""
        self._close_transaction(state, commit=False)
        self._count(call, counter)
        key: GuardKey = state["key"]
        return Stop(
            Outcome.DEFERRED, guard=GUARD_NAME,
            reason=f"{why}; this run's writes were rolled back",
            retry_after_seconds=self.config.poll_seconds,
            details={"key": key.value, **details},
        )

    def _close_transaction(self, state: dict[str, Any], *, commit: bool) -> None:
        session = state.pop("session", None)
        transaction = state.pop("transaction", None)
        connection = state.pop("connection", None)
        try:
            if session is not None:
                session.close()
            if transaction is not None and transaction.is_active:
                if commit:
                    transaction.commit()
                else:
                    transaction.rollback()
        except Exception as exc:  # noqa: BLE001 - rollback of a broken connection; it is closed
            logger.warning("idempotency transaction cleanup: %s", exc)
        finally:
            if connection is not None:
                connection.close()

    def _quietly(self, call: Call, action: Callable[[], Any], what: str) -> None:
        try:
            action()
        except StorageError as exc:
            # The lease ends on its own; only the record's view is late.
            logger.warning("idempotency %s not recorded: %s", what, exc)

    def on_error(self, call: Call, exc: BaseException) -> None:
        """Give the claim back; a transactional body whose database went away is DEFERRED.

        Its writes were rolled back with the transaction, so the job has had no effect:
        failing it would lose it (no retry policy) for what is only an outage.
        """
        state = call.kept(self) or {}
        self._close_transaction(state, commit=False)
        holder: Holder | None = state.get("holder")
        outage = self.config.transactional and _database_outage(exc)
        if holder is not None:
            store = self.store(call)
            if outage or is_retryable(exc):
                self._quietly(call, lambda: store.release(holder), "release")
            else:
                error = f"{type(exc).__name__}: {exc}"
                self._quietly(call, lambda: store.fail(holder, error, self.config.ttl_seconds),
                              "fail")
        if outage:
            self._count(call, Outcome.DEFERRED.value)
            raise Stop(
                Outcome.DEFERRED, guard=GUARD_NAME,
                reason=f"the database went away under the transactional body "
                f"({type(exc).__name__}); its writes were rolled back",
                retry_after_seconds=self.config.store_down_retry_seconds,
                details={"store_down": True},
            ) from exc

    def on_stop(self, call: Call, stop: Stop) -> None:
        # An inner guard stopped the call (lock held, breaker open): the body did not run.
        state = call.kept(self) or {}
        self._close_transaction(state, commit=False)
        holder: Holder | None = state.get("holder")
        if holder is not None:
            self._quietly(call, lambda: self.store(call).release(holder), "release")


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


def idempotent(
    key: KeyOption = None,
    *,
    ttl_seconds: float = 86400.0,
    lease_seconds: float | None = None,
    transactional: bool = False,
    on_store_down: StoreDown | str = StoreDown.FAIL_CLOSED,
    store_down_retry_seconds: float = 5.0,
    poll_seconds: float = 1.0,
    cache: bool = True,
    synchronous_commit: bool = False,
    prepared_statements: bool = True,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Make a task idempotent: one effect and one result per key within `ttl_seconds`.

    Place it under `@app.task(...)`. See `IdempotencyConfig` for the options.

    Raises:
        ConfigurationError: bad options, a key template naming a missing argument, or
            `transactional=True` on a function without a `session=None` parameter.
    """
    config = IdempotencyConfig(
        key=key, ttl_seconds=ttl_seconds, lease_seconds=lease_seconds,
        transactional=transactional, on_store_down=on_store_down,
        store_down_retry_seconds=store_down_retry_seconds, poll_seconds=poll_seconds,
        cache=cache, synchronous_commit=synchronous_commit,
        prepared_statements=prepared_statements,
    )

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        KeySpec(func, key)  # a template naming a missing argument fails here
        if transactional:
            parameter = inspect.signature(func).parameters.get("session")
            if parameter is None or parameter.default is not None or parameter.kind not in (
                inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
            ):
                raise ConfigurationError(
                    f"{func.__name__}: transactional=True gives the body a SQLAlchemy session; "
                    "declare a parameter `session: Session | None = None` for it",
                    function=func.__name__,
                )
        guard = IdempotencyGuard(config)
        attach(func, guard)
        attach(func, IdempotencyKeyGuard(guard))
        return func

    return decorate


def _database_outage(exc: BaseException) -> bool:
    """Is `exc` PostgreSQL being unreachable (not a bug, not a constraint)?"""
    from sqlalchemy.exc import DBAPIError

    from resilience.errors import StoreUnavailable

    if isinstance(exc, StoreUnavailable):
        return True
    if not isinstance(exc, DBAPIError):
        return False
    return isinstance(wrap_database_error(exc, "body"), StoreUnavailable)


IdempotencyKeyCheck = IdempotencyKeyGuard  # deprecated alias, removed in the next release
