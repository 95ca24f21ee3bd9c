"""Test tasks of the locks package; every run records its start and end in PostgreSQL."""

from __future__ import annotations

import os
import time
from typing import Any

from sqlalchemy import text

from jobs import app
from resilience.errors import LockNotOwnedError, StaleFencingToken
from resilience.idempotency import idempotent
from resilience.locks import FencingTokens, exclusive, singleton
from resilience.stores import stores_for

TIER = "critical"

CREATE_TABLES = """
CREATE TABLE IF NOT EXISTS locks_test_runs (
    id bigserial PRIMARY KEY,
    run_id text NOT NULL,
    slot text NOT NULL,
    task_id text,
    pid integer,
    token bigint,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at timestamptz
);
CREATE TABLE IF NOT EXISTS locks_test_writes (
    id bigserial PRIMARY KEY,
    run_id text NOT NULL,
    slot text NOT NULL,
    task_id text,
    token bigint,
    outcome text NOT NULL,
    written_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""


def _engine() -> Any:
    return stores_for(app).engine()


def _start(run_id: str, slot: str, task_id: str | None, token: int | None = None) -> int:
    with _engine().begin() as connection:
        return int(connection.execute(
            text("INSERT INTO locks_test_runs (run_id, slot, task_id, pid, token) "
                 "VALUES (:run_id, :slot, :task_id, :pid, :token) RETURNING id"),
            {"run_id": run_id, "slot": slot, "task_id": task_id, "pid": os.getpid(),
             "token": token},
        ).scalar_one())


def _end(row_id: int) -> None:
    with _engine().begin() as connection:
        connection.execute(
            text("UPDATE locks_test_runs SET ended_at = clock_timestamp() WHERE id = :id"),
            {"id": row_id},
        )


def _stopped(run_id: str) -> bool:
    return bool(stores_for(app).redis().exists(f"locks-test:stop:{run_id}"))


@app.task(tier=TIER, bind=True, name="tests.locks.singleton_run")
@singleton(key="{slot}", policy="skip")
def singleton_run(self: Any, run_id: str, slot: str, seconds: float = 0.05) -> dict[str, Any]:
    """Hold the singleton lock of `slot` for `seconds` (or until the test says stop)."""
    row = _start(run_id, slot, self.request.id)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not _stopped(run_id):
        time.sleep(0.02)
    _end(row)
    return {"ran": True, "pid": os.getpid()}


@app.task(tier=TIER, bind=True, name="tests.locks.exclusive_run")
@exclusive(key="{slot}", ttl_seconds=10, policy="skip")
def exclusive_run(
    self: Any, run_id: str, slot: str, seconds: float = 0.05, fencing_token: int | None = None
) -> dict[str, Any]:
    """Hold the exclusive lock of `slot` for `seconds`, recording the fencing token."""
    row = _start(run_id, slot, self.request.id, fencing_token)
    time.sleep(seconds)
    _end(row)
    return {"ran": True, "token": fencing_token}


@app.task(tier=TIER, bind=True, name="tests.locks.fenced_write")
@exclusive(key="{slot}", ttl_seconds=2, policy="defer", defer_seconds=0.5,
           same_task_wait_seconds=0)
def fenced_write(
    self: Any, run_id: str, slot: str, pause_seconds: float = 0.0,
    fencing_token: int | None = None,
) -> dict[str, Any]:
    """Acquire, wait `pause_seconds` (the test may SIGSTOP us here), then write fenced."""
    _start(run_id, slot, self.request.id, fencing_token)
    time.sleep(pause_seconds)
    try:
        with _engine().begin() as connection:
            FencingTokens.guard_write(connection, f"resource:{run_id}:{slot}", fencing_token)
            connection.execute(
                text("INSERT INTO locks_test_writes (run_id, slot, task_id, token, outcome) "
                     "VALUES (:run_id, :slot, :task_id, :token, 'written')"),
                {"run_id": run_id, "slot": slot, "task_id": self.request.id,
                 "token": fencing_token},
            )
    except StaleFencingToken:
        with _engine().begin() as connection:
            connection.execute(
                text("INSERT INTO locks_test_writes (run_id, slot, task_id, token, outcome) "
                     "VALUES (:run_id, :slot, :task_id, :token, 'rejected')"),
                {"run_id": run_id, "slot": slot, "task_id": self.request.id,
                 "token": fencing_token},
            )
        return {"written": False, "token": fencing_token}
    return {"written": True, "token": fencing_token}


@app.task(tier=TIER, bind=True, name="tests.locks.checkpointed")
@singleton(key="{slot}", policy="skip", probe_seconds=0)
def checkpointed(
    self: Any, run_id: str, slot: str, seconds: float = 5.0, checkpoint: Any = None
) -> dict[str, Any]:
    """Run until told to stop, then check the lock before "committing". No watcher: the
    checkpoint queries the lock session itself."""
    _start(run_id, slot, self.request.id)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not _stopped(run_id):
        time.sleep(0.02)
    try:
        checkpoint()
    except LockNotOwnedError as exc:
        with _engine().begin() as connection:
            connection.execute(
                text("INSERT INTO locks_test_writes (run_id, slot, task_id, outcome) "
                     "VALUES (:run_id, :slot, :task_id, :outcome)"),
                {"run_id": run_id, "slot": slot, "task_id": self.request.id,
                 "outcome": f"lost: {exc}"},
            )
        return {"committed": False}
    return {"committed": True}


@app.task(tier=TIER, bind=True, name="tests.locks.retrying_singleton", max_retries=3)
@singleton(key="{slot}", policy="skip")
def retrying_singleton(self: Any, run_id: str, slot: str) -> dict[str, Any]:
    """Retry once through Celery's own retry; the retry must not be blocked by our lock."""
    _end(_start(run_id, slot, self.request.id))
    if self.request.retries == 0:
        raise self.retry(countdown=0)
    return {"ran": True, "retries": self.request.retries}


