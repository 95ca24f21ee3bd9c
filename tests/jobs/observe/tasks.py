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
from resilience.ratelimit import limit_concurrency, rate_limit
from resilience.retry import RetryBudget, retry_policy


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


@app.task(tier="standard", name="tests.observe.metrics_declared")
@circuit_breaker("observe-metrics-dep")
def metrics_declared(n: int) -> int:
    """Declares the breaker the metrics test forces open (scrapes show declared names)."""
    return n


@app.task(tier="standard", name="tests.observe.page_declared")
@circuit_breaker("observe-payments-api")
def page_declared(n: int) -> int:
    """Declares the breaker the browser test forces open on the /resilience page."""
    return n


@app.task(tier="standard", name="tests.observe.alert_declared")
@circuit_breaker("observe-prom-live")
def alert_declared(n: int) -> int:
    """Declares the breaker the live Prometheus test forces open to fire its alert."""
    return n


@app.task(tier="standard", name="tests.observe.declared")
@circuit_breaker("observe-snapshot-dep")
@retry_policy(max_attempts=2, dependency="observe-budget-dep", budget=RetryBudget())
@limit_concurrency("observe-slots", 3)
def declared(n: int) -> int:
    """Declares a breaker, a retry budget and a concurrency limit: the periodic views read
    only the names the app's tasks declare (no SCAN), so these are the ones they show."""
    return n


@app.task(tier="standard", name="tests.observe.keyed")
@limit_concurrency("observe-keyed", 2, key="{n}")
def keyed(n: int) -> int:
    """A concurrency limit per argument: one semaphore per key, not enumerated by the
    periodic views (no SCAN)."""
    return n
