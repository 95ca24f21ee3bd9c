"""Benchmark tasks of failure control: one dependency call, budgeted or plain Celery autoretry."""

from __future__ import annotations

import urllib.error
import urllib.request

from jobs import app
from resilience.retry.backoff import wait_full_jitter
from resilience.retry.budget import RetryBudget
from resilience.retry.guard import retry_policy

STORM_DEPENDENCY = "bench-storm"
#: ratio 0.2 and no floor: at most 1 / (1 - 0.2) = 1.25 calls per job while 100 % fail.
STORM_BUDGET = RetryBudget(ratio=0.2, min_per_second=0, window_seconds=10)


def call_dependency(url: str) -> int:
    """Charge the vendor at `url`; a 5xx raises urllib's HTTPError (retryable: status 503 on
    it)."""
    request = urllib.request.Request(f"{url}/charges", data=b'{"amount_cents": 100}',
                                     headers={"Idempotency-Key": "storm"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(response.status)


@app.task(tier="standard")
@retry_policy(
    max_attempts=4,
    backoff=wait_full_jitter(base=0.1, cap=1.0),
    dependency=STORM_DEPENDENCY,
    budget=STORM_BUDGET,
)
def storm_budgeted(url: str) -> int:
    return call_dependency(url)


@app.task(
    tier="standard",
    autoretry_for=(urllib.error.HTTPError,),
    max_retries=3,
    default_retry_delay=0.1,
    retry_backoff=False,
)
def storm_plain(url: str) -> int:
    return call_dependency(url)
