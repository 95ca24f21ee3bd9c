"""Tasks of the enqueue-admission tests (loaded by every test worker; none is consumed)."""

from __future__ import annotations

from jobs import app
from resilience.circuit.guard import circuit_breaker

ADMISSION_BREAKER = "test-breaker-admission"
OPEN_SECONDS = 30
MINIMUM_CALLS = 2


@app.task(tier="standard")
@circuit_breaker(ADMISSION_BREAKER, minimum_calls=MINIMUM_CALLS, open_seconds=OPEN_SECONDS,
                 on_open="refuse")
def admission_refuse(n: int) -> int:
    return n


@app.task(tier="standard")
@circuit_breaker(ADMISSION_BREAKER, minimum_calls=MINIMUM_CALLS, open_seconds=OPEN_SECONDS)
def admission_enqueue(n: int) -> int:
    return n
