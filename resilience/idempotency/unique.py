"""`@unique`: `.delay()` of a job already queued (or running) returns the existing job.

One Lua script takes `resilience:unique:{<task>:<key>}` for the new task id or names the
holder (`UniqueEnqueueGuard`); the key is given back, only while it still names this job
(compare-and-delete), when the job starts or finishes (`UniqueReleaseGuard`), or at once
when a later enqueue guard or the publish fails. A queue dedupe, not a guarantee: see
docs/idempotency.md (`@unique`, a duplicate with its own task id).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from celery import signals, states
from celery.app.task import Context
from celery.exceptions import Retry
from celery.utils.dispatch import Signal

from resilience.admission.broker import UNIQUE_HEADER, broker_redis, guarded_publish
from resilience.config import check, configured
from resilience.counters import count_outcome
from resilience.errors import (
    DuplicateJob,
    JobStopped,
    ResilienceError,
    StoreUnavailable,
)
from resilience.keys import KeyOption, KeySpec, redis_key
from resilience.outcomes import Outcome, Stop
from resilience.pipeline import Call, EnqueueGuard, EnqueueStage, Guard, Publish, Stage, attach
from resilience.scripts import LuaScript
from resilience.store_down import StoreDown, store_down_policy
from resilience.stores import stores_for

if TYPE_CHECKING:
    import redis
    from celery import Task

logger = logging.getLogger("resilience.idempotency.unique")

UniqueMode = Literal["until_started", "until_finished"]
GUARD_NAME = "unique"
NAMESPACE = "resilience:unique"
ACQUIRE = LuaScript.load(__file__, "unique_acquire.lua")
RELEASE = LuaScript.load(__file__, "unique_release.lua")
#: `Publish.state` entry: the task id the caller fixed before the enqueue, or None.
_GIVEN_TASK_ID = "unique:given_task_id"

#: Sent in the producer when an enqueue whose task id was fixed by its caller is answered by
#: the job holding its unique key (the id's outcome is stored already). Arguments: `sender`
#: (the task), `task_id` (the id that will never run), `holder` (the holding job's id),
#: `key`, `headers` (the message headers it would have had). A receiver that raises makes
#: the enqueue raise that error (the outbox relay then tries the row again).
job_deduplicated = Signal(name="resilience.job_deduplicated")


@dataclass(frozen=True, kw_only=True)
class UniqueConfig:
    """Options of `@unique`.

    Args:
        ttl_seconds: longest time a key is held (a lost job frees it after this).
        mode: "until_started" (a new copy may be queued once this one starts) or
            "until_finished" (not until it finished).
        raise_on_duplicate: raise `DuplicateJob` instead of returning the existing job.
        key: None (all bound arguments), a template, or a callable (see `KeySpec`).
        on_store_down: Redis unreachable at enqueue: "fail_open" (enqueue anyway, counted
            FAIL-OPEN; the default: unique is a dedupe, not a guarantee) or "fail_closed"
            (raise `StoreUnavailable` to the caller).
    """

    ttl_seconds: float = 3600.0
    mode: UniqueMode = "until_started"
    raise_on_duplicate: bool = False
    key: KeyOption = None
    on_store_down: StoreDown | str = StoreDown.FAIL_OPEN

    def __post_init__(self) -> None:
        object.__setattr__(self, "on_store_down", store_down_policy(self.on_store_down))
        check(self, "ttl_seconds", "> 0", lambda v: v > 0)
        check(self, "mode", "'until_started' or 'until_finished'",
              lambda v: v in ("until_started", "until_finished"))


class UniqueKeys:
    """The unique keys of one task: shared by its enqueue guard and its release guard."""

    def __init__(self, config: UniqueConfig) -> None:
        self.config = config
        self.task_name = ""
        self.tier: str | None = None
        self.spec: KeySpec | None = None

    def bind(self, task: Task) -> None:
        if self.spec is None:
            self.task_name = task.name
            self.tier = getattr(task, "tier", None)
            self.spec = KeySpec(task.run, self.config.key)

    def redis_key(self, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> str:
        assert self.spec is not None, "guard used before bind()"
        return redis_key(NAMESPACE, f"{self.task_name}:{self.spec.value(args, kwargs)}")

    @staticmethod
    def store(app: Any) -> RedisUniqueKeys | MemoryUniqueKeys:
        """The keys' store: the broker's Redis when its transport checks them in the push
        (`resilience.admission.broker`: one round trip per `.delay()`), else the shared
        Redis, or memory with `MemoryStores`."""
        if guarded_publish(app):
            return RedisUniqueKeys(broker_redis(app))
        return stores_for(app).backend(
            "unique", lambda stores: RedisUniqueKeys(stores.redis()), memory=MemoryUniqueKeys
        )

    def release(self, store: RedisUniqueKeys | MemoryUniqueKeys, key: str,
                task_id: str | None) -> None:
        if task_id is None:
            return
        try:
            store.release(key, task_id)
        except Exception as exc:  # noqa: BLE001 - the key expires with its TTL anyway
            logger.warning("unique key %s not released: %s", key, exc)


class RedisUniqueKeys:
    """Unique keys in Redis: the two scripts, one round trip each."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def acquire(self, key: str, task_id: str, ttl_ms: int) -> str | None:
        """Take `key` for `task_id`; None when taken, else the task id holding it."""
        return ACQUIRE(self.client, [key], [task_id, ttl_ms])

    def release(self, key: str, task_id: str) -> None:
        """Delete `key` if it still names `task_id`."""
        RELEASE(self.client, [key], [task_id])


