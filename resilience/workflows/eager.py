"""Durable canvases and batches run in process: memory mode and `task_always_eager`.

A user's tests have no PostgreSQL and no worker (`resilience.testing`, the pytest plugin's
`resilience_memory`, or `task_always_eager`), and plain Celery runs a canvas inline there.
So does `durable(sig).apply_async()`: it runs every step at once, in position order (Celery's
eager order: depth first, as the canvas is written), each through its task's own `apply()`
(its guards, Celery's eager retries), and returns a run whose `.get()` answers the value or
raises `WorkflowFailed`. A batch runs its members the same way, then its callbacks once.

No second state machine: the graph, each step's input and the workflow's result are the
engine's (`canvas.flatten` / `link`, `input_args`, `resolve`, `outcomes`), an outcome's step
state is `states.state_of_error` / `state_of_stop`, and the transitions are the backend's
(`backend.py`), done one at a time since nothing here is concurrent:

- a step runs once its dependencies are final: release "succeeded" (a canvas edge, a batch's
  on_success) needs every one succeeded, else it is skipped; "final" (on_complete) runs;
- a step that ends without success fails the workflow (cancelled for a cancelled step),
  unless it is a batch member, which ends only itself; steps that were released are then
  cancelled (the guard cancels such a step when it starts), the others skipped;
- the compensations of the succeeded steps run in reverse completion order, one at a time,
  each once, with the step's result first unless immutable (state compensating, then
  compensated, or failed when a compensation failed; a cancelled run stays cancelled);
- nothing left: succeeded, or failed when a batch member did not succeed.

Results pass through Celery's JSON as they would between workers (a tuple arrives as a
list; a value JSON cannot carry fails the step, as it does in PostgreSQL).

State lives in this process (`EagerWorkflowBackend`, one per app's stores: `MemoryStores.reset`
empties it), read by `describe` / `recent` and the batch views. Operator actions (`cancel`,
`retry`, `replay`) are PostgreSQL-only: an eager run is final when `apply_async` returns.
The step message header (`resilience_workflow_step`) is not set: no guard of an eager step
reaches the workflow tables, so an `@idempotent` step with no key of its own gets its task's
default key, not `workflow:<id>:<position>`.
"""

from __future__ import annotations

import datetime as dt
import itertools
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kombu.utils.json import dumps, loads

from resilience.outbox.backends.memory import on_transaction_end
from resilience.outcomes import outcome_of
from resilience.stores import MemoryStores, Stores, stores_for
from resilience.workflows import metrics
from resilience.workflows.backend import Released
from resilience.workflows.canvas import StepSpec, Template, input_args, positions, resolve
from resilience.workflows.errors import WorkflowFailed, WorkflowNotFound
from resilience.workflows.states import (
    FINAL_WORKFLOW_STATES,
    LIVE_STEP_STATES,
    SUCCESS_STATES,
    StepState,
    StepSummary,
    WorkflowState,
    WorkflowSummary,
    one_line,
    state_of_error,
    state_of_stop,
)

if TYPE_CHECKING:
    from celery import Celery

#: `Stores.backend` kind of the eager runs.
KIND = "workflows-eager"
#: Runs kept per process (the oldest go first): eager mode is for tests and development.
MAX_RUNS = 10_000

_sequence = itertools.count(1)


def eager_mode(app: Celery) -> bool:
    """Whether `app` runs durable canvases and batches in process: `task_always_eager`, or
    its stores are in memory (`resilience.testing`)."""
    return bool(app.conf.task_always_eager) or isinstance(stores_for(app), MemoryStores)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


@dataclass
class EagerStep:
    """One step of an eager run: the flattened step and where it is."""

    spec: StepSpec
    state: StepState = StepState.PENDING
    result: Any = None
    error: str | None = None
    exception: BaseException | None = None
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    completed: int | None = None  # completion order, for reverse-order compensation
    compensation_state: StepState | None = None
    compensation_error: str | None = None

    @property
    def live(self) -> bool:
        return self.state in LIVE_STEP_STATES

    def summary(self) -> StepSummary:
        compensate = self.spec.compensate
        return StepSummary(
            position=self.spec.position, task_name=self.spec.task_name, state=self.state,
            task_id=self.spec.task_id, depends_on=self.spec.depends_on, result=self.result,
            error=self.error, started_at=self.started_at, finished_at=self.finished_at,
            compensate=None if compensate is None else compensate["task"],
            compensation_state=self.compensation_state,
            compensation_task_id=self.spec.compensation_task_id,
            compensation_error=self.compensation_error)


#: Called with each step once it is final (batches keep their members' EagerResults).
StepHook = Callable[[EagerStep, Any], None]


