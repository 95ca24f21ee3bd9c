"""Recording a batch member's final state: two execution guards and the outcome mapping.

Every job of a batch carries the batch id in the message header `batch_id`. Its final
outcome is recorded once (`BatchBackend.record` leaves `pending` only once), by:

- `BatchGuard` (stage BATCH, outermost: it sees every other guard's stop and the error the
  retry guard settled on). It records in a short transaction of its own after the job's
  own effects committed, and before Celery stores the result and acknowledges the message:
  a worker killed before it recorded leaves the message to be delivered again.
- `BatchTransactionGuard` (stage BATCH_RECORD, just inside IDEMPOTENCY): for an
  `@idempotent(transactional=True)` job it records SUCCEEDED through the body's session,
  so the state commits in the same transaction as the job's writes and its idempotency
  record (and rolls back with them). The outer guard then has nothing left to do.

Outcomes, as `state_of_stop` / `state_of_error` map them: a body that returned is
SUCCEEDED; REPLAYED is `replayed` (the key had already succeeded: it counts as success);
SHED, SKIPPED, CANCELLED and DEAD-LETTERED keep their names; any other error is `failed`.
DEFERRED, RETRY and a requeueing `Reject` are not final: the job will run again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from resilience.batches.backends import BatchBackend, MemberState, Recorded
from resilience.batches.backends.memory import batch_backend
from resilience.errors import ConfigurationError, DeadLettered, StorageError
from resilience.outcomes import Outcome, Stop
from resilience.pipeline import Call, Guard, Stage
from resilience.store_down import StoreDown, store_down_policy, store_failed

if TYPE_CHECKING:
    from celery import Task

logger = logging.getLogger("resilience.batches")

#: Message header carrying the batch id of a member job.
GUARD_NAME = "batch"


#: Where the batch guards sit (`resilience.pipeline.STAGES`): BATCH outside every other guard
#: (it sees each stop, CANCEL, POISON and DEADLINE included); BATCH_RECORD inside IDEMPOTENCY,
#: so its commit runs before the body's transaction commits.
BatchStage = Stage


_STOP_STATES: dict[Outcome, MemberState | None] = {
    Outcome.SUCCEEDED: MemberState.SUCCEEDED,
    Outcome.REPLAYED: MemberState.REPLAYED,
    Outcome.SHED: MemberState.SHED,
    Outcome.SKIPPED: MemberState.SKIPPED,
    Outcome.CANCELLED: MemberState.CANCELLED,
    Outcome.DEAD_LETTERED: MemberState.DEAD_LETTERED,
    Outcome.REJECTED: MemberState.SKIPPED,
    Outcome.DISCARDED: MemberState.SKIPPED,
    Outcome.DEFERRED: None,
    Outcome.RETRY: None,
    Outcome.FAIL_OPEN: None,
}


def state_of_stop(outcome: Outcome | str) -> MemberState | None:
    """The member state a guard's stop leaves; None when the job will run again."""
    return _STOP_STATES.get(Outcome(outcome))


def state_of_error(error: BaseException) -> MemberState | None:
    """The member state an error leaves; None when Celery will run the job again."""
    from celery.exceptions import Ignore, Reject, Retry

    if isinstance(error, Stop):
        return state_of_stop(error.outcome)
    if isinstance(error, Retry):
        return None
    if isinstance(error, Reject):
        return None if error.requeue else MemberState.FAILED
    if isinstance(error, Ignore):
        return MemberState.SKIPPED
    if isinstance(error, DeadLettered):
        return MemberState.DEAD_LETTERED
    outcome = getattr(error, "outcome", None)  # JobStopped: a stopped chord member
    if isinstance(outcome, str) and outcome in Outcome._value2member_map_:
        return state_of_stop(outcome)
    return MemberState.FAILED


# The job ids whose outcome a guard handled in this thread, so the Celery signal that
# follows (`resilience.batches.signals`) does not record it again.
_handled = threading.local()


def handled(task_id: str | None) -> bool:
    """Did a batch guard of this thread handle the outcome of `task_id` (last job only)?"""
    return task_id is not None and getattr(_handled, "task_id", None) == task_id


@dataclass(frozen=True, kw_only=True)
class BatchConfig:
    """Options of the batch guards.

    Args:
        on_store_down: "fail_closed" (default): when PostgreSQL cannot take the member's
            state the job is DEFERRED and delivered again to record it (its body runs again
            unless it is `@idempotent`); "fail_open": log, count FAIL-OPEN and go on (the
            member stays pending and its batch never completes).
        retry_seconds: the deferral under "fail_closed".
    """

    on_store_down: StoreDown | str = StoreDown.FAIL_CLOSED
    retry_seconds: float = 2.0

    def __post_init__(self) -> None:
        if not self.retry_seconds > 0:
            raise ConfigurationError(f"retry_seconds must be > 0, got {self.retry_seconds}")
        object.__setattr__(self, "on_store_down", store_down_policy(self.on_store_down))


