"""Execution guards: cluster-wide concurrency limit and rate limit (stage LIMITS).

No slot or no permit ends the call with `Stop(DEFERRED)`: the message is republished with a
countdown (the computed retry-after), so a waiting job never spins and never spends a retry.
When the store is down the guards fail open by default (`on_store_down="fail_open"`: run,
warn, count `FAIL-OPEN`); `"fail_closed"` defers instead. A store that rejects the decision
(`StoreRejected`) dead-letters the job.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from resilience.counters import count_call
from resilience.errors import ConfigurationError, StorageError
from resilience.keys import KeyOption, KeySpec
from resilience.outcomes import Outcome, Stop
from resilience.pipeline import Call, Guard, Stage, attach
from resilience.ratelimit.algorithms import Decision
from resilience.ratelimit.rates import Rate, parse
from resilience.store_down import StoreDown, resolve, store_failed

if TYPE_CHECKING:
    from celery import Task

    from resilience.ratelimit.backends import LimiterBackend

logger = logging.getLogger("resilience.ratelimit")

Algorithm = Literal["gcra", "sliding_window"]
#: Called with (call, limit key, decision) after every decision: grant times for audits.
DecisionHook = Callable[[Call, str, Decision], None]
ALGORITHMS: tuple[str, ...] = ("gcra", "sliding_window")

#: Seconds added to the task's hard time limit for a default lease: the hard limit kills
#: the process, so a lease this long never ends while its holder still runs.
LEASE_MARGIN_SECONDS = 10.0


def split_name(name_or_key: str, key: KeyOption) -> tuple[str, KeyOption]:
    """`"customer:{customer_id}"` -> ("customer", "{customer_id}"); a plain name stays.

    Raises:
        ConfigurationError: empty name, a template without a name prefix, or a template
            together with `key=`.
    """
    if not isinstance(name_or_key, str) or not name_or_key.strip():
        raise ConfigurationError(f"a limit needs a non-empty name, got {name_or_key!r}")
    if "{" not in name_or_key:
        return name_or_key, key
    if key is not None:
        raise ConfigurationError(f"limit {name_or_key!r} is a key template; do not also pass key=")
    prefix, brace, rest = name_or_key.partition("{")
    name = prefix.rstrip(":-_/ ")
    if not name:
        raise ConfigurationError(
            f"key template {name_or_key!r} needs a name before the first field, e.g. "
            "'vendor:{customer_id}'; or pass the name and key= separately"
        )
    return name, prefix[len(name):].lstrip(":-_/ ") + brace + rest


def _validate_common(config: Any, name: str, retry_seconds: float) -> None:
    if not name:
        raise ConfigurationError("a limit needs a non-empty name")
    if not retry_seconds > 0:
        raise ConfigurationError(f"retry_seconds must be positive, got {retry_seconds!r}")
    object.__setattr__(config, "on_store_down", resolve(
        config.on_store_down, config.fail_open, legacy_option="fail_open",
        default=StoreDown.FAIL_OPEN))


@dataclass(frozen=True, kw_only=True)
class ConcurrencyLimitConfig:
    """At most `limit` executions at once across the fleet, per `name` (and key).

    Args:
        name: the limit's name (a dependency: "payments-api"); counters use it.
        limit: slots (> 0).
        lease_seconds: how long a slot is held if its holder never releases it (SIGKILL);
            None takes the task's hard time limit plus 10 s. It must not be shorter than
            the hard time limit, or a slow holder's slot would be handed to a second one.
        retry_seconds: typical countdown when no slot is free (jittered 0.5x-1.5x, and
            never past the earliest lease expiry).
        on_store_down: "fail_open" (default: run anyway) or "fail_closed" (defer).
        fail_open: deprecated spelling of `on_store_down` (True / False).
    """

    name: str
    limit: int
    lease_seconds: float | None = None
    retry_seconds: float = 1.0
    on_store_down: StoreDown | str | None = None
    fail_open: bool | None = None

    def __post_init__(self) -> None:
        _validate_common(self, self.name, self.retry_seconds)
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit <= 0:
            raise ConfigurationError(
                f"concurrency limit {self.name!r}: limit must be a positive integer, got "
                f"{self.limit!r}", name=self.name,
            )
        if self.lease_seconds is not None and not self.lease_seconds > 0:
            raise ConfigurationError(
                f"concurrency limit {self.name!r}: lease_seconds must be positive, got "
                f"{self.lease_seconds!r}", name=self.name,
            )


@dataclass(frozen=True, kw_only=True)
class RateLimitConfig:
    """At most `rate` permits across the fleet, per `name` (and key).

    Args:
        name: the limit's name; counters use it.
        rate: `Rate` or notation such as "100/minute".
        algorithm: "gcra" (O(1) state, smooth; default) or "sliding_window" (strict quota:
            never more than `limit` in any window; O(limit) state).
        burst: GCRA only; permits that may be taken at once (default 1: evenly spaced,
            which also keeps every window of one period within the limit).
        retry_seconds: countdown when the store failed and fail_open is False.
        on_store_down: "fail_open" (default: run anyway) or "fail_closed" (defer).
        fail_open: deprecated spelling of `on_store_down` (True / False).
    """

    name: str
    rate: Rate
    algorithm: Algorithm = "gcra"
    burst: int = 1
    retry_seconds: float = 1.0
    on_store_down: StoreDown | str | None = None
    fail_open: bool | None = None

    def __post_init__(self) -> None:
        _validate_common(self, self.name, self.retry_seconds)
        if not isinstance(self.rate, Rate):
            object.__setattr__(self, "rate", parse(self.rate))
        if self.algorithm not in ALGORITHMS:
            raise ConfigurationError(
                f"rate limit {self.name!r}: unknown algorithm {self.algorithm!r}; use one of "
                f"{', '.join(ALGORITHMS)}", name=self.name,
            )
        if isinstance(self.burst, bool) or not isinstance(self.burst, int) or self.burst < 1:
            raise ConfigurationError(
                f"rate limit {self.name!r}: burst must be an integer >= 1, got {self.burst!r}",
                name=self.name,
            )
        if self.algorithm == "sliding_window" and self.burst != 1:
            raise ConfigurationError(
                f"rate limit {self.name!r}: burst applies to gcra only; a sliding window "
                "allows its whole limit at once", name=self.name,
            )


class _LimitGuard(Guard):
    """Shared parts: key per call, backend per app, counting, fail-open."""

    stage = Stage.RATE

    def __init__(
        self,
        config: Any,
        *,
        key: KeyOption = None,
        func: Callable[..., Any] | None = None,
        backend: LimiterBackend | None = None,
        random_fraction: Callable[[], float] = random.random,
        on_decision: DecisionHook | None = None,
    ) -> None:
        self.config = config
        self.on_decision = on_decision
        self.keys = KeySpec(func, key) if (key is not None and func is not None) else None
        if key is not None and func is None:
            raise ConfigurationError("a keyed limit needs the task function (use the decorator)")
        self.backend = backend
        self.random_fraction = random_fraction

    def bind(self, task: Task) -> None:
        if self.keys is not None:
            # The task's `run` drops `self` for bind=True tasks, as call.args do.
            self.keys = KeySpec(task.run, self.keys.key)
        if self.backend is None:
            from resilience.ratelimit.backends.redis import RedisBackend
            from resilience.stores import stores_for

            stores = stores_for(task.app)
            self.backend = RedisBackend(stores.redis)

    def describe(self, task: Task | None = None) -> dict[str, Any]:
        key = self.keys.key if self.keys is not None else None
        return {"key": key, **super().describe(task)} if key is not None else super().describe(task)

    def limit_key(self, call: Call) -> str:
        if self.keys is None:
            return self.config.name
        return self.keys.build(self.config.name, call.args, call.kwargs).full

    def counter(self, call: Call, outcome: str) -> None:
        count_call(call, outcome, guard=self.name, name=self.config.name)

    def observe(self, call: Call, key: str, decision: Decision) -> None:
        """Hand the decision to `on_decision` (metrics, audit); its errors never fail a job."""
        if self.on_decision is None:
            return
        try:
            self.on_decision(call, key, decision)
        except Exception as exc:  # noqa: BLE001 - an observer must not change the outcome
            logger.warning("%s on_decision hook failed: %s", self.name, exc)

    def countdown(self, decision: Decision) -> float:
        """Seconds until the deferred message comes back: the store's retry-after."""
        return max(0.05, decision.retry_after_seconds)

    def defer(self, call: Call, key: str, decision: Decision, reason: str) -> Stop:
        self.counter(call, Outcome.DEFERRED.value)
        return Stop(
            Outcome.DEFERRED,
            guard=self.name,
            reason=reason,
            retry_after_seconds=self.countdown(decision),
            details={"limit": self.config.name, "key": key, "used": decision.used},
        )

    def store_failed(self, call: Call, key: str, error: StorageError) -> None:
        store_failed(call, error, guard=self.name, policy=self.config.on_store_down,
                     retry_after_seconds=self.config.retry_seconds, name=self.config.name,
                     details={"limit": self.config.name, "key": key})


