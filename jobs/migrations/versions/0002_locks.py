"""Locks: held-lock registry, fencing token sequence and high-water marks.

Revision ID: 0002_locks
Revises: 0001_platform
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_locks"
down_revision = "0001_platform"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.schema.CreateSequence(sa.Sequence("resilience_fencing_token_seq")))
    op.create_table(
        "resilience_fencing_marks",
        sa.Column("key", sa.String(600), primary_key=True),
        sa.Column("token", sa.BigInteger, nullable=False),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
    )
    op.create_table(
        "resilience_held_locks",
        sa.Column("key", sa.String(600), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("task_id", sa.String(64)),
        sa.Column("task_name", sa.String(255)),
        sa.Column("hostname", sa.String(255)),
        sa.Column("pid", sa.Integer),
        sa.Column("token", sa.BigInteger),
        sa.Column("advisory_id", sa.BigInteger),
        sa.Column("ttl_seconds", sa.Float),
        sa.Column(
            "acquired_at", sa.DateTime(timezone=True), server_default=sa.func.now(),
            nullable=False,
        ),
        # Informational and rewritten on every acquire/release: UNLOGGED skips the WAL (about
        # half the cost of a singleton acquire), and crash recovery empties it, which is
        # right because a crash also ends every session that held a lock.
        prefixes=["UNLOGGED"],
    )


def downgrade() -> None:
    op.drop_table("resilience_held_locks")
    op.drop_table("resilience_fencing_marks")
    op.execute(sa.schema.DropSequence(sa.Sequence("resilience_fencing_token_seq")))
