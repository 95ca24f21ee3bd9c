"""Idempotency records, plus the demo transfer ledger used by the idempotency chaos test.

Revision ID: 0003_idempotency
Revises: 0001_platform
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0003_idempotency"
down_revision = "0001_platform"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "idempotency_records",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("task_name", sa.String(200), nullable=False),
        sa.Column("key", sa.String(512), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("result", JSONB, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("lease_owner", sa.String(200), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("task_id", sa.String(64), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("task_name", "key", name="uq_idempotency_records_task_name_key"),
        sa.CheckConstraint(
            "state IN ('in_progress', 'succeeded', 'failed')",
            name="ck_idempotency_records_state_known",
        ),
    )
    op.create_index(
        "ix_idempotency_records_expires_at_finished",
        "idempotency_records",
        ["expires_at"],
        postgresql_where=sa.text("state <> 'in_progress'"),
    )
    op.create_index(
        "ix_idempotency_records_lease_expires_at_open",
        "idempotency_records",
        ["lease_expires_at"],
        postgresql_where=sa.text("state = 'in_progress'"),
    )
    op.create_index(
        "ix_idempotency_records_updated_at", "idempotency_records", ["updated_at"]
    )
    # Demo/test ledger: deliberately WITHOUT a unique constraint on the transfer key, so a
    # double effect shows up as a second row instead of being hidden by the database.
    op.create_table(
        "idempotency_demo_entries",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("transfer_key", sa.String(128), nullable=False),
        sa.Column("account", sa.String(64), nullable=False),
        sa.Column("amount_cents", sa.BigInteger, nullable=False),
        sa.Column("task_id", sa.String(64)),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
    )
    op.create_index(
        "ix_idempotency_demo_entries_transfer_key", "idempotency_demo_entries", ["transfer_key"]
    )


def downgrade() -> None:
    op.drop_index("ix_idempotency_demo_entries_transfer_key", "idempotency_demo_entries")
    op.drop_table("idempotency_demo_entries")
    op.drop_index("ix_idempotency_records_updated_at", "idempotency_records")
    op.drop_index("ix_idempotency_records_lease_expires_at_open", "idempotency_records")
    op.drop_index("ix_idempotency_records_expires_at_finished", "idempotency_records")
    op.drop_table("idempotency_records")
