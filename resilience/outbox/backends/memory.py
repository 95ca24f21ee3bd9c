"""The outbox in memory (`resilience_stores = "memory"`, `resilience.testing`).

The job of `apply_async_in(session, ...)` runs when, and only when, the caller's transaction
commits (a `Session`'s outermost one, a `Connection`'s; None: at once): the row is kept
invisible until then, and then the relay's own flow (`Relay.relay_once`) publishes what is
due. A rollback drops the rows; rows due later wait for a `Relay(app).relay_once()` the test
calls. One process, thread-safe.
"""

from __future__ import annotations

import datetime as dt
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from resilience.errors import ConfigurationError
from resilience.outbox.backends.base import NewRow, OutboxRow, OutboxState

if TYPE_CHECKING:
    from celery import Celery


def on_transaction_end(connection: Any, commit: Callable[[], None],
                       rollback: Callable[[], None]) -> None:
    """Call `commit` when `connection`'s transaction commits and `rollback` when it rolls
    back; `commit` at once when `connection` is None.

    Raises:
        ConfigurationError: `connection` is neither None nor a SQLAlchemy Session or Connection.
    """
    if connection is None:
        commit()
        return
    from sqlalchemy import event
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session

    if isinstance(connection, Session):
        events = (("after_commit", lambda session: _end(session, True)),
                  ("after_soft_rollback", _session_rolled_back))
    elif isinstance(connection, Connection):
        events = (("commit", lambda connection: _end(connection, True)),
                  ("rollback", lambda connection: _end(connection, False)))
    else:
        raise ConfigurationError(
            "in-memory outbox: the transaction must be a SQLAlchemy Session or Connection, "
            f"or None, got {type(connection).__name__}")
    if not connection.in_transaction():
        connection.begin()  # as the insert on a database would (autobegin)
    with _pending_lock:
        pending = _pending.get(connection)
        if pending is None:
            pending = _pending[connection] = []
            for name, listener in events:
                event.listen(connection, name, listener)
        pending.append((commit, rollback))


#: What waits for the end of each session's or connection's transaction: (commit, rollback)
#: pairs. One listener pair per session or connection, registered on first use.
_pending: weakref.WeakKeyDictionary[Any, list[tuple[Callable[[], None], Callable[[], None]]]] = (
    weakref.WeakKeyDictionary())
_pending_lock = threading.Lock()


def _end(target: Any, committed: bool) -> None:
    with _pending_lock:
        waiting = _pending.get(target) or []
        if target in _pending:
            _pending[target] = []
    for commit, rollback in waiting:
        (commit if committed else rollback)()


def _session_rolled_back(session: Any, previous: Any) -> None:
    if not session.in_transaction():  # the outermost transaction ended
        _end(session, False)


@dataclass
class _Row:
    id: int
    row: NewRow
    due_at: float  # on time.time()
    state: str = "pending"  # pending, published, dead_lettered
    attempts: int = 0
    claimed: bool = False
    published_at: float | None = None


