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

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from resilience.schema import metadata

TABLE_NAME = "resilience_outbox"

outbox = sa.Table(
    TABLE_NAME, metadata,
    sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
    sa.Column("task_id", sa.Text, nullable=False,
              comment="fixed at insert; the relay publishes it"),
    sa.Column("task_name", sa.Text, nullable=False),
    sa.Column("args", JSONB, nullable=False),
    sa.Column("kwargs", JSONB, nullable=False),
    sa.Column("options", JSONB, nullable=False, comment="apply_async options (JSON only)"),
    sa.Column("ordering_key", sa.Text, comment="same key: published in id order"),
    sa.Column("state", sa.String(16), nullable=False, server_default="pending"),
    sa.Column("due_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now(),
              comment="not published before this (countdown / eta)"),
    sa.Column("next_attempt_at", sa.DateTime(timezone=True),
              comment="backoff after a refused publish"),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("last_error", sa.Text),
    sa.Column("dead_letter_id", sa.BigInteger),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
              server_default=sa.func.now()),
    sa.Column("finished_at", sa.DateTime(timezone=True),
              comment="when it was published or dead-lettered"),
    sa.CheckConstraint("state IN ('pending', 'published', 'dead_lettered')", name="state_known"),
    # The relay reads pending rows in id order; the status view reads them by due time;
    # the ordering-key check looks for an earlier pending row of the same key.
    sa.Index("ix_resilience_outbox_pending_id", "id",
             postgresql_where=sa.text("state = 'pending'")),
    sa.Index("ix_resilience_outbox_pending_due_at", "due_at",
             postgresql_where=sa.text("state = 'pending'")),
    sa.Index("ix_resilience_outbox_pending_ordering_key", "ordering_key", "id",
             postgresql_where=sa.text("state = 'pending' AND ordering_key IS NOT NULL")),
    # Published-last-minute, the dead-letter count and the purge read finished rows.
    sa.Index("ix_resilience_outbox_finished", "state", "finished_at",
             postgresql_where=sa.text("state <> 'pending'")),
)
