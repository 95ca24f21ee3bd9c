"""Fleet-wide retry budget per dependency, shared in Redis (Finagle/Envoy semantics).

A retry is granted while `retries_in_window + 1 <= ratio * requests_in_window + floor`, over
a sliding window (a ring of slots); each decision is one `budget.lua` call on Redis server
time. Requests are aggregated per process (`RequestCounts`, `flush_seconds`) and a retry
decision carries the pending ones along. The rule, its bounds, the store-down policy and
what aggregation costs: docs/failure.md ("Fleet-wide retry budget", "Local state").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from resilience import flushing
from resilience.batch import for_client
from resilience.config import check, is_number
from resilience.connections import wrap_store_errors
from resilience.connections.redis import read_hashes
from resilience.errors import StorageError
from resilience.keys import redis_key, stored_keys
from resilience.scripts import LuaScript
from resilience.store_down import StoreDown, store_down_policy
from resilience.stores import stores_for

if TYPE_CHECKING:
    import redis

    from resilience.batch import Rounds

logger = logging.getLogger("resilience.retry.budget")

NAMESPACE = "resilience:budget"


def budget_key(dependency: str) -> str:
    """The Redis key of `dependency`'s budget: `resilience:budget:{<dependency>}`."""
    return redis_key(NAMESPACE, dependency)


@dataclass(frozen=True, kw_only=True)
class RetryBudget:
    """How many retries a dependency may receive, fleet-wide.

    Args:
        ratio: retries allowed per request in the window (0..1); 0.2 = at most 20 %.
        min_per_second: retries always allowed per second, so a quiet dependency can still
            be retried (the floor; Finagle's minRetriesPerSec).
        window_seconds: length of the sliding window requests and retries are counted over.
        slots: how many slices the window is cut into (its sliding granularity).
        on_store_down: "fail_open" (default: allow the retry; `max_attempts` still bounds
            it) or "fail_closed" (refuse: dead-letter) while Redis is unreachable.
        flush_seconds: how long a process holds the requests its calls counted before
            sending them as one script call; 0 = one script call per request.
    """

    ratio: float = 0.2
    min_per_second: float = 1.0
    window_seconds: float = 10.0
    slots: int = 10
    on_store_down: StoreDown | str = StoreDown.FAIL_OPEN
    flush_seconds: float = 0.1

    def __post_init__(self) -> None:
        check(self, "flush_seconds", "a number within 0..60",
              lambda v: is_number(v) and 0 <= v <= 60)
        check(self, "ratio", "within 0..1", lambda v: 0.0 <= v <= 1.0)
        check(self, "min_per_second", ">= 0", lambda v: v >= 0)
        check(self, "window_seconds", "> 0", lambda v: v > 0)
        check(self, "slots", ">= 1", lambda v: v >= 1)
        object.__setattr__(self, "on_store_down", store_down_policy(self.on_store_down))

    @property
    def floor(self) -> float:
        """Retries always allowed per window."""
        return self.min_per_second * self.window_seconds


@dataclass(frozen=True)
class BudgetDecision:
    """What the budget said: allowed, and the window's figures (for the dead-letter reason)."""

    allowed: bool
    requests: int
    retries: int
    store_down: bool = False


@dataclass(frozen=True)
class BudgetState:
    """One dependency's budget now: what its window holds and how much of it is spent."""

    dependency: str
    requests: int
    retries: int
    #: Retries the budget allows in this window: ratio * requests + floor.
    retries_allowed: float
    ratio: float
    window_seconds: float

    @classmethod
    def read(
        cls, dependency: str, budget: RetryBudget, fields: Mapping[str, str], now_ms: int
    ) -> BudgetState:
        """The state of a budget hash's `fields` at `now_ms` (server time)."""
        requests, retries = window_figures(
            fields, now_ms=now_ms, window_ms=int(budget.window_seconds * 1000), slots=budget.slots
        )
        return cls(dependency=dependency, requests=requests, retries=retries,
                   retries_allowed=budget.ratio * requests + budget.floor, ratio=budget.ratio,
                   window_seconds=budget.window_seconds)

    @property
    def used(self) -> float:
        """Share of the allowed retries spent (0.0 when none are allowed)."""
        return self.retries / self.retries_allowed if self.retries_allowed else 0.0


