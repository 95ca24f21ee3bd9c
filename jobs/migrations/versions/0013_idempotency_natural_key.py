"""Idempotency records: the natural key is the primary key, and completions are HOT updates.

The surrogate `id` and the separate unique constraint on `(task_name, key)` become one
primary key on `(task_name, key)`: one index entry per claim instead of two. The two
partial indexes (cleanup's over finished rows by `expires_at`, the reaper's over open claims
by `lease_expires_at`) become one plain index on `expires_at`: their predicates read
`state`, which every completion changes, so no completion could be a HOT update. The claim
now sets `expires_at` far enough for the completion to leave it, and a fillfactor below 100
keeps room on each page for the completed row version. Existing pages keep their fill until
they are rewritten (VACUUM FULL, pg_repack); new pages get the room at once.

Revision ID: 0013_idempotency_natural_key
Revises: 0012_idempotency_cleanup
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013_idempotency_natural_key"
down_revision = "0012_idempotency_cleanup"
branch_labels = None
depends_on = None

TABLE = "idempotency_records"


def upgrade() -> None:
    op.drop_column(TABLE, "id")  # its primary key goes with it
    op.drop_constraint("uq_idempotency_records_task_name_key", TABLE, type_="unique")
    op.create_primary_key("pk_idempotency_records", TABLE, ["task_name", "key"])
    op.drop_index("ix_idempotency_records_expires_at_finished", TABLE)
    op.drop_index("ix_idempotency_records_lease_expires_at_open", TABLE)
    op.create_index("ix_idempotency_records_expires_at", TABLE, ["expires_at"])
    op.execute(f"ALTER TABLE {TABLE} SET (fillfactor = 80)")


def downgrade() -> None:
    op.execute(f"ALTER TABLE {TABLE} RESET (fillfactor)")
    op.drop_index("ix_idempotency_records_expires_at", TABLE)
    op.create_index(
        "ix_idempotency_records_lease_expires_at_open",
        TABLE,
        ["lease_expires_at"],
        postgresql_where=sa.text("state = 'in_progress'"),
    )
    op.create_index(
        "ix_idempotency_records_expires_at_finished",
        TABLE,
        ["expires_at"],
        postgresql_where=sa.text("state <> 'in_progress'"),
    )
    op.drop_constraint("pk_idempotency_records", TABLE, type_="primary")
    op.create_unique_constraint(
        "uq_idempotency_records_task_name_key", TABLE, ["task_name", "key"]
    )
    # BIGSERIAL numbers the existing rows; the column comes last instead of first.
    op.execute(f"ALTER TABLE {TABLE} ADD COLUMN id BIGSERIAL")
    op.create_primary_key("pk_idempotency_records", TABLE, ["id"])
