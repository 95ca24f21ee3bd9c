"""The `resilience_cancellations` table: the record of every cancellation (the tombstones)."""

from __future__ import annotations

import sqlalchemy as sa

from resilience.schema import metadata

cancellations = sa.Table(
    "resilience_cancellations", metadata,
    sa.Column("id", sa.BigInteger, primary_key=True),
    #: `id:<task id>` or `key:<task name>:<key>` (see resilience.cancel.backends).
    sa.Column("target", sa.Text, nullable=False, unique=True),
    sa.Column("task_name", sa.Text),
    sa.Column("task_id", sa.Text),
    sa.Column("key", sa.Text),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(),
              nullable=False),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    sa.Index("ix_resilience_cancellations_expires_at", "expires_at"),
)
