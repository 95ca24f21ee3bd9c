"""The idempotency record table: one row per (task name, key), the durable truth.

State machine of a row:

    (none) --claim--> in_progress --complete--> succeeded
                          |  \\--fail (non-retryable)--> failed
                          |---release (retryable): lease ends now, row stays in_progress
                          '---reaper (lease expired long ago)--> failed

A claim may take over a row when its lease has expired, when it failed (failures are not
cached), or when the whole record has expired; each takeover increments `attempt`, the
fencing number, and writes a fresh `lease_owner` token. Completion, failure and release
match on both, so a holder whose claim was taken over changes nothing.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

from resilience.idempotency.backends import FAILED, IN_PROGRESS, STATES, SUCCEEDED
from resilience.schema import metadata

TABLE_NAME = "idempotency_records"

__all__ = ["FAILED", "IN_PROGRESS", "STATES", "SUCCEEDED", "TABLE_NAME", "idempotency_records"]

idempotency_records = Table(
    TABLE_NAME,
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    # Ids, names and keys are TEXT: a length limit here would turn a long value into an
    # error on every attempt (keys are bounded by resilience.keys.MAX_KEY_LENGTH).
    Column("task_name", Text, nullable=False, comment="namespace of the key"),
    Column("key", Text, nullable=False, comment="the idempotency key"),
    Column("fingerprint", String(64), nullable=False, comment="sha256 of the bound arguments"),
    Column("state", String(16), nullable=False),
    Column("result", JSONB, nullable=True, comment="the stored result (succeeded)"),
    Column("error", Text, nullable=True, comment="the recorded error (failed)"),
    Column("attempt", Integer, nullable=False, comment="fencing number, +1 per takeover"),
    Column("lease_owner", Text, nullable=True, comment="token of the current holder"),
    Column("lease_expires_at", DateTime(timezone=True), nullable=True),
    Column("task_id", Text, nullable=True, comment="task id of the holder / producer"),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("task_name", "key", name="uq_idempotency_records_task_name_key"),
    CheckConstraint("state IN ('in_progress', 'succeeded', 'failed')", name="state_known"),
    # Cleanup scans only finished rows by expiry; the reaper only open claims by lease.
    Index(
        "ix_idempotency_records_expires_at_finished",
        "expires_at",
        postgresql_where=text("state <> 'in_progress'"),
    ),
    Index(
        "ix_idempotency_records_lease_expires_at_open",
        "lease_expires_at",
        postgresql_where=text("state = 'in_progress'"),
    ),
    # No index on `updated_at` (dropped in 0012): every claim and completion changes it, so
    # it cost an index entry per write for the operator's `list` alone. Completions are
    # still not HOT updates: they change `state`, which both partial indexes' predicates
    # read (see docs/idempotency.md, "Cleanup").
)
