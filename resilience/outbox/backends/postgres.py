"""`PostgresOutboxBackend`: the outbox's steps, each one SQL statement.

- insert: one statement in the caller's transaction (the row, and a NOTIFY that PostgreSQL
  delivers at commit and drops on rollback, so the relay wakes only for committed work);
  with an ordering key, first a transaction-level advisory lock on the key, so producers of
  one key take their ids in commit order.
- batch: `SELECT ... FOR UPDATE SKIP LOCKED LIMIT n` in id order (a second relay skips the
  rows this one holds); the marks commit with the batch's transaction.
- wait: LISTEN on a connection of its own, `select()` on its socket. LISTEN is session
  state: behind a transaction pooler (PgBouncer) it goes to the direct lock URL
  (`Stores.locks_database_url`), one connection per relay process
  (`resilience.connections.postgres.connect`); the rest runs on the pooler.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import select
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from kombu.utils.json import JSONEncoder
from sqlalchemy import text

from resilience import flushing
from resilience.connections import StoreBackend, wrap_store_errors
from resilience.connections.postgres import Lead, StatementRunner, asynchronous_commit, connect
from resilience.deadletter.place import dead_letter
from resilience.errors import StorageError
from resilience.outbox.backends.base import NewRow, OutboxRow, OutboxState
from resilience.outbox.models import TABLE_NAME
from resilience.prepared import PreparedStatement

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

    from resilience.stores import Stores

logger = logging.getLogger("resilience.outbox")

#: The NOTIFY channel a committed row wakes the relays on.
CHANNEL = "resilience_outbox"
#: First half of the two-int advisory-lock id of an ordering key (the platform's other
#: advisory locks use the one-bigint form, a separate id space).
ORDERING_LOCK_CLASS = 720_190_108

_LOCK_ORDERING_KEY = text("SELECT pg_advisory_xact_lock(:lock_class, hashtext(:ordering_key))")

# The CTE returns the id and queues the NOTIFY in one round trip; NOTIFYs of one
# transaction on one channel with one payload are folded into one.
_INSERT = text(f"""
WITH inserted AS (
    INSERT INTO {TABLE_NAME}
        (task_id, task_name, args, kwargs, options, ordering_key, due_at)
    VALUES (:task_id, :task_name, CAST(:args AS JSONB), CAST(:kwargs AS JSONB),
            CAST(:options AS JSONB), :ordering_key,
            COALESCE(CAST(:due_at AS TIMESTAMPTZ),
                     clock_timestamp() + make_interval(secs => :delay_seconds)))
    RETURNING id
)
SELECT id, pg_notify('{CHANNEL}', '') FROM inserted
""")

# A row of an ordering key waits while an earlier row of the key is pending (in backoff,
# not yet due, or held by another relay): one row per key per batch, in id order.
_LOCK_BATCH = text(f"""
SELECT o.id, o.task_id, o.task_name, o.args, o.kwargs, o.options, o.ordering_key,
       o.attempts, EXTRACT(EPOCH FROM o.due_at - clock_timestamp()) AS due_in_seconds
FROM {TABLE_NAME} o
WHERE o.state = 'pending'
  AND o.due_at <= clock_timestamp() + make_interval(secs => :lookahead_seconds)
  AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= clock_timestamp())
  AND (o.ordering_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM {TABLE_NAME} e
        WHERE e.state = 'pending' AND e.ordering_key = o.ordering_key AND e.id < o.id))
ORDER BY o.id
LIMIT :limit
FOR UPDATE OF o SKIP LOCKED
""")

# Rows a worker publishes itself right after its transaction commits (`insert_held`): due
# only after the hold, so the relay leaves them alone unless that worker died first. No
# NOTIFY: the relay has nothing to do for them now.
_INSERT_HELD = text(f"""
INSERT INTO {TABLE_NAME} (task_id, task_name, args, kwargs, options, due_at)
SELECT r.task_id, r.task_name, r.args, r.kwargs, r.options,
       clock_timestamp() + make_interval(secs => :hold_seconds)
FROM jsonb_to_recordset(CAST(:rows AS JSONB))
     AS r(task_id TEXT, task_name TEXT, args JSONB, kwargs JSONB, options JSONB)
