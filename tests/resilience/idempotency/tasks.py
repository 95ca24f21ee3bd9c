"""Idempotency test tasks (loaded by every test worker)."""

from __future__ import annotations

import random
import time
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from jobs import app
from resilience.idempotency import idempotent, unique
from resilience.stores import stores_for

INSERT_ENTRY = text(
    "INSERT INTO idempotency_demo_entries (transfer_key, account, amount_cents, task_id) "
    "VALUES (:key, :account, :amount, :task_id)"
)


def runs_key(key: str) -> str:
    return f"test:idempotency:runs:{key}"


@app.task(tier="critical", bind=True)
@idempotent(key="{transfer_key}", transactional=True, lease_seconds=3, poll_seconds=0.5)
def idem_transfer(
    self: Any,
    transfer_key: str,
    source: str,
    target: str,
    amount_cents: int,
    pause_seconds: float = 0.0,
    fail: bool = False,
    session: Session | None = None,
) -> dict[str, Any]:
    """Move money between two accounts: a debit row and a credit row, in one transaction."""
    assert session is not None
    session.execute(
        INSERT_ENTRY,
        {
            "key": transfer_key,
            "account": source,
            "amount": -amount_cents,
            "task_id": self.request.id,
        },
    )
    if pause_seconds:
        # A window between the two writes, where a SIGKILL hurts most.
        time.sleep(random.uniform(0, pause_seconds))
    session.execute(
        INSERT_ENTRY,
        {
            "key": transfer_key,
            "account": target,
            "amount": amount_cents,
            "task_id": self.request.id,
        },
    )
    if fail:
        raise ValueError("transfer refused after writing")
    return {"transfer_key": transfer_key, "amount_cents": amount_cents}


# cache=True: the tests of the cache read it on any pool process ("auto" turns it on only
# in the process that saw a replay).
@app.task(tier="critical", bind=True)
@idempotent(key="{key}", ttl_seconds=3600, cache=True)
def idem_count(self: Any, key: str, payload: int = 0, pause_seconds: float = 0.0) -> dict[str, Any]:
    """Count executions of the body in Redis; returns the task id that ran it."""
    stores_for(app).redis().incr(runs_key(key))
    if pause_seconds:
        time.sleep(pause_seconds)
    return {"key": key, "payload": payload, "ran_in": self.request.id}


@app.task(tier="critical", bind=True, max_retries=3)
@idempotent(key="{key}")
def idem_flaky(self: Any, key: str, mode: str) -> dict[str, Any]:
    """mode=retry: retries once then succeeds; mode=error: fails with a ValueError."""
    runs = stores_for(app).redis().incr(runs_key(key))
    if mode == "retry" and runs == 1:
        raise self.retry(countdown=0.1)
    if mode == "error":
        raise ValueError(f"refused {key}")
    return {"key": key, "runs": runs}


@app.task(tier="critical")
@idempotent(key="{key}")
def idem_unserializable(key: str) -> Any:
    """Returns a set, which cannot be replayed as JSON."""
    stores_for(app).redis().incr(runs_key(key))
    return {1, 2}


@app.task(tier="critical", bind=True)
@unique(ttl_seconds=60, mode="until_finished", raise_on_duplicate=True, key="{key}")
def unique_raising(self: Any, key: str, pause_seconds: float = 0.0) -> str:
    stores_for(app).redis().incr(runs_key(key))
    time.sleep(pause_seconds)
    return self.request.id


@app.task(tier="critical", bind=True)
@unique(ttl_seconds=60, mode="until_started", key="{key}")
def unique_started(self: Any, key: str, pause_seconds: float = 0.0) -> str:
    stores_for(app).redis().incr(runs_key(key))
    time.sleep(pause_seconds)
    return self.request.id
