"""Tasks of the breaker tests (loaded by every test worker)."""

from __future__ import annotations

from typing import Any

from jobs import app
from resilience.circuit.guard import circuit_breaker
from resilience.retry.guard import retry_policy
from tests.resilience.retry.tasks import call_dependency

BREAKER = "test-breaker-dependency"
MINIMUM_CALLS = 5
HALF_OPEN_PROBES = 2


@app.task(tier="standard")
@circuit_breaker(
    BREAKER,
    window=10,
    minimum_calls=MINIMUM_CALLS,
    failure_rate_threshold=0.5,
    open_seconds=0.5,
    half_open_probes=HALF_OPEN_PROBES,
    probe_timeout_seconds=15,
)
def failure_breaker_call(url: str) -> int:
    return call_dependency(url)


def degraded(url: str) -> dict[str, Any]:
    return {"cached": True, "url": url}


@app.task(tier="standard")
@circuit_breaker("test-breaker-fallback", minimum_calls=1, open_seconds=60, fallback=degraded)
def failure_breaker_fallback(url: str) -> int:
    return call_dependency(url)


@app.task(tier="standard")
@circuit_breaker("test-breaker-gated", open_seconds=30)
@retry_policy(max_attempts=3, dependency="test-gated")
def failure_breaker_gated(url: str) -> int:
    return call_dependency(url)