RETURNING id
""")

# A held row its producer published is deleted, not updated: the step row that released
# it records the release and the step's start, and a delete writes no new row version nor
# index entry (an update to 'published' wrote one and two). A row the relay took meanwhile
# stays as the relay marked it.
# "Not published nor dead-lettered" rather than "pending" (the same rows): with "pending",
# the generic plan of this prepared statement may read the rows through a partial index of
# pending rows, filtering every pending row (held, delayed, backed off) on each mark.
_MARK_HELD_PUBLISHED = PreparedStatement("resilience_outbox_mark_held", f"""
DELETE FROM {TABLE_NAME}
WHERE id = ANY(CAST(%(ids)s AS BIGINT[])) AND state NOT IN ('published', 'dead_lettered')
""")

#: How long the mark of a published held row may wait to ride on the publishing thread's
#: next statement (`mark_published(..., later=True)`) before the flush timer sends it
#: alone: far below any hold (the relay publishes a row still unmarked after its hold).
MARK_DELAY_SECONDS = 0.2


class _Mark:
    """Ids whose mark waits as a `Lead`; `done` once a statement carried it."""

    __slots__ = ("at", "done", "ids")

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids
        self.at = time.monotonic()
        self.done = False

    def settle(self) -> None:
        self.done = True


class _LateMarks:
    """A process's marks waiting as leads (a `resilience.flushing` aggregate): the timer
    sends those no statement carried within the backend's `mark_delay_seconds` (the thread
    stayed idle, or the statement carrying them failed) on a pooled connection, and all at
    shutdown. A mark sent twice (the two raced) matches no row the second time."""

    def __init__(self, backend: PostgresOutboxBackend) -> None:
        self.backend = backend
        self.lock = threading.Lock()
        self.waiting: list[_Mark] = []

    def add(self, mark: _Mark) -> None:
        with self.lock:
            self.waiting.append(mark)
        flushing.wake(self.backend.mark_delay_seconds)

    def flush(self, now: float, *, force: bool = False) -> bool:
        delay = self.backend.mark_delay_seconds
        keep: list[_Mark] = []
        due: list[_Mark] = []
        with self.lock:
            for mark in self.waiting:
                (due if force or mark.done or now - mark.at >= delay else keep).append(mark)
            self.waiting = keep
        ids = [row_id for mark in due if not mark.done for row_id in mark.ids]
        if ids:
            try:
                self.backend.mark_published_pooled(ids)
            except StorageError as exc:
                logger.warning("outbox rows %s published but not marked (%s): the relay "
                               "publishes them again after their hold", ids, exc)
        return bool(keep)


_MARK_PUBLISHED = text(f"""
UPDATE {TABLE_NAME}
SET state = 'published', finished_at = clock_timestamp(), attempts = attempts + 1
WHERE id = ANY(:ids)
""")

_POSTPONE = text(f"""
UPDATE {TABLE_NAME}
SET attempts = attempts + 1, last_error = :error,
    next_attempt_at = clock_timestamp() + make_interval(secs => :delay_seconds)
WHERE id = :id
""")

_MARK_DEAD = text(f"""
UPDATE {TABLE_NAME}
SET state = 'dead_lettered', finished_at = clock_timestamp(), attempts = attempts + 1,
    last_error = :error, dead_letter_id = :dead_letter_id
WHERE id = :id
""")

_NEXT_DUE = text(f"""
SELECT EXTRACT(EPOCH FROM min(due_at) - clock_timestamp())
FROM {TABLE_NAME} WHERE state = 'pending' AND due_at > clock_timestamp()
""")

_PURGE = text(f"""
DELETE FROM {TABLE_NAME} WHERE id IN (
    SELECT id FROM {TABLE_NAME}
    WHERE state <> 'pending'
      AND finished_at < clock_timestamp() - make_interval(secs => :older_than_seconds)
    LIMIT :limit)
