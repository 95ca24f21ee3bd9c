"""Test tasks of the schedules package: each execution is one row in PostgreSQL, with the
run id its message carries (header resilience_schedule_run), so a test counts executions
per slot without trusting the run history it also checks."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import text

from jobs import app
from resilience.idempotency import idempotent
from resilience.retry import retry_policy
from resilience.schedules import SCHEDULE_RUN_HEADER
from resilience.stores import stores_for

TIER = "standard"

CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS schedules_test_executions (
    id bigserial PRIMARY KEY,
    tag text NOT NULL,
    run_id bigint,
    task_id text,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at timestamptz
);
CREATE INDEX IF NOT EXISTS schedules_test_executions_tag ON schedules_test_executions (tag);
"""


def _run_id(request: Any) -> int | None:
    headers = getattr(request, "headers", None) or {}
    value = headers.get(SCHEDULE_RUN_HEADER) or getattr(request, SCHEDULE_RUN_HEADER, None)
    return None if value is None else int(value)


@app.task(tier=TIER, bind=True, name="tests.schedules.record")
def record(self: Any, tag: str, seconds: float = 0.0) -> str:
    """Record this execution (its run id), taking `seconds`."""
    with stores_for(app).engine().begin() as connection:
        row = connection.execute(
            text("INSERT INTO schedules_test_executions (tag, run_id, task_id) "
                 "VALUES (:tag, :run_id, :task_id) RETURNING id"),
            {"tag": tag, "run_id": _run_id(self.request), "task_id": self.request.id}).one()
    if seconds:
        time.sleep(seconds)
    with stores_for(app).engine().begin() as connection:
        connection.execute(text("UPDATE schedules_test_executions SET ended_at = "
                                "clock_timestamp() WHERE id = :id"), {"id": row.id})
    return tag


@app.task(tier=TIER, bind=True, name="tests.schedules.record_once")
@idempotent()
def record_once(self: Any, tag: str) -> str:
    """`record`, idempotent on its outbox row (`outbox:<row id>`, the default key of a
    relayed job): a row published twice (a beat killed between publishing it and marking
    it published, then the relay) runs once."""
    with stores_for(app).engine().begin() as connection:
        connection.execute(
            text("INSERT INTO schedules_test_executions (tag, run_id, task_id, ended_at) "
                 "VALUES (:tag, :run_id, :task_id, clock_timestamp())"),
            {"tag": tag, "run_id": _run_id(self.request), "task_id": self.request.id})
    return tag


@app.task(tier=TIER, name="tests.schedules.fail")
def fail(tag: str) -> None:
    """Fail (no retry policy): the run is `failed`."""
    raise RuntimeError(f"{tag}: failing on purpose")


@app.task(tier=TIER, name="tests.schedules.dead")
@retry_policy(max_attempts=1, budget=None)
def dead(tag: str) -> None:
    """Fail under a retry policy with no attempt left: dead-lettered."""
    raise ConnectionError(f"{tag}: failing on purpose")
