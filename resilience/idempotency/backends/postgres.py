"""PostgreSQL backend of the idempotency guard: each decision is one SQL statement.

Happy path: one round trip for the claim (`INSERT ... ON CONFLICT DO UPDATE ... WHERE
<takeover allowed> RETURNING attempt`, autocommit), one for the completion (an `UPDATE` by
primary key changing no indexed column: a HOT update, see `resilience.idempotency.models`).
Only a claim that claims nothing pays a second statement, reading the row in the way. Each
worker thread keeps one autocommit connection (`StatementRunner`): no pool checkout,
`SELECT 1`, `BEGIN` or `COMMIT` per statement. Transactional mode (`begin()`) is the
exception: the body's writes and the completion share one transaction on a pooled
connection (`PostgresTransaction`), committed while every lock the call holds is owned.

Behind a transaction pooler (`Stores.transaction_pooled`) no session state holds from one
statement to the next: `synchronous_commit=off` is sent per statement (`SET LOCAL`, in the
write's query string) and prepared statements are off (`backend_for`); without a pooler it
is set once per connection (a `SET LOCAL` per write cost ~25 µs). See docs/idempotency.md
("How a call goes").

Race timeline the claim is written for (insert first, never check-then-act)::

    A: INSERT ... ON CONFLICT          -> row inserted, attempt 1, owner a
    B: INSERT ... ON CONFLICT          -> conflict; live lease: WHERE false, nothing claimed
    B: SELECT (READ_SQL)               -> A's row, lease live: DEFERRED
    A: killed; lease expires
    C: INSERT ... ON CONFLICT          -> conflict, lease expired: attempt 2, owner c
    A': (a paused A wakes up) UPDATE ... WHERE attempt = 1 AND lease_owner = 'a' -> 0 rows
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from resilience.connections import StoreBackend, translate_store_error
from resilience.connections.postgres import ASYNCHRONOUS_COMMIT, HeldConnection, StatementRunner
from resilience.errors import ConfigurationError, StorageError, StoreUnavailable
from resilience.holders import Holder
from resilience.idempotency.backends import (
    FAILED,
    HOLDER_KIND,
    IN_PROGRESS,
    STATES,
    SUCCEEDED,
    Claim,
    ClaimResult,
    Record,
    Transaction,
)
from resilience.idempotency.models import TABLE_NAME
from resilience.prepared import PreparedStatement as _Statement

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from resilience.stores import Stores

logger = logging.getLogger("resilience.idempotency")

# What a claim that did not claim reads: the row in the way (replay, defer or refuse).
_COLUMNS = (
    "attempt, state, fingerprint, result, error, task_id, lease_owner, "
    "EXTRACT(EPOCH FROM (lease_expires_at - now()))::float8 AS lease_remaining, "
    "EXTRACT(EPOCH FROM (expires_at - now()))::float8 AS expires_in")

# The claim returns only the attempt it claimed, nothing when the key is someone else's;
# READ_SQL (duplicates only) then reads the row in the way: answering a duplicate in the same
# statement cost every fresh claim ~15 µs of server CPU (docs/idempotency.md). `expires_at`
# covers the lease and the TTL, so a completion within the lease leaves it as it is
# (COMPLETE_SQL: `GREATEST`) and changes no indexed column.
CLAIM_SQL = f"""
INSERT INTO {TABLE_NAME} AS r
    (task_name, key, fingerprint, state, attempt, lease_owner, lease_expires_at,
     task_id, created_at, updated_at, expires_at)
VALUES (%(task_name)s, %(key)s, %(fingerprint)s, '{IN_PROGRESS}', 1, %(owner)s,
        now() + %(lease_seconds)s * interval '1 second', %(task_id)s, now(), now(),
        now() + (%(lease_seconds)s::float8 + %(ttl_seconds)s::float8) * interval '1 second')
