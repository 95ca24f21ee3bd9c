"""Write, list and requeue dead letters (PostgreSQL, table `resilience_dead_letters`).

A dead letter keeps what is needed to run the job again (task name, original arguments as
JSON, queue) and why it was given up on. See docs/failure.md, "Dead-letter place".
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from resilience.connections import translate_store_error, wrap_store_errors
from resilience.deadletter.models import dead_letters
from resilience.errors import ResilienceError

if TYPE_CHECKING:
    from celery import Celery
    from sqlalchemy.engine import Engine

logger = logging.getLogger("resilience.deadletter")


class DeadLetterNotFound(ResilienceError, LookupError):
    """Raised when a dead-letter id does not exist or was already requeued."""


class DeadLetterNotRunnable(ResilienceError, ValueError):
    """Raised when requeueing a dead letter whose message never decoded into a task call."""


@dataclass(frozen=True)
class DeadLetter:
    """One row of the dead-letter place."""

    id: int
    task_name: str
    task_id: str | None
    args: list[Any]
    kwargs: dict[str, Any]
    tier: str | None
    queue: str | None
    guard: str
    reason: str
    exception_type: str | None
    exception_message: str | None
    attempts: int
    created_at: datetime
    requeued_at: datetime | None
    requeued_task_id: str | None
    #: What arrived, when the worker's intake could not turn the message into a task.
    raw_message: dict[str, Any] | None = None
    #: The dependency whose open breaker or spent retry budget gave the job up (else None).
    dependency: str | None = None


def jsonable(value: Any) -> Any:
    """`value` as JSON can hold it: as it is, or with what JSON cannot carry as its repr."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return json.loads(json.dumps(value, default=repr))


def dead_letter(
    engine: Engine, *, task_name: str, task_id: str | None, args: Any, kwargs: Any, guard: str,
    reason: str, attempts: int, tier: str | None = None, queue: str | None = None,
    exception: BaseException | None = None, raw_message: dict[str, Any] | None = None,
    dependency: str | None = None,
) -> int:
    """Record a job in the dead-letter place and return the entry's id.

    Args:
        dependency: the dependency that was down (breaker open, retry budget spent), so the
            row may be replayed automatically once it recovers; None for any other reason.

    Raises:
        StoreRejected / StoreUnavailable / StorageError: PostgreSQL refused the row or
            could not be reached.
    """
    failed = exception is not None
    row = dict(
        task_name=task_name, task_id=task_id, tier=tier, queue=queue, guard=guard,
        reason=reason, attempts=attempts, raw_message=raw_message, dependency=dependency,
        args=jsonable(list(args or ())), kwargs=jsonable(dict(kwargs or {})),
        exception_type=_qualified_name(type(exception)) if failed else None,
        exception_message=str(exception)[:4000] if failed else None,
    )
    with wrap_store_errors("dead-letter place: insert", task_id=task_id), \
            engine.begin() as connection:
        return int(connection.execute(
            dead_letters.insert().values(**row).returning(dead_letters.c.id)).scalar_one())


def _qualified_name(cls: type) -> str:
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def _entry(row: Any) -> DeadLetter:
    return DeadLetter(**dict(row._mapping))


def list_entries(
    engine: Engine, *, limit: int = 50, task_name: str | None = None, pending_only: bool = False
) -> list[DeadLetter]:
    """The newest entries first."""
    query = sa.select(dead_letters).order_by(dead_letters.c.id.desc()).limit(limit)
    if task_name:
        query = query.where(dead_letters.c.task_name == task_name)
    if pending_only:
        query = query.where(dead_letters.c.requeued_at.is_(None))
    with wrap_store_errors("dead-letter place: list"), engine.connect() as connection:
        return [_entry(row) for row in connection.execute(query)]


def get(engine: Engine, entry_id: int) -> DeadLetter:
    """One entry.

    Raises:
        DeadLetterNotFound: no entry with this id.
    """
    with wrap_store_errors("dead-letter place: read", id=entry_id), \
            engine.connect() as connection:
        row = connection.execute(
            sa.select(dead_letters).where(dead_letters.c.id == entry_id)).first()
    if row is None:
        raise DeadLetterNotFound(f"no dead letter with id {entry_id}", id=entry_id)
    return _entry(row)


def runnable(entry: DeadLetter) -> bool:
    """Whether the entry can be published again: a task name and decoded arguments."""
    return entry.raw_message is None or bool(entry.raw_message.get("runnable"))


def requeue(engine: Engine, app: Celery, entry_id: int) -> str:
    """Publish the entry's task again with its original arguments; return the new task id.

    The row is marked (if still pending) and the job published in one transaction: two
    operators publish it once, a failed publish rolls the mark back. Published through the
    registered task's `apply_async` (argument validation and enqueue guards apply), else
    `app.send_task` to the recorded queue.

    Raises:
        DeadLetterNotFound: no such entry, or it was already requeued.
        DeadLetterNotRunnable: the entry is a message that never decoded into a task call
            (see `jobs dead-letters show`); it is left as it is.
    """
    table = dead_letters
    if not runnable(get(engine, entry_id)):
        raise DeadLetterNotRunnable(
            f"dead letter {entry_id} is a message that never decoded into a task call; "
            "inspect it with `jobs dead-letters show` and publish a corrected job instead",
            id=entry_id)
    try:
        with engine.begin() as connection:
            row = connection.execute(
                table.update()
                .where(table.c.id == entry_id, table.c.requeued_at.is_(None))
                .values(requeued_at=sa.func.now())
                .returning(table)).first()
            if row is None:
                raise DeadLetterNotFound(
                    f"dead letter {entry_id} does not exist or was already requeued", id=entry_id)
            entry = _entry(row)
            options: dict[str, Any] = {"queue": entry.queue} if entry.queue else {}
            task = app.tasks.get(entry.task_name)
            if task is not None:
                result = task.apply_async(tuple(entry.args), dict(entry.kwargs), **options)
            else:
                result = app.send_task(entry.task_name, args=list(entry.args),
                                       kwargs=dict(entry.kwargs), **options)
            connection.execute(
                table.update().where(table.c.id == entry_id).values(requeued_task_id=result.id))
    except sa.exc.SQLAlchemyError as exc:
        # Only the database's errors: a publish error is the broker's and stays as it is.
        raise translate_store_error(exc, "dead-letter place: requeue", id=entry_id) from exc
    logger.info("dead letter %s requeued as task %s", entry_id, result.id)
    return str(result.id)
