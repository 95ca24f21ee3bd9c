"""TTL cleanup and the abandoned-claim reaper: short batches until done or out of time.

Both lock the rows they touch with `FOR UPDATE SKIP LOCKED`, so two runs at once (two
beats, a manual run during a scheduled one) split the work instead of blocking or failing,
and a claim in flight (its row locked by the claiming statement) is skipped, not deleted.

Invariants: cleanup deletes only rows that are finished (`state <> 'in_progress'`) and whose
`expires_at` has passed; the reaper touches only `in_progress` rows whose lease ended more
than `grace_seconds` ago, and turns them `failed`, never deletes them, so their attempt
number keeps fencing out the dead holder until the record expires.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy.exc import DBAPIError

from resilience.config import check
from resilience.connections import translate_store_error
from resilience.errors import ConfigurationError
from resilience.idempotency.backends import FAILED, IN_PROGRESS
from resilience.idempotency.models import TABLE_NAME

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

logger = logging.getLogger("resilience.idempotency.cleanup")

# One batch: the expired rows' ctids are collected once (`ARRAY(...)` is an initplan, run
# exactly once, so SKIP LOCKED cannot pick more rows on a rescan and the batch never grows
# past its bound), locked, and deleted by a TID scan without a primary-key probe per row.
# The conditions are checked again on the locked rows (a row version the claim replaced is
# not the one locked).
DELETE_EXPIRED_SQL = f"""
DELETE FROM {TABLE_NAME}
WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM {TABLE_NAME}
        WHERE state <> '{IN_PROGRESS}' AND expires_at < now()
        ORDER BY expires_at
        LIMIT %(batch_size)s
        FOR UPDATE SKIP LOCKED))
  AND state <> '{IN_PROGRESS}' AND expires_at < now()
"""

# The single-pass statement cleanup ran before 0012 (rows joined back through the primary
# key, `(task_name, key)` since 0013); kept so `python -m bench cleanup` can compare both.
DELETE_EXPIRED_BY_ID_SQL = f"""
WITH batch AS MATERIALIZED (
    SELECT task_name, key FROM {TABLE_NAME}
    WHERE state <> '{IN_PROGRESS}' AND expires_at < now()
    ORDER BY expires_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {TABLE_NAME} AS r USING batch
WHERE (r.task_name, r.key) = (batch.task_name, batch.key)
  AND r.state <> '{IN_PROGRESS}' AND r.expires_at < now()
"""

# The reaper's batch comes from a scan of the table: no index reads `state` or the lease,
# so that every completion can be a HOT update (see resilience.idempotency.models). It runs
# every few minutes; one scan per run is its cost. Its rows are taken by ctid, as above.
REAP_SQL = f"""
UPDATE {TABLE_NAME} AS r
SET state = '{FAILED}',
    error = 'abandoned: the holder''s lease ended at ' || r.lease_expires_at::text
            || ' and it never finished',
    lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
WHERE r.ctid = ANY(ARRAY(
        SELECT ctid FROM {TABLE_NAME}
        WHERE state = '{IN_PROGRESS}'
          AND lease_expires_at < now() - %(grace_seconds)s * interval '1 second'
        ORDER BY lease_expires_at
        LIMIT %(batch_size)s
        FOR UPDATE SKIP LOCKED))
  AND r.state = '{IN_PROGRESS}'
  AND r.lease_expires_at < now() - %(grace_seconds)s * interval '1 second'
"""


@dataclass(frozen=True, kw_only=True)
class CleanupConfig:
    """How much one cleanup (or reaper) run may do: short batches until one comes back
    short or `time_budget_seconds` is spent (the next run continues a backlog).

    Args:
        batch_size: rows per statement (one short transaction each).
        pause_seconds: sleep between batches, to leave the database room under load.
        max_batches: upper bound on batches per run (None: only the time budget bounds it).
        time_budget_seconds: a run starts no batch after this long.
        grace_seconds: the reaper leaves claims whose lease ended less than this ago.
    """

    batch_size: int = 1000
    pause_seconds: float = 0.0
    max_batches: int | None = None
    time_budget_seconds: float = 30.0
    grace_seconds: float = 300.0

    def __post_init__(self) -> None:
        check(self, "batch_size", "1..100000", lambda v: 1 <= v <= 100_000)
        if self.pause_seconds < 0 or self.grace_seconds < 0:
            raise ConfigurationError("pause_seconds and grace_seconds must be >= 0")
        check(self, "max_batches", ">= 1", lambda v: v is None or v >= 1)
        check(self, "time_budget_seconds", "> 0", lambda v: v > 0)


@dataclass(frozen=True)
class CleanupReport:
    """What one run did.

    Args:
        rows: rows deleted (cleanup) or marked failed (reaper).
        batches: statements run.
        seconds: wall time of the run, pauses included.
        exhausted: the run stopped on its time budget or batch bound with rows still to do
            (a backlog: the next run continues).
    """

    rows: int
    batches: int
    seconds: float
    exhausted: bool

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, float | int | bool]:
        """JSON-ready fields (the maintenance task's result)."""
        return {"rows": self.rows, "batches": self.batches, "seconds": round(self.seconds, 3),
                "rows_per_s": round(self.rows_per_second, 1), "exhausted": self.exhausted}


def _batches(engine: Engine, sql: str, policy: CleanupConfig, sleep: Callable[[float], None],
             clock: Callable[[], float], action: str, **parameters: float) -> CleanupReport:
    started = clock()
    total = batches = 0
    exhausted = False
    while True:
        try:
            with engine.begin() as connection:
                affected = connection.exec_driver_sql(
                    sql, {"batch_size": policy.batch_size, **parameters}).rowcount
        except DBAPIError as exc:
            raise translate_store_error(exc, f"idempotency store: {action}") from exc
        total += affected
        batches += 1
        if affected < policy.batch_size:
            break
        if (policy.max_batches is not None and batches >= policy.max_batches) or (
            clock() - started >= policy.time_budget_seconds
        ):
            exhausted = True
            break
        if policy.pause_seconds:
            sleep(policy.pause_seconds)
    return CleanupReport(rows=total, batches=batches, seconds=clock() - started,
                         exhausted=exhausted)


def run_cleanup(engine: Engine, policy: CleanupConfig | None = None,
                sleep: Callable[[float], None] = time.sleep,
                clock: Callable[[], float] = time.monotonic) -> CleanupReport:
    """Delete expired finished records until none is left or the time budget is spent.

    Safe to run twice at once: `SKIP LOCKED` splits the rows between the runs.

    Raises:
        StoreUnavailable, StorageError.
    """
    report = _batches(engine, DELETE_EXPIRED_SQL, policy or CleanupConfig(), sleep, clock,
                      "cleanup")
    log = logger.warning if report.exhausted else logger.info
    log(
        "idempotency cleanup deleted %d expired records in %d batches, %.1f s (%.0f rows/s)%s",
        report.rows, report.batches, report.seconds, report.rows_per_second,
        "; budget spent, expired records remain" if report.exhausted else "",
    )
    return report


def reap_abandoned(engine: Engine, policy: CleanupConfig | None = None,
                   sleep: Callable[[float], None] = time.sleep,
                   clock: Callable[[], float] = time.monotonic) -> int:
    """Mark claims abandoned long ago as failed (reclaimable); returns how many.

    Raises:
        StoreUnavailable, StorageError.
    """
    policy = policy or CleanupConfig()
    reaped = _batches(engine, REAP_SQL, policy, sleep, clock, "reap",
                      grace_seconds=float(policy.grace_seconds)).rows
    logger.info("idempotency reaper marked %d abandoned claims failed", reaped)
    return reaped
