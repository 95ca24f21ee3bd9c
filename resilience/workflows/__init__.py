"""Durable canvas: Celery's chain, group and chord, with their state in PostgreSQL.

    from celery import chain, group
    from resilience.workflows import durable

    run = durable(chain(a.s(1), group(b.s(), c.s()), d.s()), name="orders").apply_async()
    run.get(timeout=30)

A step's completion and the publish of what it releases commit in one transaction (the
outbox), so no crash, redelivery, Redis flush or result-backend loss drops or doubles a
continuation; chords need no chord_unlock and no result backend. A failed workflow runs
the compensations of its succeeded steps (`.set(compensate=undo.s())`) in reverse order,
one at a time. Operators: `describe`, `recent`, `cancel`, `retry`, `replay`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from celery import current_app

from resilience.stores import MemoryStores
from resilience.workflows.backend import WorkflowBackend, backend_for
from resilience.workflows.durable import DurableCanvas, WorkflowRun, durable
from resilience.workflows.eager import EagerWorkflowRun, eager_backend_of
from resilience.workflows.errors import (
    InvalidWorkflow,
    WorkflowFailed,
    WorkflowNotFound,
    WorkflowNotRetryable,
    WorkflowTimeout,
)
from resilience.workflows.guard import (
    WorkflowConfig,
    WorkflowGuard,
    WorkflowRecordGuard,
    cancel_steps,
    workflow_guards,
)
from resilience.workflows.metrics import observe_steps, workflow_event
from resilience.workflows.states import StepState, StepSummary, WorkflowState, WorkflowSummary

if TYPE_CHECKING:
    from celery import Celery

    from resilience.stores import Stores

__all__ = [
    "DurableCanvas",
    "EagerWorkflowRun",
    "InvalidWorkflow",
    "StepState",
    "StepSummary",
    "WorkflowBackend",
    "WorkflowConfig",
    "WorkflowFailed",
    "WorkflowGuard",
    "WorkflowNotFound",
    "WorkflowNotRetryable",
    "WorkflowRecordGuard",
    "WorkflowRun",
    "WorkflowState",
    "WorkflowSummary",
    "WorkflowTimeout",
    "cancel",
    "describe",
    "durable",
    "observe_steps",
    "recent",
    "replay",
    "retry",
    "workflow_guards",
]


def _backend(stores: Stores) -> WorkflowBackend:
    return stores.backend("workflows", backend_for)


def describe(stores: Stores, workflow_id: str) -> WorkflowSummary:
    """The workflow and each of its steps.

    Raises:
        WorkflowNotFound; StorageError: PostgreSQL cannot be read.
    """
    eager = eager_backend_of(stores)
    if isinstance(stores, MemoryStores) or eager.find(workflow_id) is not None:
        return eager.summary(workflow_id)  # run in process (memory mode, eager)
    return _backend(stores).summary(workflow_id)


def recent(stores: Stores, *, limit: int = 50, state: str | None = None
           ) -> list[WorkflowSummary]:
    """The latest workflows, newest first, optionally of one `state` (steps not read).

    Raises:
        ValueError: an unknown state; StorageError: PostgreSQL cannot be read.
    """
    ran = eager_backend_of(stores).recent(limit=limit, state=state)
    if isinstance(stores, MemoryStores):
        return ran  # memory mode: the runs of this process only
    stored = _backend(stores).recent(limit=limit, state=state)
    if not ran:
        return stored
    return sorted([*ran, *stored], key=lambda found: found.created_at, reverse=True)[:limit]


def cancel(stores: Stores, workflow_id: str, *, app: Celery | None = None
           ) -> WorkflowSummary:
    """Cancel a running workflow: pending steps are skipped, queued ones cancelled
    (`resilience.cancel`; one already running finishes and is compensated), and the
    compensations of its succeeded steps run (published by the outbox relay).

    Args:
        app: the Celery app whose cancellations to write (default: the current app).

    Raises:
        WorkflowNotFound; StorageError.
    """
    backend = _backend(stores)
    released = backend.cancel(workflow_id)
    app = app or current_app._get_current_object()
    if released.cancel:
        cancel_steps(app, released.cancel)
    if released.finished is not None:
        workflow_event(app, str(released.finished), released.name)
    return backend.summary(workflow_id)


def retry(stores: Stores, workflow_id: str, *, from_step: int | None = None
          ) -> WorkflowSummary:
    """Run a stopped workflow again from its failed step (or step `from_step`): that step,
    every step that did not succeed and their transitive dependents go back to pending,
    the ready ones republished (by the outbox relay) with their recorded input; a step that
    depends on none of them keeps its result and is not run again. A re-run step really
    runs: its idempotency key gets its run counter (`workflow:<id>:<pos>:<n>`).

    Raises:
        WorkflowNotFound, WorkflowNotRetryable; StorageError.
    """
    backend = _backend(stores)
    backend.restart(workflow_id, from_step)
    return backend.summary(workflow_id)


def replay(stores: Stores, workflow_id: str, *, from_step: int) -> WorkflowSummary:
    """A new run of the workflow's canvas (`replay_of` = this one): `from_step` and its
    transitive dependents run again, every other step is copied as succeeded with its
    result; it starts at `from_step` (published by the outbox relay).

    Raises:
        WorkflowNotFound, WorkflowNotRetryable; StorageError.
    """
    backend = _backend(stores)
    new_id, _ = backend.replay(workflow_id, from_step)
    return backend.summary(new_id)