""")

# One statement, one snapshot and one `now()`: the counts agree with each other.
_DESCRIBE = text(f"""
SELECT
  (SELECT count(*) FROM {TABLE_NAME} WHERE state = 'pending') AS pending,
  (SELECT count(*) FROM {TABLE_NAME}
   WHERE state = 'pending' AND due_at <= now()) AS due,
  (SELECT EXTRACT(EPOCH FROM now() - min(due_at)) FROM {TABLE_NAME}
   WHERE state = 'pending' AND due_at <= now()) AS lag_seconds,
  (SELECT count(*) FROM {TABLE_NAME} WHERE state = 'published'
   AND finished_at > now() - interval '60 seconds') AS published_last_minute,
  (SELECT count(*) FROM {TABLE_NAME} WHERE state = 'dead_lettered') AS dead_lettered,
  (SELECT EXTRACT(EPOCH FROM min(due_at) - now()) FROM {TABLE_NAME}
   WHERE state = 'pending' AND due_at > now()) AS next_due_in_seconds
""")


class _InTransaction:
    """An `Engine` stand-in whose `begin()` is a savepoint of an open connection, so
    `resilience.deadletter.place.dead_letter` writes its row in the batch's transaction:
    a relay killed before the batch commits leaves neither the dead letter nor the mark."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        with self.connection.begin_nested():
            yield self.connection


class PostgresBatch:
    """The rows one relay holds locked; marks go out in the batch's transaction."""

    def __init__(self, connection: Connection, rows: list[OutboxRow],
                 dead_letter: Callable[..., int]) -> None:
        self.connection = connection
        self.rows = rows
        self._dead_letter = dead_letter
        self._published: list[int] = []

    def published(self, ids: list[int]) -> None:
        self._published.extend(ids)

    def postpone(self, row: OutboxRow, delay_seconds: float, error: str) -> None:
        with wrap_store_errors("outbox: postpone", id=row.id):
            self.connection.execute(
                _POSTPONE, {"id": row.id, "delay_seconds": delay_seconds, "error": error[:4000]}
            )

    def dead_lettered(self, row: OutboxRow, reason: str,
                      exception: BaseException | None) -> int | None:
        entry = self._dead_letter(
            _InTransaction(self.connection),
            task_name=row.task_name,
            task_id=row.task_id,
            args=row.args,
            kwargs=row.kwargs,
            guard="outbox",
            reason=reason,
            attempts=row.attempts + 1,
            queue=row.options.get("queue"),
            exception=exception,
        )
        with wrap_store_errors("outbox: mark dead-lettered", id=row.id):
            self.connection.execute(
                _MARK_DEAD, {"id": row.id, "error": reason[:4000], "dead_letter_id": entry}
            )
        return entry

    def flush(self) -> None:
        """Mark the published rows (one statement)."""
        if self._published:
            self.connection.execute(_MARK_PUBLISHED, {"ids": self._published})
            self._published = []


