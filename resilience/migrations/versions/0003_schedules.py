"""Schedules: the schedule and run-history tables (resilience.schedules).

Revision ID: 0003_schedules
Revises: 0002_workflows
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0003_schedules"
down_revision = "0002_workflows"

NOW = sa.text("now()")
SCHEDULES, RUNS = "resilience_schedules", "resilience_schedule_runs"


def upgrade() -> None:
    op.create_table(
        SCHEDULES,
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("task", sa.Text(), nullable=False, comment="the task name the job is sent to"),
        sa.Column("args", JSONB(), nullable=False),
        sa.Column("kwargs", JSONB(), nullable=False),
        sa.Column("options", JSONB(), nullable=False, comment="apply_async options (JSON only)"),
        sa.Column("kind", sa.String(16), nullable=False, comment="interval | cron"),
        sa.Column("every_seconds", sa.Float(), nullable=True,
                  comment="interval entries: the period"),
        sa.Column("cron", sa.Text(), nullable=True, comment="cron entries: 5-field expression"),
        sa.Column("timezone", sa.Text(), server_default="UTC", nullable=False,
                  comment="cron entries: the zone the expression is read in"),
        sa.Column("catch_up", sa.String(16), server_default="skip", nullable=False,
                  comment="skip | once | all: what to do with missed slots"),
        sa.Column("catch_up_window_seconds", sa.Float(), server_default="3600", nullable=False),
        sa.Column("overlap", sa.String(24), server_default="allow", nullable=False,
                  comment="allow | skip | queue_one | cancel_previous"),
        sa.Column("paused", sa.Boolean(), server_default="false", nullable=False),
        sa.Column("source", sa.String(16), server_default="runtime", nullable=False,
                  comment="code (seeded from beat_schedule) | runtime (added through the API)"),
        sa.Column("last_slot", sa.DateTime(timezone=True), nullable=True,
                  comment="the newest slot fired or recorded missed"),
        sa.Column("resumed_at", sa.DateTime(timezone=True), nullable=True,
                  comment="the last resume: slots before it are caught up, not fired on time"),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False),
        sa.Column("version", sa.Integer(), server_default="1", nullable=False,
                  comment="+1 on each edit, pause or resume"),
        sa.Column("pruned_missed", sa.BigInteger(), server_default="0", nullable=False,
                  comment="missed slots of run rows pruned (history.prune_runs): the metric "
                          "counts on"),
        sa.Column("pruned_skipped", sa.BigInteger(), server_default="0", nullable=False,
                  comment="skipped_overlap run rows pruned"),
        sa.CheckConstraint("kind IN ('interval', 'cron')", name=op.f(f"ck_{SCHEDULES}_kind_known")),
        sa.CheckConstraint("(kind = 'interval' AND every_seconds > 0) OR "
                           "(kind = 'cron' AND cron IS NOT NULL)",
                           name=op.f(f"ck_{SCHEDULES}_timing_set")),
        sa.CheckConstraint("catch_up IN ('skip', 'once', 'all')",
                           name=op.f(f"ck_{SCHEDULES}_catch_up_known")),
        sa.CheckConstraint("overlap IN ('allow', 'skip', 'queue_one', 'cancel_previous')",
                           name=op.f(f"ck_{SCHEDULES}_overlap_known")),
        sa.CheckConstraint("source IN ('code', 'runtime')",
                           name=op.f(f"ck_{SCHEDULES}_source_known")),
        sa.PrimaryKeyConstraint("name", name=f"pk_{SCHEDULES}"),
    )
    op.create_table(
        RUNS,
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False,
                  comment="the job carries it in the header resilience_schedule_run"),
        sa.Column("schedule", sa.Text(), nullable=False),
        sa.Column("slot", sa.DateTime(timezone=True), nullable=False,
                  comment="the time it was due"),
        sa.Column("fired_at", sa.DateTime(timezone=True), nullable=True,
                  comment="when its job was written to the outbox; NULL: never sent"),
        sa.Column("task_id", sa.Text(), nullable=True),
        sa.Column("outcome", sa.String(24), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("late_seconds", sa.Float(), nullable=True, comment="fired_at - slot"),
        sa.Column("detail", JSONB(), nullable=True),
        sa.CheckConstraint(
            "outcome IN ('sent', 'succeeded', 'failed', 'dead_lettered', 'cancelled', 'shed', "
            "'skipped', 'skipped_overlap', 'missed', 'queued')",
            name=op.f(f"ck_{RUNS}_outcome_known")),
        sa.ForeignKeyConstraint(["schedule"], [f"{SCHEDULES}.name"], ondelete="CASCADE",
                                name=f"fk_{RUNS}_schedule_{SCHEDULES}"),
        sa.PrimaryKeyConstraint("id", name=f"pk_{RUNS}"),
        sa.UniqueConstraint("schedule", "slot", name=f"uq_{RUNS}_schedule_slot"),
    )
    op.create_index(f"ix_{RUNS}_schedule_id", RUNS, ["schedule", "id"])
    op.create_index(f"ix_{RUNS}_schedule_outcome_slot", RUNS, ["schedule", "outcome", "slot"])


def downgrade() -> None:
    op.drop_index(f"ix_{RUNS}_schedule_outcome_slot", table_name=RUNS)
    op.drop_index(f"ix_{RUNS}_schedule_id", table_name=RUNS)
    op.drop_table(RUNS)
    op.drop_table(SCHEDULES)
