"""TTL cleanup and the abandoned-claim reaper, in bounded batches.

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

from resilience.errors import ConfigurationError
from resilience.idempotency.backends.postgres import wrap_database_error
from resilience.idempotency.models import FAILED, IN_PROGRESS, TABLE_NAME

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

logger = logging.getLogger("resilience.idempotency.cleanup")

# The batch is a CTE: PostgreSQL materializes it once. Inside `WHERE id IN (...)` a LIMIT
# subquery may be rescanned by the plan, and each rescan with SKIP LOCKED can pick other rows,
# so a "batch" could grow past its bound.
DELETE_EXPIRED_SQL = f"""
WITH batch AS MATERIALIZED (
    SELECT id FROM {TABLE_NAME}
    WHERE state <> '{IN_PROGRESS}' AND expires_at < now()
    ORDER BY expires_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {TABLE_NAME} AS r USING batch
WHERE r.id = batch.id AND r.state <> '{IN_PROGRESS}' AND r.expires_at < now()
"""

REAP_SQL = f"""
WITH batch AS MATERIALIZED (
    SELECT id FROM {TABLE_NAME}
    WHERE state = '{IN_PROGRESS}'
      AND lease_expires_at < now() - %(grace_seconds)s * interval '1 second'
    ORDER BY lease_expires_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {TABLE_NAME} AS r
SET state = '{FAILED}',
    error = 'abandoned: the holder''s lease ended at ' || r.lease_expires_at::text
            || ' and it never finished',
    lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
FROM batch
WHERE r.id = batch.id AND r.state = '{IN_PROGRESS}'
  AND r.lease_expires_at < now() - %(grace_seconds)s * interval '1 second'
"""


@dataclass(frozen=True, kw_only=True)
class CleanupConfig:
    """How much one cleanup run may do.

    Args:
        batch_size: rows per statement (one short transaction each).
        pause_seconds: sleep between batches, so cleanup never monopolizes the database.
        max_batches: upper bound per run; the next scheduled run continues.
        grace_seconds: the reaper leaves claims whose lease ended less than this ago.
    """

    batch_size: int = 1000
    pause_seconds: float = 0.1
    max_batches: int = 100
    grace_seconds: float = 300.0

    def __post_init__(self) -> None:
        if not 1 <= self.batch_size <= 100_000:
            raise ConfigurationError(f"batch_size must be 1..100000, got {self.batch_size}")
        if self.pause_seconds < 0 or self.grace_seconds < 0:
            raise ConfigurationError("pause_seconds and grace_seconds must be >= 0")
        if self.max_batches < 1:
            raise ConfigurationError(f"max_batches must be >= 1, got {self.max_batches}")


def _batches(
    engine: Engine,
    sql: str,
    parameters: dict[str, float | int],
    policy: CleanupConfig,
    sleep: Callable[[float], None],
    action: str,
) -> int:
    total = 0
    for batch in range(policy.max_batches):
        try:
            with engine.begin() as connection:
                affected = connection.exec_driver_sql(sql, parameters).rowcount
        except DBAPIError as exc:
            raise wrap_database_error(exc, action) from exc
        total += affected
        if affected < policy.batch_size:
            break
        if batch + 1 < policy.max_batches:
            sleep(policy.pause_seconds)
    return total


def delete_expired(
    engine: Engine,
    policy: CleanupConfig | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Delete expired finished records; returns how many were deleted.

    Raises:
        StoreUnavailable, StorageError.
    """
    policy = policy or CleanupConfig()
    deleted = _batches(
        engine, DELETE_EXPIRED_SQL, {"batch_size": policy.batch_size}, policy, sleep, "cleanup"
    )
    logger.info("idempotency cleanup deleted %d expired records", deleted)
    return deleted


def reap_abandoned(
    engine: Engine,
    policy: CleanupConfig | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Mark claims abandoned long ago as failed (reclaimable); returns how many.

    Raises:
        StoreUnavailable, StorageError.
    """
    policy = policy or CleanupConfig()
    parameters = {"batch_size": policy.batch_size, "grace_seconds": float(policy.grace_seconds)}
    reaped = _batches(engine, REAP_SQL, parameters, policy, sleep, "reap")
    logger.info("idempotency reaper marked %d abandoned claims failed", reaped)
    return reaped


CleanupPolicy = CleanupConfig  # deprecated alias, removed in the next release
