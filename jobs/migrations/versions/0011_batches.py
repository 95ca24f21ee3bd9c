"""Batches: a group of jobs whose callbacks run once, when every member is final.

`resilience_batches` holds one row per batch (its pending count, callbacks and when it
completed); `resilience_batch_members` one row per member job with its final state
(see `resilience.batches.models`).

Revision ID: 0011_batches
Revises: 0010_dead_letter_replay
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0011_batches"
down_revision = "0010_dead_letter_replay"
branch_labels = None
depends_on = None

BATCHES = "resilience_batches"
MEMBERS = "resilience_batch_members"


def upgrade() -> None:
    op.create_table(
        BATCHES,
        sa.Column("id", sa.Text, nullable=False),
        sa.Column("description", sa.Text, nullable=True),
        sa.Column("total", sa.Integer, nullable=False),
        sa.Column("pending", sa.Integer, nullable=False),
        sa.Column("on_success", JSONB, nullable=True),
        sa.Column("on_complete", JSONB, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.func.now()),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("success_task_id", sa.Text, nullable=True),
        sa.Column("complete_task_id", sa.Text, nullable=True),
        sa.PrimaryKeyConstraint("id", name=f"pk_{BATCHES}"),
        sa.CheckConstraint("pending >= 0 AND pending <= total",
                           name=f"ck_{BATCHES}_pending_in_range"),
    )
    op.create_index("ix_resilience_batches_created_at", BATCHES, ["created_at"])
    op.create_table(
        MEMBERS,
        sa.Column("batch_id", sa.Text, nullable=False),
        sa.Column("task_id", sa.Text, nullable=False),
        sa.Column("task_name", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False, server_default="pending"),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("batch_id", "task_id", name=f"pk_{MEMBERS}"),
        sa.ForeignKeyConstraint(["batch_id"], [f"{BATCHES}.id"], ondelete="CASCADE",
                                name=f"fk_{MEMBERS}_batch_id_{BATCHES}"),
        sa.CheckConstraint(
            "state IN ('pending', 'succeeded', 'replayed', 'failed', 'shed', 'skipped', "
            "'cancelled', 'dead_lettered')",
            name=f"ck_{MEMBERS}_state_known",
        ),
    )
    op.create_index("ix_resilience_batch_members_task_id", MEMBERS, ["task_id"])


def downgrade() -> None:
    op.drop_table(MEMBERS)
    op.drop_table(BATCHES)