@app.task(tier=TIER, bind=True, name="tests.locks.retrying_exclusive", max_retries=3)
@exclusive(key="{slot}", ttl_seconds=10, policy="skip")
def retrying_exclusive(self: Any, run_id: str, slot: str) -> dict[str, Any]:
    """Retry once through Celery's own retry; the retry must not be blocked by our lock."""
    _end(_start(run_id, slot, self.request.id))
    if self.request.retries == 0:
        raise self.retry(countdown=0)
    return {"ran": True, "retries": self.request.retries}


@app.task(tier=TIER, bind=True, name="tests.locks.deferring_singleton")
@singleton(key="{slot}", policy="defer", defer_seconds=2)
def deferring_singleton(self: Any, run_id: str, slot: str) -> dict[str, Any]:
    """A singleton that defers (instead of skipping) while another run holds its key."""
    _end(_start(run_id, slot, self.request.id))
    return {"ran": True}


#: The probe period of `watched_ledger`'s singleton (the test bounds the loss with it).
WATCHED_PROBE_SECONDS = 0.5


@app.task(tier=TIER, bind=True, name="tests.locks.watched_ledger")
@idempotent(key="{run_id}:{role}", transactional=True, cache=False, lease_seconds=3,
            poll_seconds=0.5, store_down_retry_seconds=0.5)
@singleton(key="{slot}", policy="skip", probe_seconds=WATCHED_PROBE_SECONDS)
def watched_ledger(
    self: Any, run_id: str, slot: str, role: str, seconds: float = 30.0,
    fencing_token: int | None = None, checkpoint: Any = None, session: Any = None,
) -> dict[str, Any]:
    """A transactional singleton body with a fenced write, for a holder that loses its lock.

    First run of `role`: record the start (with the token), call `checkpoint()` every 20 ms
    until it raises (the time goes to Redis `locks-test:lost:<run_id>:<role>`), the test
    says stop, or `seconds` pass; wait for `locks-test:go:<run_id>`; then write to the
    resource fenced with the token (outcome `written` / `rejected`) and insert an `effect`
    row in the body's transaction, which commits with the idempotency record — or not. A
    later run of the same role (the deferral of a refused commit) writes nothing.
    """
    redis = stores_for(app).redis()
    if redis.incr(f"locks-test:runs:{run_id}:{role}") > 1:
        return {"rerun": True, "token": fencing_token}
    _start(run_id, slot, self.request.id, fencing_token)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not _stopped(run_id):
        try:
            checkpoint()
        except LockNotOwnedError:
            redis.set(f"locks-test:lost:{run_id}:{role}", repr(time.time()), ex=600)
            break
        time.sleep(0.02)
    while time.monotonic() < deadline and not redis.exists(f"locks-test:go:{run_id}"):
        time.sleep(0.02)
    outcome = "written"
    try:
        with _engine().begin() as connection:
            FencingTokens.guard_write(connection, f"resource:{run_id}:{slot}", fencing_token)
            _write(connection, run_id, slot, self.request.id, fencing_token, outcome)
    except StaleFencingToken:
        outcome = "rejected"
        with _engine().begin() as connection:
            _write(connection, run_id, slot, self.request.id, fencing_token, outcome)
    _write(session, run_id, slot, self.request.id, fencing_token, "effect")
    return {"written": outcome == "written", "token": fencing_token}


def _write(connection: Any, run_id: str, slot: str, task_id: str | None, token: int | None,
           outcome: str) -> None:
    connection.execute(
        text("INSERT INTO locks_test_writes (run_id, slot, task_id, token, outcome) "
             "VALUES (:run_id, :slot, :task_id, :token, :outcome)"),
        {"run_id": run_id, "slot": slot, "task_id": task_id, "token": token,
         "outcome": outcome})
