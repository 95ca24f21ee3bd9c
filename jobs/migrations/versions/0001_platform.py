"""The platform's own tables: the demo's ledger, daily reports and idempotency demo ledger.

Revision ID: 0001_platform
Revises:
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_platform"
down_revision = None
branch_labels = None
depends_on = None

NOW = sa.text("now()")


def upgrade() -> None:
    op.create_table(
        "ledger_entries",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("order_id", sa.Text(), nullable=False),
        sa.Column("account", sa.Text(), nullable=False),
        sa.Column("amount_cents", sa.BigInteger(), nullable=False),
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("task_id", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False),
        sa.CheckConstraint("currency ~ '^[A-Z]{3}$'", name=op.f("ck_ledger_entries_currency_iso")),
        sa.PrimaryKeyConstraint("id", name="pk_ledger_entries"),
    )
    op.create_index("ix_ledger_entries_order_id", "ledger_entries", ["order_id"])
    op.create_index("ix_ledger_entries_account", "ledger_entries", ["account"])
    op.create_index("ix_ledger_entries_created_at", "ledger_entries", ["created_at"])
    op.create_table(
        "daily_reports",
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("entries", sa.Integer(), nullable=False),
        sa.Column("total_cents", sa.BigInteger(), nullable=False),
        sa.Column("built_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False),
        sa.PrimaryKeyConstraint("day", name="pk_daily_reports"),
    )
    # The idempotency demo and chaos test's ledger: deliberately WITHOUT a unique constraint
    # on the transfer key, so a double effect shows as a second row instead of an error.
    op.create_table(
        "idempotency_demo_entries",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("transfer_key", sa.Text(), nullable=False),
        sa.Column("account", sa.Text(), nullable=False),
        sa.Column("amount_cents", sa.BigInteger(), nullable=False),
        sa.Column("task_id", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_idempotency_demo_entries"),
    )
    op.create_index("ix_idempotency_demo_entries_transfer_key", "idempotency_demo_entries",
                    ["transfer_key"])


def downgrade() -> None:
    op.drop_table("idempotency_demo_entries")
    op.drop_table("daily_reports")
    op.drop_table("ledger_entries")
