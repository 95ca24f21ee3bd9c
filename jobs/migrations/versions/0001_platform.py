"""Example job tables: ledger entries and daily reports.

Revision ID: 0001_platform
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_platform"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ledger_entries",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("order_id", sa.String(64), nullable=False),
        sa.Column("account", sa.String(64), nullable=False),
        sa.Column("amount_cents", sa.BigInteger, nullable=False),
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("task_id", sa.String(64)),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint("currency ~ '^[A-Z]{3}$'", name="ck_ledger_entries_currency_iso"),
    )
    op.create_index("ix_ledger_entries_order_id", "ledger_entries", ["order_id"])
    op.create_index("ix_ledger_entries_account", "ledger_entries", ["account"])
    op.create_index("ix_ledger_entries_created_at", "ledger_entries", ["created_at"])
    op.create_table(
        "daily_reports",
        sa.Column("day", sa.Date, primary_key=True),
        sa.Column("entries", sa.Integer, nullable=False),
        sa.Column("total_cents", sa.BigInteger, nullable=False),
        sa.Column(
            "built_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
    )


def downgrade() -> None:
    op.drop_table("daily_reports")
    op.drop_index("ix_ledger_entries_created_at", "ledger_entries")
    op.drop_index("ix_ledger_entries_account", "ledger_entries")
    op.drop_index("ix_ledger_entries_order_id", "ledger_entries")
    op.drop_table("ledger_entries")