ON CONFLICT (task_name, key) DO UPDATE SET
    fingerprint = EXCLUDED.fingerprint,
    state = '{IN_PROGRESS}',
    attempt = r.attempt + 1,
    lease_owner = EXCLUDED.lease_owner,
    lease_expires_at = EXCLUDED.lease_expires_at,
    task_id = EXCLUDED.task_id,
    result = NULL,
    error = NULL,
    created_at = CASE WHEN r.expires_at <= now() THEN now() ELSE r.created_at END,
    updated_at = now(),
    expires_at = EXCLUDED.expires_at
WHERE
    -- the whole record expired (cleanup has not run yet), and no live claim holds it
    (r.expires_at <= now()
        AND NOT (r.state = '{IN_PROGRESS}' AND r.lease_expires_at > now()))
    -- same arguments: a failure is not cached; a dead holder's lease is over
    OR (r.fingerprint = EXCLUDED.fingerprint
        AND (r.state = '{FAILED}'
             OR (r.state = '{IN_PROGRESS}'
                 AND (r.lease_expires_at IS NULL OR r.lease_expires_at <= now()))))
RETURNING attempt
"""

# The row in the way of a claim that returned nothing, read in a new snapshot: it may have
# moved on since (completed: a replay; deleted by a purge or cleanup: the claim is tried
# again; its lease just ended: DEFERRED for a moment, then a delivery takes it over).
READ_SQL = f"""
SELECT {_COLUMNS} FROM {TABLE_NAME}
WHERE task_name = %(task_name)s AND key = %(key)s
"""

_CLAIM_MATCHES = (
    "task_name = %(task_name)s AND key = %(key)s AND attempt = %(attempt)s "
    f"AND lease_owner = %(owner)s AND state = '{IN_PROGRESS}'")

# The record lives at least `ttl_seconds` after its completion. `expires_at` (the only
# indexed column an update could change) moves only when the completion came after the
# lease the claim counted in: otherwise the new row version is a HOT update.
_KEEP_AT_LEAST_TTL = (
    "expires_at = GREATEST(expires_at, now() + %(ttl_seconds)s * interval '1 second')"
)

COMPLETE_SQL = f"""
UPDATE {TABLE_NAME} SET state = '{SUCCEEDED}', result = %(result)s::jsonb, error = NULL,
    lease_owner = NULL, lease_expires_at = NULL, updated_at = now(), {_KEEP_AT_LEAST_TTL}
WHERE {_CLAIM_MATCHES}
"""

FAIL_SQL = f"""
UPDATE {TABLE_NAME} SET state = '{FAILED}', result = NULL, error = %(error)s,
    lease_owner = NULL, lease_expires_at = NULL, updated_at = now(), {_KEEP_AT_LEAST_TTL}
WHERE {_CLAIM_MATCHES}
"""

# A release keeps the row (and its attempt number) and ends the lease now, so the retry
# claims it at once and a stale holder stays fenced out.
RELEASE_SQL = f"""
UPDATE {TABLE_NAME} SET lease_owner = NULL, lease_expires_at = now(), updated_at = now()
WHERE {_CLAIM_MATCHES}
"""


# -- the operator's side ------------------------------------------------------------------
_RECORD_FIELDS = (
    "task_name, key, fingerprint, state, result, error, attempt, lease_owner, "
    "lease_expires_at, task_id, created_at, updated_at, expires_at")

FIND_SQL = f"""
SELECT {_RECORD_FIELDS} FROM {TABLE_NAME} WHERE task_name = %(task_name)s AND key = %(key)s
"""

RECENT_SQL = f"""
SELECT {_RECORD_FIELDS} FROM {TABLE_NAME}
WHERE (%(task_name)s::text IS NULL OR task_name = %(task_name)s)
  AND (%(state)s::text IS NULL OR state = %(state)s)
