"""Final outcomes no guard sees, recorded from Celery's signals (steps and batch members).

The workflow guard records every outcome of an execution that reaches the guard pipeline.
These are the rest:

- `task_failure` in the worker's pool process for a job that failed before its pipeline
  ran (arguments that no longer fit the signature: dead-lettered by the intake check);
- `task_failure` in the worker's main process: a hard time limit whose message is
  acknowledged (Celery's default `acks_on_timeout`), a lost worker process whose message
  is not requeued;
- `task_revoked`: Celery's `revoke` (`jobs cancel` sends one too) or an expired job,
  dropped by the worker without running: `cancelled`, or `shed` when it expired;
- `job_deduplicated` (`resilience.idempotency.unique`), in the outbox relay: a batch member
  whose `@unique` key another job holds is never published, so it never runs: `skipped`.
  It does not follow the holder, which may be no member and whose outcome may come much
  later; its own result names the holder (`details.existing_task_id`).

The main process knows the job's id, not its headers, so those find the step by task id
(unique, indexed). A job that is no step costs a header lookup in the pool process and one
indexed statement in the main process, only on these rare paths.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from celery import signals
from celery.exceptions import TimeLimitExceeded, WorkerLostError

from resilience.headers import BATCH_HEADER, Headers
from resilience.idempotency.unique import job_deduplicated
from resilience.outbox.relay import publish_held
from resilience.workflows.guard import handled, workflow_backend
from resilience.workflows.states import StepState, one_line, state_of_error

logger = logging.getLogger("resilience.workflows")

_connected = False


def _record(sender: Any, task_id: str | None, state: StepState | None,
            workflow_id: str | None, error: str | None = None) -> None:
    if task_id is None or state is None or sender is None:
        return
    try:
        backend = workflow_backend(sender.app)
        released = backend.record(None, task_id=task_id, state=state,
                                  workflow_id=workflow_id, error=error)
        if released.rows:
            publish_held(sender.app, released.rows, backend.outbox)
    except Exception as exc:  # noqa: BLE001 - a signal handler must not break the worker
        logger.error("step %s: final state %s NOT recorded: %s", task_id, state, exc)
        return
    if released.recorded:
        logger.info("step %s: %s (no guard saw it)", task_id, state,
                    extra={"task_id": task_id, "workflow_id": workflow_id})


def on_task_failure(sender: Any = None, task_id: str | None = None,
                    exception: BaseException | None = None, **_: Any) -> None:
    """Record a failure the guards did not see (see the module doc)."""
    if sender is None or task_id is None or exception is None or handled(task_id):
        return
    if isinstance(exception, TimeLimitExceeded | WorkerLostError):
        # The main process: Celery sends this signal for a lost worker only when the
        # message is not requeued; a hard time limit is requeued unless acks_on_timeout.
        if (isinstance(exception, TimeLimitExceeded) and getattr(sender, "acks_late", False)
                and not getattr(sender, "acks_on_timeout", True)):
            return
        _record(sender, task_id, StepState.FAILED, None, one_line(exception))
        return
    request = getattr(sender, "request", None)
    if getattr(request, "id", None) != task_id:
        return
    headers = Headers(request)
    step = headers.workflow_step
    workflow_id = step.workflow_id if step is not None else headers.batch_id
    if workflow_id is not None and (step is None or not step.compensation):
        _record(sender, task_id, state_of_error(exception), workflow_id, one_line(exception))


def on_task_revoked(sender: Any = None, request: Any = None, expired: bool = False,
                    **_: Any) -> None:
    """A revoked or expired job the worker dropped: the step is cancelled or shed."""
    task_id = getattr(request, "id", None) or getattr(request, "task_id", None)
    state = StepState.SHED if expired else StepState.CANCELLED
    _record(sender, task_id, state, None, "expired" if expired else "revoked")


def on_job_deduplicated(sender: Any = None, task_id: str | None = None,
                        holder: str | None = None, headers: Any = None, **_: Any) -> None:
    """A batch member deduplicated at publish by `@unique` will never run: `skipped`.

    Raises:
        StorageError: not recorded; the enqueue raises it, so the relay publishes the row
            again later (and records then).
    """
    batch_id = headers.get(BATCH_HEADER) if isinstance(headers, Mapping) else None
    if sender is None or task_id is None or not isinstance(batch_id, str) or not batch_id:
        return
    backend = workflow_backend(sender.app)
    released = backend.record(None, task_id=task_id, state=StepState.SKIPPED,
                              workflow_id=batch_id, error=f"its unique key is held by {holder}")
    if released.rows:
        publish_held(sender.app, released.rows, backend.outbox)
    if released.recorded:
        logger.info("batch %s member %s skipped: its unique key is held by %s", batch_id,
                    task_id, holder, extra={"batch_id": batch_id, "task_id": task_id})


def connect() -> None:
    """Connect the handlers to Celery's signals and `job_deduplicated` (once per process)."""
    global _connected
    if _connected:
        return
    signals.task_failure.connect(on_task_failure, weak=False)
    signals.task_revoked.connect(on_task_revoked, weak=False)
    job_deduplicated.connect(on_job_deduplicated, weak=False)
    _connected = True
