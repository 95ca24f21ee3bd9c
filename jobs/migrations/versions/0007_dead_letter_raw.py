"""Dead letters keep the raw message a worker could not turn into a task.

A message that cannot be decoded, has no task header, names no registered task or carries a
body that is not `[args, kwargs, embed]` never reaches a task's guards. The worker's intake
(`resilience.deadletter.intake`) records it here with its reason; `raw_message` holds what
arrived (headers, properties, content type and the body as text or base64), so an operator
can see it, and `requeue` can refuse what cannot run.

Revision ID: 0007_dead_letter_raw
Revises: 0006_text_columns
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_dead_letter_raw"
down_revision = "0006_text_columns"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("dead_letters", sa.Column("raw_message", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("dead_letters", "raw_message")
