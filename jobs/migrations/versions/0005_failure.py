"""Failure control: the dead-letter place.

Revision ID: 0005_failure
Revises: 0001_platform
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_failure"
down_revision = "0001_platform"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "dead_letters",
        sa.Column("id", sa.BigInteger, autoincrement=True, nullable=False),
        sa.Column("task_name", sa.String(255), nullable=False),
        sa.Column("task_id", sa.String(64)),
        sa.Column("args", sa.JSON, nullable=False),
        sa.Column("kwargs", sa.JSON, nullable=False),
        sa.Column("tier", sa.String(32)),
        sa.Column("queue", sa.String(255)),
        sa.Column("guard", sa.String(64), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("exception_type", sa.String(255)),
        sa.Column("exception_message", sa.Text),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("requeued_at", sa.DateTime(timezone=True)),
        sa.Column("requeued_task_id", sa.String(64)),
        sa.PrimaryKeyConstraint("id", name="pk_dead_letters"),
    )
    op.create_index("ix_dead_letters_task_name", "dead_letters", ["task_name"])
    op.create_index("ix_dead_letters_created_at", "dead_letters", ["created_at"])


def downgrade() -> None:
    op.drop_table("dead_letters")
