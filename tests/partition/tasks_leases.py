"""Tasks of the lease partition tests (test_leases.py, issue 25): a job under a cluster-wide
concurrency limit of 1 whose slot is a lease in the guard Redis. It records its start and
end in PostgreSQL (worker a still reaches it while cut from the guard Redis) and ignores its
result (the guard Redis also keeps results). Limits: soft 9 s, hard 10 s, lease 10 s (a
lease shorter than the hard limit is refused at bind); fail-closed, so a worker that cannot
reach Redis defers instead of running beside the holder. And an `@idempotent` outbox job
(standard tier: worker b runs it) for the relay cut from PostgreSQL."""

from __future__ import annotations

import os
import time
from typing import Any

from celery import signals
from sqlalchemy import text

from jobs import app
from resilience.idempotency import idempotent
from resilience.ratelimit import limit_concurrency
from resilience.stores import stores_for

TIER = "critical"
PREFIX = "tests.partition.leases."
#: The slot's lease, equal to the task's hard time limit (the shortest bind accepts).
LEASE_SECONDS = 10.0

CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS partition_lease_events (
    id bigserial PRIMARY KEY,
    run_id text NOT NULL,
    node text NOT NULL,
    task_id text,
    event text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""


def record(run_id: str, event: str, task_id: str | None) -> None:
    """One event ("start", "end", "deferred") of `run_id`, in PostgreSQL, with the node."""
    with stores_for(app).engine().begin() as connection:
        connection.execute(
            text("INSERT INTO partition_lease_events (run_id, node, task_id, event) "
                 "VALUES (:run_id, :node, :task_id, :event)"),
            {"run_id": run_id, "node": os.environ.get("PARTITION_NODE", "?"),
             "task_id": task_id, "event": event})


@app.task(tier=TIER, bind=True, name=PREFIX + "slot", ignore_result=True,
          soft_time_limit=9, time_limit=LEASE_SECONDS)
@limit_concurrency("partition-leases", 1, lease_seconds=LEASE_SECONDS,
                   on_store_down="fail_closed", retry_seconds=0.5)
def slot(self: Any, run_id: str, seconds: float) -> None:
    """Hold the limit's one slot for `seconds`, recording the start and end."""
    record(run_id, "start", self.request.id)
    try:
        time.sleep(seconds)
    finally:
        record(run_id, "end", self.request.id)


CREATE_EFFECTS = """
CREATE TABLE IF NOT EXISTS partition_outbox_effects (
    id bigserial PRIMARY KEY,
    run_id text NOT NULL,
    n integer NOT NULL,
    task_id text
);
"""


@app.task(tier="standard", bind=True, name=PREFIX + "outbox_effect", soft_time_limit=5,
          time_limit=6)
@idempotent(transactional=True, cache=False)
def outbox_effect(self: Any, run_id: str, n: int, session: Any = None) -> int:
    """One ledger row (no unique constraint: a double effect shows), committed with the
    idempotency record, which the outbox keys on the row: a row published twice runs once."""
    session.execute(text("INSERT INTO partition_outbox_effects (run_id, n, task_id) "
                         "VALUES (:run_id, :n, :task_id)"),
                    {"run_id": run_id, "n": n, "task_id": self.request.id})
    return n


@signals.task_retry.connect(weak=False)
def _deferred(sender: Any = None, request: Any = None, **_: Any) -> None:
    name = getattr(sender, "name", "") or ""
    if name.startswith(PREFIX) and request is not None:
        kwargs = getattr(request, "kwargs", None) or {}
        record(str(kwargs.get("run_id", "?")), "deferred", getattr(request, "id", None))
