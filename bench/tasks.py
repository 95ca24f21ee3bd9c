"""Tasks the benchmark workers load."""

from __future__ import annotations

from jobs import app
from resilience.stores import stores_for


@app.task(tier="standard", ignore_result=True)
def noop(counter: str) -> None:
    """Count one execution in Redis, the least work a task can visibly do."""
    stores_for(app).redis().incr(counter)