ORDER BY updated_at DESC LIMIT %(limit)s
"""

PURGE_SQL = f"""
DELETE FROM {TABLE_NAME}
WHERE task_name = %(task_name)s AND key = %(key)s AND (%(force)s OR state <> '{IN_PROGRESS}')
"""

COUNT_SQL = f"SELECT state, count(*) AS n FROM {TABLE_NAME} GROUP BY state"

# Counts without counting every record: open claims exactly (a scan of the table: no index
# reads `state`, so that completions stay HOT updates), the table's size from the planner's
# statistics (rows per page at the last ANALYZE times today's pages, as the planner scales
# it) and the finished states' shares from `pg_stats` (the state column's most common
# values). `total` is -1 when never analyzed.
ESTIMATE_SQL = f"""
SELECT
    (SELECT count(*) FROM {TABLE_NAME} WHERE state = '{IN_PROGRESS}') AS in_progress,
    (SELECT CASE WHEN c.reltuples < 0 OR c.relpages = 0 THEN -1::float8
                 ELSE c.reltuples / c.relpages
                      * (pg_relation_size(c.oid) / current_setting('block_size')::float8)
            END
     FROM pg_class c WHERE c.oid = to_regclass('{TABLE_NAME}')) AS total,
    (SELECT json_build_object('values', s.most_common_vals::text::text[],
                              'shares', s.most_common_freqs)
     FROM pg_stats s JOIN pg_class c ON c.relname = s.tablename
     JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = s.schemaname
     WHERE c.oid = to_regclass('{TABLE_NAME}') AND s.attname = 'state') AS shares
"""

#: Below this many rows (by the statistics) the counts are exact: a scan is cheap.
EXACT_COUNT_BELOW_ROWS = 100_000

# Open claims someone holds (a released claim has no owner): oldest first, as locks list.
HOLDERS_SQL = f"""
SELECT task_name, key, attempt, task_id, lease_owner,
       EXTRACT(EPOCH FROM (now() - updated_at))::float8 AS held_seconds,
       COALESCE(lease_expires_at > now(), false) AS alive
FROM {TABLE_NAME}
WHERE state = '{IN_PROGRESS}' AND lease_owner IS NOT NULL
ORDER BY updated_at LIMIT %(limit)s
"""


@contextlib.contextmanager
def _database_errors(action: str) -> Iterator[None]:
    """SQLAlchemy's database errors leave as `StorageError`s.

    Only `DBAPIError`: an ORM error raised while flushing the body's session (a mapping
    mistake) is the body's own error, and fails the call as the body's errors do.
    """
    try:
        yield
    except DBAPIError as exc:
        raise translate_store_error(exc, f"idempotency store: {action}") from exc


#: Without a pooler: prepended once, when a connection's session is not in the mode wanted.
SESSION_ASYNCHRONOUS_COMMIT = "SET synchronous_commit = off; "
SESSION_DEFAULT_COMMIT = "SET synchronous_commit TO DEFAULT; "

PING = _Statement("resilience_idempotency_ping", "SELECT 1")
CLAIM = _Statement("resilience_idempotency_claim", CLAIM_SQL)
READ = _Statement("resilience_idempotency_read", READ_SQL)
COMPLETE = _Statement("resilience_idempotency_complete", COMPLETE_SQL)
FAIL = _Statement("resilience_idempotency_fail", FAIL_SQL)
RELEASE = _Statement("resilience_idempotency_release", RELEASE_SQL)
FIND = _Statement("resilience_idempotency_find", FIND_SQL)
RECENT = _Statement("resilience_idempotency_recent", RECENT_SQL)
PURGE = _Statement("resilience_idempotency_purge", PURGE_SQL)
COUNT = _Statement("resilience_idempotency_count", COUNT_SQL)
ESTIMATE = _Statement("resilience_idempotency_estimate", ESTIMATE_SQL)
HOLDERS = _Statement("resilience_idempotency_holders", HOLDERS_SQL)
#: The claim's and completion's parameters that one guard passes the same on every call.
_CLAIM_FIXED = ("task_name", "lease_seconds", "ttl_seconds")
_COMPLETE_FIXED = ("task_name", "ttl_seconds")


class PostgresTransaction:
    """The body's transaction: a pooled connection, a Session joined to it, and the
    record's completion inside it (see `Transaction`)."""

    def __init__(self, engine: Engine) -> None:
        with _database_errors("open transaction"):
            self._connection = engine.connect()
            try:
                self._transaction = self._connection.begin()
            except BaseException:
                self._connection.close()
                raise
        # rollback_only: the body's session.commit() only flushes into this transaction;
        # the guard commits it together with the record's completion.
        self.session = Session(
            bind=self._connection, join_transaction_mode="rollback_only", expire_on_commit=False)

    def complete(self, claim: Claim | None, result_json: str, ttl_seconds: float) -> bool:
        with _database_errors("commit"):
            self.session.flush()
            if claim is None:
                return True
            parameters = claim.parameters(result=result_json, ttl_seconds=float(ttl_seconds))
            return self._connection.exec_driver_sql(COMPLETE_SQL, parameters).rowcount == 1

    def commit(self) -> None:
        with _database_errors("commit"):
            self._transaction.commit()

    def close(self) -> None:
        try:
            self.session.close()
            if self._transaction.is_active:
                self._transaction.rollback()
        except Exception as exc:  # noqa: BLE001 - rollback of a broken connection; it is closed
            logger.warning("idempotency transaction cleanup: %s", exc)
        finally:
            self._connection.close()


