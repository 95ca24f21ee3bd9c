"""Tasks of the outbox tests (loaded by every test worker).

Every effect is a row in `outbox_test_effects`, a ledger without a unique constraint, so a
job that took effect twice shows as two rows.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from jobs import app
from resilience.admission import bulkhead
from resilience.idempotency import idempotent
from resilience.stores import stores_for

#: The depth limit of `outbox_bounded`'s queue.
BOUNDED_DEPTH = 2

CREATE_LEDGER = text("""
CREATE TABLE IF NOT EXISTS outbox_test_effects (
    id BIGSERIAL PRIMARY KEY,
    run TEXT NOT NULL,
    n INTEGER NOT NULL,
    task_id TEXT,
    ran_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
)
""")
INSERT_EFFECT = text(
    "INSERT INTO outbox_test_effects (run, n, task_id) VALUES (:run, :n, :task_id)"
)


def record(run: str, n: int, task_id: str | None) -> None:
    with stores_for(app).engine().begin() as connection:
        connection.execute(INSERT_EFFECT, {"run": run, "n": n, "task_id": task_id})


@app.task(tier="critical", bind=True, name="tests.outbox.effect")
@idempotent(transactional=True, poll_seconds=0.2)
def outbox_effect(self: Any, run: str, n: int, session: Session | None = None) -> int:
    """One ledger row, committed with the idempotency record (keyed on the outbox row)."""
    assert session is not None
    session.execute(INSERT_EFFECT, {"run": run, "n": n, "task_id": self.request.id})
    return n


@app.task(tier="critical", bind=True, name="tests.outbox.plain")
def outbox_plain(self: Any, run: str, n: int) -> int:
    """One ledger row per execution, no idempotency: every publish shows."""
    record(run, n, self.request.id)
    return n


@app.task(tier="optional", bind=True, name="tests.outbox.bounded")
@bulkhead(max_queue_depth=BOUNDED_DEPTH, policy="abort", retry_after_seconds=0.1)
def outbox_bounded(self: Any, run: str, n: int) -> int:
    """A task whose queue admits at most BOUNDED_DEPTH waiting messages."""
    record(run, n, self.request.id)
    return n
