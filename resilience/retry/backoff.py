"""Backoff strategies: tiny callables `strategy(attempt, previous_delay_seconds) -> seconds`.

In the tenacity spirit a strategy is a few lines and its randomness is injectable, so tests
pin the random source instead of sleeping. `attempt` is the number of the attempt that just
failed (1 for the first call); `previous_delay_seconds` is the delay chosen before it (None
on the first failure).

- `full_jitter` (default): uniform(0, min(cap, base * 2 ** (attempt - 1))). Spreads a herd of
  retries evenly; the AWS Architecture Blog's recommended default.
- `decorrelated_jitter`: min(cap, uniform(base, previous * 3)). Grows from the delay actually
  used, so consecutive retries of one job are less correlated with other jobs'.
"""

from __future__ import annotations

import random as random_module
from collections.abc import Callable
from dataclasses import dataclass, field

from resilience.errors import ConfigurationError

#: A backoff strategy: (failed attempt number, previous delay or None) -> delay in seconds.
Backoff = Callable[[int, "float | None"], float]

JITTERS = ("full", "decorrelated")


def _check(base_seconds: float, cap_seconds: float) -> None:
    if base_seconds < 0:
        raise ConfigurationError(
            f"base_delay_seconds must be >= 0, got {base_seconds}", base=base_seconds
        )
    if cap_seconds < base_seconds:
        raise ConfigurationError(
            f"cap_delay_seconds ({cap_seconds}) must be >= base_delay_seconds ({base_seconds})",
            cap=cap_seconds,
        )


@dataclass(frozen=True, kw_only=True)
class FullJitter:
    """uniform(0, min(cap, base * 2^(attempt-1))) seconds."""

    base_seconds: float = 1.0
    cap_seconds: float = 60.0
    random: Callable[[], float] = field(default=random_module.random, compare=False)

    def __post_init__(self) -> None:
        _check(self.base_seconds, self.cap_seconds)

    def __call__(self, attempt: int, previous_delay_seconds: float | None = None) -> float:
        ceiling = min(self.cap_seconds, self.base_seconds * 2 ** max(0, min(attempt - 1, 62)))
        return ceiling * self.random()


@dataclass(frozen=True, kw_only=True)
class DecorrelatedJitter:
    """min(cap, uniform(base, 3 * previous)) seconds; previous starts at base."""

    base_seconds: float = 1.0
    cap_seconds: float = 60.0
    random: Callable[[], float] = field(default=random_module.random, compare=False)

    def __post_init__(self) -> None:
        _check(self.base_seconds, self.cap_seconds)

    def __call__(self, attempt: int, previous_delay_seconds: float | None = None) -> float:
        previous = max(self.base_seconds, previous_delay_seconds or self.base_seconds)
        high = previous * 3
        return min(self.cap_seconds, self.base_seconds + (high - self.base_seconds) * self.random())


def backoff_for(
    jitter: str,
    *,
    base_seconds: float,
    cap_seconds: float,
    random: Callable[[], float] | None = None,
) -> Backoff:
    """The strategy named `jitter` ("full" or "decorrelated").

    Raises:
        ConfigurationError: unknown jitter, negative base, cap below base.
    """
    source = random or random_module.random
    if jitter == "full":
        return FullJitter(base_seconds=base_seconds, cap_seconds=cap_seconds, random=source)
    if jitter == "decorrelated":
        return DecorrelatedJitter(base_seconds=base_seconds, cap_seconds=cap_seconds, random=source)
    raise ConfigurationError(f"jitter must be one of {JITTERS}, got {jitter!r}", jitter=jitter)


def delay_with_retry_after(
    strategy: Backoff, attempt: int, previous_delay_seconds: float | None, retry_after: float | None
) -> float:
    """The strategy's delay, raised to the dependency's Retry-After when it asked for more."""
    delay = strategy(attempt, previous_delay_seconds)
    if retry_after is not None:
        delay = max(delay, retry_after)
    return delay
