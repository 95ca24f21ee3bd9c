"""Classified retries: which errors may be retried, how long to wait, and a fleet-wide budget.

    @app.task(tier="standard")
    @retry_policy(max_attempts=4, dependency="payments-api", budget=RetryBudget(ratio=0.2))
    def charge(order_id: str) -> None: ...
"""

from resilience.retry.budget import RetryBudget
from resilience.retry.classify import NonRetryable, Retryable, is_retryable, retry_after
from resilience.retry.guard import RetryConfig, RetryGuard, RetryPolicy, retry_policy

# RetryPolicy: deprecated alias of RetryConfig, removed in the next release.
__all__ = [
    "NonRetryable",
    "RetryBudget",
    "RetryConfig",
    "RetryGuard",
    "RetryPolicy",
    "Retryable",
    "is_retryable",
    "retry_after",
    "retry_policy",
]
