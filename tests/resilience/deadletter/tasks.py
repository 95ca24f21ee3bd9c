"""Tasks of the dead-letter tests (loaded by every test worker)."""

from __future__ import annotations

import os
import signal

from jobs import app
from resilience.deadletter.poison import poison_guard
from resilience.stores import stores_for

MAX_DELIVERIES = 2


@app.task(tier="standard")
@poison_guard(max_deliveries=MAX_DELIVERIES)
def failure_poison(counter: str) -> None:
    """Kill the pool process running it, every time: WorkerLostError, requeued at once."""
    stores_for(app).redis().incr(counter)
    os.kill(os.getpid(), signal.SIGKILL)


@app.task(tier="standard")
@poison_guard(max_deliveries=MAX_DELIVERIES)
def failure_echo(value: int) -> int:
    return value
