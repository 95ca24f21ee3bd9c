"""`PostgresBatchBackend`: the batch steps, each a statement or two in one transaction.

- create: the batch row and every member row (one `INSERT ... SELECT unnest(...)`) in the
  producer's transaction, beside the members' outbox rows.
- record: one statement gives the member its final state only if it is still pending and,
  only then, takes one from the batch's pending count. The batch row's lock orders the
  members' transactions: the one that takes the count to 0 sees every other member's
  state committed, completes the batch (`UPDATE ... WHERE completed_at IS NULL AND
  pending = 0 RETURNING`), counts the tallies and writes the callbacks to the outbox, all
  before it commits. A redelivery or a duplicate finds its member final and changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from kombu.utils.json import JSONEncoder
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from resilience.batches.backends import (
    FINAL_STATES,
    BatchSummary,
    MemberState,
    NewBatch,
    Recorded,
)
from resilience.batches.callbacks import COMPLETE, SUCCESS, callback_row, due_callbacks
from resilience.batches.errors import BatchNotFound
from resilience.batches.models import BATCHES_TABLE, MEMBERS_TABLE
from resilience.connections import StoreBackend, wrap_store_errors
from resilience.outbox.backends.postgres import PostgresOutboxBackend

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from resilience.stores import Stores

_INSERT_BATCH = text(f"""
INSERT INTO {BATCHES_TABLE} (id, description, total, pending, on_success, on_complete)
VALUES (:id, :description, :total, :total, CAST(:on_success AS JSONB),
        CAST(:on_complete AS JSONB))
""")

_INSERT_MEMBERS = text(f"""
INSERT INTO {MEMBERS_TABLE} (batch_id, task_id, task_name)
SELECT :batch_id, member.task_id, member.task_name
FROM unnest(CAST(:task_ids AS TEXT[]), CAST(:task_names AS TEXT[]))
     AS member(task_id, task_name)
""")

# The member leaves `pending` at most once; only then is the batch's count taken down. A
# worker's main process knows a lost job's id but not its batch: then batch_id is NULL.
_RECORD = text(f"""
WITH member AS (
    UPDATE {MEMBERS_TABLE}
    SET state = :state, finished_at = clock_timestamp()
    WHERE task_id = :task_id AND state = 'pending'
      AND (CAST(:batch_id AS TEXT) IS NULL OR batch_id = CAST(:batch_id AS TEXT))
    RETURNING batch_id
)
UPDATE {BATCHES_TABLE} AS b SET pending = b.pending - 1
FROM member WHERE b.id = member.batch_id
RETURNING b.id, b.pending
""")

_COMPLETE = text(f"""
UPDATE {BATCHES_TABLE} SET completed_at = clock_timestamp()
WHERE id = :id AND completed_at IS NULL AND pending = 0
RETURNING id
""")

_FIRED = text(f"""
UPDATE {BATCHES_TABLE}
SET success_task_id = COALESCE(:success_task_id, success_task_id),
    complete_task_id = COALESCE(:complete_task_id, complete_task_id)
