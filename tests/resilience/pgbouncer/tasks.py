"""Tasks of the PgBouncer tests: each run writes an effect row through the app's engine
(PgBouncer in these tests), so the tests count runs in PostgreSQL."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import text

from jobs import app
from resilience.idempotency import idempotent
from resilience.locks import singleton
from resilience.stores import stores_for

_EFFECT = text("INSERT INTO pgbouncer_test_effects (run_id, key, task_id) "
               "VALUES (:run_id, :key, :task_id)")


def failing(run_id: str, key: str) -> str:
    """The Redis key that makes `charge(run_id, key)` fail while it exists."""
    return f"tests:pgbouncer:fail:{run_id}:{key}"


def _effect(connection: Any, run_id: str, key: str, task_id: str | None) -> None:
    connection.execute(_EFFECT, {"run_id": run_id, "key": key, "task_id": task_id})


@app.task(tier="critical", bind=True, name="tests.pgbouncer.charge")
@idempotent(key="{run_id}:{key}", cache=False)
def charge(self: Any, run_id: str, key: str) -> dict[str, Any]:
    """One effect row per run; raises a non-retryable error after it while the Redis key
    `failing(run_id, key)` exists (same arguments: the failure is not replayed)."""
    with stores_for(app).engine().begin() as connection:
        _effect(connection, run_id, key, self.request.id)
    if stores_for(app).redis().exists(failing(run_id, key)):
        raise ValueError(f"charge {key} refused")
    return {"key": key, "ran_in": self.request.id}


@app.task(tier="critical", bind=True, name="tests.pgbouncer.transfer")
@idempotent(key="{run_id}:{key}", transactional=True, cache=False)
def transfer(self: Any, run_id: str, key: str, session: Any = None) -> dict[str, Any]:
    """The effect row in the body's transaction, committed with the record's completion."""
    _effect(session, run_id, key, self.request.id)
    return {"key": key, "ran_in": self.request.id}


@app.task(tier="critical", bind=True, name="tests.pgbouncer.exclusive_report")
@singleton(key="{run_id}:{key}", policy="skip")
def exclusive_report(self: Any, run_id: str, key: str, hold_seconds: float = 0.0,
                     checkpoint: Any = None) -> dict[str, Any]:
    """Holds its singleton lock `hold_seconds`, checks it is still held, writes its effect."""
    time.sleep(hold_seconds)
    checkpoint()
    with stores_for(app).engine().begin() as connection:
        _effect(connection, run_id, key, self.request.id)
    return {"key": key, "ran_in": self.request.id}
