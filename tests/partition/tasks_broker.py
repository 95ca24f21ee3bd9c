"""Tasks of the broker-partition tests (test_broker_partition.py): `@idempotent` jobs whose
effect is one ledger row in PostgreSQL, transactional or not.

Each body run is recorded in the guard Redis (a replay runs no body, so it records
nothing); the ledger rows say how many effects committed. This module imports nothing
from tests/partition/tasks.py: the module's workers load it alone (`JOBS_IMPORTS`), so
their short visibility timeout only has to cover these tasks' time limits.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from sqlalchemy import text

from jobs import app
from resilience.idempotency import idempotent
from resilience.stores import stores_for

TIER = "critical"

#: One row per committed effect (no unique constraint: a double effect would show).
CREATE_LEDGER = """
CREATE TABLE IF NOT EXISTS broker_partition_ledger (
    id bigserial PRIMARY KEY,
    run_id text NOT NULL,
    index integer NOT NULL,
    node text NOT NULL,
    task_id text NOT NULL,
    written_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""

_INSERT = text("INSERT INTO broker_partition_ledger (run_id, index, node, task_id) "
               "VALUES (:run_id, :index, :node, :task_id)")


def runs_key(run_id: str) -> str:
    """The Redis list of a test run's body starts (JSON records)."""
    return f"broker-partition:{run_id}:runs"


def _started(run_id: str, index: int, task_id: str | None) -> str:
    """Record that this body runs; the node it runs on (`PARTITION_NODE`)."""
    node = os.environ.get("PARTITION_NODE", "?")
    stores_for(app).redis().rpush(runs_key(run_id), json.dumps(
        {"index": index, "node": node, "task_id": task_id, "at": time.time()}))
    return node


@app.task(tier=TIER, bind=True, name="tests.partition.broker.ledger")
@idempotent(key="broker-ledger:{run_id}:{index}", transactional=True, cache=False,
            lease_seconds=5, poll_seconds=1)
def ledger(self: Any, run_id: str, index: int, seconds: float,
           session: Any = None) -> dict[str, Any]:
    """Transactional: `seconds` of work, then one ledger row in the body's transaction,
    committed with the idempotency record."""
    node = _started(run_id, index, self.request.id)
    time.sleep(seconds)
    session.execute(_INSERT, {"run_id": run_id, "index": index, "node": node,
                              "task_id": self.request.id})
    return {"index": index, "node": node}


# Its own limits, the module workers' (FAST_ENV): every test process loads this module and
# validates the lease against the task's hard limit, whatever the tier's default there.
@app.task(tier=TIER, bind=True, name="tests.partition.broker.effect", soft_time_limit=2,
          time_limit=3)
@idempotent(key="broker-effect:{run_id}:{index}", cache=False, lease_seconds=5,
            poll_seconds=1)
def effect(self: Any, run_id: str, index: int, seconds: float) -> dict[str, Any]:
    """Not transactional: `seconds` of work, then one ledger row committed on its own
    connection; the idempotency record is written after it."""
    node = _started(run_id, index, self.request.id)
    time.sleep(seconds)
    with stores_for(app).engine().begin() as connection:
        connection.execute(_INSERT, {"run_id": run_id, "index": index, "node": node,
                                     "task_id": self.request.id})
    return {"index": index, "node": node}


@app.task(tier=TIER, bind=True, name="tests.partition.broker.hard_limited",
          soft_time_limit=None, time_limit=3)
@idempotent(key="broker-hard:{run_id}:{index}", transactional=True, cache=False,
            lease_seconds=5, poll_seconds=1)
def hard_limited(self: Any, run_id: str, index: int, seconds: float,
                 session: Any = None) -> dict[str, Any]:
    """`ledger` under a 3 s hard time limit and no soft one."""
    node = _started(run_id, index, self.request.id)
    time.sleep(seconds)
    session.execute(_INSERT, {"run_id": run_id, "index": index, "node": node,
                              "task_id": self.request.id})
    return {"index": index, "node": node}
