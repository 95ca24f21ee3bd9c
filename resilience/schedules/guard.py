"""Run history: how a scheduled job ended, recorded on its run row.

A job the scheduler fired carries the header `resilience_schedule_run` (its run row's id).
`ScheduleRunGuard` (stage SCHEDULE, outermost: it sees every other guard's stop and the
error the retry guard settled on) records the run's outcome when the job ends, in a short
transaction after the job's own effects committed. A job without the header costs one
header lookup.

    body returned / REPLAYED          -> succeeded
    DEAD-LETTERED (or DeadLettered)   -> dead_lettered
    CANCELLED                         -> cancelled
    SHED                              -> shed
    SKIPPED, REJECTED, DISCARDED      -> skipped (skipped_overlap when the entry's
                                         singleton skipped it: singleton.py)
    any other error                   -> failed
    DEFERRED, RETRY, requeueing Reject -> nothing yet: the job runs again

Only a `sent` run changes, so a redelivered job's second end records nothing. A store error
while recording is logged and the job's own outcome stands (the run stays `sent`): history
is an observation, and failing the job for it would run it again.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from resilience.errors import DeadLettered, StorageError
from resilience.outcomes import Outcome, Stop
from resilience.pipeline import Call, Guard, Stage
from resilience.schedules.overlap import SINGLETON_GUARD
from resilience.schedules.policies import RunOutcome
from resilience.schedules.store import SCHEDULE_RUN_HEADER, schedule_store

if TYPE_CHECKING:
    from celery import Task

logger = logging.getLogger("resilience.schedules")

GUARD_NAME = "schedule"

_STOP_OUTCOMES: dict[Outcome, RunOutcome | None] = {
    Outcome.SUCCEEDED: RunOutcome.SUCCEEDED,
    Outcome.REPLAYED: RunOutcome.SUCCEEDED,
    Outcome.SHED: RunOutcome.SHED,
    Outcome.SKIPPED: RunOutcome.SKIPPED,
    Outcome.REJECTED: RunOutcome.SKIPPED,
    Outcome.DISCARDED: RunOutcome.SKIPPED,
    Outcome.CANCELLED: RunOutcome.CANCELLED,
    Outcome.DEAD_LETTERED: RunOutcome.DEAD_LETTERED,
    Outcome.DEFERRED: None,
    Outcome.RETRY: None,
    Outcome.FAIL_OPEN: None,
}


def outcome_of_stop(stop: Stop) -> RunOutcome | None:
    """The run outcome a guard's stop leaves; None when the job will run again. A run the
    entry's singleton skipped (its previous run still held it) is `skipped_overlap`."""
    outcome = _STOP_OUTCOMES.get(Outcome(stop.outcome))
    if outcome is RunOutcome.SKIPPED and getattr(stop, "guard", None) == SINGLETON_GUARD:
        return RunOutcome.SKIPPED_OVERLAP
    return outcome


def outcome_of_error(error: BaseException) -> RunOutcome | None:
    """The run outcome an error leaves; None when Celery will run the job again."""
    from celery.exceptions import Ignore, Reject, Retry  # lazy: celery's exceptions module

    if isinstance(error, Stop):
        return outcome_of_stop(error)
    if isinstance(error, Retry):
        return None
    if isinstance(error, Reject):
        return None if error.requeue else RunOutcome.FAILED
    if isinstance(error, Ignore):
        return RunOutcome.SKIPPED
    if isinstance(error, DeadLettered):
        return RunOutcome.DEAD_LETTERED
    return RunOutcome.FAILED


def run_id_of(call: Call) -> int | None:
    """The run id a scheduled job carries, or None (not scheduled, or unusable)."""
    value = call.headers.get(SCHEDULE_RUN_HEADER)
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class ScheduleRunGuard(Guard):
    """Records a scheduled job's end on its run row (see the module doc)."""

    name = GUARD_NAME
    stage = Stage.SCHEDULE

    def describe(self, task: Task | None = None) -> dict[str, Any]:
        return {}

    def before_run(self, call: Call) -> None:
        run_id = run_id_of(call)
        if run_id is not None:
            call.keep(self, run_id)

    def after_run(self, call: Call, result: Any) -> None:
        self._record(call, RunOutcome.SUCCEEDED, None)

    def on_stop(self, call: Call, stop: Stop) -> None:
        self._record(call, outcome_of_stop(stop), {"stop": str(stop.outcome),
                                                   "guard": getattr(stop, "guard", None)})

    def on_error(self, call: Call, exc: BaseException) -> None:
        self._record(call, outcome_of_error(exc), {"error": type(exc).__name__})

    def _record(self, call: Call, outcome: RunOutcome | None,
                detail: dict[str, Any] | None) -> None:
        run_id = call.take_back(self)
        if run_id is None or outcome is None:
            return
        try:
            schedule_store(call.stores).record(run_id, outcome, detail)
        except StorageError as exc:
            logger.warning("schedules: the outcome %s of run %s (task %s) was not recorded: %s",
                           outcome.value, run_id, call.task_id, exc)
