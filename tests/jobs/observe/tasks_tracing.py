"""Test tasks of the tracing test: one job behind a breaker, retried, idempotent.

`traced` runs on its own queue, `tests-tracing`, consumed only by the worker the tracing
test starts in its own process (the session's tier workers never take its messages, so
every span lands in the test's in-memory exporter).
"""

from __future__ import annotations

from typing import Any

from jobs import app
from resilience.circuit.guard import circuit_breaker
from resilience.idempotency import idempotent
from resilience.retry import Retryable, retry_policy, wait_full_jitter
from resilience.stores import stores_for

QUEUE = "tests-tracing"
BREAKER = "tests-tracing-dependency"


@app.task(tier="standard", queue=QUEUE, name="tests.tracing.traced")
@idempotent(key="{key}")
@circuit_breaker(BREAKER, open_seconds=0.5)
@retry_policy(max_attempts=3, backoff=wait_full_jitter(base=0.1, cap=1.0), budget=None)
def traced(key: str) -> dict[str, Any]:
    """Fails its first run with a retryable error (Retry-After 0.3 s), then succeeds."""
    runs = stores_for(app).redis().incr(f"tests:tracing:runs:{key}")
    if runs == 1:
        raise Retryable("vendor unavailable", retry_after_seconds=0.3)
    return {"key": key, "runs": runs}
