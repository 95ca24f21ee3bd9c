"""The outbox table: one row per job a producer's transaction enqueued (or a long delay).

State machine of a row:

    pending --relay published it--> published   (kept an hour, then purged)
       |  \\--refused (TierFull, broker down)--> pending, attempts + 1, next_attempt_at later
       '---unknown task / non-retryable error--> dead_lettered
                                                   (a `resilience_dead_letters` row names it)

The row is written in the producer's own transaction, so a rolled-back transaction leaves
no row and no job. The task id is fixed at insert; the relay publishes with it.
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
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

from resilience.schema import metadata

TABLE_NAME = "resilience_outbox"

outbox = Table(
    TABLE_NAME,
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("task_id", Text, nullable=False, comment="fixed at insert; the relay publishes it"),
    Column("task_name", Text, nullable=False),
    Column("args", JSONB, nullable=False),
    Column("kwargs", JSONB, nullable=False),
    Column("options", JSONB, nullable=False, comment="apply_async options (JSON only)"),
    Column("ordering_key", Text, nullable=True, comment="same key: published in id order"),
    Column("state", String(16), nullable=False, server_default="pending"),
    Column("due_at", DateTime(timezone=True), nullable=False, server_default=func.now(),
           comment="not published before this (countdown / eta)"),
    Column("next_attempt_at", DateTime(timezone=True), nullable=True,
           comment="backoff after a refused publish"),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("last_error", Text, nullable=True),
    Column("dead_letter_id", BigInteger, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("finished_at", DateTime(timezone=True), nullable=True,
           comment="when it was published or dead-lettered"),
    CheckConstraint("state IN ('pending', 'published', 'dead_lettered')", name="state_known"),
    # The relay reads pending rows in id order; the status view reads them by due time;
    # the ordering-key check looks for an earlier pending row of the same key.
    Index("ix_resilience_outbox_pending_id", "id", postgresql_where=text("state = 'pending'")),
    Index("ix_resilience_outbox_pending_due_at", "due_at",
          postgresql_where=text("state = 'pending'")),
    Index("ix_resilience_outbox_pending_ordering_key", "ordering_key", "id",
          postgresql_where=text("state = 'pending' AND ordering_key IS NOT NULL")),
    # Published-last-minute, the dead-letter count and the purge read finished rows.
    Index("ix_resilience_outbox_finished", "state", "finished_at",
          postgresql_where=text("state <> 'pending'")),
)