WHERE id = :id
""")

_SUMMARY_COLUMNS = f"""
b.id, b.description, b.total, b.pending, b.on_success, b.on_complete, b.created_at,
b.completed_at, b.success_task_id, b.complete_task_id,
COALESCE((SELECT jsonb_object_agg(t.state, t.n) FROM (
    SELECT m.state, count(*) AS n FROM {MEMBERS_TABLE} m
    WHERE m.batch_id = b.id GROUP BY m.state
) t), CAST('{{}}' AS JSONB)) AS tallies
"""

_SUMMARY = text(f"SELECT {_SUMMARY_COLUMNS} FROM {BATCHES_TABLE} b WHERE b.id = :id")

_RECENT = text(f"""
SELECT {_SUMMARY_COLUMNS} FROM {BATCHES_TABLE} b
WHERE NOT :incomplete_only OR b.completed_at IS NULL
ORDER BY b.created_at DESC, b.id LIMIT :limit
""")


def _summary(row: Any) -> BatchSummary:
    counted = dict(row.tallies or {})
    tallies = {state.value: int(counted.get(state.value, 0)) for state in FINAL_STATES}
    return BatchSummary(
        id=row.id, description=row.description, total=int(row.total),
        pending=int(row.pending), tallies=tallies, created_at=row.created_at,
        completed_at=row.completed_at, on_success=row.on_success,
        on_complete=row.on_complete, success_task_id=row.success_task_id,
        complete_task_id=row.complete_task_id,
    )


class PostgresBatchBackend(StoreBackend):
    """Batches in PostgreSQL (tables `resilience_batches`, `resilience_batch_members`).

    Args:
        engine: a callable returning the engine (the stores' engine, re-created per process).
    """

    store_operation = "batches"

    def __init__(self, engine: Callable[[], Engine]) -> None:
        self.engine = engine

    @contextmanager
    def _transaction(self, connection: Any) -> Iterator[Any]:
        """`connection` as it is (the caller commits), or a short transaction of its own."""
        if connection is not None:
            yield connection
            return
        with self.engine().begin() as own:
            yield own

    # -- producer side ---------------------------------------------------------------------
    def create(self, connection: Any, batch: NewBatch) -> None:
        """Write the batch and its members in the transaction of `connection`.

        Raises:
            StoreUnavailable / StoreRejected / StorageError: the insert failed (the caller's
                transaction is then aborted, as for any failed statement of theirs).
        """
        with wrap_store_errors("batches: create", batch=batch.id), \
                self._transaction(connection) as session:
            session.execute(_INSERT_BATCH, {
                "id": batch.id,
                "description": batch.description,
                "total": len(batch.members),
                "on_success": _json(batch.on_success),
                "on_complete": _json(batch.on_complete),
            })
            if batch.members:
                session.execute(_INSERT_MEMBERS, {
                    "batch_id": batch.id,
                    "task_ids": [member.task_id for member in batch.members],
                    "task_names": [member.task_name for member in batch.members],
                })
            else:
                self._complete(session, batch.id)

    # -- worker side -----------------------------------------------------------------------
    def record(self, connection: Any, *, task_id: str, state: MemberState,
               batch_id: str | None = None) -> Recorded:
        """Give the member its final state; the last one completes its batch (see the module
        doc). `recorded` is False when the member was final already (or is no member).

        Raises:
            StoreUnavailable / StoreRejected / StorageError: nothing was recorded.
        """
        with wrap_store_errors("batches: record member", task_id=task_id), \
                self._transaction(connection) as session:
            counts = session.execute(_RECORD, {
                "state": MemberState(state).value, "task_id": task_id, "batch_id": batch_id,
            }).all()
            completed = tuple(row.id for row in counts
                              if int(row.pending) == 0 and self._complete(session, row.id))
        return Recorded(recorded=bool(counts), completed=completed)

    def _complete(self, session: Any, batch_id: str) -> bool:
        """Complete the batch and write its callbacks, in `session`'s transaction; False
        if it was complete already (cannot happen while `pending` only goes down)."""
        if session.execute(_COMPLETE, {"id": batch_id}).first() is None:
            return False
        summary = _summary(session.execute(_SUMMARY, {"id": batch_id}).one())
        outbox = PostgresOutboxBackend(self.engine)
        fired: dict[str, str | None] = {SUCCESS: None, COMPLETE: None}
        for kind, signature in due_callbacks(summary):
            row = callback_row(summary, kind, signature)
            outbox.insert(session, row)
            fired[kind] = row.task_id
        session.execute(_FIRED, {"id": batch_id, "success_task_id": fired[SUCCESS],
                                 "complete_task_id": fired[COMPLETE]})
        return True

    def joins(self, session: Any) -> bool:
        """True for a SQLAlchemy Session or Connection on this backend's database."""
        if isinstance(session, Session):
            bind = session.get_bind()
        elif isinstance(session, Connection):
            bind = session
        else:
            return False
        engine = getattr(bind, "engine", bind)
        try:
            return bool(engine.url == self.engine().url)
        except Exception:  # noqa: BLE001 - a bind we cannot compare: not ours
            return False

    # -- operator side ---------------------------------------------------------------------
    def summary(self, batch_id: str) -> BatchSummary:
        with wrap_store_errors("batches: read", batch=batch_id), \
                self.engine().connect() as connection:
            row = connection.execute(_SUMMARY, {"id": batch_id}).first()
        if row is None:
            raise BatchNotFound(f"no batch {batch_id!r}", batch_id=batch_id)
        return _summary(row)

    def recent(self, *, limit: int = 50, incomplete_only: bool = False) -> list[BatchSummary]:
        with self.engine().connect() as connection:
            rows = connection.execute(
                _RECENT, {"limit": int(limit), "incomplete_only": bool(incomplete_only)}
            ).all()
        return [_summary(row) for row in rows]


def _json(value: dict[str, Any] | None) -> str | None:
    # kombu's encoder: UUID, datetime, Decimal ... are stored tagged; the callback's
    # message carries the tags and the worker's JSON decoder turns them back.
    return None if value is None else json.dumps(value, cls=JSONEncoder)


def backend_for(stores: Stores) -> PostgresBatchBackend:
    """Batches in the PostgreSQL of `stores`; statements outside a caller's transaction
    (a worker recording a member) are bounded (`Stores.guard_engine`)."""
    return PostgresBatchBackend(stores.guard_engine)
