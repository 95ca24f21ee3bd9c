"""The library's tables: idempotency records, locks, dead letters, outbox, cancellations
(batches are workflows: 0002_workflows).

Every table is `resilience_*`. Column comments document the columns in the database too.
Constraint names are final (`op.f`): the metadata's naming convention would otherwise prefix
a check constraint's name a second time.

Revision ID: 0001_baseline
Revises:
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001_baseline"
down_revision = None

NOW = sa.text("now()")


def upgrade() -> None:
    _locks()
    _idempotency()
    _dead_letters()
    _outbox()
    _cancellations()


def downgrade() -> None:
    for table in ("resilience_cancellations", "resilience_outbox", "resilience_dead_letters",
                  "resilience_idempotency_records", "resilience_held_locks",
                  "resilience_fencing_marks"):
        op.drop_table(table)
    op.execute(sa.schema.DropSequence(sa.Sequence("resilience_fencing_token_seq")))


def _locks() -> None:
    op.execute(sa.schema.CreateSequence(sa.Sequence("resilience_fencing_token_seq")))
    op.create_table(
        "resilience_fencing_marks",
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_resilience_fencing_marks"),
    )
    op.create_table(
        "resilience_held_locks",
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("task_id", sa.Text(), nullable=True),
        sa.Column("task_name", sa.Text(), nullable=True),
        sa.Column("hostname", sa.Text(), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("token", sa.BigInteger(), nullable=True),
        sa.Column("advisory_id", sa.BigInteger(), nullable=True),
        sa.Column("ttl_seconds", sa.Float(), nullable=True),
        sa.Column("acquired_at", sa.DateTime(timezone=True), server_default=NOW,
                  nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_resilience_held_locks"),
        # Informational and rewritten on every acquire/release: UNLOGGED skips the WAL, and
        # crash recovery empties it, which is right: a crash also ends every holder session.
        prefixes=["UNLOGGED"],
    )


def _idempotency() -> None:
    table = "resilience_idempotency_records"
    op.create_table(
        table,
        sa.Column("task_name", sa.Text(), nullable=False, comment="namespace of the key"),
        sa.Column("key", sa.Text(), nullable=False, comment="the idempotency key"),
        sa.Column("fingerprint", sa.String(64), nullable=False,
                  comment="sha256 of the bound arguments"),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("result", JSONB(), nullable=True, comment="the stored result (succeeded)"),
        sa.Column("error", sa.Text(), nullable=True, comment="the recorded error (failed)"),
        sa.Column("attempt", sa.Integer(), nullable=False,
                  comment="fencing number, +1 per takeover"),
        sa.Column("lease_owner", sa.Text(), nullable=True,
                  comment="token of the current holder"),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("task_id", sa.Text(), nullable=True,
                  comment="task id of the holder / producer"),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False,
                  comment="set by the claim to cover the lease and the TTL; a completion "
                  "moves it only when it comes after the lease"),
        sa.CheckConstraint("state IN ('in_progress', 'succeeded', 'failed')",
                           name=op.f(f"ck_{table}_state_known")),
        # The natural key is the primary key; the only other index is cleanup's, on a column
        # a completion within the lease leaves as it is, and the fillfactor leaves room on
        # each page: completions are HOT updates (see docs/idempotency.md, "The table").
        sa.PrimaryKeyConstraint("task_name", "key", name=f"pk_{table}"),
        postgresql_with={"fillfactor": 80},
    )
    op.create_index(f"ix_{table}_expires_at", table, ["expires_at"])


def _dead_letters() -> None:
    table = "resilience_dead_letters"
    op.create_table(
        table,
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("task_name", sa.Text(), nullable=False),
        sa.Column("task_id", sa.Text(), nullable=True),
        sa.Column("args", sa.JSON(), nullable=False),
        sa.Column("kwargs", sa.JSON(), nullable=False),
        sa.Column("tier", sa.Text(), nullable=True),
        sa.Column("queue", sa.Text(), nullable=True),
        sa.Column("guard", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("exception_type", sa.Text(), nullable=True),
        sa.Column("exception_message", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False),
        sa.Column("requeued_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("requeued_task_id", sa.Text(), nullable=True),
        sa.Column("raw_message", sa.JSON(), nullable=True),
        sa.Column("dependency", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=f"pk_{table}"),
    )
    op.create_index(f"ix_{table}_task_name", table, ["task_name"])
    op.create_index(f"ix_{table}_created_at", table, ["created_at"])
    op.create_index(f"ix_{table}_pending_dependency", table, ["dependency", "id"],
                    postgresql_where=sa.text("requeued_at IS NULL AND dependency IS NOT NULL"))


def _outbox() -> None:
    table = "resilience_outbox"
    op.create_table(
        table,
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("task_id", sa.Text(), nullable=False,
                  comment="fixed at insert; the relay publishes it"),
        sa.Column("task_name", sa.Text(), nullable=False),
        sa.Column("args", JSONB(), nullable=False),
        sa.Column("kwargs", JSONB(), nullable=False),
        sa.Column("options", JSONB(), nullable=False, comment="apply_async options (JSON only)"),
        sa.Column("ordering_key", sa.Text(), nullable=True,
                  comment="same key: published in id order"),
        sa.Column("state", sa.String(16), server_default="pending", nullable=False),
        sa.Column("due_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False,
                  comment="not published before this (countdown / eta)"),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True,
                  comment="backoff after a refused publish"),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("dead_letter_id", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True,
                  comment="when it was published or dead-lettered"),
        sa.CheckConstraint("state IN ('pending', 'published', 'dead_lettered')",
                           name=op.f(f"ck_{table}_state_known")),
        sa.PrimaryKeyConstraint("id", name=f"pk_{table}"),
    )
    pending = sa.text("state = 'pending'")
    op.create_index(f"ix_{table}_pending_id", table, ["id"], postgresql_where=pending)
    op.create_index(f"ix_{table}_pending_due_at", table, ["due_at"], postgresql_where=pending)
    op.create_index(f"ix_{table}_pending_ordering_key", table, ["ordering_key", "id"],
                    postgresql_where=sa.text("state = 'pending' AND ordering_key IS NOT NULL"))
    op.create_index(f"ix_{table}_finished", table, ["state", "finished_at"],
                    postgresql_where=sa.text("state <> 'pending'"))


def _cancellations() -> None:
    table = "resilience_cancellations"
    op.create_table(
        table,
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("task_name", sa.Text(), nullable=True),
        sa.Column("task_id", sa.Text(), nullable=True),
        sa.Column("key", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=f"pk_{table}"),
        sa.UniqueConstraint("target", name=f"uq_{table}_target"),
    )
    op.create_index(f"ix_{table}_expires_at", table, ["expires_at"])

