"""`BreakerAdmissionGuard` (EnqueueStage.BREAKER): `.delay()` refuses while the breaker is
open (`on_open="refuse"`, docs/failure.md).

The state comes from this process's copy, read again once older than `refresh_seconds`
(one round trip), so it may be stale by that long. An unreadable store fails open, warned
and counted FAIL-OPEN once per failed read, not per job: the counters live in the same
Redis. Never refused: a republish, and a canvas continuation (`parent_id`): refusing it
would fail a parent whose body already succeeded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from resilience.counters import count_outcome
from resilience.errors import DependencyUnavailable, StorageError
from resilience.outcomes import Outcome
from resilience.pipeline import EnqueueGuard, EnqueueStage, Publish

if TYPE_CHECKING:
    from celery import Task

logger = logging.getLogger("resilience.circuit")

class BreakerStates(Protocol):
    """What this stage reads of a breaker store (`circuit`'s `BreakerBackend` is one)."""

    def describe(self, names: Sequence[str]) -> Sequence[Any]:
        """The state of each named breaker (`state`, `retry_in_seconds`)."""


@dataclass(frozen=True)
class _Copy:
    """This process's copy of one breaker's state."""

    asked_at: float  # the guard's clock (monotonic seconds)
    state: str | None  # None: the store could not be read (fail open until the next refresh)
    retry_in_seconds: float = 0.0  # open: the rest of the open period when asked


class BreakerAdmissionGuard(EnqueueGuard):
    """Refuses a publish while the task's breaker is open (`on_open="refuse"`).

    Args:
        breaker: the config of the breaker the task declares (`circuit`'s `BreakerConfig`:
            its name and open period).
        config: the task's admission policy (`circuit`'s `AdmissionConfig`).
        backend: where the breaker lives, or a callable giving one for the bound task
            (`circuit` passes the app's shared Redis).
        clock: monotonic seconds; tests move it instead of waiting for a refresh.
    """

    name = "circuit"
    stage = EnqueueStage.BREAKER

    def __init__(self, breaker: Any, config: Any, *,
                 backend: BreakerStates | Callable[[Task], BreakerStates],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.breaker = breaker
        self.config = config
        self.clock = clock
        self._backend = backend
        self.backend: BreakerStates | None = None if callable(backend) else backend
        self._copy: _Copy | None = None

    def bind(self, task: Task) -> None:
        if self.backend is None and callable(self._backend):
            self.backend = self._backend(task)

    def describe(self, task: Task | None = None) -> dict[str, Any]:
        return {"name": self.breaker.name, "on_open": self.config.on_open,
                "refresh_seconds": self.config.refresh_seconds}

    def forget(self) -> None:
        """Drop this process's copy: the next publish reads the store."""
        self._copy = None

    def before_publish(self, publish: Publish) -> None:
        """Raise `DependencyUnavailable` while the breaker refuses; else let it through.

        Raises:
            DependencyUnavailable: the breaker is open or forced open (nothing is queued).
        """
        options = publish.options
        if (self.config.on_open != "refuse" or options.get("retries") is not None
                or options.get("parent_id")):
            return
        now = self.clock()
        copy = self._copy
        if copy is None or not now - copy.asked_at < self.config.refresh_seconds:
            copy = self._refresh(now, publish)
        if copy.state is None:
            return  # the store is unreadable: fail open (counted once per failed read)
        wait = self._refusal(copy, now)
        if wait is None:
            return
        reason = f"breaker {self.breaker.name!r} is {copy.state}"
        self._count(publish, Outcome.REJECTED, reason=reason, retry_after_seconds=wait)
        raise DependencyUnavailable(
            f"{publish.task.name}: {reason}; not enqueued (on_open='refuse'), "
            f"retry in {wait:.1f}s",
            retry_after=wait,
            breaker=self.breaker.name,
            state=copy.state,
            task=publish.task.name)

    def _refusal(self, copy: _Copy, now: float) -> float | None:
        """Seconds the caller should wait, or None to admit."""
        if copy.state == "forced_open":
            return self.breaker.open_seconds
        if copy.state == "open":
            remaining = copy.retry_in_seconds - (now - copy.asked_at)
            return round(remaining, 3) if remaining > 0 else None
        return None

    def _refresh(self, now: float, publish: Publish) -> _Copy:
        """Read the breaker's state once; an unreadable store fails open. A read is dated
        when asked (its age never understated), a failed one when it ended (a store that
        takes its timeout to fail is asked once per `refresh_seconds`)."""
        assert self.backend is not None, "BreakerAdmissionGuard used before bind()"
        try:
            state = self.backend.describe([self.breaker.name])[0]
            copy = _Copy(now, state.state, state.retry_in_seconds or 0.0)
        except StorageError as error:
            logger.warning(
                "breaker %s: state unreadable at enqueue, admitting jobs until the next "
                "refresh in %.1fs (fail open): %s",
                self.breaker.name, self.config.refresh_seconds, error)
            self._count(publish, Outcome.FAIL_OPEN, reason=f"breaker store unreadable: {error}")
            copy = _Copy(self.clock(), None)  # after the count, which may wait on it too
        self._copy = copy
        return copy

    def _count(self, publish: Publish, outcome: Outcome, **event: Any) -> None:
        count_outcome(publish.task.app, outcome.value, guard=self.name,
                      tier=getattr(publish.task, "tier", None), name=self.breaker.name,
                      **event)

