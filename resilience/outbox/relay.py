"""The relay: publishes committed outbox rows, in id order, each with its fixed task id.

One batch (`Relay.relay_once`) locks rows `FOR UPDATE SKIP LOCKED`, publishes each through
the task's own `apply_async` (enqueue guards apply) and commits what became of each:
published (or deduplicated), postponed with backoff, or dead-lettered. Steps and semantics:
docs/outbox.md, "The relay" and "A row whose `@unique` key is held". A crash:

    relay A: lock rows 1..100 -> publish 1..100 -> (SIGKILL) -> mark, commit never happen
    PostgreSQL: A's session ends, the locks and the uncommitted marks go away
    relay B: lock rows 1..100 again -> publish 1..100 again -> mark, commit

Rows 1..100 were published twice, with the same task ids and `outbox_id` headers: the
at-least-once half of the contract; `@idempotent` keys such a job on `outbox:<row id>`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from resilience.classify import is_retryable
from resilience.config import check
from resilience.counters import count_outcome
from resilience.errors import (
    AdmissionError,
    ConfigurationError,
    DuplicateJob,
    InvalidKey,
    InvalidTaskArguments,
    JobDeferred,
    StorageError,
    StoreRejected,
    StoreUnavailable,
)
from resilience.headers import OUTBOX_HEADER
from resilience.outbox.backends.base import Batch, OutboxBackend, OutboxRow
from resilience.outbox.backends.memory import MemoryOutboxBackend
from resilience.outbox.backends.postgres import backend_for
from resilience.outbox.trace import trace_context_of
from resilience.outcomes import Outcome
from resilience.stores import stores_for

if TYPE_CHECKING:
    from celery import Celery, Task

logger = logging.getLogger("resilience.outbox")

GUARD_NAME = "outbox"
#: Published and dead-lettered rows are deleted after an hour, looked for every minute.
KEEP_FINISHED_SECONDS, PURGE_EVERY_SECONDS = 3600.0, 60.0


@dataclass(frozen=True, kw_only=True)
class RelayConfig:
    """Options of the relay.

    Args:
        batch_size: rows locked and published per transaction.
        poll_seconds: longest sleep when idle (a committed row wakes the relay sooner).
        lookahead_seconds: rows due within this are published now with the remainder as
            their countdown, so they run on time rather than up to a poll late.
        backoff_initial_seconds: first wait after a refused publish; doubles per attempt.
        backoff_max_seconds: longest wait between attempts of one row.
    """

    batch_size: int = 100
    poll_seconds: float = 1.0
    lookahead_seconds: float = 1.0
    backoff_initial_seconds: float = 0.5
    backoff_max_seconds: float = 30.0

    def __post_init__(self) -> None:
        check(self, "batch_size", "a positive integer",
              lambda v: not isinstance(v, bool) and isinstance(v, int) and v >= 1)
        for name in ("poll_seconds", "backoff_initial_seconds", "backoff_max_seconds"):
            check(self, name, "> 0", lambda v: v > 0)
        if self.lookahead_seconds < 0:
            raise ConfigurationError("lookahead_seconds must be >= 0")

    def backoff_seconds(self, attempts: int) -> float:
        """Wait before the next attempt of a row refused `attempts + 1` times."""
        return min(self.backoff_max_seconds,
                   self.backoff_initial_seconds * 2 ** min(max(attempts, 0), 30))


@dataclass
class RelayReport:
    """What one batch did (`deduplicated` rows are among the `published`: marked, their
    key held by another job, their outcome stored by the unique guard)."""

    locked: int = 0
    published: int = 0
    deduplicated: int = 0
    postponed: int = 0
    dead_lettered: int = 0


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:1000]


def _retryable(exc: BaseException) -> bool:
    """Will publishing this row later succeed? Refusals and outages yes, bad rows no."""
    if isinstance(exc, StoreUnavailable):
        return True
    if isinstance(exc, InvalidTaskArguments | InvalidKey | ConfigurationError | StoreRejected):
        return False
    return is_retryable(exc)


class Relay:
    """Publishes the outbox's committed rows (see the module docstring).

    Args:
        app: the Celery app whose tasks the rows name (its task modules loaded).
        config: the options.
        backend: the outbox; None: the one of the app's stores (PostgreSQL, or memory).
        clock: monotonic seconds (injectable).
    """

    def __init__(self, app: Celery, config: RelayConfig | None = None,
                 backend: OutboxBackend | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self.config = config or RelayConfig()
        self.backend = backend or outbox_backend(app)
        self.clock = clock
        limit = app.conf.get("resilience_max_countdown_seconds")
        # A remainder beyond the app's longest countdown would go back into the outbox.
        self.lookahead_seconds = (min(self.config.lookahead_seconds, float(limit) / 2)
                                  if limit else self.config.lookahead_seconds)

    # -- one batch -------------------------------------------------------------------------
    def relay_once(self) -> RelayReport:
        """Lock, publish and mark one batch of rows.

        Raises:
            StorageError: the outbox could not be read or marked (nothing was marked; rows
                published in this batch will be published again).
        """
        report = RelayReport()
        with self.backend.batch(limit=self.config.batch_size,
                                lookahead_seconds=self.lookahead_seconds) as batch:
            report.locked = len(batch.rows)
            published: list[int] = []
            refused: dict[str, str] = {}  # queue -> why its first row was refused
            halted: str | None = None  # the broker or a store is down: stop publishing
            for row in batch.rows:
                task = self.app.tasks.get(row.task_name)
                if task is None:
                    self._dead_letter(batch, row, report, None, (
                        f"unknown task {row.task_name!r}: not registered in the relay's app "
                        "(load its module, e.g. with JOBS_IMPORTS)"))
                    continue
                queue = str(row.options.get("queue") or getattr(task, "queue", None) or "")
                waiting = halted or refused.get(queue)
                if waiting is not None:
                    # One refusal per queue per batch: a `wait` tier blocks once, not per row.
                    self._postpone(batch, row, report, waiting)
                    continue
                try:
                    result = publish_row(task, row)
                except DuplicateJob:
                    # raise_on_duplicate: the guard stored the row's outcome (a holder that
                    # is the row's own job answers its AsyncResult, never this error).
                    published.append(row.id)
                    report.deduplicated += 1
                    continue
                except (AdmissionError, JobDeferred) as exc:
                    refused[queue] = _reason(exc)
                    self._postpone(batch, row, report, refused[queue])
                    continue
                except Exception as exc:  # noqa: BLE001 - classified: postpone or dead-letter
                    if _retryable(exc):
                        halted = _reason(exc)
                        self._postpone(batch, row, report, halted)
                    else:
                        self._dead_letter(batch, row, report, exc,
                                          f"publish failed: {_reason(exc)}")
                    continue
                if getattr(result, "outcome", None) is Outcome.DISCARDED:
                    # A discarding tier sent nothing; a committed job is not dropped here.
                    refused[queue] = f"tier full: {result.get().get('reason', 'discarded')}"
                    self._postpone(batch, row, report, refused[queue])
                    continue
                if getattr(result, "id", row.task_id) != row.task_id:
                    report.deduplicated += 1  # the holder's AsyncResult: outcome stored
                published.append(row.id)
            batch.published(published)
            report.published = len(published)
        if report.locked:
            logger.info("outbox relay: %s published (%s deduplicated), %s postponed, "
                        "%s dead-lettered", report.published, report.deduplicated,
                        report.postponed, report.dead_lettered)
        return report

    def _postpone(self, batch: Batch, row: OutboxRow, report: RelayReport, why: str) -> None:
        batch.postpone(row, self.config.backoff_seconds(row.attempts), why)
        report.postponed += 1

    def _dead_letter(self, batch: Batch, row: OutboxRow, report: RelayReport,
                     exc: BaseException | None, reason: str) -> None:
        entry = batch.dead_lettered(row, reason, exc)
        report.dead_lettered += 1
        task = self.app.tasks.get(row.task_name)
        count_outcome(self.app, Outcome.DEAD_LETTERED.value, guard=GUARD_NAME,
                      tier=getattr(task, "tier", None), name=row.task_name)
        logger.warning("outbox row %s (%s[%s]) dead-lettered as %s: %s", row.id,
                       row.task_name, row.task_id, entry, reason)

    # -- the long-running loop -------------------------------------------------------------
    def run(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        """Relay until `should_stop()` is true: a full batch that made progress is followed
        by the next at once; otherwise wait for a committed row (NOTIFY), the next due
        row, or `poll_seconds`, whichever comes first."""
        last_purge = float("-inf")
        while not should_stop():
            try:
                report = self.relay_once()
                if self.clock() - last_purge >= PURGE_EVERY_SECONDS:
                    last_purge = self.clock()
                    self.backend.purge_published(older_than_seconds=KEEP_FINISHED_SECONDS,
                                                 limit=1000)
            except StorageError as exc:
                logger.warning("outbox relay: %s; trying again in %gs", exc,
                               self.config.poll_seconds)
                self.backend.wait(self.config.poll_seconds)
                continue
            if report.locked >= self.config.batch_size and (
                    report.published or report.dead_lettered):  # rows left the pending state
                continue
            self.backend.wait(self._idle_seconds())

    def _idle_seconds(self) -> float:
        timeout = self.config.poll_seconds
        try:
            next_due = self.backend.next_due_in_seconds()
        except StorageError:
            return timeout
        if next_due is not None:
            timeout = min(timeout, max(0.0, next_due - self.lookahead_seconds))
        return timeout


def publish_row(task: Task, row: OutboxRow) -> Any:
    """Publish one row through the task's `apply_async` (enqueue guards apply), with its
    task id and the header `outbox_id`."""
    options = dict(row.options)
    headers = dict(options.pop("headers", None) or {})
    headers[OUTBOX_HEADER] = row.id
    if row.due_in_seconds > 0:
        options["countdown"] = row.due_in_seconds
    # Within the enqueuing caller's trace, when the row carries one (with_trace_context).
    with trace_context_of(headers):
        return task.apply_async(tuple(row.args), dict(row.kwargs), task_id=row.task_id,
                                headers=headers, **options)


def publish_held(app: Celery, rows: list[OutboxRow], backend: Any = None, *,
                 mark_later: bool = False) -> int:
    """The fast path after a commit: publish rows written with `insert_held` at once and
    mark them published, so a continuation costs no relay poll (with `mark_later`, a
    worker's: the mark rides on its next statement, `mark_published(later=True)`). A row
    whose publish is refused or fails stays pending: the relay publishes it after its
    hold. Never raises; returns how many rows were published.
    """
    published: list[int] = []
    for row in rows:
        task = app.tasks.get(row.task_name)
        if task is None:
            continue  # the relay dead-letters it after the hold, with the reason
        try:
            result = publish_row(task, row)
        except Exception as exc:  # noqa: BLE001 - left to the relay, which classifies it
            logger.warning("outbox row %s (%s[%s]) not published after commit (%s): the relay "
                           "publishes it", row.id, row.task_name, row.task_id, _reason(exc))
            continue
        if getattr(result, "outcome", None) is Outcome.DISCARDED:
            continue
        published.append(row.id)
    if published:
        try:
            (backend or outbox_backend(app)).mark_published(published, later=mark_later)
        except StorageError as exc:
            logger.warning("outbox rows %s published but not marked (%s): the relay publishes "
                           "them again after their hold", published, exc)
    return len(published)


def outbox_backend(app: Any) -> OutboxBackend:
    """The outbox of `app`'s stores: PostgreSQL, or the in-memory one (publishing through
    `app` when the caller's transaction commits) with `MemoryStores`."""
    backend = stores_for(app).backend("outbox", backend_for, memory=MemoryOutboxBackend)
    if isinstance(backend, MemoryOutboxBackend):
        backend.bind(app, Relay)
    return backend
