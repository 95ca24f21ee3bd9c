"""Tasks of the pause tests: each run counts itself in Redis."""

from __future__ import annotations

from jobs import app
from resilience.stores import stores_for


@app.task(tier="critical", name="tests.pause.counted")
def counted(run_id: str, n: int) -> int:
    stores_for(app).redis().incr(f"tests:pause:{run_id}")
    return n


@app.task(tier="optional", name="tests.pause.inline")
def inline(n: int) -> int:
    return n


@app.task(tier="critical", name="tests.pause.per_job")
def per_job(run_id: str, n: int) -> int:
    """Count each run of job `n` in its own field, so a missing or doubled job shows."""
    stores_for(app).redis().hincrby(f"tests:pause:{run_id}:runs", str(n), 1)
    return n
