"""Tasks of the retry tests (loaded by every test worker)."""

from __future__ import annotations

# Retry delays are at least 0.3 s: Celery stores a task's RETRY state only after publishing
# the retry, so with a near-zero countdown another worker (the suite's shared standard
# worker also consumes this queue) can finish the retry first and the late RETRY write
# would overwrite its final state.
import time
import urllib.request
from typing import Any

from jobs import app
from resilience.classify import NonRetryable, Retryable
from resilience.headers import Headers
from resilience.retry.backoff import wait_decorrelated_jitter, wait_full_jitter
from resilience.retry.budget import RetryBudget
from resilience.retry.guard import retry_policy
from resilience.stores import stores_for


def call_dependency(url: str) -> int:
    """GET `url`; an HTTP error status raises urllib's HTTPError (status and headers on it)."""
    with urllib.request.urlopen(url, timeout=10) as response:
        return int(response.status)


@app.task(tier="standard")
@retry_policy(
    max_attempts=4,
    backoff=wait_full_jitter(base=0.05, cap=0.2),
    dependency="test-storm",
    # A window longer than the test and no floor: the bound is then a pure count property.
    budget=RetryBudget(ratio=0.2, min_per_second=0, window_seconds=600),
)
def failure_storm_budgeted(url: str) -> int:
    return call_dependency(url)


@app.task(tier="standard")
@retry_policy(max_attempts=5, backoff=wait_full_jitter(base=0.3, cap=0.5))
def failure_non_retryable(counter: str, status: int | None = None) -> None:
    stores_for(app).redis().incr(counter)
    if status is not None:
        raise NonRetryable(f"dependency said {status}", status=status)
    raise ValueError("bad input")


@app.task(tier="standard")
@retry_policy(max_attempts=3, backoff=wait_full_jitter(base=0.3, cap=0.5))
def failure_retry_after(counter: str, retry_after_seconds: float) -> str:
    redis = stores_for(app).redis()
    redis.rpush(counter, repr(time.time()))
    if redis.llen(counter) == 1:
        raise Retryable("busy, come back later", retry_after_seconds=retry_after_seconds)
    return "done"


@app.task(tier="standard", bind=True, max_retries=2)
@retry_policy(
    max_attempts=3,
    backoff=wait_full_jitter(base=0.3, cap=0.5),
    dependency="test-self-retry",
    budget=RetryBudget(ratio=0.2, min_per_second=0, window_seconds=600),
)
def failure_self_retry(self: Any, counter: str) -> str:
    attempts = stores_for(app).redis().incr(counter)
    if attempts == 1:
        raise self.retry(countdown=0.05)
    return "done"


@app.task(tier="standard", bind=True)
@retry_policy(max_attempts=3, backoff=wait_decorrelated_jitter(base=0.3, cap=0.5))
def failure_decorrelated(self: Any, counter: str) -> str:
    redis = stores_for(app).redis()
    redis.rpush(counter, repr(Headers(self.request).previous_delay))
    if redis.llen(counter) < 3:
        raise Retryable("again")
    return "done"


@app.task(tier="standard", autoretry_for=(Retryable,), max_retries=1, default_retry_delay=0.3)
@retry_policy(
    max_attempts=3,
    backoff=wait_full_jitter(base=0.3, cap=0.5),
    dependency="test-autoretry",
    budget=RetryBudget(ratio=1.0, min_per_second=0, window_seconds=600),
)
def failure_autoretry(counter: str) -> None:
    stores_for(app).redis().incr(counter)
    raise Retryable("still failing")
