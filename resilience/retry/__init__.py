"""Classified retries: which errors may be retried, how long to wait, and a fleet-wide budget.

    @app.task(tier="standard")
    @retry_policy(max_attempts=4, dependency="payments-api", budget=RetryBudget(ratio=0.2))
    def charge(order_id: str) -> None: ...
"""

from resilience.classify import NonRetryable, Retryable, is_retryable, retry_after
from resilience.retry.backoff import (
    Wait,
    wait_combine,
    wait_decorrelated_jitter,
    wait_exponential,
    wait_fixed,
    wait_full_jitter,
    wait_random,
)
from resilience.retry.budget import RetryBudget
from resilience.retry.guard import RetryConfig, RetryGuard, retry_policy

__all__ = [
    "NonRetryable", "RetryBudget", "RetryConfig", "RetryGuard", "Retryable", "Wait",
    "is_retryable", "retry_after", "retry_policy", "wait_combine", "wait_decorrelated_jitter",
    "wait_exponential", "wait_fixed", "wait_full_jitter", "wait_random",
]