class EagerRun:
    """One workflow (or batch) run in process: its steps, its state, and the interpreter
    that drives them (see the module doc).

    Args:
        app: the Celery app whose tasks run the steps.
        steps: the flattened canvas (`canvas.flatten`, or a batch's member and callback steps).
        template: the workflow's result template.
        canvas: the document the PostgreSQL row would keep (a batch's has `batch`).
    """

    def __init__(self, app: Celery, *, workflow_id: str, name: str | None,
                 steps: list[StepSpec], template: Template, canvas: dict[str, Any]) -> None:
        self.app = app
        self.id = workflow_id
        self.name = name
        self.steps = [EagerStep(spec) for spec in steps]
        self.template = template
        self.canvas = canvas
        self.state = WorkflowState.RUNNING
        self.result: Any = None
        self.error: str | None = None
        self.exception: BaseException | None = None
        self.failed_step: int | None = None
        self.created_at = _now()
        self.finished_at: dt.datetime | None = None
        #: Told of each step once it is final, with its task's EagerResult (or None).
        self.on_step: StepHook | None = None
        self._last: Any = None  # the EagerResult of the step being ended

    # -- the interpreter --------------------------------------------------------------------
    def run(self) -> None:
        """Run every step that gets released, then the compensations; returns when final."""
        metrics.workflow_event(self.app, "STARTED", self.name)
        for step in self.steps:
            if self.state is not WorkflowState.RUNNING:
                break
            if not step.live:
                continue  # recorded from elsewhere (`EagerWorkflowBackend.record`)
            sources = [self.steps[p] for p in step.spec.depends_on]
            if step.spec.release == "succeeded" and any(
                    s.state not in SUCCESS_STATES for s in sources):
                # Only a batch member's failure leaves the run going: its dependents settle.
                self._end(step, StepState.SKIPPED, None, settled=True)
                continue
            self._execute(step)
        if self.state is WorkflowState.RUNNING:
            self._finish()
        else:
            self._compensate()
        metrics.workflow_event(self.app, str(self.state), self.name)

    def _execute(self, step: EagerStep) -> None:
        spec = step.spec
        sources = [self.steps[p] for p in spec.depends_on]
        arguments = input_args(spec.signature(),
                               {s.spec.position: s.result for s in sources},
                               {s.spec.position: s.state.value for s in sources})
        step.started_at = _now()
        started = time.perf_counter()
        state, value, error, exception = self._apply(spec.task_name, arguments, spec.kwargs,
                                                     spec.options, spec.task_id)
        self._end(step, state, error, value, exception)
        metrics.step_finished(spec.task_name, state.value, time.perf_counter() - started)

    def _apply(self, task_name: str, args: list[Any], kwargs: dict[str, Any],
               options: dict[str, Any], task_id: str | None
               ) -> tuple[StepState, Any, str | None, BaseException | None]:
        """Run one task inline, as eager Celery does (`Task.apply`: its guards, its eager
        retries); its final state, JSON result, error line and exception."""
        task = self.app.tasks[task_name]
        try:
            done = task.apply(tuple(args), dict(kwargs), task_id=task_id or str(uuid.uuid4()),
                              headers=options.get("headers"), throw=False)
        except Exception as exc:  # noqa: BLE001 - raised before the body: the step failed
            return StepState.FAILED, None, one_line(exc), exc
        self._last = done
        if done.state == "SUCCESS":
            stopped = outcome_of(done)  # a guard's stop (REPLAYED answers the value)
            if stopped is not None:
                state = state_of_stop(stopped.outcome) or StepState.FAILED
                if state not in SUCCESS_STATES:
                    reason = f"{stopped.outcome.value} by {stopped.guard}: {stopped.reason}"
                    return state, None, reason, None
            try:
                return StepState.SUCCEEDED, loads(dumps(done.result)), None, None
            except (TypeError, ValueError) as exc:
                return StepState.FAILED, None, (
                    f"UnserializableResult: a step's result must be what Celery's JSON "
                    f"carries ({exc})"), exc
        error = done.result if isinstance(done.result, BaseException) else None
        # No message to deliver again: a step Celery would run later (a deferral) fails.
        state = (state_of_error(error) if error is not None else None) or StepState.FAILED
        return state, None, one_line(error if error is not None else str(done.state)), error

    def _end(self, step: EagerStep, state: StepState, error: str | None, value: Any = None,
             exception: BaseException | None = None, *, settled: bool = False) -> None:
        """Give `step` its final state; a failure that is not a batch member's stops the run
        (a step `settled` unrun by its release condition stops nothing)."""
        step.state, step.error, step.exception = state, error, exception
        step.finished_at = _now()
        if state in SUCCESS_STATES:
            step.result, step.completed = value, next(_sequence)
        if self.on_step is not None:
            self.on_step(step, self._last)
        self._last = None
        if state not in SUCCESS_STATES and not step.spec.member and not settled \
                and self.state is WorkflowState.RUNNING:
            self._stop(WorkflowState.CANCELLED if state is StepState.CANCELLED
                       else WorkflowState.FAILED, step)

    def _stop(self, state: WorkflowState, failed: EagerStep) -> None:
        """The run fails (or is cancelled) at `failed`: released steps are cancelled,
        pending ones skipped."""
        self.state, self.error, self.exception = state, failed.error, failed.exception
        self.failed_step = failed.spec.position
        self.finished_at = _now()
        reason = f"workflow {self.id} is {state}"
        for step in self.steps:
            if step.live:
                released = all(self.steps[p].state in SUCCESS_STATES
                               for p in step.spec.depends_on)
                step.state = StepState.CANCELLED if released else StepState.SKIPPED
                step.error = reason if released else None
                step.finished_at = self.finished_at

    def _compensate(self) -> None:
        """Undo the succeeded steps, last completed first, one at a time."""
        done = sorted((s for s in self.steps
                       if s.state in SUCCESS_STATES and s.spec.compensate is not None),
                      key=lambda s: s.completed or 0, reverse=True)
        if not done:
            return
        if self.state is WorkflowState.FAILED:
            self.state = WorkflowState.COMPENSATING
        failed = False
        for step in done:
            signature = step.spec.compensate or {}
            arguments = list(signature.get("args") or ())
            if not signature.get("immutable"):
                arguments = [step.result, *arguments]
            state, _, error, _ = self._apply(signature["task"], arguments,
                                             dict(signature.get("kwargs") or {}),
                                             dict(signature.get("options") or {}),
                                             step.spec.compensation_task_id)
            self._last = None
            step.compensation_state = state
            step.compensation_error = None if state in SUCCESS_STATES else error
            failed = failed or state not in SUCCESS_STATES
        if self.state is WorkflowState.COMPENSATING:
            self.state = WorkflowState.FAILED if failed else WorkflowState.COMPENSATED

    def _finish(self) -> None:
        """Nothing remains: succeeded, or failed at the first step that did not succeed."""
        results = {s.spec.position: s.result for s in self.steps}
        self.result = resolve(self.template, {p: results[p] for p in positions(self.template)})
        self.finished_at = _now()
        failed = next((s for s in self.steps if s.state not in SUCCESS_STATES), None)
        if failed is None:
            self.state = WorkflowState.SUCCEEDED
            return
        self.state = WorkflowState.FAILED
        self.failed_step = failed.spec.position
        self.error, self.exception = failed.error or failed.state.value, failed.exception

    # -- views ------------------------------------------------------------------------------
    def summary(self, with_steps: bool = True) -> WorkflowSummary:
        counts: dict[str, int] = {}
        for step in self.steps:
            counts[step.state.value] = counts.get(step.state.value, 0) + 1
        return WorkflowSummary(
            id=self.id, name=self.name, state=self.state, created_at=self.created_at,
            finished_at=self.finished_at, result=self.result, error=self.error,
            failed_step=self.failed_step, total=len(self.steps),
            steps=[s.summary() for s in self.steps] if with_steps else [], counts=counts)


