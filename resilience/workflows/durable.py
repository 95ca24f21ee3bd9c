"""Starting a canvas durably: `durable(sig).apply_async()` and the run handle it returns.

    run = durable(chain(a.s(1), group(b.s(), c.s()), d.s()), name="orders").apply_async()
    run.get(timeout=30)          # read from PostgreSQL: no result backend, no chord_unlock

`apply_async()` writes the workflow, its steps and the outbox rows of its first steps in one
transaction of its own, then publishes those rows itself (the relay publishes them if this
process dies first); `apply_async_in(session)` writes them in the caller's transaction and
leaves the publishing to the relay, so nothing exists unless the caller commits.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

from celery import current_app
from celery.canvas import Signature

from resilience.errors import InvalidTaskArguments
from resilience.keys import canonical_arguments
from resilience.outbox.backends.memory import on_transaction_end
from resilience.outbox.relay import publish_held
from resilience.stores import MemoryStores, stores_for
from resilience.workflows import metrics
from resilience.workflows.backend import WorkflowBackend
from resilience.workflows.canvas import COMPENSATE_OPTION, StepSpec, flatten
from resilience.workflows.eager import EagerRun, EagerWorkflowRun, eager_mode
from resilience.workflows.eager import start as eager_start
from resilience.workflows.errors import InvalidWorkflow, WorkflowFailed, WorkflowTimeout
from resilience.workflows.guard import WorkflowGuard, workflow_backend
from resilience.workflows.states import FINAL_WORKFLOW_STATES, WorkflowState

if TYPE_CHECKING:
    from celery import Celery, Task


class WorkflowRun:
    """A started workflow: its id, its state and its result, read from PostgreSQL."""

    def __init__(self, app: Celery, workflow_id: str, name: str | None = None) -> None:
        self.app = app
        self.id = workflow_id
        self.name = name

    @property
    def backend(self) -> WorkflowBackend:
        return workflow_backend(self.app)

    @property
    def state(self) -> WorkflowState:
        """The workflow's state now.

        Raises:
            WorkflowNotFound: the workflow was rolled back (or deleted).
        """
        return WorkflowState(self.backend.state(self.id)[0])

    def get(self, timeout: float | None = 30.0, interval: float = 0.05) -> Any:
        """Wait for the workflow's result: what plain Celery's `.get()` returns for the
        canvas (the last step's result, a group's list, a chord body's result).

        Args:
            timeout: seconds to wait; None waits for ever.
            interval: seconds between reads.

        Raises:
            WorkflowFailed: it failed, is compensating or compensated, or was cancelled
                (`.state`, `.step`, `.error`).
            WorkflowTimeout: no final state within `timeout`.
            WorkflowNotFound: no such workflow.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        backend = self.backend
        while True:
            state, result, error, step = backend.state(self.id)
            if state == WorkflowState.SUCCEEDED:
                return result
            if state != WorkflowState.RUNNING:
                where = f" at step {step}" if step is not None else ""
                raise WorkflowFailed(f"workflow {self.id} {state}{where}: {error}",
                                     state=state, step=step, error=error,
                                     workflow_id=self.id)
            if deadline is not None and time.monotonic() >= deadline:
                raise WorkflowTimeout(f"workflow {self.id} still {state} after {timeout}s",
                                      workflow_id=self.id, state=state)
            time.sleep(interval)

    def ready(self) -> bool:
        """Whether the workflow reached a final state."""
        return self.state in FINAL_WORKFLOW_STATES

    def __repr__(self) -> str:
        return f"<WorkflowRun {self.id}{f' {self.name!r}' if self.name else ''}>"


class DurableCanvas:
    """A canvas ready to start durably (see `durable`)."""

    def __init__(self, canvas: Signature, *, name: str | None = None,
                 app: Celery | None = None) -> None:
        if not isinstance(canvas, Signature):
            raise InvalidWorkflow(f"durable() takes a Celery signature (task.s(), chain, group, "
                                  f"chord), got {type(canvas).__name__}")
        self.canvas = canvas
        self.name = name
        self.steps, self.template = flatten(canvas)
        self.app = app or self._app_of(canvas)
        for step in self.steps:
            self._check(step)

    @staticmethod
    def _app_of(canvas: Signature) -> Celery:
        """The app of the canvas's tasks: a chain or group made with `chain(...)` carries
        none of its own, and the current app may be another (a test's, a second app's)."""
        pending = [canvas]
        while pending:
            sig = pending.pop(0)
            if sig._app is not None:
                return sig._app
            tasks = sig.get("kwargs", {}).get("tasks") if isinstance(sig, dict) else None
            pending.extend(getattr(sig, "tasks", None) or tasks or ())
            body = getattr(sig, "body", None)
            if isinstance(body, Signature):
                pending.append(body)
        return current_app._get_current_object()

    def _task(self, name: str, role: str) -> Task:
        task = self.app.tasks.get(name)
        if task is None:
            raise InvalidWorkflow(f"{role} names {name!r}, which is not a registered task of "
                                  f"app {self.app.main!r} (import its module first)", task=name)
        pipelines = getattr(task, "pipelines", None)
        guarded = pipelines is not None and any(
            isinstance(guard, WorkflowGuard) for guard in pipelines()[0].guards)
        if not guarded:
            raise InvalidWorkflow(
                f"{name} cannot run as a durable workflow step: it is not a GuardedTask with "
                f"the workflow guards (call resilience.init_app(app) on app {self.app.main!r})",
                task=name)
        return task

    def _check(self, step: StepSpec) -> None:
        task = self._task(step.task_name, f"step {step.position}")
        try:
            canonical_arguments({"args": step.args, "kwargs": step.kwargs,
                                 "options": step.options})
        except InvalidTaskArguments as exc:
            raise InvalidWorkflow(f"step {step.position} ({step.task_name}) cannot be stored: "
                                  f"{exc}", task=step.task_name) from None
        if step.source is None or step.immutable:
            validate = getattr(task, "validate_arguments", None)
            if validate is not None:
                try:
                    validate(tuple(step.args), dict(step.kwargs))
                except InvalidTaskArguments as exc:
                    raise InvalidWorkflow(f"step {step.position} ({step.task_name}): {exc}",
                                          task=step.task_name) from None
        if step.compensate is not None:
            self._task(step.compensate["task"], f"the compensation of step {step.position}")

    def _document(self) -> dict[str, Any]:
        return {"signature": dict(self.canvas), "result": self.template}

    def _stores_checked(self) -> Any:
        stores = stores_for(self.app)
        if isinstance(stores, MemoryStores) or not stores.has_database:
            raise InvalidWorkflow("durable workflows keep their state in PostgreSQL: configure "
                                  "resilience_database_url (memory stores cannot run them)")
        return stores

    def _run_eagerly(self, session: Any) -> EagerWorkflowRun:
        """Memory mode or `task_always_eager`: run the canvas in process when `session`
        commits (None: now), as plain Celery runs a canvas eagerly (`eager.py`)."""
        run = EagerRun(self.app, workflow_id=uuid.uuid4().hex, name=self.name,
                       steps=self.steps, template=self.template, canvas=self._document())
        eager_start(run, session)
        return EagerWorkflowRun(self.app, run.id, self.name)

    def apply_async(self) -> WorkflowRun | EagerWorkflowRun:
        """Write the workflow in a transaction of its own, then publish its first steps.

        In memory mode (`resilience.testing`) and under `task_always_eager` the canvas runs
        in process instead, before this returns (`resilience.workflows.eager`); the run's
        `get()` answers at once.

        Raises:
            InvalidWorkflow: checked before anything is written.
            StorageError: PostgreSQL failed (nothing was written).
        """
        if eager_mode(self.app):
            return self._run_eagerly(None)
        stores = self._stores_checked()
        workflow_id = uuid.uuid4().hex
        backend = workflow_backend(self.app)
        with stores.engine().begin() as connection:
            released = backend.create(connection, workflow_id=workflow_id, name=self.name,
                                      canvas=self._document(), steps=self.steps)
        metrics.workflow_event(self.app, "STARTED", self.name)
        publish_held(self.app, released.rows, backend.outbox)
        return WorkflowRun(self.app, workflow_id, self.name)

    def apply_async_in(self, session: Any) -> WorkflowRun | EagerWorkflowRun:
        """Write the workflow, its steps and its first outbox rows in the caller's
        transaction; the relay publishes them once it commits. (Memory mode and
        `task_always_eager`: the canvas runs in process when it commits, never on rollback.)

        Args:
            session: a SQLAlchemy Session or Connection on the app's database.

        Raises:
            InvalidWorkflow: checked before anything is written.
            StorageError: an insert failed (the caller's transaction is aborted).
        """
        if eager_mode(self.app):
            return self._run_eagerly(session)
        self._stores_checked()
        workflow_id = uuid.uuid4().hex
        workflow_backend(self.app).create(session, workflow_id=workflow_id, name=self.name,
                                          canvas=self._document(), steps=self.steps,
                                          hold=False)
        # Counted once the caller commits (a rolled-back run never started); counting at
        # the first step's start would cost every step's start a check.
        on_transaction_end(session, lambda: metrics.workflow_event(
            self.app, "STARTED", self.name), lambda: None)
        return WorkflowRun(self.app, workflow_id, self.name)


def durable(canvas: Signature, *, name: str | None = None,
            app: Celery | None = None) -> DurableCanvas:
    """`canvas` (a task signature, chain, group, chord, nested) to start durably.

    Compensations are a signature option: `charge.s(order).set(compensate=refund.s(order))`.

    Raises:
        InvalidWorkflow: an unsupported canvas, a task that is not registered or not a
            GuardedTask (its app never initialised), arguments that cannot be stored.
    """
    return DurableCanvas(canvas, name=name, app=app)


__all__ = ["COMPENSATE_OPTION", "DurableCanvas", "WorkflowRun", "durable"]
