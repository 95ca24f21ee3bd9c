"""The schedule tables: one row per schedule, one row per slot it fired or missed.

A schedule row is read by the beat leader on every tick (one SELECT), so an edit applies at
the next tick. `last_slot` is the newest slot the leader has dealt with (fired, or recorded
as missed); it only moves forward, in the transaction that writes the slot's run row.

State machine of a run row (`outcome`):

    sent --its job ends (resilience.schedules.guard)--> succeeded | failed | dead_lettered
      |                                                 | cancelled | shed | skipped
      '--(overlap policies, resilience.schedules.overlap)
    queued --fired when the previous run ends--> sent
    missed | skipped_overlap                        (final when written: nothing was sent)

UNIQUE(schedule, slot): a slot has at most one run row, so two beats (or a leader killed in
the middle of a fire and its successor) can never fire one slot twice: the second insert
does nothing, and its transaction writes no outbox row.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB

from resilience.schema import metadata

SCHEDULES_TABLE = "resilience_schedules"
RUNS_TABLE = "resilience_schedule_runs"

schedules = Table(
    SCHEDULES_TABLE,
    metadata,
    Column("name", Text, primary_key=True),
    Column("task", Text, nullable=False, comment="the task name the job is sent to"),
    Column("args", JSONB, nullable=False),
    Column("kwargs", JSONB, nullable=False),
    Column("options", JSONB, nullable=False, comment="apply_async options (JSON only)"),
    Column("kind", String(16), nullable=False, comment="interval | cron"),
    Column("every_seconds", Float, nullable=True, comment="interval entries: the period"),
    Column("cron", Text, nullable=True, comment="cron entries: 5-field expression"),
    Column("timezone", Text, nullable=False, server_default="UTC",
           comment="cron entries: the zone the expression is read in"),
    Column("catch_up", String(16), nullable=False, server_default="skip",
           comment="skip | once | all: what to do with missed slots"),
    Column("catch_up_window_seconds", Float, nullable=False, server_default="3600"),
    Column("overlap", String(24), nullable=False, server_default="allow",
           comment="allow | skip | queue_one | cancel_previous"),
    Column("paused", Boolean, nullable=False, server_default="false"),
    Column("source", String(16), nullable=False, server_default="runtime",
           comment="code (seeded from beat_schedule) | runtime (added through the API)"),
    Column("last_slot", DateTime(timezone=True), nullable=True,
           comment="the newest slot fired or recorded missed"),
    Column("resumed_at", DateTime(timezone=True), nullable=True,
           comment="the last resume: slots before it are caught up, not fired on time"),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("version", Integer, nullable=False, server_default="1",
           comment="+1 on each edit, pause or resume"),
    Column("pruned_missed", BigInteger, nullable=False, server_default="0",
           comment="missed slots of run rows pruned (history.prune_runs): the metric "
                   "counts on"),
    Column("pruned_skipped", BigInteger, nullable=False, server_default="0",
           comment="skipped_overlap run rows pruned"),
    CheckConstraint("kind IN ('interval', 'cron')", name="kind_known"),
    CheckConstraint("(kind = 'interval' AND every_seconds > 0) OR "
                    "(kind = 'cron' AND cron IS NOT NULL)", name="timing_set"),
    CheckConstraint("catch_up IN ('skip', 'once', 'all')", name="catch_up_known"),
    CheckConstraint("overlap IN ('allow', 'skip', 'queue_one', 'cancel_previous')",
                    name="overlap_known"),
    CheckConstraint("source IN ('code', 'runtime')", name="source_known"),
)

runs = Table(
    RUNS_TABLE,
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True,
           comment="the job carries it in the header resilience_schedule_run"),
    Column("schedule", Text, ForeignKey(f"{SCHEDULES_TABLE}.name", ondelete="CASCADE"),
           nullable=False),
    Column("slot", DateTime(timezone=True), nullable=False, comment="the time it was due"),
    Column("fired_at", DateTime(timezone=True), nullable=True,
           comment="when its job was written to the outbox; NULL: never sent"),
    Column("task_id", Text, nullable=True),
    Column("outcome", String(24), nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    Column("late_seconds", Float, nullable=True, comment="fired_at - slot"),
    Column("detail", JSONB, nullable=True),
    UniqueConstraint("schedule", "slot", name="uq_resilience_schedule_runs_schedule_slot"),
    CheckConstraint(
        "outcome IN ('sent', 'succeeded', 'failed', 'dead_lettered', 'cancelled', 'shed', "
        "'skipped', 'skipped_overlap', 'missed', 'queued')", name="outcome_known"),
    # The previous run of a schedule (overlap) and the last runs (describe) read newest first.
    Index("ix_resilience_schedule_runs_schedule_id", "schedule", "id"),
    # The metrics (ScheduleStore.run_totals): per schedule and outcome, counts and the newest
    # succeeded slot read from the index, not from every run row.
    Index("ix_resilience_schedule_runs_schedule_outcome_slot", "schedule", "outcome", "slot"),
)
