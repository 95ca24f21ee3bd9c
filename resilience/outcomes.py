"""Outcomes: what a guard decided about one job, as users see it in results, counters and logs."""

from __future__ import annotations

from enum import Enum
from typing import Any


class Outcome(str, Enum):
    """The vocabulary of guard decisions (DESIGN.md)."""

    SUCCEEDED = "SUCCEEDED"
    SHED = "SHED"
    REPLAYED = "REPLAYED"
    SKIPPED = "SKIPPED"
    DEFERRED = "DEFERRED"
    REJECTED = "REJECTED"
    DISCARDED = "DISCARDED"
    RETRY = "RETRY"
    DEAD_LETTERED = "DEAD-LETTERED"
    #: An operator cancelled the job (`jobs cancel`): it never starts, nothing is retried.
    CANCELLED = "CANCELLED"
    #: A store was down and the guard let the job through (`on_store_down="fail_open"`).
    FAIL_OPEN = "FAIL-OPEN"

    def __str__(self) -> str:
        return self.value


class Stop(Exception):
    """Signal raised by a guard to end one execution early with a visible outcome.

    Args:
        outcome: what happened (SKIPPED, REPLAYED, SHED, DEFERRED, ...).
        guard: the name of the guard that decided.
        reason: one human sentence, shown in Flower and logs.
        result: for REPLAYED, the stored result returned to the caller.
        retry_after_seconds: for DEFERRED, when to try again.
        details: structured fields (key, holder task id, breaker name, ...).
    """

    def __init__(
        self,
        outcome: Outcome,
        *,
        guard: str,
        reason: str,
        result: Any = None,
        retry_after_seconds: float | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{outcome}: {reason}")
        self.outcome = Outcome(outcome)
        self.guard = guard
        self.reason = reason
        self.result = result
        self.retry_after_seconds = retry_after_seconds
        self.details = dict(details or {})

    def as_result(self) -> dict[str, Any]:
        """The JSON result a stopped task returns, so Flower and AsyncResult show the why."""
        body: dict[str, Any] = {
            "outcome": self.outcome.value,
            "guard": self.guard,
            "reason": self.reason,
        }
        if self.details:
            body["details"] = self.details
        if self.outcome is Outcome.REPLAYED or self.result is not None:
            body["result"] = self.result
        return body


def is_outcome_result(value: Any) -> bool:
    """True when `value` is the result of a task stopped by a guard."""
    return isinstance(value, dict) and value.get("outcome") in Outcome._value2member_map_
