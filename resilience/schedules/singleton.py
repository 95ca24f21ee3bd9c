"""`ScheduleSingletonGuard`: two runs of one schedule entry never run at once.

The job side of Overlap.SKIP and Overlap.QUEUE_ONE (overlap.py). The scheduler stamps their
jobs with the header `resilience_schedule_singleton` ("skip:<name>" or "defer:<name>"); this
guard, a library default of every GuardedTask, takes the PostgreSQL advisory lock
`schedule:<name>` through the singleton machinery of `resilience.locks` (the same backend,
session pool, watcher and store-down policy as `@singleton`) for as long as the job runs:

    run A (slot 10:00)  takes schedule:nightly ......................... gives it back
    run B (slot 10:01)        history stale, B sent -> lock held by A -> SKIPPED
                                                       (its run row: skipped_overlap)
    queue_one's B                                    -> DEFERRED, runs once A let go

So the entry never runs twice at once even when the scheduler's history is stale (an
outcome row not yet written, or never). A job without the header pays one header lookup;
a task's own `@singleton` is a separate guard (stage EXCLUSIVITY, just inside this one).

The header, not a task option, carries it: which entry a job belongs to is known when the
scheduler sends it, not when the task is defined, and a task may serve several entries
with different policies. Layers: this service imports the locks guard; locks knows nothing
of schedules (it offers the `key_of` / `policy_of` hooks).
"""

from __future__ import annotations

from typing import Any, ClassVar

from resilience.keys import GuardKey
from resilience.locks.config import SingletonConfig
from resilience.locks.guards import SingletonGuard
from resilience.pipeline import Call, Stage
from resilience.schedules.overlap import (
    LOCK_NAMESPACE,
    SCHEDULE_SINGLETON_HEADER,
    SINGLETON_GUARD,
    parse_singleton_header,
)


def _no_arguments() -> None:
    """The guard is keyed by a header, not by a function's arguments."""


class ScheduleSingletonGuard(SingletonGuard):
    """Holds `schedule:<name>` while a job of a SKIP / QUEUE_ONE entry runs (module doc).

    Args:
        options: the singleton's options but `policy`, which the header gives (skip for
            SKIP, defer for QUEUE_ONE); fail closed when PostgreSQL is down (DEFERRED).
    """

    name: ClassVar[str] = SINGLETON_GUARD
    stage: ClassVar[Stage] = Stage.SCHEDULE_OVERLAP

    def __init__(self, options: SingletonConfig | None = None) -> None:
        super().__init__(_no_arguments, None, options or SingletonConfig())

    def describe(self, task: Any = None) -> dict[str, Any]:
        return {"header": SCHEDULE_SINGLETON_HEADER}

    def key_of(self, call: Call) -> GuardKey | None:
        parsed = parse_singleton_header(call.headers.get(SCHEDULE_SINGLETON_HEADER))
        if parsed is None:
            return None
        _, entry = parsed
        return GuardKey(namespace=LOCK_NAMESPACE, value=entry, fingerprint=entry)

    def policy_of(self, call: Call) -> str:
        parsed = parse_singleton_header(call.headers.get(SCHEDULE_SINGLETON_HEADER))
        return parsed[0] if parsed is not None else self.options.policy