class MemoryUniqueKeys:
    """Unique keys in process memory (`resilience.stores.MemoryStores`): the scripts'
    decisions under one lock, on the monotonic clock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[str, tuple[str, float]] = {}

    def acquire(self, key: str, task_id: str, ttl_ms: int) -> str | None:
        now = time.monotonic()
        with self._lock:
            held = self._keys.get(key)
            if held is not None and held[1] > now:
                return held[0]
            self._keys[key] = (task_id, now + ttl_ms / 1000)
            return None

    def release(self, key: str, task_id: str) -> None:
        with self._lock:
            held = self._keys.get(key)
            if held is not None and held[0] == task_id:
                del self._keys[key]


class _OnKeys:
    """The unique guards' shared part: their task's `UniqueKeys`, bound with the task."""

    name = GUARD_NAME

    def __init__(self, keys: UniqueKeys) -> None:
        self.keys = keys

    def bind(self, task: Task) -> None:
        self.keys.bind(task)


class UniqueEnqueueGuard(_OnKeys, EnqueueGuard):
    """Refuses a second copy of a queued job: returns its AsyncResult or raises DuplicateJob."""

    stage = EnqueueStage.UNIQUE

    def before_publish(self, publish: Publish) -> None:
        key = self.keys.redis_key(publish.args, publish.kwargs)
        publish.state[_GIVEN_TASK_ID] = publish.task_id
        # The route publishes with `publish.task_id`, so the key names the real job.
        task_id = publish.task_id = publish.task_id or str(uuid.uuid4())
        ttl_ms = max(1, int(self.keys.config.ttl_seconds * 1000))
        if guarded_publish(publish.task.app):
            # The transport takes the key in the push itself; a duplicate comes back as
            # DuplicateJob from the publish, answered in give_back.
            headers = dict(publish.options.get("headers") or {})
            headers[UNIQUE_HEADER] = {"key": key, "task_id": task_id, "ttl_ms": ttl_ms}
            publish.options["headers"] = headers
            publish.state[GUARD_NAME] = (key, task_id, True)  # taken in the push
            return
        store = self.keys.store(publish.task.app)
        try:
            holder = store.acquire(key, task_id, ttl_ms)
        except Exception as exc:
            if self.keys.config.on_store_down is StoreDown.FAIL_CLOSED:
                raise StoreUnavailable(
                    f"{self.keys.task_name}: unique check impossible, Redis unavailable "
                    f"({type(exc).__name__}); not enqueued (on_store_down='fail_closed')",
                    key=key) from exc
            logger.warning("unique check of %s skipped, Redis unavailable: %s", key, exc)
            self._count(publish, Outcome.FAIL_OPEN.value)
            return
        if holder is None:
            publish.state[GUARD_NAME] = (key, task_id, False)
            return
        self._duplicate(publish, key, holder)

    def _duplicate(self, publish: Publish, key: str, holder: str) -> None:
        """Answer a duplicate: the existing job's AsyncResult (a Stop) or `DuplicateJob`,
        after giving a task id fixed by the caller its outcome (`settle`).

        A holder that is this very task id (the outbox relay publishing a row again) is the
        job itself, already queued: its AsyncResult, never an error."""
        self._count(publish, Outcome.REJECTED.value)
        stop = Stop(Outcome.REJECTED, guard=GUARD_NAME, reason=f"duplicate of queued job {holder}",
                    result=publish.task.AsyncResult(holder),
                    details={"key": key, "existing_task_id": holder})
        own_id = publish.state.get(_GIVEN_TASK_ID)
        if own_id is not None and own_id != holder:
            self.settle(publish, str(own_id), stop)
        if self.keys.config.raise_on_duplicate and own_id != holder:
            raise self._error(key, holder)
        raise stop

    def _error(self, key: str, holder: str) -> DuplicateJob:
        return DuplicateJob(
            f"{self.keys.task_name}: a job with this key is already queued or running "
            f"(task id {holder})", key=key, task_id=holder)

    def settle(self, publish: Publish, task_id: str, stop: Stop) -> None:
        """Store the outcome of `task_id`, a duplicate that will never run, as a worker
        that stopped it would (`GuardedTask.stopped`), then send `job_deduplicated`.

        - default: the REJECTED outcome (`Stop.as_result()`, naming the holder in
          `details.existing_task_id`) as its result, state SUCCESS, so `.get()` returns it;
        - `raise_on_duplicate`: a FAILURE with `DuplicateJob`, so `.get()` raises it;
        - a chord member: a FAILURE the chord counts (`JobStopped`, or `DuplicateJob` with
          `raise_on_duplicate`), so the chord fails (`ChordError`) instead of waiting for
          a member that never runs; its body never gets an outcome as a result;
        - the first link of a chain: the same FAILURE, which Celery's backend carries to
          every later link, so the chain's `.get()` raises instead of waiting forever.

        Raises:
            StoreUnavailable: the outcome could not be stored (the id would stay PENDING).
            Exception: what a `job_deduplicated` receiver raised.
        """
        task = publish.task
        holder = str(stop.details["existing_task_id"])
        request = _request_of(publish, task_id)
        try:  # a failure: Celery's backend fails the chord or the chain's rest with it
            if self.keys.config.raise_on_duplicate or request.chord or request.chain:
                error: ResilienceError = (
                    self._error(str(stop.details["key"]), holder)
                    if self.keys.config.raise_on_duplicate else
                    JobStopped(f"{stop.outcome.value} by {GUARD_NAME}: {stop.reason}; a "
                               "chord member or chain link that did not run fails its "
                               "chord or chain",
                               outcome=stop.outcome.value, guard=GUARD_NAME,
                               details=stop.details))
                task.backend.mark_as_failure(task_id, error, request=request)
            else:
                outcome = stop.as_result()
                outcome.pop("result", None)  # the holder's AsyncResult: named in details
                task.backend.store_result(task_id, outcome, states.SUCCESS, request=request)
        except Exception as exc:
            raise StoreUnavailable(
                f"{task.name}[{task_id}]: duplicate of {holder}, but its outcome could not "
                f"be stored ({type(exc).__name__}: {exc}); it would stay PENDING",
                key=stop.details["key"], task_id=task_id,
            ) from exc
        logger.info("%s[%s] not enqueued: its unique key is held by %s", task.name, task_id,
                    holder, extra={"task_id": task_id, "task_name": task.name,
                                   "guard": GUARD_NAME, "outcome": stop.outcome.value})
        headers = dict(publish.options.get("headers") or {})
        for _receiver, answer in job_deduplicated.send(
                sender=task, task_id=task_id, holder=holder, key=stop.details["key"],
                headers=headers):
            if isinstance(answer, Exception):
                raise answer

    def _count(self, publish: Publish, outcome: str) -> None:
        count_outcome(publish.task.app, outcome, guard=GUARD_NAME, tier=self.keys.tier,
                      name=self.keys.task_name)

    def give_back(self, publish: Publish, error: BaseException) -> None:
        """A later guard refused the job or the publish failed: the key names no job, so
        it is released at once (only if it still names this task id)."""
        taken = publish.state.pop(GUARD_NAME, None)
        if taken is None:
            return
        key, task_id, in_push = taken
        if in_push:
            (publish.options.get("headers") or {}).pop(UNIQUE_HEADER, None)
            if isinstance(error, DuplicateJob) and error.fields.get("key") == key:
                self._duplicate(publish, key, str(error.fields["task_id"]))
        # Compare-and-delete: a no-op when the key was never taken for this task id.
        self.keys.release(self.keys.store(publish.task.app), key, task_id)


class UniqueReleaseGuard(_OnKeys, Guard):
    """Gives the unique key back when the job starts or finishes (per `mode`)."""

    # Outermost, so the key is released even when the deadline guard sheds the job.
    stage = Stage.UNIQUE

    def _release(self, call: Call) -> None:
        try:
            key = self.keys.redis_key(call.args, call.kwargs)
        except Exception as exc:  # noqa: BLE001 - bad arguments fail the task elsewhere
            logger.warning("unique key not computable: %s", exc)
            return
        self.keys.release(self.keys.store(call.task.app), key, call.task_id)

    def before_run(self, call: Call) -> None:
        if self.keys.config.mode == "until_started":
            self._release(call)

    def after_run(self, call: Call, result: Any) -> None:
        if self.keys.config.mode == "until_finished":
            self._release(call)

    def on_error(self, call: Call, exc: BaseException) -> None:
        # A retry keeps the same task id in the queue: the job is not finished.
        if self.keys.config.mode == "until_finished" and not isinstance(exc, Retry):
            self._release(call)

    def on_stop(self, call: Call, stop: Stop) -> None:
        if self.keys.config.mode == "until_finished" and stop.outcome is not Outcome.DEFERRED:
            self._release(call)


def unique(
    config: UniqueConfig | None = None, /, **overrides: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Enqueue at most one copy of a job per key while it is queued (or running).

    Place it under `@app.task(...)`. Takes a `UniqueConfig` and/or keyword overrides of its
    fields (options, defaults and meaning: `UniqueConfig`).

    Raises:
        ConfigurationError: bad or unknown options, or a key template naming a missing
            argument.
    """
    config = configured(UniqueConfig, config, overrides, where="unique")

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        KeySpec(func, config.key)  # a template naming a missing argument fails here
        keys = UniqueKeys(config)
        attach(func, UniqueEnqueueGuard(keys))
        attach(func, UniqueReleaseGuard(keys))
        return func

    return decorate