class ConcurrencyGuard(_LimitGuard):
    """Cluster-wide semaphore: a slot is a lease in Redis, released after the body.

    Race timeline a lease covers: worker A takes a slot, is SIGKILLed before releasing;
    its lease expires at acquire + lease_seconds on Redis's clock, and the next acquire
    after that reclaims it (ZREMRANGEBYSCORE) in the same script that grants the new slot.
    """

    name = "concurrency"
    stage = Stage.CONCURRENCY
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
                "time_limit", name=self.config.name,
            )

    def lease_for(self, call: Call) -> float:
        if self.config.lease_seconds is not None:
            return self.config.lease_seconds
        hard = getattr(call.task, "time_limit", None) or 300.0
        return float(hard) + LEASE_MARGIN_SECONDS

    def countdown(self, decision: Decision) -> float:
        typical = self.config.retry_seconds * (0.5 + self.random_fraction())
        # A slot is certainly free once the earliest lease ends; usually sooner (release).
        return max(0.05, min(typical, decision.retry_after_seconds or typical))

    def before_run(self, call: Call) -> None:
        assert self.backend is not None
        key = self.limit_key(call)
        holder = f"{call.task_id or 'inline'}:{uuid.uuid4().hex[:12]}"
        try:
            decision = self.backend.acquire_lease(
                key, holder=holder, limit=self.config.limit, lease_seconds=self.lease_for(call)
            )
        except StorageError as error:
            self.store_failed(call, key, error)
            return
        self.observe(call, key, decision)
        if not decision.allowed:
            raise self.defer(
                call, key, decision,
                f"all {self.config.limit} slots of {key!r} are taken",
            )
        call.keep(self, (key, holder))


    def release(self, call: Call) -> None:
        taken = call.take_back(self)
        if taken is None or self.backend is None:
            return
        key, holder = taken
        try:
            if not self.backend.release_lease(key, holder=holder):
                logger.warning("concurrency slot %s of %s had expired before release",
                               holder, key)
        except StorageError as error:
            # The lease expires on its own; nothing is lost but the slot's remaining time.
            logger.warning("concurrency slot %s of %s not released: %s", holder, key, error)


