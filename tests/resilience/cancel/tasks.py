"""Tasks of the cancellation tests (loaded by every test worker)."""

from __future__ import annotations

import time

from sqlalchemy import text

from jobs import app
from resilience.idempotency import idempotent
from resilience.stores import stores_for


@app.task(tier="critical", name="tests.cancel.order", cancel_key="{order}")
def cancel_order(run_id: str, order: str, n: int) -> int:
    """Count one run per (run, order) in Redis."""
    stores_for(app).redis().incr(f"tests:cancel:{run_id}:{order}")
    return n


@app.task(tier="critical", name="tests.cancel.transfer")
@idempotent(key="{run_id}", transactional=True)
def cancel_transfer(run_id: str, session: object = None) -> str:
    """Write one row, say it started, wait for the test's go, return (then commit)."""
    session.execute(  # type: ignore[attr-defined]
        text("INSERT INTO tests_cancel_effects (run_id) VALUES (:run)"), {"run": run_id})
    redis = stores_for(app).redis()
    redis.set(f"tests:cancel:{run_id}:started", 1)
    deadline = time.monotonic() + 30
    while not redis.get(f"tests:cancel:{run_id}:go") and time.monotonic() < deadline:
        time.sleep(0.05)
    return run_id
