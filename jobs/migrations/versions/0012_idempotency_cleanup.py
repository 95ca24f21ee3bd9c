"""Idempotency records: drop the `updated_at` index.

Every claim, completion, failure and release changes `updated_at`, so the index cost one
entry per write; only the operator's `jobs idempotency list` ordered by it. Cleanup and the
reaper keep their partial indexes (see docs/idempotency.md, "Cleanup").

Revision ID: 0012_idempotency_cleanup
Revises: 0011_batches
Create Date: 2026-11-26
"""

from __future__ import annotations

from alembic import op

revision = "0012_idempotency_cleanup"
down_revision = "0011_batches"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_idempotency_records_updated_at", "idempotency_records")


def downgrade() -> None:
    op.create_index("ix_idempotency_records_updated_at", "idempotency_records", ["updated_at"])
