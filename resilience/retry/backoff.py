"""Backoff strategies: small objects `wait(attempt, previous_delay_seconds) -> seconds` that
compose, in tenacity's `wait_*` style.

`attempt` is the number of the attempt that just failed (1 for the first call);
`previous_delay_seconds` is the delay chosen before it (None on the first failure).
Randomness is injectable (`random=`), so tests pin it instead of sleeping.

- `wait_fixed(s)`, `wait_random(a, b)`, `wait_exponential(base=, cap=)`: the building blocks;
- `wait_full_jitter(base=, cap=)` (the default): uniform(0, min(cap, base * 2 ** (attempt - 1))),
  the AWS Architecture Blog's recommended default; spreads a herd of retries evenly;
- `wait_decorrelated_jitter(base=, cap=)`: min(cap, uniform(base, previous * 3)); grows from
  the delay actually used, so one job's retries correlate less with other jobs';
- `a + b` waits the sum: `wait_exponential(base=1, cap=30) + wait_random(0, 1)`.
"""

from __future__ import annotations

import random as random_module
from collections.abc import Callable
from dataclasses import dataclass, field

from resilience.errors import ConfigurationError

Random = Callable[[], float]


class Wait:
    """A backoff strategy; `+` adds two of them."""

    def __call__(self, attempt: int, previous_delay_seconds: float | None = None) -> float:
        raise NotImplementedError

    def __add__(self, other: Wait) -> Wait:
        if not isinstance(other, Wait):
            return NotImplemented
        return wait_combine(self, other)

    def __radd__(self, other: object) -> Wait:
        # sum([...]) starts from 0.
        if other == 0:
            return self
        return NotImplemented


def _non_negative(**values: float) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ConfigurationError(f"{name} must be a number >= 0, got {value!r}", option=name)


def _base_and_cap(base: float, cap: float) -> None:
    _non_negative(base=base, cap=cap)
    if cap < base:
        raise ConfigurationError(f"cap ({cap}) must be >= base ({base})", option="cap")


@dataclass(frozen=True)
class wait_fixed(Wait):
    """Always `seconds`."""

    seconds: float

    def __post_init__(self) -> None:
        _non_negative(seconds=self.seconds)

    def __call__(self, attempt: int, previous_delay_seconds: float | None = None) -> float:
        return float(self.seconds)


@dataclass(frozen=True)
class wait_random(Wait):
    """uniform(`low`, `high`) seconds."""

    low: float = 0.0
    high: float = 1.0
    random: Random = field(default=random_module.random, compare=False, kw_only=True)

    def __post_init__(self) -> None:
        _non_negative(low=self.low, high=self.high)
        if self.high < self.low:
            raise ConfigurationError(f"high ({self.high}) must be >= low ({self.low})",
                                     option="high")

    def __call__(self, attempt: int, previous_delay_seconds: float | None = None) -> float:
        return self.low + (self.high - self.low) * self.random()


@dataclass(frozen=True, kw_only=True)
class wait_exponential(Wait):
    """min(`cap`, `base` * 2 ** (attempt - 1)) seconds, no randomness."""

    base: float = 1.0
    cap: float = 60.0

    def __post_init__(self) -> None:
        _base_and_cap(self.base, self.cap)

    def __call__(self, attempt: int, previous_delay_seconds: float | None = None) -> float:
        return min(self.cap, self.base * 2 ** max(0, min(attempt - 1, 62)))


@dataclass(frozen=True, kw_only=True)
class wait_full_jitter(Wait):
    """uniform(0, min(`cap`, `base` * 2 ** (attempt - 1))) seconds."""

    base: float = 1.0
    cap: float = 60.0
    random: Random = field(default=random_module.random, compare=False)

    def __post_init__(self) -> None:
        _base_and_cap(self.base, self.cap)

    def __call__(self, attempt: int, previous_delay_seconds: float | None = None) -> float:
        ceiling = min(self.cap, self.base * 2 ** max(0, min(attempt - 1, 62)))
        return ceiling * self.random()


@dataclass(frozen=True, kw_only=True)
class wait_decorrelated_jitter(Wait):
    """min(`cap`, uniform(`base`, 3 * previous)) seconds; previous starts at `base`."""

    base: float = 1.0
    cap: float = 60.0
    random: Random = field(default=random_module.random, compare=False)

    def __post_init__(self) -> None:
        _base_and_cap(self.base, self.cap)

    def __call__(self, attempt: int, previous_delay_seconds: float | None = None) -> float:
        previous = max(self.base, previous_delay_seconds or self.base)
        return min(self.cap, self.base + (previous * 3 - self.base) * self.random())


class wait_combine(Wait):
    """The sum of several strategies' waits (what `a + b` builds)."""

    def __init__(self, *strategies: Wait) -> None:
        for strategy in strategies:
            if not isinstance(strategy, Wait):
                raise ConfigurationError(
                    f"wait_combine takes Wait strategies, got {strategy!r}", option="backoff")
        flat: list[Wait] = []
        for strategy in strategies:
            flat.extend(strategy.strategies if isinstance(strategy, wait_combine) else [strategy])
        self.strategies = tuple(flat)

    def __call__(self, attempt: int, previous_delay_seconds: float | None = None) -> float:
        return sum(strategy(attempt, previous_delay_seconds) for strategy in self.strategies)

    def __repr__(self) -> str:
        return " + ".join(repr(strategy) for strategy in self.strategies)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, wait_combine) and self.strategies == other.strategies

    def __hash__(self) -> int:
        return hash(self.strategies)


def check_backoff(value: object) -> Wait:
    """`value` if it is a strategy.

    Raises:
        ConfigurationError: anything else; a string names the object to use instead.
    """
    if isinstance(value, Wait):
        return value
    if isinstance(value, str):
        raise ConfigurationError(
            f"backoff={value!r}: strategies are objects, e.g. "
            "backoff=wait_full_jitter(base=1, cap=60) or wait_decorrelated_jitter(...) "
            "(resilience.retry.backoff)",
            option="backoff",
        )
    raise ConfigurationError(
        f"backoff must be a Wait strategy (resilience.retry.backoff), got {value!r}",
        option="backoff",
    )


def delay_with_retry_after(
    strategy: Wait, attempt: int, previous_delay_seconds: float | None, retry_after: float | None
) -> float:
    """The strategy's delay, raised to the dependency's Retry-After when it asked for more."""
    delay = strategy(attempt, previous_delay_seconds)
    if retry_after is not None:
        delay = max(delay, retry_after)
    return delay
