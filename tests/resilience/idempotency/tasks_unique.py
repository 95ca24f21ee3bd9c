"""Tasks of the `@unique` tests whose duplicates carry an id fixed by their caller (an outbox
row, a canvas member, an explicit `task_id`); loaded by every test worker."""

from __future__ import annotations

import time
from typing import Any

from jobs import app
from resilience.idempotency import unique
from resilience.stores import stores_for
from tests.resilience.idempotency.tasks import runs_key


@app.task(tier="critical", bind=True, name="tests.unique.held")
@unique(ttl_seconds=60, mode="until_finished", key="{key}")
def held(self: Any, key: str, pause_seconds: float = 0.0) -> str:
    """Counts its runs; its key is held until it finished."""
    stores_for(app).redis().incr(runs_key(key))
    time.sleep(pause_seconds)
    return str(self.request.id)


@app.task(tier="critical", bind=True, name="tests.unique.held_raising")
@unique(ttl_seconds=60, mode="until_finished", raise_on_duplicate=True, key="{key}")
def held_raising(self: Any, key: str, pause_seconds: float = 0.0) -> str:
    """`held`, whose duplicates raise `DuplicateJob`."""
    stores_for(app).redis().incr(runs_key(key))
    time.sleep(pause_seconds)
    return str(self.request.id)


@app.task(tier="critical", name="tests.unique.collect")
def collect(results: list[Any]) -> list[Any]:
    """A chord body: its header's results as they came."""
    return results
