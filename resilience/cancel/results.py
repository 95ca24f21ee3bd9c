"""The result of a job cancelled by id before it started: CANCELLED at once, never REVOKED.

Celery's worker answers a `revoke` broadcast by marking the job REVOKED in the result backend
when its state there is still unstarted (PENDING, RECEIVED, RETRY, REJECTED), on every
worker the broadcast reaches, whether or not it consumes the job's queue (Celery 5.7,
`celery/worker/control.py` `_revoke`). `jobs cancel ID` sends one so running workers drop
the message at once; without this module its job was REVOKED the moment another tier's
worker heard it, then SUCCESS with outcome CANCELLED when the cancel guard stopped its
delivery. The stored state changed, and a caller's `.get()` answered whichever it saw
first (`TaskRevokedError` while the job's workers were down)::

    jobs cancel ID           standard worker (revoke)       critical worker (restarted)
    record + mark
    revoke ───────────────▶  state PENDING: store REVOKED
                                                            guard: CANCELLED, store SUCCESS
    caller .get() ─▶ REVOKED (published first) although the job ends CANCELLED

`store_cancelled` runs before the `revoke`: it stores the outcome the cancel guard would
(`cancelled_stop`), so the revoke finds a final state and writes nothing, the guard's later
write is refused (nothing replaces SUCCESS), and every reader sees CANCELLED from the start.
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
    started (STARTED: the platform tracks it) or finished keeps its state: a transactional
    body meets the mark at its checkpoint. As in Celery's own revoke, the state is read, then
    written: a worker that starts the job in between (only one whose copy of the marks is
    older than the cancellation, `refresh_seconds`) is overwritten.

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