class PostgresIdempotencyBackend(StoreBackend):
    """Claims, completes, fails and releases idempotency records in PostgreSQL.

    Args:
        runner: runs each statement on its thread's connection (`Stores.statements`).
        prepared: use server-side prepared statements; turn off behind a pooler that does
            not keep them (PgBouncer in transaction mode before 1.21).
        transaction_engine: the pooled engine transactional bodies write through (or a
            callable returning it, so it is only created when used); None: no `begin()`.
        synchronous_commit: False: the claim, completion, failure and release do not wait
            for the WAL flush (set on the thread's session, in the same query string as the
            first write that needs it; per statement when `transaction_pooled`).
        transaction_pooled: a transaction or statement pooler sits in between, so no
            session setting holds from one statement to the next.
        transactions: opens the body's transaction instead of `transaction_engine` (the
            Django one of `resilience.contrib.django`); None: a SQLAlchemy Session.
    """

    store_operation = "idempotency store"

    def __init__(self, runner: StatementRunner, *, prepared: bool = True,
                 transaction_engine: Engine | Callable[[], Engine] | None = None,
                 synchronous_commit: bool = True, transaction_pooled: bool = False,
                 transactions: Callable[[], Transaction] | None = None) -> None:
        self.runner = runner
        self._transactions = transactions
        self.prepared = prepared
        self.synchronous_commit = synchronous_commit
        self.transaction_pooled = transaction_pooled
        self._transaction_engine = transaction_engine

    def _commit_mode(self, connection: HeldConnection) -> tuple[str, Callable[[], None] | None]:
        """The prefix a write needs for this backend's `synchronous_commit`, and how to
        record the session's new setting once it succeeded (two backends may share a
        thread's connection; a failed statement rolled its SET back with it)."""
        if self.transaction_pooled:
            return ("" if self.synchronous_commit else ASYNCHRONOUS_COMMIT), None
        wanted = None if self.synchronous_commit else False  # None: the server's default
        if connection.settings.get("synchronous_commit") is wanted:
            return "", None
        return (SESSION_DEFAULT_COMMIT if wanted is None else SESSION_ASYNCHRONOUS_COMMIT,
                functools.partial(connection.settings.__setitem__, "synchronous_commit", wanted))

    def _execute(self, statement: _Statement, parameters: dict[str, Any], action: str, *,
                 write: bool = False, named: bool = True, fixed: tuple[str, ...] = (),
                 lead: bool = False) -> Any:
        """Run one statement on this thread's connection (`StatementRunner.run`).

        Raises:
            StoreUnavailable, StoreRejected, StorageError.
        """
        return self.runner.run(statement, parameters, f"idempotency store: {action}",
                               prepared=self.prepared, prefix=self._commit_mode if write else None,
                               named=named, fixed=fixed, lead=lead)

    def ping(self) -> None:
        """One round trip on this thread's connection (`SELECT 1`): a health check, and the
        benchmark's measure of what a PostgreSQL round trip costs apart from the claim's SQL.

        Raises:
            StoreUnavailable, StorageError.
        """
        self._execute(PING, {}, "ping")

    # -- the guard's steps -----------------------------------------------------------------
    def claim(self, *, task_name: str, key: str, fingerprint: str, owner: str,
              task_id: str | None, lease_seconds: float, ttl_seconds: float) -> ClaimResult:
        """Claim `key` for `owner`, or return the record that stands in the way.

        Raises:
            StoreUnavailable, StoreRejected, StorageError.
        """
        parameters = {"task_name": task_name, "key": key, "fingerprint": fingerprint,
                      "owner": owner, "task_id": task_id, "lease_seconds": float(lease_seconds),
                      "ttl_seconds": float(ttl_seconds)}
        for _ in (1, 2):
            claimed = self._execute(CLAIM, parameters, "claim", write=True, named=False,
                                    fixed=_CLAIM_FIXED)
            if claimed:
                # What the claim just wrote: nothing to read back.
                attempt = int(claimed[0][0])
                return ClaimResult(
                    claim=Claim(task_name=task_name, key=key, attempt=attempt, owner=owner),
                    attempt=attempt, state=IN_PROGRESS, fingerprint=fingerprint, result=None,
                    error=None, task_id=task_id, lease_owner=owner,
                    lease_remaining_seconds=float(lease_seconds),
                    expires_in_seconds=float(lease_seconds) + float(ttl_seconds))
            rows = self._execute(READ, parameters, "claim (read)")
            if rows:
                row = rows[0]
                return ClaimResult(
                    claim=None, attempt=int(row.attempt), state=row.state,
                    fingerprint=row.fingerprint, result=row.result, error=row.error,
                    task_id=row.task_id, lease_owner=row.lease_owner,
                    lease_remaining_seconds=row.lease_remaining,
                    expires_in_seconds=float(row.expires_in or 0.0))
            # Deleted between the two statements (a purge, cleanup): claim again.
        raise StorageError(f"idempotency store: claim of {task_name}:{key} found no row")

    def complete(self, claim: Claim, result_json: str, ttl_seconds: float) -> bool:
        """Record success with its result; False when the claim was taken over (stale).

        The call's last commit: what waits to ride on it (a singleton's release held on
        this thread's connection, freed at this commit) goes in the same round trip.
        """
        parameters = claim.parameters(result=result_json, ttl_seconds=float(ttl_seconds))
        return self._execute(COMPLETE, parameters, "complete", write=True,
                             fixed=_COMPLETE_FIXED, lead=True) == 1

    def fail(self, claim: Claim, error: str, ttl_seconds: float) -> bool:
        """Record a non-retryable failure; False when the claim was taken over."""
        parameters = claim.parameters(error=error[:4000], ttl_seconds=float(ttl_seconds))
        return self._execute(FAIL, parameters, "fail", write=True) == 1

    def release(self, claim: Claim) -> bool:
        """End the claim's lease now so a retry can claim at once; False when stale."""
        return self._execute(RELEASE, claim.parameters(), "release", write=True) == 1

    def begin(self) -> Transaction:
        """Open the body's transaction on the pooled engine (or `transactions`').

        Raises:
            StorageError: the database cannot be reached.  ConfigurationError: no
                `transaction_engine` was given.
        """
        if self._transactions is not None:
            return self._transactions()
        engine = self._transaction_engine
        if engine is None:
            raise ConfigurationError(
                "this idempotency backend has no transaction_engine; transactional=True needs one")
        return PostgresTransaction(engine() if callable(engine) else engine)

    def unavailable(self, error: BaseException) -> bool:
        """Is `error` PostgreSQL being unreachable (not a bug, not a constraint)?"""
        return isinstance(error, StoreUnavailable) or (isinstance(error, DBAPIError) and isinstance(
            translate_store_error(error, "idempotency store: body"), StoreUnavailable))

    # -- the operator's side ---------------------------------------------------------------
    def read(self, task_name: str, key: str) -> Record | None:
        rows = self._execute(FIND, {"task_name": task_name, "key": key}, "read")
        return Record(**rows[0]) if rows else None

    def recent(self, *, limit: int, task_name: str | None = None,
               state: str | None = None) -> list[Record]:
        rows = self._execute(
            RECENT, {"task_name": task_name, "state": state, "limit": int(limit)}, "read")
        return [Record(**row) for row in rows]

    def purge(self, task_name: str, key: str, *, force: bool = False) -> bool:
        parameters = {"task_name": task_name, "key": key, "force": bool(force)}
        return self._execute(PURGE, parameters, "purge") > 0

    def count_by_state(self) -> dict[str, int]:
        counts = dict.fromkeys(STATES, 0)
        counts.update({row.state: int(row.n) for row in self._execute(COUNT, {}, "count")})
        return counts

    def estimate_by_state(self) -> dict[str, int]:
        """Record count per state without scanning the table: open claims exact, finished
        states estimated from the planner's statistics (exact while the table is small or
        not analyzed yet).

        Raises:
            StoreUnavailable, StorageError.
        """
        row = self._execute(ESTIMATE, {}, "count")[0]
        open_claims = int(row.in_progress)
        total = float(row.total if row.total is not None else -1)
        shares: dict[str, float] = {}
        if row.shares:
            shares = dict(zip(row.shares["values"], row.shares["shares"], strict=True))
        if total < EXACT_COUNT_BELOW_ROWS or not shares:
            return self.count_by_state()
        finished = max(total - open_claims, 0.0)
        # A state too rare to be among the most common values gets what they leave over.
        rest = max(1.0 - sum(shares.values()), 0.0)
        succeeded = shares.get(SUCCEEDED, rest if FAILED in shares else rest / 2)
        failed = shares.get(FAILED, rest if SUCCEEDED in shares else rest / 2)
        both = succeeded + failed
        counts = dict.fromkeys(STATES, 0)
        counts[IN_PROGRESS] = open_claims
        if both > 0:
            counts[FAILED] = round(finished * failed / both)
            counts[SUCCEEDED] = round(finished) - counts[FAILED]
        return counts

    def holders(self, *, limit: int) -> list[Holder]:
        rows = self._execute(HOLDERS, {"limit": int(limit)}, "holders")
        return [Holder(kind=HOLDER_KIND, key=f"{row.task_name}:{row.key}",
                       owner=row.task_id or row.lease_owner, token=int(row.attempt),
                       held_seconds=max(0.0, float(row.held_seconds)), alive=bool(row.alive))
                for row in rows]


def backend_for(stores: Stores, *, synchronous_commit: bool = True,
                prepared: bool = True) -> PostgresIdempotencyBackend:
    """The PostgreSQL idempotency backend of `stores`, for this process; transactional
    bodies write through `stores.engine()`.

    With `synchronous_commit=False` the writes do not wait for the WAL flush: a PostgreSQL
    crash may forget the last fraction of a second of records, never corrupts. Prepared
    statements are off whatever `prepared` says when `stores` declares a transaction or
    statement pooler (`Stores.transaction_pooled`): they would not survive it.
    """
    return PostgresIdempotencyBackend(
        stores.statements(), prepared=prepared and not stores.transaction_pooled,
        transaction_engine=stores.engine, synchronous_commit=synchronous_commit,
        transaction_pooled=stores.transaction_pooled, transactions=stores.begin_transaction())
