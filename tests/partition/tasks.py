"""Tasks of the partition tests. Runs are recorded in the guard Redis, writes in PostgreSQL,
so a worker cut from one store still reports through the other; each record names the
worker's node (`PARTITION_NODE`, set by the fixture)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from sqlalchemy import text

from jobs import app
from resilience.errors import StaleFencingToken
from resilience.idempotency import idempotent
from resilience.locks import FencingTokens, exclusive, singleton
from resilience.stores import stores_for

TIER = "critical"

CREATE_TABLES = """
CREATE TABLE IF NOT EXISTS partition_writes (
    id bigserial PRIMARY KEY,
    run_id text NOT NULL,
    node text NOT NULL,
    task_id text,
    token bigint,
    outcome text NOT NULL,
    written_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""


def runs_key(run_id: str) -> str:
    """The Redis list of a test run's starts and ends (JSON records)."""
    return f"partition:{run_id}:runs"


def _record(run_id: str, event: str, task_id: str | None, **fields: Any) -> int:
    """Append a record to `run_id`'s runs; how many there are now."""
    return stores_for(app).redis().rpush(runs_key(run_id), json.dumps({
        "event": event, "node": os.environ.get("PARTITION_NODE", "?"), "task_id": task_id,
        "at": time.time(), **fields}))


@app.task(tier=TIER, bind=True, name="tests.partition.hold")
@singleton(key="partition:{run_id}", policy="skip")
def hold(self: Any, run_id: str, seconds: float) -> dict[str, Any]:
    """Hold `run_id`'s singleton lock for `seconds`, recording start and end in Redis."""
    _record(run_id, "start", self.request.id)
    time.sleep(seconds)
    _record(run_id, "end", self.request.id)
    return {"ran": True}


@app.task(tier=TIER, bind=True, name="tests.partition.fenced_writes")
@exclusive(key="partition:{run_id}", ttl_seconds=3, policy="skip")
def fenced_writes(self: Any, run_id: str, seconds: float, interval_seconds: float = 0.2,
                  fencing_token: int | None = None) -> dict[str, Any]:
    """For `seconds`, write to `run_id`'s resource every `interval_seconds`, each write
    fenced with this holder's token; refused writes are recorded as such."""
    _record(run_id, "start", self.request.id, token=fencing_token)
    engine = stores_for(app).engine()
    node = os.environ.get("PARTITION_NODE", "?")
    deadline = time.monotonic() + seconds
    while True:
        outcome = "written"
        try:
            with engine.begin() as connection:
                FencingTokens.guard_write(connection, f"partition:{run_id}", fencing_token)
                _write(connection, run_id, node, self.request.id, fencing_token, outcome)
        except StaleFencingToken:
            outcome = "refused"
            with engine.begin() as connection:
                _write(connection, run_id, node, self.request.id, fencing_token, outcome)
        if time.monotonic() >= deadline:
            break
        time.sleep(interval_seconds)
    _record(run_id, "end", self.request.id, token=fencing_token)
    return {"token": fencing_token}


def _write(connection: Any, run_id: str, node: str, task_id: str | None, token: int | None,
           outcome: str) -> None:
    connection.execute(
        text("INSERT INTO partition_writes (run_id, node, task_id, token, outcome) "
             "VALUES (:run_id, :node, :task_id, :token, :outcome)"),
        {"run_id": run_id, "node": node, "task_id": task_id, "token": token,
         "outcome": outcome})


@app.task(tier=TIER, bind=True, name="tests.partition.job")
def job(self: Any, run_id: str, index: int, seconds: float) -> int:
    """A plain job: record its start and end (in the guard Redis) around `seconds` of work."""
    _record(run_id, "start", self.request.id, index=index)
    time.sleep(seconds)
    _record(run_id, "end", self.request.id, index=index)
    return index


@app.task(tier=TIER, bind=True, name="tests.partition.ledger")
@idempotent(key="partition-ledger:{run_id}", transactional=True, cache=False, lease_seconds=5,
            store_down_retry_seconds=2, poll_seconds=1)
def ledger(self: Any, run_id: str, seconds: float, session: Any = None) -> dict[str, Any]:
    """A transactional `@idempotent` job: `seconds` of work, then one ledger row written in
    the body's transaction (committed with the claim's completion)."""
    _record(run_id, "start", self.request.id)
    time.sleep(seconds)
    _write(session, run_id, os.environ.get("PARTITION_NODE", "?"), self.request.id, None,
           "written")
    _record(run_id, "end", self.request.id)
    return {"ran_in": self.request.id}


@app.task(tier=TIER, bind=True, name="tests.partition.overrun", time_limit=3,
          soft_time_limit=None)
@idempotent(key="partition-overrun:{run_id}", transactional=True, cache=False, lease_seconds=2)
def overrun(self: Any, run_id: str, seconds: float, session: Any = None) -> dict[str, Any]:
    """`ledger` under a 3 s hard time limit and no soft one: the first run sleeps
    `seconds` (past the limit, it is killed), a later run of the same call does not."""
    if _record(run_id, "start", self.request.id) == 1:
        time.sleep(seconds)
    _write(session, run_id, os.environ.get("PARTITION_NODE", "?"), self.request.id, None,
           "written")
    return {"ran_in": self.request.id}


@app.task(tier=TIER, bind=True, name="tests.partition.soft_overrun", time_limit=6,
          soft_time_limit=1)
@idempotent(key="partition-soft:{run_id}", transactional=True, cache=False)
def soft_overrun(self: Any, run_id: str, seconds: float, session: Any = None) -> dict[str, Any]:
    """`ledger` under a 1 s soft time limit: the first run sleeps `seconds` (past the
    limit, it raises in the body), a later run of the same call does not."""
    if _record(run_id, "start", self.request.id) == 1:
        time.sleep(seconds)
    _write(session, run_id, os.environ.get("PARTITION_NODE", "?"), self.request.id, None,
           "written")
    return {"ran_in": self.request.id}


@app.task(tier=TIER, bind=True, name="tests.partition.hold_checked")
@singleton(key="partition:{run_id}", policy="skip")
def hold_checked(self: Any, run_id: str, seconds: float,
                 checkpoint: Any = None) -> dict[str, Any]:
    """`hold`, calling `checkpoint()` every 0.5 s: a lost lock is recorded ("lost", with
    the error) and stops the body before its end. Only the run's first start holds for
    `seconds` (its deferred retry, and later tries, end after one checkpoint)."""
    first = _record(run_id, "start", self.request.id) == 1
    deadline = time.monotonic() + (seconds if first else 0.5)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        try:
            checkpoint()
        except Exception as exc:
            _record(run_id, "lost", self.request.id, error=type(exc).__name__)
            raise
    _record(run_id, "end", self.request.id)
    return {"ran": True}
