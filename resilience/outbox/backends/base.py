"""The outbox's atomic steps (`OutboxBackend`) and the values they exchange.

The relay's flow never sees SQL: it asks the backend for a batch of publishable rows (locked
for it alone), and tells the batch what became of each. PostgreSQL is the one backend for
production: the rows must live in the database the producers write their own data to, or
the insert could not share their transaction; `memory` is for unit tests.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class NewRow:
    """A job to write to the outbox.

    Args:
        task_id: the id the job will be published (and run) with.
        delay_seconds: not published before now + this (ignored when `due_at` is given).
        due_at: an absolute time instead of a delay (an `eta`).
    """

    task_id: str
    task_name: str
    args: list[Any]
    kwargs: dict[str, Any]
    options: dict[str, Any]
    ordering_key: str | None = None
    delay_seconds: float = 0.0
    due_at: Any = None


@dataclass(frozen=True)
class OutboxRow:
    """A pending row the relay holds locked while it publishes it.

    Args:
        due_in_seconds: seconds until its due time (<= 0: due now); the relay publishes
            rows due within its look-ahead with this as the countdown.
    """

    id: int
    task_id: str
    task_name: str
    args: list[Any]
    kwargs: dict[str, Any]
    options: dict[str, Any]
    ordering_key: str | None
    attempts: int
    due_in_seconds: float


@dataclass(frozen=True)
class OutboxState:
    """What is in the outbox now.

    Args:
        pending: rows not yet published (due now or later).
        due: pending rows whose due time has come (the relay's backlog).
        scheduled: pending rows due later (long delays).
        lag_seconds: age of the oldest due row past its due time; 0 when none is due.
        published_last_minute: rows published in the last 60 seconds.
        dead_lettered: rows the relay gave up on (each has a dead-letter row).
        next_due_in_seconds: seconds until the next scheduled row is due; None if none.
    """

    pending: int
    due: int
    scheduled: int
    lag_seconds: float
    published_last_minute: int
    dead_lettered: int
    next_due_in_seconds: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields (status views, `--json`), seconds to the millisecond."""
        later = self.next_due_in_seconds
        return {**asdict(self), "lag_seconds": round(self.lag_seconds, 3),
                "next_due_in_seconds": None if later is None else round(later, 3)}


class Batch(Protocol):
    """Rows locked for one relay until the batch ends (commit of everything told)."""

    rows: list[OutboxRow]

    def published(self, ids: list[int]) -> None:
        """Mark rows published (in the batch's transaction)."""

    def postpone(self, row: OutboxRow, delay_seconds: float, error: str) -> None:
        """Leave a row pending; not tried again for `delay_seconds`."""

    def dead_lettered(self, row: OutboxRow, reason: str,
                      exception: BaseException | None) -> int | None:
        """Record the row in the dead-letter place and mark it; returns the entry's id."""


class OutboxBackend(Protocol):
    """The atomic steps of the outbox."""

    def insert(self, connection: Any, row: NewRow) -> int:
        """Write `row` in the caller's transaction (`connection`: a SQLAlchemy Session or
        Connection, or None for a short transaction of its own); returns the row id."""

    def batch(self, *, limit: int, lookahead_seconds: float) -> AbstractContextManager[Batch]:
        """Lock up to `limit` publishable rows in id order, skipping rows another relay
        holds; what the batch is told commits when the context ends without error."""

    def wait(self, timeout_seconds: float) -> bool:
        """Block until a producer commits a row or `timeout_seconds` pass; True if woken."""

    def next_due_in_seconds(self) -> float | None:
        """Seconds until the next scheduled row is due; None if none is scheduled."""

    def purge_published(self, *, older_than_seconds: float, limit: int) -> int:
        """Delete up to `limit` rows published more than `older_than_seconds` ago."""

    def describe(self) -> OutboxState:
        """The outbox's live state."""
