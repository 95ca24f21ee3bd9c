"""Workflow and step states, the summaries the views read, and how an outcome maps to a
step's final state."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from celery.exceptions import Ignore, Reject, Retry

from resilience.errors import DeadLettered
from resilience.outcomes import Outcome, Stop


class WorkflowState(StrEnum):
    """Where a workflow run is; `running` and `compensating` are the live ones."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    COMPENSATING = "compensating"
    COMPENSATED = "compensated"
    CANCELLED = "cancelled"


class StepState(StrEnum):
    """Where a step (or its compensation) is; all but pending and queued are final."""

    PENDING = "pending"
    QUEUED = "queued"
    SUCCEEDED = "succeeded"
    REPLAYED = "replayed"
    FAILED = "failed"
    DEAD_LETTERED = "dead_lettered"
    CANCELLED = "cancelled"
    SHED = "shed"
    SKIPPED = "skipped"


#: Final workflow states (`run.get()` stops waiting).
FINAL_WORKFLOW_STATES = frozenset({WorkflowState.SUCCEEDED, WorkflowState.FAILED,
                                   WorkflowState.COMPENSATED, WorkflowState.CANCELLED})
#: States a step's result counts as success in.
SUCCESS_STATES = frozenset({StepState.SUCCEEDED, StepState.REPLAYED})
LIVE_STEP_STATES = frozenset({StepState.PENDING, StepState.QUEUED})


@dataclass(frozen=True)
class StepSummary:
    """One step as `describe` reports it."""

    position: int
    task_name: str
    state: StepState
    task_id: str
    depends_on: list[int]
    result: Any = None
    error: str | None = None
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    compensate: str | None = None
    compensation_state: StepState | None = None
    compensation_task_id: str | None = None
    compensation_error: str | None = None


@dataclass(frozen=True)
class WorkflowSummary:
    """One workflow run as `describe` / `recent` report it (`steps` empty in `recent`)."""

    id: str
    name: str | None
    state: WorkflowState
    created_at: dt.datetime
    finished_at: dt.datetime | None = None
    replay_of: str | None = None
    result: Any = None
    error: str | None = None
    failed_step: int | None = None
    total: int = 0
    steps: list[StepSummary] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)


_STOP_STATES: dict[Outcome, StepState | None] = {
    Outcome.SUCCEEDED: StepState.SUCCEEDED,
    Outcome.REPLAYED: StepState.REPLAYED,
    Outcome.SHED: StepState.SHED,
    Outcome.SKIPPED: StepState.SKIPPED,
    Outcome.CANCELLED: StepState.CANCELLED,
    Outcome.DEAD_LETTERED: StepState.DEAD_LETTERED,
    Outcome.REJECTED: StepState.SKIPPED,
    Outcome.DISCARDED: StepState.SKIPPED,
    Outcome.DEFERRED: None,
    Outcome.RETRY: None,
    Outcome.FAIL_OPEN: None,
}


def state_of_stop(outcome: Outcome | str) -> StepState | None:
    """The step state a guard's stop leaves; None when the step will run again."""
    return _STOP_STATES.get(Outcome(outcome))


def state_of_error(error: BaseException) -> StepState | None:
    """The step state an error leaves; None when Celery will run the step again."""


    if isinstance(error, Stop):
        return state_of_stop(error.outcome)
    if isinstance(error, Retry):
        return None
    if isinstance(error, Reject):
        return None if error.requeue else StepState.FAILED
    if isinstance(error, Ignore):
        return StepState.SKIPPED
    if isinstance(error, DeadLettered):
        return StepState.DEAD_LETTERED
    outcome = getattr(error, "outcome", None)
    if isinstance(outcome, str) and outcome in Outcome._value2member_map_:
        return state_of_stop(outcome)
    return StepState.FAILED


def one_line(error: BaseException | str | None, limit: int = 500) -> str | None:
    """An error as one line (type and message), bounded."""
    if error is None:
        return None
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return " ".join(text.split())[:limit]
