"""The workflow tables: one row per workflow run, one row per step of its canvas.

State machine of a step (`StepState`):

    pending (waiting for `waiting` deps) --last dep succeeded--> queued (outbox row written)
    queued --its job's final outcome--> succeeded | replayed | failed | dead_lettered
                                        | cancelled | shed | skipped
    pending --the workflow failed or was cancelled--> skipped

Only `pending`/`queued` is ever left (`UPDATE ... WHERE state IN ('pending', 'queued')`), so
a redelivered or duplicated step counts once. The transaction that records a step
succeeded takes one from each dependent's `waiting` and writes the outbox rows of those
that reach 0; the workflow row's `remaining` counts the steps not yet succeeded.

A step with a compensation (`compensate`) has `compensation_state` NULL until the workflow
fails; then the compensations of succeeded steps are queued one at a time, in reverse
`completed_seq` order (the order their steps completed).

The columns with a closed set of values (states, kind, release, `waiting` >= 0) are of
domain types rather than under table CHECK constraints: PostgreSQL parses and plans a
table's CHECK expressions again in every statement that writes one of its rows (a step's
start and completion each write step rows), while a domain's check is cached per session
and runs only where a statement assigns that column. Same values refused, ~60 µs less
server CPU per step row written on the bench machine.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    Sequence,
    String,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, DOMAIN, JSONB

from resilience.schema import metadata

WORKFLOWS_TABLE = "resilience_workflows"
STEPS_TABLE = "resilience_workflow_steps"
COMPLETED_SEQUENCE = "resilience_workflow_completed_seq"

WORKFLOW_STATES = ("running", "succeeded", "failed", "compensating", "compensated",
                   "cancelled")
STEP_STATES = ("pending", "queued", "succeeded", "replayed", "failed", "dead_lettered",
               "cancelled", "shed", "skipped")

completed_seq = Sequence(COMPLETED_SEQUENCE, metadata=metadata)


def _one_of(values: tuple[str, ...]) -> str:
    return "VALUE IN (" + ", ".join(f"'{value}'" for value in values) + ")"


#: The domains of the closed columns (see the module doc); 0002_workflows creates them.
WORKFLOW_STATE = DOMAIN("resilience_workflow_state", String(16), check=_one_of(WORKFLOW_STATES))
STEP_STATE = DOMAIN("resilience_workflow_step_state", String(16), check=_one_of(STEP_STATES))
STEP_KIND = DOMAIN("resilience_workflow_step_kind", String(16),
                   check=_one_of(("step", "callback")))
STEP_RELEASE = DOMAIN("resilience_workflow_step_release", String(16),
                      check=_one_of(("succeeded", "final")))
STEP_WAITING = DOMAIN("resilience_workflow_step_waiting", Integer, check="VALUE >= 0")


workflows = Table(
    WORKFLOWS_TABLE,
    metadata,
    Column("id", Text, primary_key=True, comment="uuid4 hex; steps carry it in a header"),
    Column("name", Text, nullable=True),
    Column("state", WORKFLOW_STATE, nullable=False, server_default="running"),
    Column("canvas", JSONB, nullable=False, comment="the signature as written, and the "
           "result template"),
    Column("total", Integer, nullable=False),
    Column("remaining", Integer, nullable=False, comment="steps not yet succeeded"),
    Column("result", JSONB, nullable=True),
    Column("error", Text, nullable=True),
    Column("failed_position", Integer, nullable=True, comment="the step that failed it"),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    Column("replay_of", Text, nullable=True, comment="the run this one replays"),
    Index("ix_resilience_workflows_created_at", "created_at"),
    Index("ix_resilience_workflows_state", "state",
          postgresql_where=text("state IN ('running', 'compensating')")),
)

steps = Table(
    STEPS_TABLE,
    metadata,
    Column("workflow_id", Text, ForeignKey(f"{WORKFLOWS_TABLE}.id", ondelete="CASCADE"),
           primary_key=True),
    Column("position", Integer, primary_key=True, comment="depth-first order of the canvas"),
    Column("kind", STEP_KIND, nullable=False, server_default="step"),
    Column("task_id", Text, nullable=False, unique=True),
    Column("task_name", Text, nullable=False),
    Column("signature", JSONB, nullable=False,
           comment="args, kwargs, options, immutable, source (where its input comes from)"),
    Column("depends_on", ARRAY(Integer), nullable=False, server_default="{}"),
    Column("dependents", ARRAY(Integer), nullable=False, server_default="{}",
           comment="the steps that depend on this one"),
    Column("release", STEP_RELEASE, nullable=False, server_default="succeeded",
           comment="released when all deps succeeded, or when all are final"),
    Column("waiting", STEP_WAITING, nullable=False, comment="deps not yet done"),
    Column("input", JSONB, nullable=True, comment="the args it was published with"),
    Column("state", STEP_STATE, nullable=False, server_default="pending"),
    Column("result", JSONB, nullable=True),
    Column("error", Text, nullable=True),
    Column("compensate", JSONB, nullable=True, comment="compensation signature"),
    Column("compensation_task_id", Text, nullable=True, unique=True),
    Column("compensation_state", STEP_STATE, nullable=True),
    Column("compensation_error", Text, nullable=True),
    Column("started_at", DateTime(timezone=True), nullable=True),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    Column("completed_seq", BigInteger, nullable=True,
           comment="completion order, for reverse-order compensation"),
)
