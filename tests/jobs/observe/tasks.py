"""Test tasks of the observe package (loaded by every test worker through JOBS_IMPORTS).

Importing `jobs.observe.worker` here connects the observe signals (structured logs, lock
hold times, dead-process marking) in every test worker, as the platform's imports do.
"""

from __future__ import annotations

import os
import time
from typing import Any

import jobs.observe.worker  # noqa: F401 - connects the worker-side observe signals
from jobs import app
from resilience.circuit.guard import circuit_breaker
from resilience.idempotency import idempotent
from resilience.locks import singleton
from resilience.ratelimit import rate_limit


@app.task(tier="standard", name="tests.observe.remember")
@idempotent(key="{key}")
def remember(key: str, value: int) -> dict[str, Any]:
    """Idempotent: the second call with the same key is REPLAYED from the stored result."""
    return {"key": key, "value": value}


@app.task(tier="standard", name="tests.observe.hold")
@singleton(key="{slot}", policy="skip")
def hold(slot: str, seconds: float = 0.05) -> dict[str, Any]:
    """Holds the singleton lock of `slot` a moment; says which metrics directory it wrote to."""
    time.sleep(seconds)
    return {"slot": slot, "multiproc_dir": os.environ.get("PROMETHEUS_MULTIPROC_DIR")}


@app.task(tier="critical", name="tests.observe.paced")
@rate_limit("observe-paced", "1/3 seconds")
def paced(n: int) -> int:
    """Rate-limited: calls close together are DEFERRED by the limit."""
    return n


@app.task(tier="optional", name="tests.observe.idle")
def idle(n: int) -> int:
    """A plain optional-tier task (fills the optional queue in the browser test)."""
    return n


@app.task(tier="standard", name="tests.observe.gated")
@circuit_breaker("observe-flower-dep", open_seconds=1.0)
def gated(n: int) -> int:
    """Behind a breaker: while it is open, calls are DEFERRED (state RETRY in Flower)."""
    return n
