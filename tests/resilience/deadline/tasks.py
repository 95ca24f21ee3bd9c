"""Tasks for the deadline tests: each run marks Redis so a test can tell it ran."""

from __future__ import annotations

import json
from typing import Any

from jobs import app
from resilience.headers import Headers
from resilience.stores import stores_for


@app.task(tier="optional", name="tests.deadline.mark")
def deadline_mark(run_id: str) -> str:
    stores_for(app).redis().set(f"tests:deadline:ran:{run_id}", "1", ex=300)
    return "ran"


@app.task(tier="optional", name="tests.deadline.short", deadline_seconds=1)
def deadline_short(run_id: str) -> str:
    stores_for(app).redis().set(f"tests:deadline:ran:{run_id}", "1", ex=300)
    return "ran"


@app.task(tier="optional", name="tests.deadline.retried", bind=True, max_retries=3)
def deadline_retried(self: Any, run_id: str) -> str:
    """Retry once, then record the headers the retried message carried."""
    if self.request.retries == 0:
        raise self.retry(countdown=0.1)
    stores_for(app).redis().set(f"tests:deadline:headers:{run_id}",
                                json.dumps({"deadline": Headers(self.request).deadline}), ex=300)
    return "ran"
