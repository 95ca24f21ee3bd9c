"""Bulk requeue: every pending dead letter of a selection, published again once, crash-safe.

One batch is one PostgreSQL transaction: lock pending rows `FOR UPDATE SKIP LOCKED` in id
order, skip (and count) the rows that cannot run, write the others' jobs to the outbox on
the batch's connection and mark them, commit (steps and reasons: docs/failure.md, "Bulk
requeue"). Two operators at once:

    operator A: lock rows 1..200 -> outbox rows + marks -> commit
    operator B: (same moment) SKIP LOCKED passes over 1..200, locks 201..400 -> commit
    A, killed before its commit: its locks, outbox rows and marks vanish together;
       rows 1..200 are pending again and the next run takes them

So a row is requeued at most once, and never marked without its job (or the reverse).
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from resilience.connections import translate_store_error, wrap_store_errors
from resilience.deadletter.models import dead_letters
from resilience.deadletter.place import DeadLetter, _entry, runnable
from resilience.errors import (
    ConfigurationError,
    InvalidKey,
    InvalidTaskArguments,
    ResilienceError,
    StoreRejected,
)

if TYPE_CHECKING:
    from celery import Celery
    from sqlalchemy.engine import Connection, Engine

logger = logging.getLogger("resilience.deadletter")

#: Why a row was skipped (the keys of `RequeueReport.skipped`; argument errors add their
#: exception's name to ARGUMENTS_REFUSED).
NOT_DECODED = "never decoded into a task call"
NOT_REGISTERED = "task not registered in this process"
NOT_OUTBOX_TASK = "not a platform task (no outbox enqueue)"
ARGUMENTS_REFUSED = "arguments refused"
#: `RequeueReport.stopped` when `admit` said no.
STOPPED_BY_ADMIT = "paced: the rate limit refused the next row"

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class InvalidSelection(ResilienceError, ValueError):
    """Raised when a requeue selection or its `since` value cannot be understood."""


def parse_since(text: str, *, now: dt.datetime | None = None) -> dt.datetime:
    """The instant `text` names: a duration back from now (`90s`, `15m`, `2h`, `1h30m`, `7d`,
    `1w`) or an ISO 8601 date or time (naive means UTC).

    Raises:
        InvalidSelection: neither a duration nor an ISO 8601 value.
    """
    value = text.strip().lower()
    now = now or dt.datetime.now(dt.UTC)
    if value and _DURATION_PART.sub("", value) == "":
        seconds = sum(float(amount) * _UNIT_SECONDS[unit]
                      for amount, unit in _DURATION_PART.findall(value))
        return now - dt.timedelta(seconds=seconds)
    try:
        instant = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidSelection(
            f"--since {text!r} is neither a duration (90s, 15m, 2h, 1h30m, 7d, 1w) nor an "
            "ISO 8601 date or time (2026-11-20, 2026-11-20T10:00:00+00:00)",
            since=text,
        ) from None
    return instant if instant.tzinfo is not None else instant.replace(tzinfo=dt.UTC)


@dataclass(frozen=True, kw_only=True)
class Selection:
    """Which pending dead letters to requeue; every given field must match.

    Args:
        task_name: the task's registered name, exactly.
        reason: text the recorded reason contains (case-insensitive).
        since: dead-lettered at or after this instant.
        before: dead-lettered at or before this instant (automatic replay: old enough).
        guard: the guard that gave the job up (`retry`, `breaker`, `poison`, `intake`, ...).
        dependency: the dependency recorded as down when the job was given up on.
    """

    task_name: str | None = None
    reason: str | None = None
    since: dt.datetime | None = None
    before: dt.datetime | None = None
    guard: str | None = None
    dependency: str | None = None

    def __post_init__(self) -> None:
        for name in ("since", "before"):
            value = getattr(self, name)
            if value is not None and value.tzinfo is None:
                raise InvalidSelection(f"{name} must be timezone-aware, got {value!r}")

    @property
    def empty(self) -> bool:
        """Selects every pending row (the CLI refuses that without an explicit filter)."""
        return all(getattr(self, given.name) is None for given in fields(self))

    def conditions(self) -> list[Any]:
        """The WHERE clauses of the selection, pending rows only."""
        column = dead_letters.c
        where: list[Any] = [column.requeued_at.is_(None)]
        for name in ("task_name", "guard", "dependency"):
            if getattr(self, name) is not None:
                where.append(column[name] == getattr(self, name))
        if self.reason is not None:
            # ILIKE with the text escaped: an operator's `50%` means the characters.
            escaped = re.sub(r"([\\%_])", r"\\\1", self.reason)
            where.append(column.reason.ilike(f"%{escaped}%", escape="\\"))
        if self.since is not None:
            where.append(column.created_at >= self.since)
        if self.before is not None:
            where.append(column.created_at <= self.before)
        return where


@dataclass
class RequeueReport:
    """What one bulk requeue did (or, with `dry_run`, would do)."""

    dry_run: bool = False
    #: (dead-letter id, the new job's task id), in id order.
    requeued: list[tuple[int, str]] = field(default_factory=list)
    #: reason -> ids of the rows left pending for it.
    skipped: dict[str, list[int]] = field(default_factory=dict)
    #: Why the run ended before the selection did ('' when it did not): the limit, the pace.
    stopped: str = ""

    @property
    def skipped_count(self) -> int:
        return sum(len(ids) for ids in self.skipped.values())

    def skip(self, reason: str, entry_id: int) -> None:
        self.skipped.setdefault(reason, []).append(entry_id)

    def summary(self) -> dict[str, Any]:
        """Counts only, JSON-ready (the beat task's result, the CLI's `--json`)."""
        return {
            "dry_run": self.dry_run,
            "requeued": len(self.requeued),
            "skipped": {reason: len(ids) for reason, ids in sorted(self.skipped.items())},
            "stopped": self.stopped,
        }


#: Called once per row that can run, before it is requeued; False ends the run there (the
#: row stays pending). Automatic replay paces itself with it.
Admit = Callable[[DeadLetter], bool]


def refusal(app: Celery, entry: DeadLetter) -> tuple[Any | None, str | None]:
    """The registered task of `entry`, or why it cannot be requeued from this process."""
    if not runnable(entry):
        return None, NOT_DECODED
    task = app.tasks.get(entry.task_name)
    if task is None:
        return None, NOT_REGISTERED
    if not callable(getattr(task, "apply_async_in", None)):
        return None, NOT_OUTBOX_TASK
    return task, None


_MARK = sa.text("""
UPDATE resilience_dead_letters AS d
SET requeued_at = now(), requeued_task_id = v.task_id
FROM (SELECT unnest(CAST(:ids AS BIGINT[])) AS id,
             unnest(CAST(:task_ids AS TEXT[])) AS task_id) AS v
