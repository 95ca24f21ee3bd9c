"""Backoff strategies, tenacity's `wait_*` style: `wait(attempt, previous_delay_seconds) ->
seconds`; `a + b` waits the sum.

`attempt` is the attempt that just failed (1 for the first call); `previous_delay_seconds`
the delay chosen before it (None on the first failure). Randomness is injectable
(`random=`), so tests pin it. The formulas: docs/failure.md, "Retry policy".
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
class _Capped(Wait):
    """A strategy growing from `base` seconds up to `cap`."""

    base: float = 1.0
    cap: float = 60.0

    def __post_init__(self) -> None:
        _non_negative(base=self.base, cap=self.cap)
        if self.cap < self.base:
            raise ConfigurationError(f"cap ({self.cap}) must be >= base ({self.base})",
                                     option="cap")

    def ceiling(self, attempt: int) -> float:
        """min(`cap`, `base` * 2 ** (attempt - 1))."""
        return min(self.cap, self.base * 2 ** max(0, min(attempt - 1, 62)))


@dataclass(frozen=True, kw_only=True)
class wait_exponential(_Capped):
    """min(`cap`, `base` * 2 ** (attempt - 1)) seconds, no randomness."""

    def __call__(self, attempt: int, previous_delay_seconds: float | None = None) -> float:
        return self.ceiling(attempt)


@dataclass(frozen=True, kw_only=True)
class wait_full_jitter(_Capped):
    """uniform(0, min(`cap`, `base` * 2 ** (attempt - 1))) seconds."""

    random: Random = field(default=random_module.random, compare=False)

    def __call__(self, attempt: int, previous_delay_seconds: float | None = None) -> float:
        return self.ceiling(attempt) * self.random()


@dataclass(frozen=True, kw_only=True)
class wait_decorrelated_jitter(_Capped):
    """min(`cap`, uniform(`base`, 3 * previous)) seconds; previous starts at `base`."""

    random: Random = field(default=random_module.random, compare=False)

    def __call__(self, attempt: int, previous_delay_seconds: float | None = None) -> float:
        previous = max(self.base, previous_delay_seconds or self.base)
        return min(self.cap, self.base + (previous * 3 - self.base) * self.random())


@dataclass(frozen=True, init=False, repr=False)
class wait_combine(Wait):
    """The sum of several strategies' waits (what `a + b` builds)."""

    strategies: tuple[Wait, ...]

    def __init__(self, *strategies: Wait) -> None:
        flat: list[Wait] = []
        for strategy in strategies:
            if not isinstance(strategy, Wait):
                raise ConfigurationError(
                    f"wait_combine takes Wait strategies, got {strategy!r}", option="backoff")
            flat.extend(strategy.strategies if isinstance(strategy, wait_combine) else [strategy])
        object.__setattr__(self, "strategies", tuple(flat))

    def __call__(self, attempt: int, previous_delay_seconds: float | None = None) -> float:
        return sum(strategy(attempt, previous_delay_seconds) for strategy in self.strategies)

    def __repr__(self) -> str:
        return " + ".join(repr(strategy) for strategy in self.strategies)


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
            "(resilience.retry.backoff)", option="backoff")
    raise ConfigurationError(
        f"backoff must be a Wait strategy (resilience.retry.backoff), got {value!r}",
        option="backoff")
