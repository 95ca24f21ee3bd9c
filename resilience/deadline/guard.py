"""Deadline shedding: a job whose deadline has passed is not run (outcome SHED, counted).

`DeadlineStampGuard` writes the `deadline` and `enqueued_at` headers at enqueue (they survive
retries and deferrals); under queue pressure the effective deadline shrinks. Why headers and
not Celery's `expires`, the pressure rule and the defaults: docs/overload.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from resilience.config import check
from resilience.errors import ConfigurationError, StorageError
from resilience.headers import DEADLINE_HEADER, ENQUEUED_AT_HEADER, epoch_seconds, finite_seconds
from resilience.outcomes import Outcome, Stop
from resilience.pipeline import Call, EnqueueGuard, EnqueueStage, Guard, Publish, Stage

if TYPE_CHECKING:
    from celery import Task

logger = logging.getLogger("resilience.deadline")

#: Per-call option of `apply_async`: seconds from now until the job is shed.
DEADLINE_OPTION = "deadline_seconds"


def _positive_seconds(value: Any) -> bool:
    """A usable duration option: a finite positive int or float (not a bool or string)."""
    return isinstance(value, int | float) and finite_seconds(value) is not None and value > 0


@dataclass(frozen=True, kw_only=True)
class DeadlineConfig:
    """When a task's jobs are shed.

    Args:
        deadline_seconds: seconds from enqueue until the job is shed; None: no deadline.
        pressure_queue_depth: queue depth beyond which the deadline shrinks; None: never.
        pressure_deadline_factor: fraction of the deadline kept under pressure (0 < f <= 1).
        tier: labels the counters.
    """

    deadline_seconds: float | None = None
    pressure_queue_depth: int | None = None
    pressure_deadline_factor: float = 0.25
    tier: str | None = None

    def __post_init__(self) -> None:
        check(self, "deadline_seconds", "positive finite seconds (or None for no deadline)",
              lambda v: v is None or _positive_seconds(v))
        check(self, "pressure_queue_depth", "a positive integer or None",
              lambda v: v is None or (not isinstance(v, bool) and v > 0))
        check(self, "pressure_deadline_factor", "in (0, 1]", lambda v: 0 < v <= 1)


PolicySource = DeadlineConfig | Callable[["Task"], "DeadlineConfig | None"]


def _resolve(source: PolicySource, task: Task) -> DeadlineConfig | None:
    return source if isinstance(source, DeadlineConfig) else source(task)


class DeadlineStampGuard(EnqueueGuard):
    """Write `deadline` / `enqueued_at` headers on each new job (republishes keep theirs).

    A caller may pass `deadline_seconds=` to `apply_async`, or its own `headers={"deadline":
    epoch}`; an explicit header is never overwritten.
    """

    name = "deadline"
    stage = EnqueueStage.STAMP

    def __init__(self, policy: PolicySource, *, clock: Callable[[], float] = time.time) -> None:
        self.policy = policy
        self.clock = clock

    def before_publish(self, publish: Publish) -> None:
        per_call = publish.options.pop(DEADLINE_OPTION, None)
        if per_call is not None and not _positive_seconds(per_call):
            raise ConfigurationError(
                f"{DEADLINE_OPTION} must be positive finite seconds, got {per_call!r}")
        policy = _resolve(self.policy, publish.task)
        seconds = per_call if per_call is not None else (policy and policy.deadline_seconds)
        # A job with a countdown or an ETA is not late before it is due: its deadline (and
        # the pressure window) count from when it becomes runnable, not from the enqueue.
        now = _due_at(publish.options, self.clock())
        headers = dict(publish.options.get("headers") or {})
        headers.setdefault(ENQUEUED_AT_HEADER, now)
        if seconds and DEADLINE_HEADER not in headers:
            headers[DEADLINE_HEADER] = now + float(seconds)
        publish.options["headers"] = headers


def _due_at(options: dict[str, Any], now: float) -> float:
    """Epoch seconds at which a publish becomes runnable: now, or its countdown / ETA."""
    due = now
    countdown = finite_seconds(options.get("countdown"))
    if countdown is not None and countdown > 0:
        due = now + countdown
    eta = epoch_seconds(options.get("eta"))
    return max(due, eta) if eta is not None else due


class DeadlineGuard(Guard):
    """Shed a job whose (effective) deadline has passed before it takes a slot.

    Args:
        policy: a `DeadlineConfig` or callable(task) giving one (for pressure settings).
        depth: callable(task, queue) -> messages waiting; needed for pressure shedding.
        clock: epoch seconds now (injectable).
        depth_cache_seconds: a depth reading is reused this long per process and queue,
            so pressure costs one broker round trip per second, not per job.
    """

    name = "deadline"
    stage = Stage.DEADLINE

    def __init__(self, policy: PolicySource = DeadlineConfig(), *,
                 depth: Callable[[Task, str], int] | None = None,
                 clock: Callable[[], float] = time.time, depth_cache_seconds: float = 1.0) -> None:
        self.policy = policy
        self.depth = depth
        self.clock = clock
        self.depth_cache_seconds = depth_cache_seconds
        #: queue -> (when read, depth); one dict read or write each, atomic without a lock.
        self._depths: dict[str, tuple[float, int]] = {}

    def queue_depth(self, task: Task, queue: str) -> int | None:
        if self.depth is None:
            return None
        now = time.monotonic()
        cached = self._depths.get(queue)
        if cached and now - cached[0] < self.depth_cache_seconds:
            return cached[1]
        try:
            depth = self.depth(task, queue)
        except StorageError as error:
            logger.warning("queue depth of %s unknown, no pressure shedding: %s", queue, error)
            return None
        self._depths[queue] = (now, depth)
        return depth

    def before_run(self, call: Call) -> None:
        deadline = call.headers.deadline
        if deadline is None:
            return
        start = call.headers.enqueued_at
        now = self.clock()
        effective, pressure = deadline, False
        policy = _resolve(self.policy, call.task)
        if policy is not None and policy.pressure_queue_depth and start is not None:
            queue = call.queue
            depth = self.queue_depth(call.task, queue) if queue else None
            if depth is not None and depth > policy.pressure_queue_depth:
                pressure = True
                # min: pressure only ever shrinks (a deadline stamped before enqueued_at
                # would otherwise be pushed later).
                effective = min(deadline,
                                start + (deadline - start) * policy.pressure_deadline_factor)
        if now <= effective:
            return
        tier = (policy.tier if policy else None) or getattr(call.task, "tier", None)
        call.count(Outcome.SHED, guard=self.name, tier=tier)
        late = now - effective
        why = "under queue pressure, " if pressure else ""
        raise Stop(
            Outcome.SHED, guard=self.name, reason=f"{why}deadline passed {late:.3f}s ago; not run",
            details={"deadline": deadline, "effective_deadline": effective,
                     "late_seconds": round(late, 6), "pressure": pressure, "tier": tier},
        )