class RateLimitGuard(_LimitGuard):
    """Cluster-wide rate limit on Redis server time; no permit → DEFERRED until retry-after."""

    name = "rate-limit"
    stage = Stage.RATE
    config: RateLimitConfig

    def decide(self, key: str, caller: str | None = None) -> Decision:
        assert self.backend is not None
        rate = self.config.rate
        if self.config.algorithm == "gcra":
            return self.backend.gcra(
                key, interval_seconds=rate.emission_interval_us / 1e6, burst=self.config.burst,
                caller=caller,
            )
        return self.backend.sliding_window(
            key, limit=rate.limit, window_seconds=rate.period_seconds, caller=caller
        )

    def countdown(self, decision: Decision) -> float:
        # The store already gave each waiter its own slot; a little late is harmless, early
        # would be denied again, so the jitter only adds (at most 20 ms).
        return max(0.05, decision.retry_after_seconds) + 0.02 * self.random_fraction()

    def before_run(self, call: Call) -> None:
        key = self.limit_key(call)
        try:
            decision = self.decide(key, call.task_id)
        except StorageError as error:
            self.store_failed(call, key, error)
            return
        self.observe(call, key, decision)
        if not decision.allowed:
            raise self.defer(call, key, decision, f"rate {self.config.rate} of {key!r} reached")


def limit_concurrency(
    name_or_key: str,
    limit: int,
    *,
    lease_seconds: float | None = None,
    key: KeyOption = None,
    retry_seconds: float = 1.0,
    on_store_down: StoreDown | str = StoreDown.FAIL_OPEN,
    fail_open: bool | None = None,
    backend: LimiterBackend | None = None,
    on_decision: DecisionHook | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: at most `limit` executions at once across every worker.

    `@limit_concurrency("payments-api", 10)`; per key:
    `@limit_concurrency("customer:{customer_id}", 2)` or `key=` a template or callable.

    Raises:
        ConfigurationError: limit <= 0, bad lease, a key template naming no argument.
    """
    name, key = split_name(name_or_key, key)
    config = ConcurrencyLimitConfig(name=name, limit=limit, lease_seconds=lease_seconds,
                                    retry_seconds=retry_seconds, on_store_down=on_store_down,
                             fail_open=fail_open)

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        return attach(func, ConcurrencyGuard(config, key=key, func=func, backend=backend,
                                                 on_decision=on_decision))

    return decorate


def rate_limit(
    name_or_key: str,
    rate: str | Rate,
    *,
    algorithm: Algorithm = "gcra",
    burst: int = 1,
    key: KeyOption = None,
    retry_seconds: float = 1.0,
    on_store_down: StoreDown | str = StoreDown.FAIL_OPEN,
    fail_open: bool | None = None,
    backend: LimiterBackend | None = None,
    on_decision: DecisionHook | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: at most `rate` ("100/minute") permits across every worker.

    Raises:
        ConfigurationError: unparsable rate, limit <= 0, unknown algorithm, bad burst.
    """
    name, key = split_name(name_or_key, key)
    config = RateLimitConfig(name=name, rate=parse(rate), algorithm=algorithm, burst=burst,
                             retry_seconds=retry_seconds, on_store_down=on_store_down,
                             fail_open=fail_open)

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        return attach(func, RateLimitGuard(config, key=key, func=func, backend=backend,
                                               on_decision=on_decision))

    return decorate


ConcurrencyLimit = ConcurrencyGuard  # deprecated alias, removed in the next release
RateLimit = RateLimitGuard  # deprecated alias, removed in the next release
