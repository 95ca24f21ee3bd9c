"""Tasks of the bounded-wait partition tests (issue 25): Redis-guarded jobs that record in
PostgreSQL, so a worker cut from the guard Redis (which also keeps the topology's results)
still reports. `ignore_result`: no state is written to that Redis around the body either,
so what is measured is the guards' own waits.

A guard's DEFERRED reaches Celery as a retry: `task_retry` records it, with its time."""

from __future__ import annotations

import os
import time
from typing import Any

from celery import signals
from sqlalchemy import text

from jobs import app
from resilience.ratelimit import rate_limit
from resilience.stores import stores_for

TIER = "critical"
PREFIX = "tests.partition.bounds."

CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS partition_bound_events (
    id bigserial PRIMARY KEY,
    run_id text NOT NULL,
    node text NOT NULL,
    task_id text,
    event text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS partition_bound_rows (run_id text PRIMARY KEY);
"""


def record(run_id: str, event: str, task_id: str | None) -> None:
    """One event ("run", "deferred") of `run_id`, in PostgreSQL, with the worker's node."""
    with stores_for(app).engine().begin() as connection:
        connection.execute(
            text("INSERT INTO partition_bound_events (run_id, node, task_id, event) "
                 "VALUES (:run_id, :node, :task_id, :event)"),
            {"run_id": run_id, "node": os.environ.get("PARTITION_NODE", "?"),
             "task_id": task_id, "event": event})


@app.task(tier=TIER, bind=True, name=PREFIX + "open", ignore_result=True)
@rate_limit("partition-bounds-open", "1000/second")
def limited_open(self: Any, run_id: str) -> None:
    """A rate-limited job failing open (the default): runs unguarded while Redis is away."""
    record(run_id, "run", self.request.id)


@app.task(tier=TIER, bind=True, name=PREFIX + "closed", ignore_result=True)
@rate_limit("partition-bounds-closed", "1000/second", on_store_down="fail_closed",
            retry_seconds=1)
def limited_closed(self: Any, run_id: str) -> None:
    """A rate-limited job failing closed: DEFERRED (1 s) while Redis is away."""
    record(run_id, "run", self.request.id)


@app.task(tier=TIER, bind=True, name=PREFIX + "hold_row", ignore_result=True)
def hold_row(self: Any, run_id: str, seconds: float) -> None:
    """Insert `run_id`'s row in a transaction kept open `seconds` (recording "holding:<the
    backend's pid>" first): a writer of the same key waits until that transaction ends.
    A commit that fails (the session was ended while cut off) is recorded as "lost"."""
    try:
        with stores_for(app).engine().begin() as connection:
            pid = connection.execute(text("SELECT pg_backend_pid()")).scalar()
            connection.execute(text("INSERT INTO partition_bound_rows (run_id) VALUES (:run_id)"),
                               {"run_id": run_id})
            record(run_id, f"holding:{pid}", self.request.id)
            time.sleep(seconds)
    except Exception as exc:  # noqa: BLE001 - the expected end of a cut-off transaction
        record(run_id, f"lost:{type(exc).__name__}", self.request.id)


@signals.task_retry.connect(weak=False)
def _deferred(sender: Any = None, request: Any = None, **_: Any) -> None:
    name = getattr(sender, "name", "") or ""
    if name.startswith(PREFIX) and request is not None:
        kwargs = getattr(request, "kwargs", None) or {}
        record(str(kwargs.get("run_id", "?")), "deferred", getattr(request, "id", None))
