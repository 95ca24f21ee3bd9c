"""Bench tasks of the guards scenario: one no-op three ways.

- `guards_bench_celery`: a plain Celery task (Celery's own `Task`, none of our guards);
- `guards_bench_platform`: a platform task with only the platform defaults (poison check,
  deadline, tier bulkhead at enqueue);
- `guards_bench_guarded`: the same, wrapped in breaker + retry budget + idempotency +
  singleton, each keyed per message so every call takes the happy path.
"""

from __future__ import annotations

import time

from celery import Celery

from jobs import app
from resilience.circuit import circuit_breaker
from resilience.idempotency import idempotent
from resilience.locks import singleton
from resilience.retry import retry_policy
from resilience.stores import stores_for


def _work(counter: str, work_ms: float) -> None:
    """The job's work, waiting `work_ms` on a remote dependency (no CPU here); counted in Redis."""
    if work_ms > 0:
        time.sleep(work_ms / 1000)
    stores_for(app).redis().incr(counter)


@Celery.task(app, name="bench.guards.celery", queue="standard", ignore_result=True)
def guards_bench_celery(counter: str, n: int, work_ms: float = 0.0) -> None:
    """Count one execution in Redis (plain Celery: no platform guards at all)."""
    _work(counter, work_ms)


@app.task(tier="standard", name="bench.guards.platform", ignore_result=True)
def guards_bench_platform(counter: str, n: int, work_ms: float = 0.0) -> None:
    """Count one execution in Redis (platform defaults only)."""
    _work(counter, work_ms)


@app.task(tier="standard", name="bench.guards.guarded", ignore_result=True)
@circuit_breaker("bench-dependency", minimum_calls=1000)
@retry_policy(dependency="bench-dependency", max_attempts=3)
@idempotent(key="{counter}:{n}")
@singleton(key="{counter}:{n}")
def guards_bench_guarded(counter: str, n: int, work_ms: float = 0.0) -> None:
    """Count one execution in Redis, behind breaker, budget, idempotency and singleton."""
    _work(counter, work_ms)
