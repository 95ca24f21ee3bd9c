"""Test task of the overlap policies: each execution is one row (start, end, run id) in the
schedules tests' executions table, so a test sees two runs of an entry overlap whatever the
run history says. The body stops early once its job is cancelled (it reads its
cancellation every 0.1 s, as a cooperative body does at its checkpoints)."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import text

from jobs import app
from resilience.cancel import id_target
from resilience.cancel.view import cancellations
from resilience.stores import stores_for
from tests.resilience.schedules.tasks_schedules import _run_id

TIER = "standard"


@app.task(tier=TIER, bind=True, name="tests.schedules.overlap_work")
def work(self: Any, tag: str, seconds: float) -> str:
    """Record this execution's start and end; run `seconds` unless cancelled first."""
    engine = stores_for(app).engine()
    with engine.begin() as connection:
        row = connection.execute(
            text("INSERT INTO schedules_test_executions (tag, run_id, task_id) "
                 "VALUES (:tag, :run_id, :task_id) RETURNING id"),
            {"tag": tag, "run_id": _run_id(self.request), "task_id": self.request.id}).one()
    marks = cancellations(app).backend
    until = time.monotonic() + seconds
    outcome = "done"
    while time.monotonic() < until:
        if marks.reasons([id_target(self.request.id)], now=time.time()) is not None:
            outcome = "cancelled"
            break
        time.sleep(0.1)
    with engine.begin() as connection:
        connection.execute(text("UPDATE schedules_test_executions SET ended_at = "
                                "clock_timestamp() WHERE id = :id"), {"id": row.id})
    return outcome