class MemoryOutboxBackend:
    """The outbox in this process's memory (see the module docstring).

    Args:
        clock: wall-clock seconds (injectable).
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._rows: dict[int, _Row] = {}
        self._app: Any = None  # a weakref to the app whose relay publishes the rows
        self._relay: Callable[..., Any] | None = None

    def bind(self, app: Celery, relay: Callable[..., Any]) -> MemoryOutboxBackend:
        """Publish through `app` (the stores' app: every call site passes it) with the
        relay's flow (`relay(app, backend=self)`: `resilience.outbox.relay.Relay`)."""
        self._app = weakref.ref(app)
        self._relay = relay
        return self

    @property
    def rows(self) -> list[dict[str, Any]]:
        """Every committed row (id, task_id, task_name, state, attempts), oldest first."""
        with self._lock:
            return [{"id": kept.id, "task_id": kept.row.task_id,
                     "task_name": kept.row.task_name, "state": kept.state,
                     "attempts": kept.attempts} for kept in self._rows.values()]

    # -- producer side ---------------------------------------------------------------------
    def insert(self, connection: Any, row: NewRow) -> int:
        """Keep `row` until `connection`'s transaction commits, then publish what is due;
        a rollback drops it. Returns the row id."""
        row_id = next(self._ids)
        due_at = (row.due_at.timestamp() if isinstance(row.due_at, dt.datetime)
                  else self.clock() + row.delay_seconds)
        kept = _Row(id=row_id, row=row, due_at=due_at)

        def committed() -> None:
            with self._lock:
                self._rows[row_id] = kept
            self.relay()

        on_transaction_end(connection, committed, lambda: None)
        return row_id

    def relay(self) -> None:
        """Publish every due row now (the relay's flow, in this thread)."""
        app = self._app() if self._app is not None else None
        if app is None:
            return
        relay = self._relay(app, backend=self)
        while relay.relay_once().published:
            pass

    # -- relay side ------------------------------------------------------------------------
    @contextmanager
    def batch(self, *, limit: int, lookahead_seconds: float) -> Iterator[_MemoryBatch]:
        """Claim up to `limit` committed rows due within `lookahead_seconds`, in id order;
        rows another relay (an outer one, publishing eagerly) claimed are skipped."""
        now = self.clock()
        with self._lock:
            chosen = [kept for kept in self._rows.values()
                      if kept.state == "pending" and not kept.claimed
                      and kept.due_at <= now + lookahead_seconds][:limit]
            for kept in chosen:
                kept.claimed = True
        batch = _MemoryBatch(self, [
            OutboxRow(id=kept.id, task_id=kept.row.task_id, task_name=kept.row.task_name,
                      args=list(kept.row.args), kwargs=dict(kept.row.kwargs),
                      options=dict(kept.row.options), ordering_key=kept.row.ordering_key,
                      attempts=kept.attempts, due_in_seconds=kept.due_at - now)
            for kept in chosen])
        try:
            yield batch
        finally:
            with self._lock:
                for kept in chosen:
                    kept.claimed = False

    def _mark(self, row_id: int, **changes: Any) -> None:
        with self._lock:
            kept = self._rows.get(row_id)
            if kept is not None:
                for name, value in changes.items():
                    setattr(kept, name, value)

    def wait(self, timeout_seconds: float) -> bool:
        """Sleep `timeout_seconds` (commits publish by themselves in memory)."""
        time.sleep(max(0.0, timeout_seconds))
        return False

    def next_due_in_seconds(self) -> float | None:
        return self.describe().next_due_in_seconds

    def purge_published(self, *, older_than_seconds: float, limit: int) -> int:
        cutoff = self.clock() - older_than_seconds
        with self._lock:
            old = [row_id for row_id, kept in self._rows.items()
                   if kept.state == "published" and (kept.published_at or 0) < cutoff][:limit]
            for row_id in old:
                del self._rows[row_id]
        return len(old)

    def describe(self) -> OutboxState:
        now = self.clock()
        with self._lock:
            pending = [kept for kept in self._rows.values() if kept.state == "pending"]
            due = [kept for kept in pending if kept.due_at <= now]
            later = [kept.due_at - now for kept in pending if kept.due_at > now]
            return OutboxState(
                pending=len(pending), due=len(due), scheduled=len(pending) - len(due),
                lag_seconds=max((now - kept.due_at for kept in due), default=0.0),
                published_last_minute=sum(
                    1 for kept in self._rows.values()
                    if kept.published_at is not None and kept.published_at > now - 60),
                dead_lettered=sum(1 for kept in self._rows.values()
                                  if kept.state == "dead_lettered"),
                next_due_in_seconds=min(later) if later else None)


@dataclass
class _MemoryBatch:
    """Rows claimed by one `relay_once`; marks apply at once."""

    backend: MemoryOutboxBackend
    rows: list[OutboxRow]

    def published(self, ids: list[int]) -> None:
        now = self.backend.clock()
        for row_id in ids:
            self.backend._mark(row_id, state="published", published_at=now)

    def postpone(self, row: OutboxRow, delay_seconds: float, error: str) -> None:
        self.backend._mark(row.id, attempts=row.attempts + 1,
                           due_at=self.backend.clock() + delay_seconds)

    def dead_lettered(self, row: OutboxRow, reason: str,
                      exception: BaseException | None) -> int | None:
        self.backend._mark(row.id, state="dead_lettered", attempts=row.attempts + 1)
        return None  # no dead-letter row in memory

