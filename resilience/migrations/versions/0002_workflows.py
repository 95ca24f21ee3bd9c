"""Durable workflows: the workflow and step tables (resilience.workflows).

Revision ID: 0002_workflows
Revises: 0001_baseline
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY, DOMAIN, JSONB

revision = "0002_workflows"
down_revision = "0001_baseline"

NOW = sa.text("now()")
WORKFLOWS, STEPS = "resilience_workflows", "resilience_workflow_steps"
SEQUENCE = "resilience_workflow_completed_seq"
STEP_STATES = ("'pending', 'queued', 'succeeded', 'replayed', 'failed', 'dead_lettered', "
               "'cancelled', 'shed', 'skipped'")
#: The closed columns' domains (rather than table CHECKs, which every statement writing a
#: row parses again; resilience/workflows/models.py), created before the tables.
DOMAINS = {
    "resilience_workflow_state": (sa.String(16), "VALUE IN ('running', 'succeeded', 'failed', "
                                                 "'compensating', 'compensated', 'cancelled')"),
    "resilience_workflow_step_state": (sa.String(16), f"VALUE IN ({STEP_STATES})"),
    "resilience_workflow_step_kind": (sa.String(16), "VALUE IN ('step', 'callback')"),
    "resilience_workflow_step_release": (sa.String(16), "VALUE IN ('succeeded', 'final')"),
    "resilience_workflow_step_waiting": (sa.Integer(), "VALUE >= 0"),
}


def domain(name: str) -> DOMAIN:
    data_type, check = DOMAINS[name]
    return DOMAIN(name, data_type, check=check, create_type=False)


def upgrade() -> None:
    op.execute(sa.schema.CreateSequence(sa.Sequence(SEQUENCE)))
    for name in DOMAINS:
        domain(name).create(op.get_bind())
    op.create_table(
        WORKFLOWS,
        sa.Column("id", sa.Text(), nullable=False,
                  comment="uuid4 hex; steps carry it in a header"),
        sa.Column("name", sa.Text(), nullable=True),
        sa.Column("state", domain("resilience_workflow_state"), server_default="running",
                  nullable=False),
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
        sa.Column("kind", domain("resilience_workflow_step_kind"), server_default="step",
                  nullable=False),
        sa.Column("task_id", sa.Text(), nullable=False),
        sa.Column("task_name", sa.Text(), nullable=False),
        sa.Column("signature", JSONB(), nullable=False,
                  comment="args, kwargs, options, immutable, source (where its input comes "
                          "from)"),
        sa.Column("depends_on", ARRAY(sa.Integer()), server_default="{}", nullable=False),
        sa.Column("dependents", ARRAY(sa.Integer()), server_default="{}", nullable=False,
                  comment="the steps that depend on this one"),
        sa.Column("release", domain("resilience_workflow_step_release"),
                  server_default="succeeded", nullable=False,
                  comment="released when all deps succeeded, or when all are final"),
        sa.Column("waiting", domain("resilience_workflow_step_waiting"), nullable=False,
                  comment="deps not yet done"),
        sa.Column("input", JSONB(), nullable=True, comment="the args it was published with"),
        sa.Column("state", domain("resilience_workflow_step_state"), server_default="pending",
                  nullable=False),
        sa.Column("result", JSONB(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("compensate", JSONB(), nullable=True, comment="compensation signature"),
        sa.Column("compensation_task_id", sa.Text(), nullable=True),
        sa.Column("compensation_state", domain("resilience_workflow_step_state"),
                  nullable=True),
        sa.Column("compensation_error", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("completed_seq", sa.BigInteger(), nullable=True,
                  comment="completion order, for reverse-order compensation"),
        sa.ForeignKeyConstraint(["workflow_id"], [f"{WORKFLOWS}.id"], ondelete="CASCADE",
                                name=f"fk_{STEPS}_workflow_id_{WORKFLOWS}"),
        sa.PrimaryKeyConstraint("workflow_id", "position", name=f"pk_{STEPS}"),
        sa.UniqueConstraint("task_id", name=f"uq_{STEPS}_task_id"),
        sa.UniqueConstraint("compensation_task_id", name=f"uq_{STEPS}_compensation_task_id"),
    )


def downgrade() -> None:
    op.drop_table(STEPS)
    op.drop_table(WORKFLOWS)
    for name in DOMAINS:
        domain(name).drop(op.get_bind())
    op.execute(sa.schema.DropSequence(sa.Sequence(SEQUENCE)))
