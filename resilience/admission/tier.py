"""Tier bulkhead at enqueue (stage ADMIT): queue depth against the tier's limit; a full
tier applies its `RejectionPolicy` (abort, discard, caller_runs, wait: docs/overload.md).
Every refusal is counted (guard `bulkhead`, name = the policy).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING, Any

from resilience.admission.broker import (
    BOUND_HEADER,
    HEADERS,
    Admission,
    DepthBackend,
    depth_backend_for,
)
from resilience.config import configured
from resilience.counters import count_outcome
from resilience.errors import ConfigurationError, JobDeferred, StorageError, TierFull
from resilience.outcomes import Outcome, Stop
from resilience.pipeline import EnqueueGuard, EnqueueStage, Publish, attach
from resilience.store_down import StoreDown, store_down_policy

if TYPE_CHECKING:
    from celery import Task

logger = logging.getLogger("resilience.bulkhead")

_STATE = "bulkhead"


class RejectionPolicy(str, Enum):
    """What a full tier does with a new job."""

    ABORT = "abort"
    DISCARD = "discard"
    CALLER_RUNS = "caller_runs"
    WAIT = "wait"


@dataclass(frozen=True, kw_only=True)
class BulkheadConfig:
    """Admission limits of one tier.

    Args:
        tier: the tier's name (labels counters and errors).
        max_queue_depth: most messages waiting in the tier's queue (> 0).
        policy: what a full tier does (abort, discard, caller_runs, wait).
        wait_timeout_seconds: policy `wait`: longest block before aborting.
        retry_after_seconds: the hint `TierFull` carries for the caller.
        reservation_ttl_seconds: an admitted publish that never completes (producer died)
            stops counting against the limit after this long.
        poll_seconds: policy `wait`: first poll interval (doubles up to 0.5 s).
        on_store_down: the broker cannot be asked: "fail_open" (admit, counted FAIL-OPEN;
            the default) or "fail_closed" (raise the store's error to the caller).
    """

    tier: str
    max_queue_depth: int
    policy: RejectionPolicy = RejectionPolicy.ABORT
    wait_timeout_seconds: float = 0.0
    retry_after_seconds: float = 5.0
    reservation_ttl_seconds: float = 30.0
    poll_seconds: float = 0.02
    on_store_down: StoreDown | str = StoreDown.FAIL_OPEN

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "policy", RejectionPolicy(self.policy))
        except ValueError:
            valid = ", ".join(policy.value for policy in RejectionPolicy)
            raise ConfigurationError(
                f"unknown rejection policy {self.policy!r}; valid policies are: {valid}",
                policy=self.policy) from None
        object.__setattr__(self, "on_store_down", store_down_policy(self.on_store_down))
        if not isinstance(self.tier, str) or not self.tier:
            raise ConfigurationError(f"a bulkhead needs a tier name, got {self.tier!r}")
        depth = self.max_queue_depth
        if isinstance(depth, bool) or not isinstance(depth, int) or depth <= 0:
            raise ConfigurationError(
                f"tier {self.tier!r}: max_queue_depth must be a positive integer, got {depth!r}",
                tier=self.tier)
        for name in ("wait_timeout_seconds", "retry_after_seconds"):
            if getattr(self, name) < 0:
                raise ConfigurationError(f"tier {self.tier!r}: {name} must be >= 0",
                                         tier=self.tier)
        for name in ("reservation_ttl_seconds", "poll_seconds"):
            if not getattr(self, name) > 0:
                raise ConfigurationError(f"tier {self.tier!r}: {name} must be > 0",
                                         tier=self.tier)


@dataclass(frozen=True)
class DiscardedResult:
    """What `apply_async` returns when a full tier discarded the job (nothing was sent)."""

    task_name: str
    tier: str
    queue: str
    depth: int
    limit: int
    outcome: Outcome = field(default=Outcome.DISCARDED)
    id: None = None
    state: str = "DISCARDED"

    def ready(self) -> bool:
        return True

    def successful(self) -> bool:
        return False

    def failed(self) -> bool:
        return False

    def get(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The outcome as the dict a guard-stopped task returns."""
        return {"outcome": self.outcome.value, "guard": AdmissionGuard.name,
                "reason": f"tier {self.tier!r} full ({self.depth}/{self.limit}); job discarded",
                "details": {"tier": self.tier, "queue": self.queue, "depth": self.depth,
                            "limit": self.limit}}


@dataclass(frozen=True)
class _Taken:
    """What an admitted publish holds: a reservation to release, or None when the broker
    bounds the queue itself as it takes the message (nothing reserved)."""

    config: BulkheadConfig
    queue: str
    backend: DepthBackend
    reservation: str | None


ConfigSource = BulkheadConfig | Callable[["Task"], "BulkheadConfig | None"]


def queue_of(publish: Publish) -> str:
    """The queue a publish goes to: `queue=` option, the task's queue, or the default."""
    queue = publish.options.get("queue")
    if queue is not None:
        return str(getattr(queue, "name", queue))
    task_queue = getattr(publish.task, "queue", None)
    if task_queue:
        return str(getattr(task_queue, "name", task_queue))
    return str(publish.task.app.conf.task_default_queue)


class AdmissionGuard(EnqueueGuard):
    """Admit a publish only while the target queue is below its tier's depth limit.

    Args:
        config: a `BulkheadConfig`, or a callable giving the config for a task (None: no
            bulkhead), so apps pass their own settings without this package importing them.
        backend: depth backend; None picks the app broker's (Redis or RabbitMQ).
        sleep, clock: injectable for the `wait` policy.

    A task's own `@bulkhead` replaces the platform default: `GuardedTask` drops a class-level
    guard whose name a decorator guard already has, so one admission decides per publish.
    """

    name = "bulkhead"
    stage = EnqueueStage.ADMIT

    def __init__(self, config: ConfigSource, *, backend: DepthBackend | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not isinstance(config, BulkheadConfig) and not callable(config):
            raise ConfigurationError("config must be a BulkheadConfig or a callable(task)")
        self.config = config
        self.backend = backend
        self.sleep = sleep
        self.clock = clock

    def config_for(self, task: Task) -> BulkheadConfig | None:
        return self.config if isinstance(self.config, BulkheadConfig) else self.config(task)

    # -- the decision ------------------------------------------------------------------
    def before_publish(self, publish: Publish) -> None:
        config = self.config_for(publish.task)
        if config is None:
            return
        backend = self.backend or depth_backend_for(publish.task.app)
        queue = queue_of(publish)
        bound = (None if config.policy is RejectionPolicy.WAIT
                 else backend.transport_bound(queue, config.max_queue_depth))
        if bound is not None:
            # The broker checks the depth as it takes the message (Redis: one script;
            # RabbitMQ: x-max-length with reject-publish); a full queue comes back as an
            # error from the publish, and give_back applies the policy.
            if bound:
                publish.options["headers"] = {**(publish.options.get("headers") or {}),
                                              BOUND_HEADER: bound}
            publish.state[_STATE] = _Taken(config, queue, backend, None)
            return
        reservation = uuid.uuid4().hex
        decision = self._try(backend, publish, config, queue, reservation)
        if not decision.admitted and config.policy is RejectionPolicy.WAIT:
            decision = self._wait(backend, publish, config, queue, reservation)
        if not decision.admitted:
            self._reject(publish, config, queue, decision)
        publish.state[_STATE] = _Taken(config, queue, backend, reservation)

    def _try(self, backend: DepthBackend, publish: Publish, config: BulkheadConfig,
             queue: str, reservation: str) -> Admission:
        try:
            return backend.try_admit(queue, limit=config.max_queue_depth, reservation=reservation,
                                     reservation_ttl_seconds=config.reservation_ttl_seconds)
        except StorageError as error:
            if config.on_store_down is StoreDown.FAIL_CLOSED:
                raise
            logger.warning("tier %s: depth unknown, admitting (fail open): %s", config.tier, error)
            self._count(publish, config, Outcome.FAIL_OPEN.value, "depth-unknown")
            return Admission(True, -1)

    def _wait(self, backend: DepthBackend, publish: Publish, config: BulkheadConfig,
              queue: str, reservation: str) -> Admission:
        deadline = self.clock() + config.wait_timeout_seconds
        interval = config.poll_seconds
        decision = Admission(False, -1)
        while True:
            remaining = deadline - self.clock()
            if remaining <= 0:
                return decision
            self.sleep(min(interval, remaining))
            interval = min(interval * 2, 0.5)
            decision = self._try(backend, publish, config, queue, reservation)
            if decision.admitted:
                return decision

    def _reject(self, publish: Publish, config: BulkheadConfig, queue: str,
                decision: Admission) -> None:
        task = publish.task
        policy = config.policy
        discard = policy is RejectionPolicy.DISCARD
        self._count(publish, config, (Outcome.DISCARDED if discard else Outcome.REJECTED).value,
                    policy.value)
        if discard:
            result = DiscardedResult(task_name=task.name, tier=config.tier, queue=queue,
                                     depth=decision.depth, limit=config.max_queue_depth)
            raise Stop(Outcome.DISCARDED, guard=self.name, reason=result.get()["reason"],
                       result=result, details=result.get()["details"])
        if policy is RejectionPolicy.CALLER_RUNS:
            eager = task.apply(publish.args, publish.kwargs, task_id=publish.task_id,
                               headers=publish.options.get("headers"))
            if isinstance(eager.result, JobDeferred):
                # A guard deferred the inline run: nothing was queued and nothing ran, so
                # the caller must hear it (a result would look like a finished job).
                deferred = eager.result
                raise JobDeferred(
                    f"tier {config.tier!r} full; ran in the caller, which was "
                    f"{deferred.message}; retry after "
                    f"{deferred.fields.get('retry_after_seconds', 1.0):g}s",
                    **{**deferred.fields, "tier": config.tier, "policy": policy.value})
            raise Stop(Outcome.REJECTED, guard=self.name,
                       reason=f"tier {config.tier!r} full; ran in the caller", result=eager,
                       details={"tier": config.tier, "policy": policy.value})
        raise TierFull(
            f"tier {config.tier!r} is full: {decision.depth} messages waiting (+"
            f"{decision.reserved} being published), limit {config.max_queue_depth}; retry "
            f"after {config.retry_after_seconds:g}s",
            tier=config.tier, queue=queue, depth=decision.depth,
            limit=config.max_queue_depth, retry_after=config.retry_after_seconds,
            policy=policy.value)

    def after_publish(self, publish: Publish, result: Any) -> None:
        self._release(publish)

    def give_back(self, publish: Publish, error: BaseException) -> None:
        """The publish raised (or a later guard refused): the reservation goes back now
        instead of counting against the tier until it expires.

        Raises:
            TierFull / Stop: the broker refused the publish for a full queue (`QueueFull`:
                the transport's bound, RabbitMQ's own, or a race the check could not see):
                the tier's policy answers in its place, as it would have before publishing.
        """
        taken = self._release(publish)
        if taken is None:
            return
        for header in HEADERS:  # an inline run (caller_runs) must not carry them
            (publish.options.get("headers") or {}).pop(header, None)
        full = taken.backend.refusal(error, taken.queue, taken.config.max_queue_depth)
        if full is not None:
            self._reject(publish, taken.config, taken.queue,
                         Admission(False, int(full.depth), int(full.reserved)))

    def _release(self, publish: Publish) -> _Taken | None:
        """Give the publish's reservation back (if it holds one); what it held."""
        taken: _Taken | None = publish.state.pop(_STATE, None)
        if taken is not None and taken.reservation is not None:
            try:
                taken.backend.release(taken.queue, taken.reservation)
            except StorageError as error:
                # The reservation expires on its own after reservation_ttl_seconds.
                logger.warning("admission reservation on %s not released: %s", taken.queue,
                               error)
        return taken

    def _count(self, publish: Publish, config: BulkheadConfig, outcome: str, name: str) -> None:
        count_outcome(publish.task.app, outcome, guard=self.name, tier=config.tier, name=name)


def bulkhead(config: BulkheadConfig | None = None, /, *, backend: DepthBackend | None = None,
             sleep: Callable[[float], None] = time.sleep,
             **overrides: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: a task's own admission limit, in place of its tier's default.

    Takes a `BulkheadConfig` and/or keyword overrides of its fields (options, defaults and
    meaning: `BulkheadConfig`; `max_queue_depth` is required). Without a `tier` the task's
    `tier` attribute labels counters and errors at enqueue.

    Raises:
        ConfigurationError: an unknown option, max_queue_depth missing or <= 0, unknown
            policy, negative timeout.
    """
    own_tier = config is not None or overrides.get("tier") is not None
    if not own_tier:
        overrides = {**overrides, "tier": "task"}
    template = configured(BulkheadConfig, config, overrides, where="bulkhead")

    def config_for(task: Task) -> BulkheadConfig:
        if own_tier:
            return template
        return replace(template, tier=str(getattr(task, "tier", None) or task.name))

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        return attach(func, AdmissionGuard(config_for, backend=backend, sleep=sleep))

    return decorate
