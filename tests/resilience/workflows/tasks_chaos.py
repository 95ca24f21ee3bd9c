"""Tasks of the workflow chaos, compensation and resume tests (loaded by every test worker).

Each step writes its effect as a ledger row in the body's session, so the row commits with
the step's idempotency record and its workflow checkpoint, or not at all; the ledgers have
no unique constraints, so a doubled effect shows as a second row. Every body execution is
also counted at once in a ledger of its own (committed before the effect), so a test can
tell "ran again" (allowed after a SIGKILL) from "took effect again" (never).

A step's value is `combine(previous, name)`, so the workflow's final value spells out the
path every result took (a chord callback's value lists its members' values in member order).
"""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy import text

from jobs import app
from resilience.idempotency import idempotent
from resilience.retry import NonRetryable, retry_policy
from resilience.stores import stores_for

CREATE_LEDGERS = [
    text("""
    CREATE TABLE IF NOT EXISTS workflow_chaos_effects (
        id BIGSERIAL PRIMARY KEY, run TEXT NOT NULL, tag TEXT NOT NULL, name TEXT NOT NULL,
        task_id TEXT, previous JSONB,
        committed_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())
    """),
    text("""
    CREATE TABLE IF NOT EXISTS workflow_chaos_executions (
        id BIGSERIAL PRIMARY KEY, run TEXT NOT NULL, tag TEXT NOT NULL, name TEXT NOT NULL,
        kind TEXT NOT NULL)
    """),
    text("""
    CREATE TABLE IF NOT EXISTS workflow_chaos_compensations (
        id BIGSERIAL PRIMARY KEY, run TEXT NOT NULL, tag TEXT NOT NULL, name TEXT NOT NULL,
        task_id TEXT, result JSONB, committed_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())
    """),
    text("""
    CREATE TABLE IF NOT EXISTS workflow_chaos_fixes (
        run TEXT NOT NULL, tag TEXT NOT NULL, PRIMARY KEY (run, tag))
    """),
]

#: Steps' leases are short: a transactional step's claim may be taken over early (the
#: commit checks ownership), so a SIGKILLed claim blocks its redelivery for seconds, not
#: the default hard time limit + 30 s.
LEASE_SECONDS = 3.0


class StepRefused(NonRetryable):
    """The failure a test step raises on purpose: non-retryable, so it is dead-lettered."""


def combine(previous: Any, name: str) -> str:
    """A step's value: its name after its input (a group's values joined in order)."""
    if isinstance(previous, list):
        previous = "[" + ",".join(str(value) for value in previous) + "]"
    return f"{previous}>{name}"


def _count_execution(run: str, tag: str, name: str, kind: str) -> None:
    """One row per body execution, committed at once (outside the step's transaction)."""
    with stores_for(app).engine().begin() as connection:
        connection.execute(
            text("INSERT INTO workflow_chaos_executions (run, tag, name, kind) "
                 "VALUES (:run, :tag, :name, :kind)"),
            {"run": run, "tag": tag, "name": name, "kind": kind})


def _fixed(run: str, tag: str) -> bool:
    with stores_for(app).engine().connect() as connection:
        return connection.execute(
            text("SELECT 1 FROM workflow_chaos_fixes WHERE run = :run AND tag = :tag"),
            {"run": run, "tag": tag}).first() is not None


@app.task(tier="critical", bind=True, name="tests.workflows.chaos.step")
@retry_policy(max_attempts=3, budget=None)
@idempotent(transactional=True, lease_seconds=LEASE_SECONDS, poll_seconds=0.2)
def step(self: Any, previous: Any, *, run: str, tag: str, name: str,
         pause_seconds: float = 0.0, fail: bool = False, gated: bool = False,
         session: Any = None) -> str:
    """A workflow step: an effect row in the body's transaction, value `combine(...)`.

    `fail` refuses every time; `gated` refuses until the test writes the run's fix row.
    Both refusals are non-retryable, so the step is dead-lettered and its workflow fails.
    """
    _count_execution(run, tag, name, "step")
    if pause_seconds:
        time.sleep(pause_seconds)
    if fail or (gated and not _fixed(run, tag)):
        raise StepRefused(f"step {name} of {tag} refused on purpose")
    session.execute(
        text("INSERT INTO workflow_chaos_effects (run, tag, name, task_id, previous) "
             "VALUES (:run, :tag, :name, :task_id, CAST(:previous AS JSONB))"),
        {"run": run, "tag": tag, "name": name, "task_id": self.request.id,
         "previous": json.dumps(previous)})
    return combine(previous, name)


@app.task(tier="critical", bind=True, name="tests.workflows.chaos.undo")
@idempotent(transactional=True, lease_seconds=LEASE_SECONDS, poll_seconds=0.2)
def undo(self: Any, result: Any, *, run: str, tag: str, name: str,
         session: Any = None) -> str:
    """A compensation: a row (in commit order) in the body's transaction; gets the step's
    result first, as Celery's `link` does."""
    _count_execution(run, tag, name, "compensation")
    session.execute(
        text("INSERT INTO workflow_chaos_compensations (run, tag, name, task_id, result) "
             "VALUES (:run, :tag, :name, :task_id, CAST(:result AS JSONB))"),
        {"run": run, "tag": tag, "name": name, "task_id": self.request.id,
         "result": json.dumps(result)})
    return f"undone {name}"
