"""Cancellations that stick: the record of every `jobs cancel`.

Celery's revoke lives in each worker's memory; this table keeps a cancellation across
restarts, and the Redis copy every worker reads is restored from it (see
`resilience.cancel.tombstones`).

Revision ID: 0009_cancellations
Revises: 0008_outbox
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_cancellations"
down_revision = "0008_outbox"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "resilience_cancellations",
        sa.Column("id", sa.BigInteger(), primary_key=True),
        sa.Column("target", sa.Text(), nullable=False, unique=True),
        sa.Column("task_name", sa.Text()),
        sa.Column("task_id", sa.Text()),
        sa.Column("key", sa.Text()),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(),
                  nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_resilience_cancellations_expires_at", "resilience_cancellations",
                    ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_resilience_cancellations_expires_at", "resilience_cancellations")
    op.drop_table("resilience_cancellations")