WHERE d.id = v.id AND d.requeued_at IS NULL
RETURNING d.id
""")


def requeue_many(engine: Engine, app: Celery, selection: Selection, *, limit: int | None = None,
                 batch_size: int = 200, dry_run: bool = False,
                 admit: Admit | None = None) -> RequeueReport:
    """Requeue every pending dead letter of `selection` through the outbox, once each, safe
    from several processes at once. With `dry_run` every step runs and each batch is rolled
    back: the report says what would happen and nothing changes.

    Args:
        limit: requeue at most this many rows (None: every row of the selection).
        batch_size: rows per transaction (each is locked until its batch commits).
        admit: asked before each runnable row; False ends the run (see `Admit`).

    Raises:
        ConfigurationError: limit < 0 or batch_size < 1.
        StorageError: PostgreSQL failed; the batch in progress is rolled back (rows pending).
    """
    if limit is not None and limit < 0:
        raise ConfigurationError(f"limit must be >= 0, got {limit}")
    if batch_size < 1:
        raise ConfigurationError(f"batch_size must be >= 1, got {batch_size}")
    report = RequeueReport(dry_run=dry_run)
    after = 0
    while not report.stopped:
        remaining = None if limit is None else limit - len(report.requeued)
        if remaining == 0:
            report.stopped = f"limit of {limit} reached"
            break
        size = batch_size if remaining is None else min(batch_size, remaining)
        try:
            with engine.connect() as connection:
                with connection.begin() as transaction:
                    entries = _lock_batch(connection, selection, after, size)
                    if not entries:
                        break
                    after = entries[-1].id
                    done = _requeue_batch(connection, app, entries, report, admit)
                    if dry_run:
                        transaction.rollback()
                report.requeued.extend(done)
        except sa.exc.SQLAlchemyError as exc:
            raise translate_store_error(exc, "dead-letter place: bulk requeue") from exc
    if report.requeued or report.skipped:
        logger.info("dead letters %s: %s", "dry run" if dry_run else "requeued",
                    report.summary())
    return report


def _lock_batch(connection: Connection, selection: Selection, after: int,
                size: int) -> list[DeadLetter]:
    query = (sa.select(dead_letters).where(*selection.conditions(), dead_letters.c.id > after)
             .order_by(dead_letters.c.id).limit(size).with_for_update(skip_locked=True))
    with wrap_store_errors("dead-letter place: lock rows"):
        return [_entry(row) for row in connection.execute(query)]


def _requeue_batch(connection: Connection, app: Celery, entries: list[DeadLetter],
                   report: RequeueReport, admit: Admit | None) -> list[tuple[int, str]]:
    """Write the runnable entries' jobs into the outbox and mark them, in the caller's
    transaction; the refused ones go into `report.skipped`."""
    done: list[tuple[int, str]] = []
    for entry in entries:
        task, refused = refusal(app, entry)
        if refused is not None:
            report.skip(refused, entry.id)
            continue
        options: dict[str, Any] = {"queue": entry.queue} if entry.queue else {}
        if admit is not None and not admit(entry):
            report.stopped = STOPPED_BY_ADMIT
            break
        try:
            result = task.apply_async_in(connection, tuple(entry.args), dict(entry.kwargs),
                                         **options)
        except (InvalidTaskArguments, InvalidKey) as exc:
            # Validation runs before the insert: the transaction is intact.
            report.skip(f"{ARGUMENTS_REFUSED}: {type(exc).__name__}", entry.id)
            continue
        done.append((entry.id, str(result.id)))
    if done:
        ids = [entry_id for entry_id, _ in done]
        with wrap_store_errors("dead-letter place: mark requeued"):
            marked = connection.execute(_MARK, {
                "ids": ids, "task_ids": [task_id for _, task_id in done]}).scalars().all()
        if len(marked) != len(done):
            # The rows are locked by this transaction, so this cannot happen; if it did,
            # committing would publish a job for a row someone else requeued.
            raise StoreRejected(
                f"dead-letter place: {len(done) - len(marked)} of {len(done)} locked rows "
                "were already requeued; the batch is rolled back",
                ids=sorted(set(ids) - set(marked)))
    return done
