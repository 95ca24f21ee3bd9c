"""Ids, keys and names as TEXT: no value is refused for its length.

A task id longer than 64 characters (any string a producer passes as `task_id`) or a lock key
near 512 characters overflowed a VARCHAR column: PostgreSQL refused the row on every attempt,
and the guard deferred the job forever. Task ids, keys, names, owners, hostnames, queues and
guard names become TEXT. Columns fixed by construction keep their type: a fingerprint is a
sha256 hex digest, a state or lock kind one of a few words, a currency three letters.

VARCHAR to TEXT is binary compatible in PostgreSQL: no table rewrite, no index rebuild. The
downgrade fails when a longer value has been stored since, rather than cut keys short (two
cut keys could become one).

This revision also joins the three heads (locks, idempotency, failure) into one.

Revision ID: 0006_text_columns
Revises: 0002_locks, 0003_idempotency, 0005_failure
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_text_columns"
down_revision = ("0002_locks", "0003_idempotency", "0005_failure")
branch_labels = None
depends_on = None

#: (table, column, previous type, nullable) of every column this revision turns into TEXT.
COLUMNS: tuple[tuple[str, str, sa.types.TypeEngine, bool], ...] = (
    ("ledger_entries", "order_id", sa.String(64), False),
    ("ledger_entries", "account", sa.String(64), False),
    ("ledger_entries", "task_id", sa.String(64), True),
    ("resilience_fencing_marks", "key", sa.String(600), False),
    ("resilience_held_locks", "key", sa.String(600), False),
    ("resilience_held_locks", "owner", sa.String(64), False),
    ("resilience_held_locks", "task_id", sa.String(64), True),
    ("resilience_held_locks", "task_name", sa.String(255), True),
    ("resilience_held_locks", "hostname", sa.String(255), True),
    ("idempotency_records", "task_name", sa.String(200), False),
    ("idempotency_records", "key", sa.String(512), False),
    ("idempotency_records", "lease_owner", sa.String(200), True),
    ("idempotency_records", "task_id", sa.String(64), True),
    ("idempotency_demo_entries", "transfer_key", sa.String(128), False),
    ("idempotency_demo_entries", "account", sa.String(64), False),
    ("idempotency_demo_entries", "task_id", sa.String(64), True),
    ("dead_letters", "task_name", sa.String(255), False),
    ("dead_letters", "task_id", sa.String(64), True),
    ("dead_letters", "tier", sa.String(32), True),
    ("dead_letters", "queue", sa.String(255), True),
    ("dead_letters", "guard", sa.String(64), False),
    ("dead_letters", "exception_type", sa.String(255), True),
    ("dead_letters", "requeued_task_id", sa.String(64), True),
)


def upgrade() -> None:
    for table, column, previous, nullable in COLUMNS:
        op.alter_column(table, column, type_=sa.Text(), existing_type=previous,
                        existing_nullable=nullable)


def downgrade() -> None:
    for table, column, previous, nullable in COLUMNS:
        op.alter_column(table, column, type_=previous, existing_type=sa.Text(),
                        existing_nullable=nullable)
