"""The batch tables: one row per batch, one row per member job.

State machine of a member:

    pending --its job's final outcome is recorded--> succeeded | replayed | failed | shed
                                                     | skipped | cancelled | dead_lettered

Only `pending` is ever left (`UPDATE ... WHERE state = 'pending'`), so a redelivered or
duplicated job counts once. A batch's `pending` counts its pending members; the transaction
that takes it to 0 sets `completed_at` and writes the callbacks to the outbox.
"""

from __future__ import annotations

from sqlalchemy import (
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB

from resilience.schema import metadata

BATCHES_TABLE = "resilience_batches"
MEMBERS_TABLE = "resilience_batch_members"

batches = Table(
    BATCHES_TABLE,
    metadata,
    Column("id", Text, primary_key=True, comment="the batch id members carry in a header"),
    Column("description", Text, nullable=True),
    Column("total", Integer, nullable=False),
    Column("pending", Integer, nullable=False, comment="members without a final state"),
    Column("on_success", JSONB, nullable=True, comment="callback signature (JSON)"),
    Column("on_complete", JSONB, nullable=True, comment="callback signature (JSON)"),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("completed_at", DateTime(timezone=True), nullable=True,
           comment="set by the transaction that recorded the last member"),
    Column("success_task_id", Text, nullable=True, comment="the on_success job, once written"),
    Column("complete_task_id", Text, nullable=True, comment="the on_complete job, once written"),
    CheckConstraint("pending >= 0 AND pending <= total", name="pending_in_range"),
    Index("ix_resilience_batches_created_at", "created_at"),
)

members = Table(
    MEMBERS_TABLE,
    metadata,
    Column("batch_id", Text, ForeignKey(f"{BATCHES_TABLE}.id", ondelete="CASCADE"),
           primary_key=True),
    Column("task_id", Text, primary_key=True),
    Column("task_name", Text, nullable=False),
    Column("state", String(16), nullable=False, server_default="pending"),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    CheckConstraint(
        "state IN ('pending', 'succeeded', 'replayed', 'failed', 'shed', 'skipped', "
        "'cancelled', 'dead_lettered')",
        name="state_known",
    ),
    # A worker's main process knows a lost job's id, not its batch (hard time limit).
    Index("ix_resilience_batch_members_task_id", "task_id"),
)
