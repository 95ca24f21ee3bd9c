"""The limit algorithms: pure functions of (state, now), and the registry that names them.

An algorithm is one `Algorithm` in `ALGORITHMS`: its pure step (what the memory backend
runs), the Lua script running the same arithmetic on Redis server time, and how its state is
stored; a new one is a class here, a `.lua` file and a registry entry. Times are integer
microseconds so Python and Lua agree exactly (Lua numbers are doubles, exact to 2**53).
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

from resilience.errors import ConfigurationError
from resilience.holders import Holder
from resilience.ratelimit.rates import Rate


@dataclass(frozen=True)
class Decision:
    """One limiter decision.

    Args:
        allowed: a permit or slot was granted.
        retry_after_seconds: when denied, the earliest time a retry can succeed (0 if allowed).
        now_seconds: the decision's time on the store's clock (Redis server time).
        used: permits in the window / slots held after the decision.
    """

    allowed: bool
    retry_after_seconds: float
    now_seconds: float
    used: int = 0


@dataclass(frozen=True, kw_only=True)
class Params:
    """The figures of one limit, in whole microseconds; each algorithm reads what it needs.

    Args:
        limit: permits per period, or slots.
        period_us: the rate's period (a sliding window's length), or a slot's lease.
        interval_us: microseconds between permits at the steady rate (GCRA's T); 0 takes
            period / limit rounded up (`Rate.emission_interval_us`).
        burst: permits that may be taken at once (GCRA).
        cost: permits one request takes (GCRA).
    """

    limit: int
    period_us: int
    interval_us: int = 0
    burst: int = 1
    cost: int = 1

    def __post_init__(self) -> None:
        if self.interval_us <= 0:
            object.__setattr__(self, "interval_us", max(1, math.ceil(self.period_us / self.limit)))

    @classmethod
    def of_rate(cls, rate: Rate, *, burst: int = 1) -> Params:
        """The figures of `rate` (its interval exact, from the rate as written)."""
        return cls(limit=rate.limit, period_us=round(rate.period_seconds * 1_000_000),
                   interval_us=rate.emission_interval_us, burst=burst)

    @classmethod
    def of_slots(cls, limit: int, *, lease_seconds: float) -> Params:
        """The figures of a semaphore of `limit` slots leased for `lease_seconds`."""
        return cls(limit=limit, period_us=round(lease_seconds * 1_000_000))


@dataclass
class WaitingLine:
    """Where denied callers wait: first denied, first served.

    A denied caller is told to come back when the next permit frees plus one spacing per
    caller ahead of it, so N deferred jobs return spread at the limit's rate instead of all
    at once; a caller denied again keeps its place; a granted caller leaves the line. Ranking
    against the line (not against a precomputed schedule) adapts when callers come back late.
    """

    arrivals: dict[str, int] = field(default_factory=dict)

    def retry_after(self, caller: str, now_us: int, excess_us: int, spacing_us: int) -> int:
        """Microseconds until `caller` should try again (it was just denied)."""
        self.arrivals.setdefault(caller, now_us)
        # Callers join in time order, so their position in the dict is their place in line.
        ahead = list(self.arrivals).index(caller)
        return excess_us + ahead * spacing_us

    def granted(self, caller: str) -> None:
        """`caller` got its permit: it leaves the line."""
        self.arrivals.pop(caller, None)


class Schema(Enum):
    """How an algorithm's state is stored; a backend decodes each schema in one place."""

    #: One time in microseconds, or none yet (GCRA's theoretical arrival time).
    TIME = "time"
    #: Grant times in microseconds, oldest first (a sliding window's log).
    LOG = "log"
    #: Holder id -> lease expiry in microseconds (a lease semaphore).
    LEASES = "leases"


@dataclass(frozen=True, kw_only=True)
class Lease(Holder):
    """A semaphore slot's holder, with the time its lease has left (negative: lapsed)."""

    expires_in_seconds: float


@dataclass(frozen=True, kw_only=True)
class LimiterState:
    """What one limiter holds now (`LimiterBackend.describe`), for admin views.

    Args:
        key: the limiter's key as the guard built it (a digested key shows `#<sha256>`).
        used: slots held by live leases / grants in the window.
        holders: a semaphore's leases, lapsed ones with `alive=False`.
        figures: the algorithm's own figures (`ahead_seconds`, `in_window`).
        now_seconds: when it was read, on the store's clock (epoch seconds).
    """

    algorithm: str
    key: str
    now_seconds: float = 0.0
    used: int = 0
    waiting: int = 0
    holders: tuple[Lease, ...] = ()
    figures: dict[str, float] = field(default_factory=dict)


class Algorithm:
    """One limit algorithm: its pure step, its Lua script, the schema of its state.

    Subclasses set the class attributes and implement `step`; the rest has defaults.
    """

    #: Registry name (`RateLimitConfig.algorithm`).
    name: ClassVar[str]
    #: Part of its Redis keys (`<prefix>:<namespace>:{<key>}`): keeps the stored layout.
    namespace: ClassVar[str]
    #: Lua file in `resilience/ratelimit/backends/` running `step` atomically; contract:
    #: KEYS = [state] (+ [waiting line] when `waits`), ARGV = `arguments(...)`, reply
    #: {allowed 0|1, retry_after_us, now_us[, used]}.
    script: ClassVar[str]
    #: Lua file giving a holder's slot back (KEYS = [state], ARGV = [holder]), if it holds.
    release_script: ClassVar[str | None] = None
    schema: ClassVar[Schema]
    #: Denied callers wait in a line and come back spread `spacing_us` apart.
    waits: ClassVar[bool] = False
    #: A grant is a slot the caller gives back (`release`), not a permit spent.
    holds: ClassVar[bool] = False
    #: `Params.burst` means something to it.
    bursts: ClassVar[bool] = False

    def step(self, state: Any, now_us: int, params: Params, caller: str) -> tuple[bool, Any, int]:
        """Decide one request at `now_us`; `state` is None before the first.

        Returns:
            (allowed, new_state, retry_after_us).
        """
        raise NotImplementedError

    def arguments(self, params: Params, caller: str) -> list[int | str]:
        """ARGV of `script` for one request (see its contract comment)."""
        raise NotImplementedError

    def spacing_us(self, params: Params) -> int:
        """Microseconds between two waiters' retry times (when `waits`)."""
        return params.interval_us * params.cost

    def used(self, state: Any, now_us: int) -> int:
        """Permits in the window / live slots in `state` (0 when it keeps no count)."""
        return 0

    def release(self, state: Any, now_us: int, caller: str) -> tuple[bool, Any]:
        """Give `caller`'s slot back: (it still held a live one, new state).

        Raises:
            ConfigurationError: the algorithm holds no slots.
        """
        raise ConfigurationError(f"algorithm {self.name!r} holds no slots to release")

    def figures(self, state: Any, now_us: int) -> dict[str, float]:
        """The algorithm's own figures of `state` (`LimiterState.figures`)."""
        return {}

    def holders(self, key: str, state: Any, now_us: int) -> tuple[Lease, ...]:
        """The slots' holders in `state` (`LimiterState.holders`)."""
        return ()

    def describe(self, key: str, state: Any, now_us: int, waiting: int = 0) -> LimiterState:
        """The live figures of `state` at `now_us`."""
        return LimiterState(
            algorithm=self.name, key=key, now_seconds=now_us / 1e6,
            used=self.used(state, now_us), waiting=waiting,
            holders=self.holders(key, state, now_us), figures=self.figures(state, now_us),
        )

    def __repr__(self) -> str:
        return f"<algorithm {self.name}>"


def gcra(
    tat_us: int | None, now_us: int, *, interval_us: int, burst: int, cost: int = 1
) -> tuple[bool, int, int]:
    """Generic cell rate algorithm: one number of state (the theoretical arrival time).

    A request is allowed when, after adding `cost` emission intervals, the theoretical
    arrival time is at most `burst` intervals ahead of now. With `interval_us` rounded up
    (`Rate.emission_interval_us`) any window of one period holds at most
    `limit + burst - 1` permits (docs/overload.md, "Bounds").

    Returns:
        (allowed, new_tat_us, retry_after_us); new_tat_us is the state to store.
    """
    tat = max(tat_us if tat_us is not None else now_us, now_us)
    new_tat = tat + interval_us * cost
    excess = new_tat - now_us - interval_us * burst
    if excess > 0:
        return False, tat, excess
    return True, new_tat, 0


def sliding_window(
    grants_us: list[int], now_us: int, *, limit: int, window_us: int
) -> tuple[bool, list[int], int]:
    """Strict sliding log: at most `limit` grants in any window of `window_us`.

    `grants_us` are earlier grant times, oldest first. Grants at or before now - window
    have left the window.

    Returns:
        (allowed, kept_grants_us, retry_after_us); kept includes the new grant if allowed.
    """
    kept = [grant for grant in grants_us if grant > now_us - window_us]
    if len(kept) < limit:
        return True, [*kept, now_us], 0
    return False, kept, kept[0] + window_us - now_us


class Gcra(Algorithm):
    """GCRA: O(1) state, permits evenly spaced, `burst` at once (see `gcra`)."""

    name = "gcra"
    namespace = "gcra"
    script = "gcra.lua"
    schema = Schema.TIME
    waits = True
    bursts = True

    def step(
        self, state: int | None, now_us: int, params: Params, caller: str
    ) -> tuple[bool, int, int]:
        return gcra(
            state, now_us, interval_us=params.interval_us, burst=params.burst, cost=params.cost
        )

    def arguments(self, params: Params, caller: str) -> list[int | str]:
        return [params.interval_us, params.burst, params.cost, caller]

    def figures(self, state: int | None, now_us: int) -> dict[str, float]:
        tat = state if state is not None else now_us
        return {"ahead_seconds": max(0.0, (tat - now_us) / 1e6)}


class SlidingWindow(Algorithm):
    """Strict sliding log: never more than `limit` in any window; O(limit) state."""

    name = "sliding_window"
    namespace = "window"
    script = "window.lua"
    schema = Schema.LOG
    waits = True

    def step(
        self, state: list[int] | None, now_us: int, params: Params, caller: str
    ) -> tuple[bool, list[int], int]:
        return sliding_window(state or [], now_us, limit=params.limit, window_us=params.period_us)

    def arguments(self, params: Params, caller: str) -> list[int | str]:
        return [params.limit, params.period_us, uuid.uuid4().hex, caller]

    def spacing_us(self, params: Params) -> int:
        return params.period_us // params.limit

    def used(self, state: list[int] | None, now_us: int) -> int:
        return len(state or [])

    def figures(self, state: list[int] | None, now_us: int) -> dict[str, float]:
        return {"in_window": self.used(state, now_us)}


class LeaseSemaphore(Algorithm):
    """Counting semaphore whose slots are leases (holder -> expiry): an expired lease is
    reclaimed, so a dead holder's slot returns; a holder that has a slot renews it."""

    name = "lease"
    namespace = "concurrency"
    script = "lease_acquire.lua"
    release_script = "lease_release.lua"
    schema = Schema.LEASES
    holds = True

    def step(
        self, state: dict[str, int] | None, now_us: int, params: Params, caller: str
    ) -> tuple[bool, dict[str, int], int]:
        live = {name: expiry for name, expiry in (state or {}).items() if expiry > now_us}
        if caller in live or len(live) < params.limit:
            live[caller] = now_us + params.period_us
            return True, live, 0
        return False, live, min(live.values()) - now_us  # when the earliest lease ends

    def arguments(self, params: Params, caller: str) -> list[int | str]:
        return [params.limit, params.period_us, caller]

    def used(self, state: dict[str, int] | None, now_us: int) -> int:
        return sum(1 for expiry in (state or {}).values() if expiry > now_us)

    def release(
        self, state: dict[str, int] | None, now_us: int, caller: str
    ) -> tuple[bool, dict[str, int]]:
        remaining = dict(state or {})
        expiry = remaining.pop(caller, None)
        return expiry is not None and expiry > now_us, remaining

    def holders(self, key: str, state: dict[str, int] | None, now_us: int) -> tuple[Lease, ...]:
        leases = sorted((state or {}).items(), key=lambda item: (item[1], item[0]))
        return tuple(
            Lease(kind="concurrency", key=key, owner=holder, alive=expiry > now_us,
                  expires_in_seconds=(expiry - now_us) / 1e6)
            for holder, expiry in leases
        )


GCRA = Gcra()
SLIDING_WINDOW = SlidingWindow()
LEASE = LeaseSemaphore()

#: Every algorithm by name; backends run any of them, tests run each on every backend.
ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (GCRA, SLIDING_WINDOW, LEASE)}
#: The algorithms a rate limit may use (permits spent, not slots held).
RATE_ALGORITHMS: tuple[str, ...] = tuple(n for n, a in ALGORITHMS.items() if not a.holds)


def algorithm_named(name: str | Algorithm) -> Algorithm:
    """The registered algorithm `name` (an `Algorithm` is returned as is).

    Raises:
        ConfigurationError: no algorithm of that name.
    """
    if isinstance(name, Algorithm):
        return name
    try:
        return ALGORITHMS[name]
    except (KeyError, TypeError):
        raise ConfigurationError(
            f"unknown limit algorithm {name!r}; use one of {', '.join(ALGORITHMS)}"
        ) from None
