"""Batches in memory (`resilience_stores = "memory"`, `resilience.testing`).

The same state machine as PostgreSQL's (`backends.postgres`): a member leaves `pending` at
most once, only then is its batch's count taken down, and the record that takes it to 0
completes the batch and writes its callbacks to the (in-memory) outbox, exactly once. The
callbacks are published when the recording transaction commits (`outbox.backends.memory`:
at once for a record of its own). A batch is created at once, so members published when
the producer's transaction commits find it; a rollback of that transaction removes it.
One process, thread-safe; `MemoryStores.reset()` empties it.
"""

from __future__ import annotations

import datetime as dt
import threading
import weakref
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from resilience.batches.backends import (
    FINAL_STATES,
    BatchSummary,
    MemberState,
    NewBatch,
    Recorded,
)
from resilience.batches.backends.postgres import backend_for
from resilience.batches.callbacks import COMPLETE, SUCCESS, callback_row, due_callbacks
from resilience.batches.errors import BatchNotFound
from resilience.outbox.backends.memory import on_transaction_end
from resilience.outbox.relay import outbox_backend
from resilience.stores import stores_for

if TYPE_CHECKING:
    from celery import Celery

#: `Stores.backend` kind of the batches.
KIND = "batches"


@dataclass
class _Batch:
    summary: BatchSummary
    members: dict[str, MemberState] = field(default_factory=dict)


class MemoryBatchBackend:
    """Batches and their members in this process's memory (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._batches: dict[str, _Batch] = {}
        #: member task id -> its batch id.
        self._member_of: dict[str, str] = {}
        self._app: Any = None

    def bind(self, app: Celery) -> MemoryBatchBackend:
        """Write callbacks to `app`'s outbox (every call site passes the app)."""
        self._app = weakref.ref(app)
        return self

    def _outbox(self) -> Any:
        app = self._app() if self._app is not None else None
        if app is None:
            raise RuntimeError("in-memory batches: no app bound (internal error)")
        return outbox_backend(app)

    def create(self, connection: Any, batch: NewBatch) -> None:
        """Keep the batch and its members now; removed if `connection`'s transaction
        rolls back. An empty batch completes at once (callbacks on commit)."""
        summary = BatchSummary(
            id=batch.id, description=batch.description, total=len(batch.members),
            pending=len(batch.members), tallies={state.value: 0 for state in FINAL_STATES},
            created_at=dt.datetime.now(dt.UTC), completed_at=None,
            on_success=batch.on_success, on_complete=batch.on_complete)
        with self._lock:
            self._batches[batch.id] = _Batch(
                summary, {member.task_id: MemberState.PENDING for member in batch.members})
            for member in batch.members:
                self._member_of[member.task_id] = batch.id
        if connection is not None:
            on_transaction_end(connection, lambda: None, lambda: self._drop(batch.id))
        if not batch.members:
            self._complete(connection, batch.id)

    def _drop(self, batch_id: str) -> None:
        with self._lock:
            kept = self._batches.pop(batch_id, None)
            for task_id in kept.members if kept is not None else ():
                self._member_of.pop(task_id, None)

    def record(self, connection: Any, *, task_id: str, state: MemberState,
               batch_id: str | None = None) -> Recorded:
        """Give a pending member its final state, once; the last one completes its batch
        and writes the callbacks to the outbox (published when `connection` commits)."""
        state = MemberState(state)
        with self._lock:
            found = self._member_of.get(task_id)
            kept = self._batches.get(found) if found is not None else None
            if (kept is None or (batch_id is not None and batch_id != found)
                    or kept.members.get(task_id) is not MemberState.PENDING
                    or state is MemberState.PENDING):
                return Recorded(recorded=False)
            kept.members[task_id] = state
            tallies = dict(kept.summary.tallies)
            tallies[state.value] = tallies.get(state.value, 0) + 1
            kept.summary = replace(kept.summary, pending=kept.summary.pending - 1,
                                   tallies=tallies)
            last = kept.summary.pending == 0
        completed = (found,) if last and self._complete(connection, found) else ()
        return Recorded(recorded=True, completed=completed)

    def _complete(self, connection: Any, batch_id: str) -> bool:
        """Complete the batch (once) and write its callbacks to the outbox."""
        with self._lock:
            kept = self._batches.get(batch_id)
            if kept is None or kept.summary.completed_at is not None:
                return False
            kept.summary = replace(kept.summary, completed_at=dt.datetime.now(dt.UTC))
            summary = kept.summary
            rows = [(kind, callback_row(summary, kind, signature))
                    for kind, signature in due_callbacks(summary)]
            fired = {kind: row.task_id for kind, row in rows}
            kept.summary = replace(summary, success_task_id=fired.get(SUCCESS),
                                   complete_task_id=fired.get(COMPLETE))
        outbox = self._outbox()
        for _, row in rows:
            outbox.insert(connection, row)
        return True

    def joins(self, session: Any) -> bool:
        """False: a member's state is recorded after its body, not in its transaction."""
        return False

    def summary(self, batch_id: str) -> BatchSummary:
        """One batch with its tallies. Raises `BatchNotFound`."""
        with self._lock:
            kept = self._batches.get(batch_id)
            if kept is None:
                raise BatchNotFound(f"no batch {batch_id!r}", batch_id=batch_id)
            return kept.summary

    def recent(self, *, limit: int = 50, incomplete_only: bool = False) -> list[BatchSummary]:
        """The newest batches, newest first."""
        with self._lock:
            found = [kept.summary for kept in self._batches.values()
                     if not incomplete_only or kept.summary.completed_at is None]
        return sorted(found, key=lambda summary: summary.created_at, reverse=True)[:limit]


def batch_backend(app: Celery) -> Any:
    """The batches of `app`'s stores: PostgreSQL, or in memory with `MemoryStores`."""
    backend = stores_for(app).backend(KIND, backend_for, memory=MemoryBatchBackend)
    if isinstance(backend, MemoryBatchBackend):
        backend.bind(app)
    return backend
