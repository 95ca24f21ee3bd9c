"""The `resilience_dead_letters` table, declared on the resilience metadata."""

from __future__ import annotations

import sqlalchemy as sa

from resilience.schema import metadata

dead_letters = sa.Table(
    "resilience_dead_letters", metadata,
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("task_name", sa.Text, nullable=False),
    sa.Column("task_id", sa.Text),
    sa.Column("args", sa.JSON, nullable=False),
    sa.Column("kwargs", sa.JSON, nullable=False),
    sa.Column("tier", sa.Text),
    sa.Column("queue", sa.Text),
    sa.Column("guard", sa.Text, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("exception_type", sa.Text),
    sa.Column("exception_message", sa.Text),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(),
              nullable=False),
    sa.Column("requeued_at", sa.DateTime(timezone=True)),
    sa.Column("requeued_task_id", sa.Text),
    #: What arrived, for messages the worker's intake could not turn into a task (else NULL).
    sa.Column("raw_message", sa.JSON),
    #: The dependency whose breaker was open, or whose retry budget was spent, when the job
    #: was given up on (else NULL): such a row may be replayed once that breaker has stayed
    #: closed long enough (`resilience.deadletter.replay`).
    sa.Column("dependency", sa.Text),
    sa.Index("ix_resilience_dead_letters_task_name", "task_name"),
    sa.Index("ix_resilience_dead_letters_created_at", "created_at"),
    # Automatic replay looks for pending rows of a dependency.
    sa.Index("ix_resilience_dead_letters_pending_dependency", "dependency", "id",
             postgresql_where=sa.text("requeued_at IS NULL AND dependency IS NOT NULL")),
)