class PostgresOutboxBackend(StoreBackend):
    """The outbox in PostgreSQL (table `resilience_outbox`).

    Args:
        engine: a callable returning the engine (the stores' engine, re-created per process).
        sleep: waits when the LISTEN connection is down (injectable).
        listen: opens the LISTEN connection, a session of its own (a direct one:
            `Stores.locks_database_url`); None: the relay polls.
    """

    store_operation = "outbox"

    def __init__(self, engine: Callable[[], Engine],
                 sleep: Callable[[float], None] = time.sleep,
                 listen: Callable[[], Any] | None = None,
                 runner: StatementRunner | None = None, prepared: bool = True) -> None:
        self.engine = engine
        self.sleep = sleep
        self.listen = listen
        #: Single autocommit statements on a held connection (`mark_published`), if given.
        self.runner = runner
        self.prepared = prepared
        #: `MARK_DELAY_SECONDS` (tests lengthen it to see a mark ride).
        self.mark_delay_seconds = MARK_DELAY_SECONDS
        self._listener: Any = None

    # -- producer side ---------------------------------------------------------------------
    def insert(self, connection: Any, row: NewRow) -> int:
        """Write `row` in the transaction of `connection` (a SQLAlchemy Session or
        Connection); None: a short transaction of its own. Returns the row id.

        Raises:
            StoreUnavailable / StoreRejected / StorageError: the insert failed (the caller's
                transaction is then aborted, as for any failed statement of theirs).
        """
        params = {
            "task_id": row.task_id,
            "task_name": row.task_name,
            # kombu's encoder: arguments Celery's JSON carries (UUID, datetime, Decimal)
            # are stored tagged, and the worker decodes the relayed message back to them.
            "args": json.dumps(row.args, cls=JSONEncoder),
            "kwargs": json.dumps(row.kwargs, cls=JSONEncoder),
            "options": json.dumps(row.options),
            "ordering_key": row.ordering_key,
            "due_at": row.due_at,
            "delay_seconds": float(row.delay_seconds),
        }
        with wrap_store_errors("outbox: insert", task=row.task_name, task_id=row.task_id):
            if connection is None:
                with self.engine().begin() as own:
                    return self._insert(own, row, params)
            return self._insert(connection, row, params)

    def insert_held(self, connection: Any, rows: list[NewRow], *,
                    hold_seconds: float) -> list[int]:
        """Write `rows` (no ordering key, no delay) in the transaction of `connection`, due
        only after `hold_seconds`: the writer publishes them itself once it committed
        (`resilience.outbox.relay.publish_held`); the relay publishes them after the hold if
        the writer died first. One statement; returns the row ids in `rows` order.

        Raises:
            StoreUnavailable / StoreRejected / StorageError: the insert failed.
        """
        if not rows:
            return []
        payload = json.dumps([{
            "task_id": row.task_id, "task_name": row.task_name, "args": row.args,
            "kwargs": row.kwargs, "options": row.options,
        } for row in rows], cls=JSONEncoder)
        with wrap_store_errors("outbox: insert", rows=len(rows)):
            found = connection.execute(_INSERT_HELD, {"rows": payload,
                                                      "hold_seconds": float(hold_seconds)})
            return [int(row_id) for row_id in found.scalars()]

    def mark_published(self, ids: list[int], *, later: bool = False) -> None:
        """Mark held rows published: delete them (a short transaction of its own); the step
        rows that released them are their record. Rows the relay took meanwhile are left
        as it marked them.

        With `later` (a worker that published a step's continuations) and a held
        connection, the mark waits as a `Lead` to ride on this thread's next statement that
        takes leads (the next step's start, under traffic: one round trip fewer per
        continuation); one no statement carried within `mark_delay_seconds` goes alone on a
        pooled connection (`_LateMarks`).

        Raises:
            StoreUnavailable / StoreRejected / StorageError: nothing was marked (the relay
                publishes the rows again after their hold: a duplicate, never a loss).
        """
        if not ids:
            return
        if self.runner is None:
            self.mark_published_pooled(ids)
            return
        # Alone, an asynchronous commit; riding as a lead, the commit of the statement it
        # rides on (a step's start: asynchronous). A crash may lose the mark; the relay then
        # publishes the rows again after their hold (the outbox is at-least-once already),
        # and a workflow step that finished meanwhile answers that delivery REPLAYED.
        parameters = {"ids": list(ids)}
        if not later:
            self.runner.run(_MARK_HELD_PUBLISHED, parameters, "outbox: mark published",
                            prepared=self.prepared, prefix=asynchronous_commit, lead=True)
            return
        mark = _Mark(parameters["ids"])
        try:
            connection = self.runner.connection()
            if self.prepared:
                connection.prepare(_MARK_HELD_PUBLISHED)
            connection.leads.append(Lead(connection.render(_MARK_HELD_PUBLISHED, parameters),
                                         mark.settle))
        except StorageError as exc:  # no session to wait on: the timer sends it
            logger.debug("outbox rows %s: mark left to the timer (%s)", mark.ids, exc)
        flushing.member(("outbox-marks", id(self)), lambda: _LateMarks(self)).add(mark)

    def mark_published_pooled(self, ids: list[int]) -> None:
        """`mark_published` on a pooled connection (no held one, or a late mark's timer).

        Raises:
            StoreUnavailable / StoreRejected / StorageError: nothing was marked.
        """
        sql = text(_MARK_HELD_PUBLISHED.sql.replace("%(ids)s", ":ids"))
        with wrap_store_errors("outbox: mark published", rows=len(ids)), \
                self.engine().begin() as connection:
            connection.execute(sql, {"ids": list(ids)})

    @staticmethod
    def _insert(connection: Any, row: NewRow, params: dict[str, Any]) -> int:
        if row.ordering_key is not None:
            connection.execute(_LOCK_ORDERING_KEY, {"lock_class": ORDERING_LOCK_CLASS,
                                                    "ordering_key": row.ordering_key})
        return int(connection.execute(_INSERT, params).scalar_one())

    # -- relay side ------------------------------------------------------------------------
    @contextmanager
    def batch(self, *, limit: int, lookahead_seconds: float) -> Iterator[PostgresBatch]:
        """Lock up to `limit` publishable rows; the batch's marks commit at the end.

        An error inside the block rolls every mark back: the rows stay pending.
        """
        with wrap_store_errors("outbox: open relay connection"):
            connection = self.engine().connect()
        try:
            with wrap_store_errors("outbox: lock rows"):
                found = connection.execute(
                    _LOCK_BATCH, {"limit": limit, "lookahead_seconds": lookahead_seconds}
                ).all()
            rows = [
                OutboxRow(
                    id=int(r.id), task_id=r.task_id, task_name=r.task_name,
                    args=list(r.args or []), kwargs=dict(r.kwargs or {}),
                    options=dict(r.options or {}), ordering_key=r.ordering_key,
                    attempts=int(r.attempts), due_in_seconds=float(r.due_in_seconds),
                )
                for r in found
            ]
            batch = PostgresBatch(connection, rows, dead_letter)
            yield batch
            with wrap_store_errors("outbox: mark published"):
                batch.flush()
                connection.commit()
        finally:
            with wrap_store_errors("outbox: close relay connection"):
                connection.close()  # rolls back whatever was not committed

    def next_due_in_seconds(self) -> float | None:
        with self.engine().connect() as connection:
            value = connection.execute(_NEXT_DUE).scalar()
        return None if value is None else float(value)

    def purge_published(self, *, older_than_seconds: float, limit: int = 1000) -> int:
        with self.engine().begin() as connection:
            result = connection.execute(
                _PURGE, {"older_than_seconds": older_than_seconds, "limit": limit}
            )
        return int(result.rowcount or 0)

    def wait(self, timeout_seconds: float) -> bool:
        """Block until a NOTIFY (a producer committed a row) or the timeout.

        A broken LISTEN connection is dropped and the wait becomes a sleep: the relay
        then finds new rows by polling, as it does anyway every poll interval.
        """
        if timeout_seconds <= 0:
            return False
        if self.listen is None:
            self.sleep(timeout_seconds)
            return False
        try:
            listener = self._listen()
            if not listener.notifies:
                readable, _, _ = select.select([listener], [], [], timeout_seconds)
                if not readable:
                    return False
                listener.poll()
            woken = bool(listener.notifies)
            listener.notifies.clear()
            return woken
        except Exception as exc:  # noqa: BLE001 - any failure: fall back to polling
            logger.warning("outbox: LISTEN connection lost (%s); polling", exc)
            self.close()
            self.sleep(timeout_seconds)
            return False

    def _listen(self) -> Any:
        if self._listener is None or self._listener.closed:
            # Out of any pool: this connection stays in autocommit, LISTENing, for good.
            connection = self.listen()
            with connection.cursor() as cursor:
                cursor.execute(f"LISTEN {CHANNEL}")
            self._listener = connection
        return self._listener

    def close(self) -> None:
        """Close the LISTEN connection, if open."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(Exception):  # already broken: nothing to close
                listener.close()

    # -- operator side ---------------------------------------------------------------------
    def describe(self) -> OutboxState:
        with self.engine().connect() as connection:
            row = connection.execute(_DESCRIBE).one()
        pending, due = int(row.pending), int(row.due)
        return OutboxState(
            pending=pending,
            due=due,
            scheduled=pending - due,
            lag_seconds=max(0.0, float(row.lag_seconds or 0.0)),
            published_last_minute=int(row.published_last_minute),
            dead_lettered=int(row.dead_lettered),
            next_due_in_seconds=(None if row.next_due_in_seconds is None
                                 else float(row.next_due_in_seconds)),
        )


def backend_for(stores: Stores) -> PostgresOutboxBackend:
    """The outbox in the PostgreSQL of `stores` (LISTEN on its direct lock URL); its own
    statements (relay batches, purges, inserts outside a caller's transaction) are bounded
    (`Stores.guard_engine`)."""
    return PostgresOutboxBackend(stores.guard_engine, listen=functools.partial(
        connect, stores.locks_database_url, server_tcp=stores.locks_pool_mode == "none",
        connect_timeout_seconds=stores.socket_timeout_seconds))
