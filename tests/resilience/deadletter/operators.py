"""Operator processes of the concurrent bulk requeue test (run in forked children)."""

from __future__ import annotations

from typing import Any


def requeue_at_once(barrier: Any, results: Any, reason: str, batch_size: int) -> None:
    """Wait for the other operator, then requeue every pending row whose reason has
    `reason`; put `(dead-letter id, task id)` pairs on `results`."""
    from jobs import app
    from resilience.deadletter.bulk import Selection, requeue_many
    from resilience.stores import stores_for

    engine = stores_for(app).engine()  # re-created in this process (fork-safe stores)
    barrier.wait(timeout=120)
    report = requeue_many(engine, app, Selection(reason=reason), batch_size=batch_size)
    results.put(report.requeued)
