"""Task of the /resilience operator-action tests (loaded by every test worker)."""

from __future__ import annotations

from jobs import app
from resilience.stores import stores_for


@app.task(tier="critical", name="tests.observe.counted", cancel_key="{run_id}-{n}")
def counted(run_id: str, n: int) -> int:
    """Count each run of (run, n) in Redis: the tests assert how often a body ran."""
    stores_for(app).redis().incr(f"tests:observe:counted:{run_id}:{n}")
    return n
