"""Tasks of the batch tests (loaded by every test worker).

Effects are rows in ledgers without unique constraints, so a double effect shows as two rows.
"""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy import text

from jobs import app
from resilience.batches import CALLBACK_KEY
from resilience.idempotency import idempotent, unique
from resilience.stores import stores_for

CREATE_LEDGERS = [
    text("""
    CREATE TABLE IF NOT EXISTS batch_test_effects (
        id BIGSERIAL PRIMARY KEY, run TEXT NOT NULL, n INTEGER NOT NULL, task_id TEXT)
    """),
    text("""
    CREATE TABLE IF NOT EXISTS batch_test_callbacks (
        id BIGSERIAL PRIMARY KEY, run TEXT NOT NULL, batch_id TEXT NOT NULL,
        kind TEXT NOT NULL, argument JSONB NOT NULL)
    """),
    text("""
    CREATE TABLE IF NOT EXISTS batch_test_callback_runs (
        id BIGSERIAL PRIMARY KEY, run TEXT NOT NULL, batch_id TEXT NOT NULL,
        kind TEXT NOT NULL)
    """),
]

_EFFECT = text("INSERT INTO batch_test_effects (run, n, task_id) VALUES (:run, :n, :task_id)")


class MemberFailed(Exception):
    """The failure a test member raises on purpose."""


@app.task(tier="critical", bind=True, name="tests.batches.member")
@idempotent(transactional=True, poll_seconds=0.2)
def member(self: Any, run: str, n: int, fail: bool = False, pause_seconds: float = 0.0,
           retry_first: bool = False, session: Any = None) -> int:
    """One ledger row, committed with the idempotency record and the member's state."""
    if pause_seconds:
        time.sleep(pause_seconds)
    if retry_first and not self.request.retries:
        raise self.retry(countdown=0.2)  # not final: the retried delivery records
    if fail:
        raise MemberFailed(f"member {n} fails on purpose")
    session.execute(_EFFECT, {"run": run, "n": n, "task_id": self.request.id})
    return n


@app.task(tier="critical", bind=True, name="tests.batches.plain")
def plain(self: Any, run: str, n: int) -> int:
    """One ledger row per execution, no idempotency: a second delivery shows."""
    with stores_for(app).engine().begin() as connection:
        connection.execute(_EFFECT, {"run": run, "n": n, "task_id": self.request.id})
    return n


@app.task(tier="critical", bind=True, name="tests.batches.unique_member")
@unique(ttl_seconds=60, mode="until_finished", key="{key}")
def unique_member(self: Any, run: str, n: int, key: str, pause_seconds: float = 0.0) -> int:
    """One ledger row per execution; a second job of its key is not enqueued meanwhile."""
    time.sleep(pause_seconds)
    with stores_for(app).engine().begin() as connection:
        connection.execute(_EFFECT, {"run": run, "n": n, "task_id": self.request.id})
    return n


@app.task(tier="critical", name="tests.batches.callback")
@idempotent(key=CALLBACK_KEY, transactional=True, poll_seconds=0.2)
def callback(batch: dict[str, Any], run: str, session: Any = None) -> str:
    """Count the body's runs (committed at once), then the effect (with the record)."""
    with stores_for(app).engine().begin() as connection:
        connection.execute(
            text("INSERT INTO batch_test_callback_runs (run, batch_id, kind) "
                 "VALUES (:run, :batch_id, :kind)"),
            {"run": run, "batch_id": batch["batch_id"], "kind": batch["callback"]})
    session.execute(
        text("INSERT INTO batch_test_callbacks (run, batch_id, kind, argument) "
             "VALUES (:run, :batch_id, :kind, CAST(:argument AS JSONB))"),
        {"run": run, "batch_id": batch["batch_id"], "kind": batch["callback"],
         "argument": json.dumps(batch)})
    return batch["callback"]
