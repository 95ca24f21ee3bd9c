"""The transactional outbox: jobs written in the producer's transaction, published by the relay.

Revision ID: 0008_outbox
Revises: 0007_dead_letter_raw
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0008_outbox"
down_revision = "0007_dead_letter_raw"
branch_labels = None
depends_on = None

TABLE = "resilience_outbox"


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("id", sa.BigInteger, autoincrement=True, nullable=False),
        sa.Column("task_id", sa.Text, nullable=False),
        sa.Column("task_name", sa.Text, nullable=False),
        sa.Column("args", JSONB, nullable=False),
        sa.Column("kwargs", JSONB, nullable=False),
        sa.Column("options", JSONB, nullable=False),
        sa.Column("ordering_key", sa.Text, nullable=True),
        sa.Column("state", sa.String(16), nullable=False, server_default="pending"),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.func.now()),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("dead_letter_id", sa.BigInteger, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.func.now()),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=f"pk_{TABLE}"),
        sa.CheckConstraint("state IN ('pending', 'published', 'dead_lettered')",
                           name=f"ck_{TABLE}_state_known"),
    )
    pending = sa.text("state = 'pending'")
    op.create_index("ix_resilience_outbox_pending_id", TABLE, ["id"], postgresql_where=pending)
    op.create_index("ix_resilience_outbox_pending_due_at", TABLE, ["due_at"],
                    postgresql_where=pending)
    op.create_index("ix_resilience_outbox_pending_ordering_key", TABLE, ["ordering_key", "id"],
                    postgresql_where=sa.text("state = 'pending' AND ordering_key IS NOT NULL"))
    op.create_index("ix_resilience_outbox_finished", TABLE, ["state", "finished_at"],
                    postgresql_where=sa.text("state <> 'pending'"))


def downgrade() -> None:
    op.drop_table(TABLE)
