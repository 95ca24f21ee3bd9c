"""Tasks of the batching tests (loaded by every test worker)."""

from __future__ import annotations

from jobs import app
from resilience.circuit import circuit_breaker
from resilience.idempotency import idempotent
from resilience.locks import singleton
from resilience.retry import retry_policy
from resilience.stores import stores_for


@app.task(tier="standard")
@circuit_breaker("batch-dependency", minimum_calls=1000)
@retry_policy(dependency="batch-dependency", max_attempts=3)
@idempotent(key="{key}", cache=True)
@singleton(key="{key}")
def batch_full_stack(key: str, counter: str) -> str:
    """Count one execution; every guard of the full stack around it."""
    stores_for(app).redis().incr(counter)
    return f"done {key}"