class EagerWorkflowBackend:
    """The eager runs of one app's stores, in process memory (see the module doc): what
    `describe`, `recent`, `run.get()` and the batch views read, with the PostgreSQL
    backend's reading methods. Thread-safe; the oldest runs go beyond `MAX_RUNS`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: OrderedDict[str, EagerRun] = OrderedDict()
        self._tasks: dict[str, tuple[str, int]] = {}

    def add(self, run: EagerRun) -> None:
        """Keep `run` (before it runs: its steps can be found while they run)."""
        with self._lock:
            self._runs[run.id] = run
            for step in run.steps:
                self._tasks[step.spec.task_id] = (run.id, step.spec.position)
            while len(self._runs) > MAX_RUNS:
                _, old = self._runs.popitem(last=False)
                for step in old.steps:
                    self._tasks.pop(step.spec.task_id, None)

    def find(self, workflow_id: str) -> EagerRun | None:
        """The run of this id, or None."""
        with self._lock:
            return self._runs.get(workflow_id)

    def get(self, workflow_id: str) -> EagerRun:
        """The run of this id.

        Raises:
            WorkflowNotFound: no eager run has it (never started, or its transaction rolled
                back).
        """
        found = self.find(workflow_id)
        if found is None:
            raise WorkflowNotFound(f"no workflow {workflow_id!r}", workflow_id=workflow_id)
        return found

    def state(self, workflow_id: str) -> tuple[str, Any, str | None, int | None]:
        """(state, result, error, failed step) as `WorkflowBackend.state` gives them."""
        run = self.get(workflow_id)
        return run.state.value, run.result, run.error, run.failed_step

    def summary(self, workflow_id: str) -> WorkflowSummary:
        """The run and each of its steps (`describe`)."""
        return self.get(workflow_id).summary()

    def recent(self, *, limit: int = 50, state: str | None = None) -> list[WorkflowSummary]:
        """The latest runs, newest first, optionally of one `state` (steps not read).

        Raises:
            ValueError: an unknown state.
        """
        wanted = None if state is None else WorkflowState(state)
        with self._lock:
            runs = list(reversed(self._runs.values()))
        return [run.summary(with_steps=False) for run in runs
                if wanted is None or run.state is wanted][:limit]

    def record(self, connection: Any, *, task_id: str, state: StepState,
               workflow_id: str | None = None, error: str | None = None) -> Released:
        """Give the step of `task_id` its final state, once (`WorkflowBackend.record`): a
        step already final is left as it is (`recorded` False)."""
        with self._lock:
            found = self._tasks.get(task_id)
            run = None if found is None else self._runs.get(found[0])
        if run is None or (workflow_id is not None and run.id != workflow_id):
            return Released()
        step = run.steps[found[1]]
        if not step.live:
            return Released()
        state = StepState(state)
        run._end(step, state, None if state in SUCCESS_STATES else (error or state.value))
        return Released(recorded=True, workflow_state=run.state.value)


def _build(stores: Stores) -> EagerWorkflowBackend:
    return EagerWorkflowBackend()


def eager_backend_of(stores: Stores) -> EagerWorkflowBackend:
    """The eager runs kept for `stores` (one per process and stores; in memory mode the
    `MemoryStores` one, emptied by `reset`)."""
    return stores.backend(KIND, _build, memory=EagerWorkflowBackend)


def eager_backend(app: Celery) -> EagerWorkflowBackend:
    """The eager runs of `app` (see `eager_backend_of`)."""
    return eager_backend_of(stores_for(app))


def start(run: EagerRun, connection: Any = None) -> None:
    """Keep and run `run` when `connection`'s transaction commits (None: at once); a
    rollback leaves nothing (`resilience.outbox`'s in-memory rule: a SQLAlchemy Session or
    Connection on any database).

    Raises:
        ConfigurationError: `connection` is no transaction this can follow.
    """
    backend = eager_backend(run.app)

    def committed() -> None:
        backend.add(run)
        run.run()

    on_transaction_end(connection, committed, lambda: None)


class EagerWorkflowRun:
    """The handle of an eager run: `WorkflowRun`'s `id`, `name`, `state`, `get()`,
    `ready()`, read from process memory."""

    def __init__(self, app: Celery, workflow_id: str, name: str | None = None) -> None:
        self.app = app
        self.id = workflow_id
        self.name = name

    @property
    def backend(self) -> EagerWorkflowBackend:
        return eager_backend(self.app)

    @property
    def state(self) -> WorkflowState:
        """The run's state (final once `apply_async` returned).

        Raises:
            WorkflowNotFound: its transaction has not committed (or rolled back).
        """
        return self.backend.get(self.id).state

    def get(self, timeout: float | None = 30.0, interval: float = 0.05) -> Any:
        """The workflow's result, as plain Celery's `.get()` gives it for the canvas.
        (`timeout` and `interval` are accepted for `WorkflowRun`'s signature: an eager run
        is already final.)

        Raises:
            WorkflowFailed: it failed, was compensated or cancelled (`.state`, `.step`,
                `.error`); the step's own exception is its `__cause__`.
            WorkflowNotFound: its transaction has not committed (or rolled back).
        """
        run = self.backend.get(self.id)
        if run.state is WorkflowState.SUCCEEDED:
            return run.result
        where = f" at step {run.failed_step}" if run.failed_step is not None else ""
        raise WorkflowFailed(f"workflow {self.id} {run.state}{where}: {run.error}",
                             state=run.state.value, step=run.failed_step, error=run.error,
                             workflow_id=self.id) from run.exception

    def ready(self) -> bool:
        """Whether the run is final (it is, once its transaction committed)."""
        found = self.backend.find(self.id)
        return found is not None and found.state in FINAL_WORKFLOW_STATES

    def __repr__(self) -> str:
        return f"<EagerWorkflowRun {self.id}{f' {self.name!r}' if self.name else ''}>"


__all__ = ["KIND", "EagerRun", "EagerStep", "EagerWorkflowBackend", "EagerWorkflowRun",
           "eager_backend", "eager_backend_of", "eager_mode", "start"]