def _release_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    """A revoked job will never run: give its unique key back (if the key still names it).

    Celery's worker sends `task_revoked` when it drops a revoked message (or terminates the
    job); without this a `mode="until_finished"` key would name a dead job for its TTL.
    """
    pipelines = getattr(sender, "pipelines", None)
    if pipelines is None or request is None:
        return
    try:
        execution, _ = pipelines()
        releases = [g for g in execution.guards if isinstance(g, UniqueReleaseGuard)]
        if not releases:
            return
        store = UniqueKeys.store(sender.app)
        args = list(getattr(request, "args", None) or ())
        kwargs = dict(getattr(request, "kwargs", None) or {})
        for guard in releases:
            guard.keys.release(store, guard.keys.redis_key(args, kwargs),
                               getattr(request, "id", None))
    except Exception as exc:  # noqa: BLE001 - the key still expires with its TTL
        logger.warning("unique key of revoked job not released: %s", exc)


signals.task_revoked.connect(_release_revoked, weak=False)


def _request_of(publish: Publish, task_id: str) -> Context:
    """The request the duplicate would have run with, as far as the result backend needs
    it: its group and chord (a chord counts its members by id), arguments, headers."""
    options = publish.options
    queue = options.get("routing_key") or options.get("queue")
    return Context(
        id=task_id, task=publish.task.name, args=list(publish.args), kwargs=dict(publish.kwargs),
        group=options.get("group_id"), headers=dict(options.get("headers") or {}),
        delivery_info={"routing_key": queue if isinstance(queue, str) else None},
        **{name: options.get(name)
           for name in ("group_index", "chord", "chain", "root_id", "parent_id")})
