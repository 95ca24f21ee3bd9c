"""Breaker configuration: thresholds, window, timings; validated when the task is defined."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from resilience.config import check, is_number
from resilience.errors import ConfigurationError
from resilience.store_down import StoreDown, store_down_policy


def _rate(value: Any) -> bool:
    return is_number(value) and 0.0 < value <= 1.0


def _int_at_least_1(value: Any) -> bool:
    return isinstance(value, int) and value >= 1


@dataclass(frozen=True, kw_only=True)
class CountWindow:
    """The last `calls` outcomes."""

    calls: int = 100

    def __post_init__(self) -> None:
        check(self, "calls", "an int > 0", _int_at_least_1, label="window calls")


@dataclass(frozen=True, kw_only=True)
class TimeWindow:
    """The outcomes of the last `seconds`, in `slots` slices (the sliding granularity)."""

    seconds: float = 60.0
    slots: int = 10

    def __post_init__(self) -> None:
        check(self, "seconds", "> 0", lambda v: v > 0, label="window seconds")
        check(self, "slots", "an int >= 1", _int_at_least_1, label="window slots")


@dataclass(frozen=True, kw_only=True)
class BreakerConfig:
    """How one breaker trips and recovers.

    Args:
        name: the breaker (one per dependency); tasks naming it share its state fleet-wide.
        failure_rate_threshold: open when failures / calls >= this (0..1].
        slow_call_rate_threshold: open when slow calls / calls >= this (0..1]; None = off.
        slow_call_seconds: a call at least this long is slow; required with the rate above.
        window: `CountWindow(calls=)` / `TimeWindow(seconds=)`, or an int (a count window).
        minimum_calls: calls in the window before the breaker may open at all.
        open_seconds: how long it stays open before letting probes through.
        half_open_probes: probes allowed in total across the fleet while half-open; all must
            succeed to close, one failure (or slow call) opens again.
        probe_timeout_seconds: a half-open state without a verdict this long opens again
            (probe workers died), so lost probe permits never wedge the breaker.
        fallback: called with the task's arguments instead of deferring while open.
        on_store_down: "fail_open" (default: run, warn, count FAIL-OPEN) or "fail_closed".
        local_state_seconds: how long a process trusts its copy of a closed breaker's state
            and holds its successes (`resilience.circuit.local`): a trip elsewhere reaches
            it at most this late; 0 = every call reads and records in Redis.
    """

    name: str
    failure_rate_threshold: float = 0.5
    slow_call_rate_threshold: float | None = None
    slow_call_seconds: float | None = None
    window: CountWindow | TimeWindow = CountWindow()
    minimum_calls: int = 10
    open_seconds: float = 30.0
    half_open_probes: int = 3
    probe_timeout_seconds: float = 60.0
    fallback: Callable[..., Any] | None = None
    on_store_down: StoreDown | str = StoreDown.FAIL_OPEN
    local_state_seconds: float = 0.1

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or len(self.name) > 200:
            raise ConfigurationError(f"breaker name must be a non-empty string, got {self.name!r}")
        if isinstance(self.window, int) and not isinstance(self.window, bool):
            object.__setattr__(self, "window", CountWindow(calls=self.window))
        if not isinstance(self.window, CountWindow | TimeWindow):
            raise ConfigurationError(
                f"window must be CountWindow, TimeWindow or an int, got {self.window!r}"
            )
        check(self, "failure_rate_threshold", "within (0, 1]", _rate)
        if self.slow_call_rate_threshold is not None:
            check(self, "slow_call_rate_threshold", "within (0, 1]", _rate)
            if self.slow_call_seconds is None:
                raise ConfigurationError("slow_call_rate_threshold needs slow_call_seconds")
        check(self, "slow_call_seconds", "> 0", lambda v: v is None or v > 0)
        check(self, "minimum_calls", "an int >= 1", _int_at_least_1)
        check(self, "open_seconds", "> 0", lambda v: v > 0)
        check(self, "half_open_probes", "an int >= 1", _int_at_least_1)
        check(self, "probe_timeout_seconds", "> 0", lambda v: v > 0)
        check(self, "fallback", "callable", lambda v: v is None or callable(v))
        check(self, "local_state_seconds", "a number within 0..60",
               lambda v: is_number(v) and 0 <= v <= 60)
        object.__setattr__(self, "on_store_down", store_down_policy(self.on_store_down))


#: What `.delay()` does while the task's breaker is open (see `AdmissionConfig`).
ON_OPEN = ("enqueue", "refuse")


@dataclass(frozen=True, kw_only=True)
class AdmissionConfig:
    """What a task's `.delay()` does while its breaker is open; per task, not per breaker.

    Args:
        on_open: "enqueue" (the default: queue the job, the worker defers it) or "refuse"
            (raise `DependencyUnavailable` with `retry_after`; nothing is queued).
        refresh_seconds: longest time a producer trusts its copy of the breaker's state (one
            store read per refresh): a job may be queued this long after a trip.
    """

    on_open: str = "enqueue"
    refresh_seconds: float = 1.0

    def __post_init__(self) -> None:
        check(self, "on_open", f"one of {ON_OPEN}", lambda v: v in ON_OPEN)
        check(self, "refresh_seconds", "a number >= 0", lambda v: is_number(v) and v >= 0)