#: How a guard finds its backend: one object, or one per task (the task's app's stores).
BackendOption = BatchBackend | Callable[["Task"], BatchBackend] | None


class BatchGuard(Guard):
    """Records the final state of a batch member (see the module doc).

    Args:
        config: the options.
        backend: the batch store, a callable returning one per task, or None for PostgreSQL
            of the task's app.
    """

    name = GUARD_NAME
    stage = BatchStage.BATCH

    def __init__(self, config: BatchConfig | None = None, backend: BackendOption = None) -> None:
        self.config = config or BatchConfig()
        self._backend = backend
        #: The guard that records inside a transactional body; add both to a task.
        self.in_transaction = BatchTransactionGuard(self)

    def backend(self, task: Task) -> BatchBackend:
        """The batch store of `task`'s app."""
        if self._backend is None:
            return batch_backend(task.app)
        if callable(self._backend):
            return self._backend(task)
        return self._backend

    def before_run(self, call: Call) -> None:
        batch_id = call.headers.batch_id
        if batch_id is not None:
            call.keep(self, batch_id)

    def after_run(self, call: Call, result: Any) -> None:
        self._record(call, MemberState.SUCCEEDED)

    def on_stop(self, call: Call, stop: Stop) -> None:
        self._record(call, state_of_stop(stop.outcome))

    def on_error(self, call: Call, exc: BaseException) -> None:
        self._record(call, state_of_error(exc))

    def _record(self, call: Call, state: MemberState | None) -> None:
        batch_id = call.take_back(self)
        if batch_id is None:
            return
        _handled.task_id = call.task_id
        in_transaction: Recorded | None = call.take_back(self.in_transaction)
        if in_transaction is not None and call.task_id is not None:
            # Its state committed with the body's transaction.
            log_recorded(call.task_id, batch_id, MemberState.SUCCEEDED, in_transaction.completed)
            return
        if state is None or call.task_id is None:
            return  # the job will run again
        try:
            done = self.backend(call.task).record(None, task_id=call.task_id, state=state,
                                                  batch_id=batch_id)
        except StorageError as exc:
            _handled.task_id = None
            store_failed(call, exc, guard=GUARD_NAME, policy=self.config.on_store_down,
                         retry_after_seconds=self.config.retry_seconds,
                         details={"batch_id": batch_id, "state": state.value})
            return
        log_recorded(call.task_id, batch_id, state, done.completed)


def log_recorded(task_id: str, batch_id: str | None, state: MemberState,
                 completed: tuple[str, ...]) -> None:
    """One log line per batch completed by this record (the callbacks are written)."""
    for done in completed:
        logger.info("batch %s complete (last member %s: %s); callbacks written to the outbox",
                    done, task_id, state.value, extra={"batch_id": done, "task_id": task_id})


class BatchTransactionGuard(Guard):
    """Records SUCCEEDED through a transactional body's session, before it commits."""

    name = "batch-record"
    stage = BatchStage.BATCH_RECORD

    def __init__(self, outer: BatchGuard) -> None:
        self.outer = outer

    def describe(self, task: Task | None = None) -> dict[str, Any]:
        return {}

    def commit(self, call: Call, result: Any) -> None:
        """Write the member's state into the body's transaction (the idempotency guard
        commits it next, with the record); a failure here fails that commit."""
        batch_id = call.kept(self.outer)
        session = call.inject.get("session")
        if batch_id is None or session is None or call.task_id is None:
            return
        backend = self.outer.backend(call.task)
        if not backend.joins(session):
            return
        call.keep(self, backend.record(session, task_id=call.task_id,
                                       state=MemberState.SUCCEEDED, batch_id=batch_id))

    def on_error(self, call: Call, exc: BaseException) -> None:
        call.take_back(self)  # rolled back with the body's transaction

    def on_stop(self, call: Call, stop: Stop) -> None:
        call.take_back(self)


def batch_guards(config: BatchConfig | None = None,
                 backend: BackendOption = None) -> tuple[BatchGuard, BatchTransactionGuard]:
    """The two guards a task needs to be a batch member (the platform's tasks have them)."""
    guard = BatchGuard(config, backend)
    return guard, guard.in_transaction
