"""Running a workflow step: two execution guards.

Every step message carries the header `resilience_workflow_step` ("<workflow id>:<position>",
":compensation" appended for a compensation); a batch member carries `batch_id` instead and
is found by its task id. A job with neither costs two header lookups.

- `WorkflowGuard` (stage WORKFLOW, outside every guard but SCHEDULE: it sees every other
  guard's stop and the error the retry guard settled on). Before the body: one statement
  marks the step started and reads it; a step already final is REPLAYED with its recorded
  result (Celery's contract: a replay answers the first call's value), a step of a stopped
  workflow is CANCELLED unrun. After: it records the outcome in a short transaction of its
  own, which also releases the dependents (their outbox rows), then publishes those rows
  itself (`resilience.outbox.relay.publish_held`) so a continuation costs no relay poll;
  their mark rides on the worker's next statement (`mark_published(later=True)`).
- `WorkflowRecordGuard` (stage WORKFLOW_RECORD, just inside IDEMPOTENCY): for an
  `@idempotent(transactional=True)` step it records SUCCEEDED, and writes the released
  rows, through the body's session: the step's state commits with the body's writes and
  its idempotency record, or rolls back with them.

DEFERRED and RETRY are not final (the step runs again); any other stop or error ends the
step (`state_of_stop`, `state_of_error`) and the workflow with it, and starts the
compensations. A compensation job's outcome advances the compensations instead.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from resilience.errors import ConfigurationError, NonJsonArguments, StorageError
from resilience.headers import WorkflowStep
from resilience.keys import revive
from resilience.outbox.relay import publish_held
from resilience.outcomes import Outcome, Stop
from resilience.pipeline import Call, Guard, Stage
from resilience.store_down import StoreDown, store_down_policy, store_failed
from resilience.stores import stores_for
from resilience.workflows import metrics
from resilience.workflows.backend import Released, WorkflowBackend, backend_for
from resilience.workflows.states import (
    SUCCESS_STATES,
    StepState,
    WorkflowState,
    one_line,
    state_of_error,
    state_of_stop,
)

if TYPE_CHECKING:
    from celery import Celery, Task

logger = logging.getLogger("resilience.workflows")

GUARD_NAME = "workflow"


@dataclass(frozen=True, kw_only=True)
class WorkflowConfig:
    """Options of the workflow guards.

    Args:
        on_store_down: "fail_closed" (default): when PostgreSQL cannot take the step's
            state the step is DEFERRED and delivered again to record it (its body runs again
            unless it is `@idempotent`); "fail_open": log, count FAIL-OPEN and go on (the
            step stays queued and its workflow stalls until retried).
        retry_seconds: the deferral under "fail_closed".
    """

    on_store_down: StoreDown | str = StoreDown.FAIL_CLOSED
    retry_seconds: float = 2.0

    def __post_init__(self) -> None:
        if not self.retry_seconds > 0:
            raise ConfigurationError(f"retry_seconds must be > 0, got {self.retry_seconds}")
        object.__setattr__(self, "on_store_down", store_down_policy(self.on_store_down))


def workflow_backend(app: Celery) -> WorkflowBackend:
    """The workflow store of `app` (its stores' PostgreSQL).

    Raises:
        ConfigurationError: the app's stores have no PostgreSQL (memory stores included).
    """
    return stores_for(app).backend("workflows", backend_for)


# The task ids whose outcome a guard recorded in this thread (the last job only), so the
# Celery signal that follows (`resilience.workflows.signals`) does not record it again.
_handled = threading.local()


def handled(task_id: str | None) -> bool:
    """Did the workflow guard of this thread record the outcome of `task_id`?"""
    return task_id is not None and getattr(_handled, "task_id", None) == task_id


@dataclass
class _Running:
    step: WorkflowStep
    started: float
    simple: bool = False
    fan_in: bool = False
    released: Released | None = None  # recorded in the body's transaction


class WorkflowGuard(Guard):
    """Runs a workflow step and records its outcome (see the module doc).

    Args:
        config: the options.
    """

    name = GUARD_NAME
    stage = Stage.WORKFLOW

    def __init__(self, config: WorkflowConfig | None = None) -> None:
        self.config = config or WorkflowConfig()
        #: The guard that records inside a transactional body; add both to a task.
        self.in_transaction = WorkflowRecordGuard(self)

    def describe(self, task: Task | None = None) -> dict[str, Any]:
        return {"on_store_down": str(self.config.on_store_down),
                "retry_seconds": self.config.retry_seconds}

    def before_run(self, call: Call) -> None:
        step = call.headers.workflow_step
        if step is None:
            self._start_member(call)
            return
        backend = workflow_backend(call.task.app)
        try:
            found = backend.start(step.workflow_id, step.position)
        except StorageError as exc:
            self._store_down(call, step, exc)
            return
        if found is None:
            logger.warning("task %s names workflow step %s:%s, which does not exist: run as "
                           "a plain job", call.task_id, step.workflow_id, step.position)
            return
        if step.run != found.run:
            raise Stop(Outcome.SKIPPED, guard=GUARD_NAME,
                       reason=f"step {step.position} of workflow {step.workflow_id} was "
                              f"retried: this is a delivery of its run {step.run}, it is at "
                              f"run {found.run}",
                       details={"workflow_id": step.workflow_id, "position": step.position})
        if step.compensation:
            if found.compensation_state not in (None, StepState.QUEUED):
                raise Stop(Outcome.REPLAYED, guard=GUARD_NAME,
                           reason=f"compensation of step {step.position} of workflow "
                                  f"{step.workflow_id} is {found.compensation_state} already")
        elif found.state in SUCCESS_STATES:
            call.count(Outcome.REPLAYED, guard=GUARD_NAME)
            raise Stop(Outcome.REPLAYED, guard=GUARD_NAME,
                       reason=f"step {step.position} of workflow {step.workflow_id} "
                              f"succeeded already", result=revive(found.result),
                       details={"workflow_id": step.workflow_id, "position": step.position})
        elif found.state not in (StepState.PENDING, StepState.QUEUED):
            raise Stop(Outcome.SKIPPED, guard=GUARD_NAME,
                       reason=f"step {step.position} of workflow {step.workflow_id} is "
                              f"{found.state} already",
                       details={"workflow_id": step.workflow_id, "position": step.position})
        elif found.workflow_state != WorkflowState.RUNNING:
            reason = f"workflow {step.workflow_id} is {found.workflow_state}"
            self._settle(call, step, StepState.CANCELLED, reason)
            call.count(Outcome.CANCELLED, guard=GUARD_NAME)
            raise Stop(Outcome.CANCELLED, guard=GUARD_NAME, reason=reason,
                       details={"workflow_id": step.workflow_id, "position": step.position})
        call.keep(self, _Running(step, time.perf_counter(), found.simple, found.fan_in))

    def _start_member(self, call: Call) -> None:
        """A batch member (header `batch_id`), found by its task id. Observed, not owned: a
        redelivery of a member already final runs its body as any job's would (idempotency
        decides) and counts nothing again; a member of a cancelled batch is cancelled."""
        batch_id = call.headers.batch_id
        if batch_id is None or call.task_id is None:
            return
        try:
            found = workflow_backend(call.task.app).start_member(batch_id, call.task_id)
        except StorageError as exc:
            self._store_down(call, WorkflowStep(batch_id, -1), exc)
            return
        if found is None or found[1].state not in (StepState.PENDING, StepState.QUEUED):
            return
        step = WorkflowStep(batch_id, found[0])
        if found[1].workflow_state != WorkflowState.RUNNING:
            reason = f"batch {batch_id} is {found[1].workflow_state}"
            self._settle(call, step, StepState.CANCELLED, reason)
            raise Stop(Outcome.CANCELLED, guard=GUARD_NAME, reason=reason,
                       details={"batch_id": batch_id})
        call.keep(self, _Running(step, time.perf_counter()))

    def after_run(self, call: Call, result: Any) -> None:
        running: _Running | None = call.take_back(self)
        if running is None:
            return
        released = call.take_back(self.in_transaction)
        if released is not None:
            _handled.task_id = call.task_id
            self._after_commit(call, running, StepState.SUCCEEDED, released)
            return
        self._settle(call, running.step, StepState.SUCCEEDED, None, result, running)

    def on_stop(self, call: Call, stop: Stop) -> None:
        running: _Running | None = call.take_back(self)
        call.take_back(self.in_transaction)
        if running is None:
            return
        state = state_of_stop(stop.outcome)
        if state is None:
            return  # DEFERRED: the step runs again
        self._settle(call, running.step, state, f"{stop.outcome.value} by {stop.guard}: "
                     f"{stop.reason}", stop.result, running)

    def on_error(self, call: Call, exc: BaseException) -> None:
        running: _Running | None = call.take_back(self)
        call.take_back(self.in_transaction)
        if running is None:
            return
        state = state_of_error(exc)
        if state is None:
            return  # Celery retries it
        self._settle(call, running.step, state, one_line(exc), None, running)

    def _settle(self, call: Call, step: WorkflowStep, state: StepState, error: str | None,
                result: Any = None, running: _Running | None = None) -> None:
        """Record the step's (or compensation's) final state in a transaction of its own,
        then publish what it released."""
        _handled.task_id = call.task_id
        backend = workflow_backend(call.task.app)
        try:
            if step.compensation:
                released = backend.compensated(None, step.workflow_id, step.position, state,
                                               None if state in SUCCESS_STATES else error)
            elif state in SUCCESS_STATES:
                try:
                    released = backend.succeed(None, step.workflow_id, step.position, result,
                                               state=state,
                                               simple=running is not None and running.simple,
                                               fan_in=running is not None and running.fan_in,
                                               run=step.run)
                except NonJsonArguments as exc:
                    state, error = StepState.FAILED, (
                        f"UnserializableResult: a step's result must be what Celery's JSON "
                        f"carries ({exc})")
                    released = backend.fail(None, step.workflow_id, step.position, state, error,
                                            run=step.run)
            else:
                released = backend.fail(None, step.workflow_id, step.position, state, error,
                                        run=step.run)
        except StorageError as exc:
            _handled.task_id = None
            self._store_down(call, step, exc)
            return
        self._after_commit(call, running, state, released)

    def _after_commit(self, call: Call, running: _Running | None, state: StepState,
                      released: Released) -> None:
        app = call.task.app
        if released.rows:
            publish_held(app, released.rows, workflow_backend(app).outbox, mark_later=True)
        if released.cancel:
            cancel_steps(app, released.cancel)
        if running is not None and released.recorded and not running.step.compensation:
            metrics.step_finished(call.task.name, state.value,
                                  time.perf_counter() - running.started)
        if released.finished is not None:
            metrics.workflow_event(app, str(released.finished), released.name, later=True)
            step = running.step if running is not None else call.headers.workflow_step
            logger.info("workflow %s %s (step %s: %s)",
                        step.workflow_id if step else "?", released.finished,
                        step.position if step else "?", state.value,
                        extra={"workflow_id": step.workflow_id if step else None})

    def _store_down(self, call: Call, step: WorkflowStep, error: StorageError) -> None:
        store_failed(call, error, guard=GUARD_NAME, policy=self.config.on_store_down,
                     retry_after_seconds=self.config.retry_seconds,
                     details={"workflow_id": step.workflow_id, "position": step.position})


class WorkflowRecordGuard(Guard):
    """Records a step SUCCEEDED through a transactional body's session, before it commits."""

    name = "workflow-record"
    stage = Stage.WORKFLOW_RECORD

    def __init__(self, outer: WorkflowGuard) -> None:
        self.outer = outer

    def describe(self, task: Task | None = None) -> dict[str, Any]:
        return {}

    def commit(self, call: Call, result: Any) -> None:
        """Write the step's state and its released rows into the body's transaction (the
        idempotency guard commits it next, with the record); a failure fails that commit."""
        running: _Running | None = call.kept(self.outer)
        session = call.inject.get("session")
        if running is None or session is None or running.step.compensation:
            return
        backend = workflow_backend(call.task.app)
        if not _joins(backend, session):
            return
        call.keep(self, backend.succeed(session, running.step.workflow_id,
                                        running.step.position, result, run=running.step.run))

    def on_error(self, call: Call, exc: BaseException) -> None:
        call.take_back(self)  # rolled back with the body's transaction

    def on_stop(self, call: Call, stop: Stop) -> None:
        call.take_back(self)


