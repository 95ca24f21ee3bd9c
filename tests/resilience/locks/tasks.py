"""Test tasks of the locks package; every run records its start and end in PostgreSQL."""

from __future__ import annotations

import os
import time
from typing import Any

from sqlalchemy import text

from jobs import app
from resilience.errors import LockNotOwnedError, StaleFencingToken
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
CREATE TABLE IF NOT EXISTS locks_test_beat (
    id bigserial PRIMARY KEY,
    run_id text NOT NULL,
    task_id text,
    slot text,
    ran_at timestamptz NOT NULL DEFAULT clock_timestamp()
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
@singleton(key="{slot}", policy="skip")
def checkpointed(
    self: Any, run_id: str, slot: str, seconds: float = 5.0, checkpoint: Any = None
) -> dict[str, Any]:
    """Run until told to stop, then check the lock before "committing"."""
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


@app.task(tier=TIER, bind=True, name="tests.locks.beat_tick")
def beat_tick(self: Any, run_id: str) -> None:
    """A periodic task: record each execution with the schedule slot beat claimed for it."""
    headers = getattr(self.request, "headers", None) or {}
    slot = getattr(self.request, "resilience_beat_slot", None) or headers.get(
        "resilience_beat_slot")
    with _engine().begin() as connection:
        connection.execute(
            text("INSERT INTO locks_test_beat (run_id, task_id, slot) "
                 "VALUES (:run_id, :task_id, :slot)"),
            {"run_id": run_id, "task_id": self.request.id, "slot": slot},
        )


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
