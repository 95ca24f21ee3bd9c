"""Tasks of the workflow tests (loaded by every test worker).

Effects are rows in one ledger without unique constraints, so a double effect shows as two
rows; `ordinal` gives the order they happened in.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import text

from jobs import app
from resilience.headers import WORKFLOW_STEP_HEADER
from resilience.idempotency import idempotent
from resilience.stores import stores_for

CREATE_LEDGER = text("""
CREATE TABLE IF NOT EXISTS workflow_test_ledger (
    ordinal BIGSERIAL PRIMARY KEY, run TEXT NOT NULL, kind TEXT NOT NULL, label TEXT NOT NULL,
    value JSONB, task_id TEXT)
""")
CREATE_SWITCHES = text("""
CREATE TABLE IF NOT EXISTS workflow_test_switches (run TEXT PRIMARY KEY)
""")

_WRITE = text("""
INSERT INTO workflow_test_ledger (run, kind, label, value, task_id)
VALUES (:run, :kind, :label, CAST(:value AS JSONB), :task_id)
""")


class StepFailed(Exception):
    """The failure a test step raises on purpose (no retry policy: final)."""


def write(run: str, kind: str, label: str, value: Any = None, task_id: str | None = None,
          session: Any = None) -> None:
    import json

    params = {"run": run, "kind": kind, "label": label, "value": json.dumps(value),
              "task_id": task_id}
    if session is not None:
        session.execute(_WRITE, params)
        return
    with stores_for(app).engine().begin() as connection:
        connection.execute(_WRITE, params)


# -- pure steps (compared with plain Celery's canvas) --------------------------------------
@app.task(tier="critical", name="tests.workflows.add")
def add(x: int, y: int) -> int:
    return x + y


@app.task(tier="critical", name="tests.workflows.mul")
def mul(x: int, y: int) -> int:
    return x * y


@app.task(tier="critical", name="tests.workflows.total")
def total(values: list[Any]) -> int:
    """Sums a (possibly nested) list of numbers."""
    def flat(value: Any) -> int:
        return sum(flat(v) for v in value) if isinstance(value, list) else int(value)
    return flat(values)


@app.task(tier="critical", name="tests.workflows.pack")
def pack(*values: Any) -> list[Any]:
    """Its arguments as a list: shows exactly what a step was given."""
    return list(values)


@app.task(tier="critical", bind=True, name="tests.workflows.seen")
def seen(self: Any, *values: Any, run: str) -> list[Any]:
    """A ledger row of kind "header" whose value is the workflow header its message carried;
    returns its arguments as a list, as `pack`."""
    write(run, "header", self.name, self.request.get(WORKFLOW_STEP_HEADER), self.request.id)
    return list(values)


# -- steps with effects --------------------------------------------------------------------
@app.task(tier="critical", bind=True, name="tests.workflows.step")
def step(self: Any, previous: Any, run: str, label: str, pause_seconds: float = 0.0) -> str:
    """One ledger row per execution (no idempotency: a second run shows)."""
    if pause_seconds:
        time.sleep(pause_seconds)
    write(run, "step", label, previous, self.request.id)
    return label


@app.task(tier="critical", bind=True, name="tests.workflows.first")
def first(self: Any, run: str, label: str) -> str:
    """A first step: one ledger row per execution."""
    write(run, "step", label, None, self.request.id)
    return label


@app.task(tier="critical", bind=True, name="tests.workflows.flaky")
def flaky(self: Any, previous: Any, run: str, label: str, after: str | None = None) -> str:
    """Fails (finally) until the run's switch is set, then writes its row; `after`: it
    fails only once the run's step of that label wrote its row (at most 20 s), so a sibling
    is final before the workflow stops, on a loaded box too."""
    with stores_for(app).engine().connect() as connection:
        on = connection.execute(text("SELECT 1 FROM workflow_test_switches WHERE run = :run"),
                                {"run": run}).first()
    write(run, "attempt", label, previous, self.request.id)
    if on is None:
        deadline = time.monotonic() + 20.0
        while after is not None and time.monotonic() < deadline:
            with stores_for(app).engine().connect() as connection:
                if connection.execute(text(
                        "SELECT 1 FROM workflow_test_ledger WHERE run = :run AND kind = 'step' "
                        "AND label = :label"), {"run": run, "label": after}).first():
                    break
            time.sleep(0.05)
        raise StepFailed(f"{label} fails on purpose")
    write(run, "step", label, previous, self.request.id)
    return f"{label}<-{previous}"


@app.task(tier="critical", bind=True, name="tests.workflows.undo")
def undo(self: Any, result: Any, run: str, label: str) -> str:
    """A compensation: one ledger row per execution."""
    write(run, "undo", label, result, self.request.id)
    return f"undone {label}"


@app.task(tier="critical", bind=True, name="tests.workflows.ledger_step")
@idempotent(transactional=True, poll_seconds=0.2)
def ledger_step(self: Any, previous: Any, run: str, label: str, session: Any = None) -> str:
    """Transactional: its row commits with the step's state and its idempotency record."""
    write(run, "step", label, previous, self.request.id, session=session)
    return label


@app.task(tier="critical", bind=True, name="tests.workflows.retry_once")
def retry_once(self: Any, previous: Any, run: str, label: str) -> str:
    """Celery's own retry on its first delivery (not final), then one ledger row."""
    if not self.request.retries:
        write(run, "attempt", label, previous, self.request.id)
        raise self.retry(countdown=0.1)
    write(run, "step", label, previous, self.request.id)
    return label
