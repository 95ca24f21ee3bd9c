"""The idempotency record table: one row per (task name, key), the durable truth.

Its state machine and fencing pair: `resilience.idempotency.backends`; why the primary key
is the natural key and completions are HOT updates: docs/idempotency.md, "The table".
"""

from __future__ import annotations

from sqlalchemy import (
    CheckConstraint,
    Column,
    DateTime,
    Index,
    Integer,
    String,
    Table,
    Text,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB

from resilience.schema import metadata

TABLE_NAME = "resilience_idempotency_records"

idempotency_records = Table(
    TABLE_NAME,
    metadata,
    # Names and keys are TEXT: a length limit would turn a long value into an error on
    # every attempt (keys are bounded by resilience.keys.MAX_KEY_LENGTH).
    Column("task_name", Text, primary_key=True, comment="namespace of the key"),
    Column("key", Text, primary_key=True, comment="the idempotency key"),
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
    Column(
        "expires_at",
        DateTime(timezone=True),
        nullable=False,
        comment="set by the claim to cover the lease and the TTL; a completion moves it "
        "only when it comes after the lease",
    ),
    CheckConstraint("state IN ('in_progress', 'succeeded', 'failed')", name="state_known"),
    # The only index besides the primary key: no index may read a column a completion
    # changes (not even `state`), so that completions stay HOT updates; the fillfactor
    # leaves each page room for the completed version.
    Index("ix_resilience_idempotency_records_expires_at", "expires_at"),
    postgresql_with={"fillfactor": 80},
)
