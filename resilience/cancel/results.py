"""The result of a job cancelled by id before it started: CANCELLED at once, never REVOKED.

Celery's worker answers a `revoke` broadcast by storing REVOKED for a job not yet started,
on every worker it reaches (Celery 5.7, `celery/worker/control.py` `_revoke`), so without
this module the stored state changed under the caller::

    jobs cancel ID           standard worker (revoke)       critical worker (restarted)
    record + mark
    revoke ───────────────▶  state PENDING: store REVOKED
                                                            guard: CANCELLED, store SUCCESS
    caller .get() ─▶ REVOKED (published first) although the job ends CANCELLED

`store_cancelled` runs before the `revoke` and stores the guard's outcome first, so the
revoke finds a final state and every reader sees CANCELLED (docs/operations.md).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from celery import states
from celery.app.task import Context

from resilience.cancel.backends import id_target
from resilience.errors import StorageError
from resilience.outcomes import OUTCOME_REQUEST_ATTRIBUTE, Outcome, Stop

if TYPE_CHECKING:
    from celery import Celery

logger = logging.getLogger("resilience.cancel")

#: Name of the cancel guard, in the outcome it records.
GUARD_NAME = "cancel"
#: States of a job no worker has started: those Celery's revoke marks REVOKED.
UNSTARTED_STATES = frozenset({states.PENDING, states.RECEIVED, states.RETRY, states.REJECTED})


def cancelled_stop(reason: str, target: str) -> Stop:
    """The stop of a job cancelled by `target` ("id:<task id>" or "key:<task>:<key>")."""
    return Stop(Outcome.CANCELLED, guard=GUARD_NAME, reason=f"cancelled: {reason}",
                details={"target": target})


def store_cancelled(app: Celery, task_id: str, *, reason: str) -> bool:
    """Store job `task_id`'s result as the cancel guard would, if no worker started it yet.

    Call it after the cancellation is recorded and before Celery's `revoke`. A job already
    started or finished keeps its state. As in Celery's own revoke, the state is read, then
    written (a worker starting the job in between is overwritten).

    Returns:
        True when the CANCELLED outcome was stored.

    Raises:
        StorageError: the result backend failed (the cancellation itself is recorded).
    """
    backend = app.backend
    try:
        if backend.get_state(task_id) not in UNSTARTED_STATES:
            return False
        stop = cancelled_stop(reason, id_target(task_id))
        request: Any = Context(id=task_id)
        # The result backends of resilience.results store the decision beside the value.
        setattr(request, OUTCOME_REQUEST_ATTRIBUTE, stop.as_meta())
        backend.mark_as_done(task_id, stop.as_result(), request=request)
    except Exception as error:  # any backend's own errors, wrapped once here
        raise StorageError(f"cancelled job {task_id}: its result was not stored: {error}") \
            from error
    logger.info("cancelled job %s before it started: result stored as CANCELLED", task_id)
    return True
