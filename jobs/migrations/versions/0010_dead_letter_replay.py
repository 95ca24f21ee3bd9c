"""Dead letters name the dependency that was down, for automatic replay.

A job given up on because its dependency's breaker was open, or because the dependency's
retry budget was spent, records that dependency. `resilience.deadletter.replay` requeues
such rows once the dependency's breaker has stayed closed for a configured time; the
partial index serves its lookup of pending rows per dependency.

Revision ID: 0010_dead_letter_replay
Revises: 0009_cancellations
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_dead_letter_replay"
down_revision = "0009_cancellations"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("dead_letters", sa.Column("dependency", sa.Text(), nullable=True))
    op.create_index(
        "ix_dead_letters_pending_dependency", "dead_letters", ["dependency", "id"],
        postgresql_where=sa.text("requeued_at IS NULL AND dependency IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_dead_letters_pending_dependency", "dead_letters")
    op.drop_column("dead_letters", "dependency")
