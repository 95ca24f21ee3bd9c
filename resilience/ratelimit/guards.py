"""Execution guards: cluster-wide concurrency limit and rate limit (stages CONCURRENCY, RATE).

Flow only: options in `config.py`, arithmetic in `algorithms.py`, state in a backend. No slot
or permit: `Stop(DEFERRED)`, republished after the store's retry-after, so a waiting job never
spins nor spends a retry. Store down, store rejecting: see docs/overload.md.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from resilience.config import configured
from resilience.errors import ConfigurationError, StorageError
from resilience.keys import KeyOption, KeySpec
from resilience.outcomes import Outcome, Stop
from resilience.pipeline import Call, Guard, Stage, attach
from resilience.ratelimit.algorithms import LEASE, Algorithm, Decision, Params, algorithm_named
from resilience.ratelimit.backends.memory import MemoryBackend
from resilience.ratelimit.backends.redis import RedisBackend
from resilience.ratelimit.config import ConcurrencyLimitConfig, RateLimitConfig, split_name
from resilience.ratelimit.rates import Rate
from resilience.store_down import store_failed
from resilience.stores import stores_for

if TYPE_CHECKING:
    from celery import Task

    from resilience.ratelimit.backends import LimiterBackend

logger = logging.getLogger("resilience.ratelimit")

#: Called with (call, limit key, decision) after every decision: grant times for audits.
DecisionHook = Callable[[Call, str, Decision], None]

#: Seconds added to the task's hard time limit for a default lease: the hard limit kills
#: the process, so a lease this long never ends while its holder still runs.
LEASE_MARGIN_SECONDS = 10.0


class _LimitGuard(Guard):
    """One step of `algorithm` per call: key per call, backend per app, defer, fail-open.

    A subclass says who asks (`caller`), with which figures (`params`), how long a denied
    call waits (`countdown`) and what a grant leaves to give back (`granted`).
    """

    config: Any
    algorithm: Algorithm

    def __init__(
        self, config: Any, *, key: KeyOption = None, func: Callable[..., Any] | None = None,
        backend: LimiterBackend | None = None,
        random_fraction: Callable[[], float] = random.random,
        on_decision: DecisionHook | None = None,
    ) -> None:
        if key is not None and func is None:
            raise ConfigurationError("a keyed limit needs the task function (use the decorator)")
        self.config = config
        self.keys = KeySpec(func, key) if (key is not None and func is not None) else None
        self.backend = backend
        self.random_fraction = random_fraction
        self.on_decision = on_decision

    def bind(self, task: Task) -> None:
        if self.keys is not None:
            # The task's `run` drops `self` for bind=True tasks, as call.args do.
            self.keys = KeySpec(task.run, self.keys.key)
        if self.backend is None:
            self.backend = stores_for(task.app).backend(
                "limits", lambda stores: RedisBackend(stores.redis), memory=MemoryBackend)

    def describe(self, task: Task | None = None) -> dict[str, Any]:
        options = super().describe(task)
        return {"key": self.keys.key, **options} if self.keys is not None else options

    def limit_key(self, call: Call) -> str:
        """The limit's key for `call`: its name, or `name:value` of a keyed limit."""
        if self.keys is None:
            return self.config.name
        return self.keys.build(self.config.name, call.args, call.kwargs).full

    # -- what a subclass decides ---------------------------------------------------------
    def caller(self, call: Call) -> str | None:
        """Who asks, as the algorithm knows it (None: the backend draws one)."""
        return call.task_id

    def params(self, call: Call) -> Params:
        """The limit's figures for `call`."""
        raise NotImplementedError

    def refused(self, key: str) -> str:
        """The reason a denied call is given."""
        raise NotImplementedError

    def countdown(self, decision: Decision) -> float:
        """Seconds until the deferred message comes back."""
        raise NotImplementedError

    def granted(self, call: Call, key: str, caller: str | None) -> None:
        """A permit or slot was granted; keep what must be given back."""

    # -- the flow ------------------------------------------------------------------------
    def before_run(self, call: Call) -> None:
        assert self.backend is not None, "bind() sets the backend"
        key = self.limit_key(call)
        caller = self.caller(call)
        try:
            decision = self.backend.run(self.algorithm, key, self.params(call), caller)
        except StorageError as error:
            store_failed(call, error, guard=self.name, policy=self.config.on_store_down,
                         retry_after_seconds=self.config.retry_seconds, name=self.config.name,
                         details={"limit": self.config.name, "key": key})
            return
        if self.on_decision is not None:
            try:
                self.on_decision(call, key, decision)
            except Exception as exc:  # noqa: BLE001 - an observer must not change the outcome
                logger.warning("%s on_decision hook failed: %s", self.name, exc)
        if not decision.allowed:
            call.count(Outcome.DEFERRED, guard=self.name, name=self.config.name)
            raise Stop(Outcome.DEFERRED, guard=self.name, reason=self.refused(key),
                       retry_after_seconds=self.countdown(decision),
                       details={"limit": self.config.name, "key": key, "used": decision.used})
        self.granted(call, key, caller)


