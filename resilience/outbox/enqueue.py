"""Writing a job to the outbox: the producer's side of `task.apply_async_in` / `enqueue_in`.

The row is the job: task name, arguments, the `apply_async` options (JSON only) and the task
id the relay will publish it with, fixed here so the caller's `AsyncResult` is the job's from
the start. Countdown and ETA become the row's `due_at`. See docs/outbox.md.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from resilience.errors import InvalidKey, InvalidTaskArguments
from resilience.keys import canonical_json
from resilience.outbox.backends import NewRow, OutboxBackend
from resilience.outbox.relay import outbox_backend
from resilience.outbox.trace import with_trace_context

if TYPE_CHECKING:
    from celery import Task
    from celery.result import AsyncResult

#: `apply_async_in` option: rows with the same key are published in id order.
ORDERING_KEY_OPTION = "ordering_key"

#: Options that never go into a row: a producer object is the relay's own; countdown/eta
#: become `due_at`; the task id has its own column.
_NOT_STORED = ("producer", "countdown", "eta", "task_id", ORDERING_KEY_OPTION)


def _aware(eta: Any) -> dt.datetime:
    if isinstance(eta, str):
        eta = dt.datetime.fromisoformat(eta)
    if not isinstance(eta, dt.datetime):
        raise InvalidTaskArguments(f"eta must be a datetime or an ISO 8601 string, got {eta!r}")
    # Naive ETAs are UTC, as the platform's Celery app is (enable_utc).
    return eta if eta.tzinfo is not None else eta.replace(tzinfo=dt.UTC)


def delay_seconds_of(options: Mapping[str, Any]) -> float | None:
    """Seconds from now until a publish with these options is due (countdown or eta);
    None when it names neither."""
    countdown = options.get("countdown")
    if countdown is not None:
        return float(countdown)
    eta = options.get("eta")
    if eta is not None:
        return (_aware(eta) - dt.datetime.now(dt.UTC)).total_seconds()
    return None


def new_row(task: Task, args: tuple[Any, ...] | list[Any], kwargs: Mapping[str, Any],
            options: Mapping[str, Any], *, task_id: str | None = None) -> NewRow:
    """The row of one job (validation of the arguments is the caller's).

    Raises:
        NonJsonArguments: an option JSON cannot carry (it could not be stored).
        InvalidKey: an ordering key that is not a non-empty string.
        InvalidTaskArguments: an eta that is not a datetime or ISO 8601 string.
    """
    kept = {name: value for name, value in with_trace_context(options).items()
            if value is not None and name not in _NOT_STORED}
    ordering_key = options.get(ORDERING_KEY_OPTION)
    if ordering_key is not None and (not isinstance(ordering_key, str) or not ordering_key):
        raise InvalidKey(f"ordering_key must be a non-empty string, got {ordering_key!r}")
    canonical_json(kept)
    eta = options.get("eta")
    countdown = options.get("countdown")
    return NewRow(
        task_id=str(task_id or options.get("task_id") or uuid.uuid4()), task_name=task.name,
        args=list(args), kwargs=dict(kwargs), options=kept, ordering_key=ordering_key,
        delay_seconds=max(0.0, float(countdown)) if countdown is not None else 0.0,
        due_at=_aware(eta) if eta is not None and countdown is None else None)


def write(task: Task, connection: Any, args: tuple[Any, ...] | list[Any],
          kwargs: Mapping[str, Any], options: Mapping[str, Any], *,
          task_id: str | None = None, backend: OutboxBackend | None = None) -> AsyncResult:
    """Write one job to the outbox and return its `AsyncResult` (no broker round trip).

    Args:
        connection: the caller's SQLAlchemy Session or Connection (the row joins its
            transaction); None for a short transaction of its own.
        backend: where the outbox lives; None: the one of the task's app (PostgreSQL, or memory).

    Raises:
        NonJsonArguments, InvalidKey: see `new_row`.
        StorageError: the insert failed.
    """
    row = new_row(task, args, kwargs, options, task_id=task_id)
    (backend or outbox_backend(task.app)).insert(connection, row)
    return task.AsyncResult(row.task_id)