def _joins(backend: WorkflowBackend, session: Any) -> bool:
    """True for a SQLAlchemy Session or Connection on the backend's database."""
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session

    if isinstance(session, Session):
        bind = session.get_bind()
    elif isinstance(session, Connection):
        bind = session
    else:
        return False
    engine = getattr(bind, "engine", bind)
    try:
        return bool(engine.url == backend.engine().url)
    except Exception:  # noqa: BLE001 - a bind we cannot compare: not ours
        return False


def cancel_steps(app: Celery, task_ids: list[str]) -> None:
    """Ask `resilience.cancel` to stop the queued steps of a cancelled workflow; one that
    cannot be cancelled finds its workflow cancelled when it starts."""
    from resilience.cancel.view import cancellations  # lazy: only an operator's cancel

    for task_id in task_ids:
        try:
            cancellations(app).cancel_job(task_id, reason="its workflow was cancelled")
        except Exception as exc:  # noqa: BLE001 - the workflow state stops it anyway
            logger.warning("step %s not cancelled (%s): it stops when it starts", task_id, exc)


def workflow_guards(config: WorkflowConfig | None = None
                    ) -> tuple[WorkflowGuard, WorkflowRecordGuard]:
    """The two guards a task needs to run workflow steps (every GuardedTask has them)."""
    guard = WorkflowGuard(config)
    return guard, guard.in_transaction