class ConcurrencyGuard(_LimitGuard):
    """Cluster-wide semaphore: a slot is a lease in the store, released after the body.

    Race timeline a lease covers: worker A takes a slot, is SIGKILLed before releasing;
    its lease expires at acquire + lease_seconds on Redis's clock, and the next acquire
    after that reclaims it (ZREMRANGEBYSCORE) in the same script that grants the new slot.
    """

    name = "concurrency"
    stage = Stage.CONCURRENCY
    algorithm = LEASE
    config: ConcurrencyLimitConfig

    def bind(self, task: Task) -> None:
        super().bind(task)
        hard = getattr(task, "time_limit", None)
        lease = self.config.lease_seconds
        if lease is not None and hard and lease < hard:
            raise ConfigurationError(
                f"{task.name}: concurrency limit {self.config.name!r} lease_seconds={lease:g} "
                f"is shorter than the task's hard time limit ({hard:g}s): a slow holder's "
                "slot would be given to another execution; raise lease_seconds or lower "
                "time_limit",
                name=self.config.name,
            )

    def lease_for(self, call: Call) -> float:
        """The lease of `call`'s slot: the configured one, or the hard time limit + margin."""
        if self.config.lease_seconds is not None:
            return self.config.lease_seconds
        hard = getattr(call.task, "time_limit", None) or 300.0
        return float(hard) + LEASE_MARGIN_SECONDS

    def caller(self, call: Call) -> str:
        # Unique per execution: a redelivered message must not renew its dead twin's slot.
        return f"{call.task_id or 'inline'}:{uuid.uuid4().hex[:12]}"

    def params(self, call: Call) -> Params:
        return Params.of_slots(self.config.limit, lease_seconds=self.lease_for(call))

    def refused(self, key: str) -> str:
        return f"all {self.config.limit} slots of {key!r} are taken"

    def countdown(self, decision: Decision) -> float:
        typical = self.config.retry_seconds * (0.5 + self.random_fraction())
        # A slot is certainly free once the earliest lease ends; usually sooner (release).
        return max(0.05, min(typical, decision.retry_after_seconds or typical))

    def granted(self, call: Call, key: str, caller: str | None) -> None:
        call.keep(self, (key, caller))

    def release(self, call: Call) -> None:
        taken = call.take_back(self)
        if taken is None or self.backend is None:
            return
        key, holder = taken
        try:
            if not self.backend.release(self.algorithm, key, holder):
                logger.warning("concurrency slot %s of %s had expired before release", holder, key)
        except StorageError as error:
            # The lease expires on its own; nothing is lost but the slot's remaining time.
            logger.warning("concurrency slot %s of %s not released: %s", holder, key, error)


class RateLimitGuard(_LimitGuard):
    """Cluster-wide rate limit on Redis server time; no permit → DEFERRED until retry-after."""

    name = "rate-limit"
    stage = Stage.RATE
    config: RateLimitConfig

    def __init__(self, config: RateLimitConfig, **options: Any) -> None:
        super().__init__(config, **options)
        self.algorithm = algorithm_named(config.algorithm)
        self._params = config.params()

    def params(self, call: Call) -> Params:
        return self._params

    def refused(self, key: str) -> str:
        return f"rate {self.config.rate} of {key!r} reached"

    def countdown(self, decision: Decision) -> float:
        # The store already gave each waiter its own slot; a little late is harmless, early
        # would be denied again, so the jitter only adds (at most 20 ms).
        return max(0.05, decision.retry_after_seconds) + 0.02 * self.random_fraction()


def _decorator(
    guard: type[_LimitGuard], config_class: type[Any], first: Any, second: Any,
    second_name: str, key: KeyOption, overrides: dict[str, Any], where: str, **options: Any,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A limit decorator attaching one `guard`: its config from a config instance, or a name
    (template) and its second positional argument; keyword overrides replace fields."""
    if second is not None:
        overrides[second_name] = second
    if isinstance(first, config_class):
        config = configured(config_class, first, overrides, where=where)
    else:
        name, key = split_name(first, key)
        config = configured(config_class, None, {"name": name, **overrides}, where=where)
    return lambda func: attach(func, guard(config, key=key, func=func, **options))


def limit_concurrency(
    name_or_config: str | ConcurrencyLimitConfig,
    limit: int | None = None,
    /,
    *,
    key: KeyOption = None,
    backend: LimiterBackend | None = None,
    on_decision: DecisionHook | None = None,
    **overrides: Any,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: at most `limit` executions at once across every worker.

    `@limit_concurrency("payments-api", 10)`; per key:
    `@limit_concurrency("customer:{customer_id}", 2)` or `key=` a template or callable; or
    `@limit_concurrency(ConcurrencyLimitConfig(...), lease_seconds=30)`. Options, defaults
    and meaning: `ConcurrencyLimitConfig`.

    Raises:
        ConfigurationError: an unknown option, limit <= 0, bad lease, a key template naming
            no argument.
    """
    return _decorator(ConcurrencyGuard, ConcurrencyLimitConfig, name_or_config, limit, "limit",
                      key, overrides, "limit_concurrency", backend=backend, on_decision=on_decision)


def rate_limit(
    name_or_config: str | RateLimitConfig,
    rate: str | Rate | None = None,
    /,
    *,
    key: KeyOption = None,
    backend: LimiterBackend | None = None,
    on_decision: DecisionHook | None = None,
    **overrides: Any,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: at most `rate` ("100/minute") permits across every worker.

    `@rate_limit("vendor-api", "100/minute", burst=5)` or
    `@rate_limit(RateLimitConfig(...), burst=5)`. Options, defaults and meaning:
    `RateLimitConfig`.

    Raises:
        ConfigurationError: an unknown option, unparsable rate, limit <= 0, unknown
            algorithm, bad burst.
    """
    return _decorator(RateLimitGuard, RateLimitConfig, name_or_config, rate, "rate", key,
                      overrides, "rate_limit", backend=backend, on_decision=on_decision)