def window_figures(
    fields: Mapping[str, str], *, now_ms: int, window_ms: int, slots: int
) -> tuple[int, int]:
    """Requests and retries in the window of a budget hash at `now_ms` (server time), read
    as `budget.lua` reads it: a slot whose epoch left the window is skipped."""
    slot_ms = max(1, window_ms // slots)
    epoch = now_ms // slot_ms
    requests = retries = 0
    for i in range(slots):
        if int(fields.get(f"e{i}", -1)) > epoch - slots:
            requests += int(fields.get(f"q{i}", 0))
            retries += int(fields.get(f"r{i}", 0))
    return requests, retries


class RedisBudgetBackend:
    """The atomic step of the budget: one `budget.lua` call per decision."""

    SCRIPT = LuaScript.load(__file__, "budget.lua")

    def __init__(self, client: Callable[[], redis.Redis]) -> None:
        self._client = client

    @staticmethod
    def _args(mode: str, budget: RetryBudget, amount: int = 1) -> list[Any]:
        return [mode, int(budget.window_seconds * 1000), repr(float(budget.ratio)),
                repr(float(budget.floor)), budget.slots, amount]

    def decide(
        self, dependency: str, mode: str, budget: RetryBudget, amount: int = 1
    ) -> BudgetDecision:
        """Run one decision; a "request..." mode counts `amount` requests.

        Raises:
            StoreUnavailable, StoreRejected, StorageError: Redis failed (native error as cause).
        """
        with wrap_store_errors("retry budget", dependency=dependency):
            allowed, requests, retries = self.SCRIPT(
                self._client(), [budget_key(dependency)], self._args(mode, budget, amount))
        return BudgetDecision(bool(allowed), int(requests), int(retries))

    def count_later(
        self, rounds: Rounds, dependency: str, mode: str, budget: RetryBudget, amount: int = 1
    ) -> None:
        """Queue a counting mode ("request", "request+forced") in the call's write round."""

        def done(reply: Any) -> None:
            if isinstance(reply, BaseException):
                logger.warning("retry budget %s: %s not counted, %d of them (%s)",
                               dependency, mode, amount, reply)

        batch = for_client(rounds, self._client())
        batch.script(self.SCRIPT.for_client(batch.client), [budget_key(dependency)],
                     self._args(mode, budget, amount), then=done)

    def describe(
        self, budgets: Mapping[str, RetryBudget], *, include_stored: bool = False
    ) -> list[BudgetState]:
        """Live use of `budgets` (dependency -> budget) and, with `include_stored`, of every
        budget in Redis (one SCAN; an unconfigured one read with `RetryBudget()`), sorted by
        dependency; one round trip on Redis server time.

        Raises:
            StoreUnavailable, StoreRejected, StorageError: Redis failed.
        """
        with wrap_store_errors("retry budgets"):
            client = self._client()
            keys = {budget_key(dependency): dependency for dependency in budgets}
            if include_stored:
                keys = {**stored_keys(client, NAMESPACE), **keys}  # a long name: its digest
            ordered = sorted(keys.items(), key=lambda item: item[1])
            now_ms, hashes = read_hashes(client, [key for key, _ in ordered])
        return [
            BudgetState.read(dependency, budgets.get(dependency) or RetryBudget(), fields, now_ms)
            for (_, dependency), fields in zip(ordered, hashes, strict=True)
        ]


class MemoryBudgetBackend:
    """Budgets in process memory (`resilience.stores.MemoryStores`): `budget.lua`'s ring of
    slots and its decisions, step by step, under one lock on an injectable clock."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        #: dependency -> the budget hash's fields (e<i>, q<i>, r<i>), as Redis keeps them.
        self._hashes: dict[str, dict[str, str]] = {}

    def decide(
        self, dependency: str, mode: str, budget: RetryBudget, amount: int = 1
    ) -> BudgetDecision:
        now_ms = int(self.clock() * 1000)
        window_ms = int(budget.window_seconds * 1000)
        slot_ms = max(1, window_ms // budget.slots)
        epoch, slot = now_ms // slot_ms, (now_ms // slot_ms) % budget.slots
        with self._lock:
            fields = self._hashes.setdefault(dependency, {})
            requests, retries = window_figures(fields, now_ms=now_ms, window_ms=window_ms,
                                               slots=budget.slots)

            def bump(field: str, by: int) -> None:
                if fields.get(f"e{slot}") != str(epoch):
                    fields.update({f"e{slot}": str(epoch), f"q{slot}": "0", f"r{slot}": "0"})
                fields[f"{field}{slot}"] = str(int(fields[f"{field}{slot}"]) + by)

            if mode.startswith("request+"):
                if amount > 0:
                    bump("q", amount)
                    requests += amount
                mode = mode[len("request+"):]
            if mode == "request":
                bump("q", amount)
                return BudgetDecision(True, requests + amount, retries)
            if mode == "forced" or retries + 1 <= budget.ratio * requests + budget.floor:
                bump("r", 1)
                return BudgetDecision(True, requests, retries + 1)
            return BudgetDecision(False, requests, retries)

    def count_later(
        self, rounds: Rounds, dependency: str, mode: str, budget: RetryBudget, amount: int = 1
    ) -> None:
        """Count at once: memory has no round to join."""
        self.decide(dependency, mode, budget, amount)

    def describe(
        self, budgets: Mapping[str, RetryBudget], *, include_stored: bool = False
    ) -> list[BudgetState]:
        now_ms = int(self.clock() * 1000)
        with self._lock:
            names = set(budgets) | (set(self._hashes) if include_stored else set())
            hashes = {name: dict(self._hashes.get(name, {})) for name in names}
        return [
            BudgetState.read(name, budgets.get(name) or RetryBudget(), hashes[name], now_ms)
            for name in sorted(names)
        ]


def budget_backend_of_app(app: Any) -> RedisBudgetBackend | MemoryBudgetBackend:
    """The budgets of `app`'s tasks: on its shared Redis, in memory on `MemoryStores`."""
    return stores_for(app).backend(
        "retry budget", lambda stores: RedisBudgetBackend(stores.redis),
        memory=MemoryBudgetBackend,
    )


class RequestCounts:
    """Requests of one budget counted in this process and not yet sent (a
    `resilience.flushing.Aggregate`)."""

    def __init__(self, backend: RedisBudgetBackend, dependency: str, budget: RetryBudget) -> None:
        self.backend = backend
        self.dependency = dependency
        self.budget = budget
        self._pending = flushing.Pending()

    def add(self, now: float) -> None:
        self._pending.add(None, now, self.budget.flush_seconds)

    def due(self, now: float) -> bool:
        return self._pending.due(now)

    def take(self) -> int:
        return sum(self._pending.take().values())

    def flush(self, now: float, *, force: bool = False) -> bool:
        """The timer's (and shutdown's) flush; True while some are still pending. A failed
        send is logged and its requests dropped."""
        if not self._pending or not (force or self.due(now)):
            return bool(self._pending)
        amount = self.take()
        if amount:
            try:
                self.backend.decide(self.dependency, "request", self.budget, amount)
            except StorageError as exc:
                logger.warning("retry budget %s: request not counted, %d of them (%s)",
                               self.dependency, amount, exc)
        return False


class RetryBudgetGate:
    """A budget bound to a dependency and a backend, applying the store-down policy."""

    def __init__(self, dependency: str, budget: RetryBudget, backend: RedisBudgetBackend) -> None:
        self.dependency = dependency
        self.budget = budget
        self.backend = backend

    def pending(self) -> RequestCounts | None:
        """This process's unsent requests of the budget; None with `flush_seconds=0`."""
        if self.budget.flush_seconds <= 0:
            return None
        return flushing.member(
            ("budget", self.backend, self.dependency, self.budget),
            lambda: RequestCounts(self.backend, self.dependency, self.budget),
        )

    def _decide(self, mode: str) -> BudgetDecision:
        amount = 1
        pending = self.pending()
        held = pending.take() if pending is not None else 0
        if held:  # the decision takes this process's unsent requests along
            if mode.startswith("request"):
                amount += held
            else:
                mode, amount = f"request+{mode}", held
        try:
            return self.backend.decide(self.dependency, mode, self.budget, amount)
        except StorageError as exc:
            allowed = self.budget.on_store_down is StoreDown.FAIL_OPEN
            logger.warning("retry budget %s: store unavailable, %s (%s)", self.dependency,
                           "allowing" if allowed else "denying", exc)
            return BudgetDecision(allowed, 0, 0, store_down=True)

    def record_request(self) -> BudgetDecision:
        """Count one execution of a call to the dependency."""
        return self._decide("request")

    def try_spend(self, *, with_request: bool = False) -> BudgetDecision:
        """Ask for one retry; counted only when granted.

        `with_request` first counts the failed execution itself, in the same script call.
        """
        return self._decide("request+retry" if with_request else "retry")

    def record_forced_retry(self) -> BudgetDecision:
        """Count a retry the task made on its own (Celery's self.retry / autoretry_for)."""
        return self._decide("forced")

    def count_later(self, rounds: Rounds, mode: str) -> None:
        """Count "request" or "request+forced" with the call's after-run writes; a plain
        request is aggregated in the process (sent in this round once due)."""
        pending, amount = self.pending(), 1
        if pending is not None and mode == "request":
            now = time.monotonic()
            pending.add(now)
            amount = pending.take() if pending.due(now) else 0
        elif pending is not None:
            amount += pending.take()  # "request+forced": the pending requests come along
        if amount:
            self.backend.count_later(rounds, self.dependency, mode, self.budget, amount)

    def describe(self) -> BudgetState:
        """This budget's live use (see `RedisBudgetBackend.describe`).

        Raises:
            StorageError: Redis failed.
        """
        return self.backend.describe({self.dependency: self.budget})[0]
