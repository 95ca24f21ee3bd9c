"""Durable workflows: the workflow and step tables (resilience.workflows).

Revision ID: 0002_workflows
Revises: 0001_baseline
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

revision = "0002_workflows"
down_revision = "0001_baseline"

NOW = sa.text("now()")
WORKFLOWS, STEPS = "resilience_workflows", "resilience_workflow_steps"
SEQUENCE = "resilience_workflow_completed_seq"
STEP_STATES = ("'pending', 'queued', 'succeeded', 'replayed', 'failed', 'dead_lettered', "
               "'cancelled', 'shed', 'skipped'")


def upgrade() -> None:
    op.execute(sa.schema.CreateSequence(sa.Sequence(SEQUENCE)))
    op.create_table(
        WORKFLOWS,
        sa.Column("id", sa.Text(), nullable=False,
                  comment="uuid4 hex; steps carry it in a header"),
        sa.Column("name", sa.Text(), nullable=True),
        sa.Column("state", sa.String(16), server_default="running", nullable=False),
        sa.Column("canvas", JSONB(), nullable=False,
                  comment="the signature as written, and the result template"),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("remaining", sa.Integer(), nullable=False,
                  comment="steps not yet succeeded"),
        sa.Column("result", JSONB(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("failed_position", sa.Integer(), nullable=True,
                  comment="the step that failed it"),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("replay_of", sa.Text(), nullable=True, comment="the run this one replays"),
        sa.CheckConstraint(
            "state IN ('running', 'succeeded', 'failed', 'compensating', 'compensated', "
            "'cancelled')", name=op.f(f"ck_{WORKFLOWS}_state_known")),
        sa.PrimaryKeyConstraint("id", name=f"pk_{WORKFLOWS}"),
    )
    op.create_index(f"ix_{WORKFLOWS}_created_at", WORKFLOWS, ["created_at"])
    op.create_index(f"ix_{WORKFLOWS}_state", WORKFLOWS, ["state"],
                    postgresql_where=sa.text("state IN ('running', 'compensating')"))
    op.create_table(
        STEPS,
        sa.Column("workflow_id", sa.Text(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False,
                  comment="depth-first order of the canvas"),
        sa.Column("kind", sa.String(16), server_default="step", nullable=False),
        sa.Column("task_id", sa.Text(), nullable=False),
        sa.Column("task_name", sa.Text(), nullable=False),
        sa.Column("signature", JSONB(), nullable=False,
                  comment="args, kwargs, options, immutable, source (where its input comes "
                          "from)"),
        sa.Column("depends_on", ARRAY(sa.Integer()), server_default="{}", nullable=False),
        sa.Column("dependents", ARRAY(sa.Integer()), server_default="{}", nullable=False,
                  comment="the steps that depend on this one"),
        sa.Column("release", sa.String(16), server_default="succeeded", nullable=False,
                  comment="released when all deps succeeded, or when all are final"),
        sa.Column("waiting", sa.Integer(), nullable=False, comment="deps not yet done"),
        sa.Column("input", JSONB(), nullable=True, comment="the args it was published with"),
        sa.Column("state", sa.String(16), server_default="pending", nullable=False),
        sa.Column("result", JSONB(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("compensate", JSONB(), nullable=True, comment="compensation signature"),
        sa.Column("compensation_task_id", sa.Text(), nullable=True),
        sa.Column("compensation_state", sa.String(16), nullable=True),
        sa.Column("compensation_error", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("completed_seq", sa.BigInteger(), nullable=True,
                  comment="completion order, for reverse-order compensation"),
        sa.CheckConstraint(f"state IN ({STEP_STATES})", name=op.f(f"ck_{STEPS}_state_known")),
        sa.CheckConstraint(f"compensation_state IS NULL OR compensation_state IN "
                           f"({STEP_STATES})",
                           name=op.f(f"ck_{STEPS}_compensation_state_known")),
        sa.CheckConstraint("kind IN ('step', 'callback')", name=op.f(f"ck_{STEPS}_kind_known")),
        sa.CheckConstraint("release IN ('succeeded', 'final')",
                           name=op.f(f"ck_{STEPS}_release_known")),
        sa.CheckConstraint("waiting >= 0", name=op.f(f"ck_{STEPS}_waiting_not_negative")),
        sa.ForeignKeyConstraint(["workflow_id"], [f"{WORKFLOWS}.id"], ondelete="CASCADE",
                                name=f"fk_{STEPS}_workflow_id_{WORKFLOWS}"),
        sa.PrimaryKeyConstraint("workflow_id", "position", name=f"pk_{STEPS}"),
        sa.UniqueConstraint("task_id", name=f"uq_{STEPS}_task_id"),
        sa.UniqueConstraint("compensation_task_id", name=f"uq_{STEPS}_compensation_task_id"),
    )


def downgrade() -> None:
    op.drop_table(STEPS)
    op.drop_table(WORKFLOWS)
    op.execute(sa.schema.DropSequence(sa.Sequence(SEQUENCE)))
