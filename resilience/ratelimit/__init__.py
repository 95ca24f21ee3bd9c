"""Cluster-wide concurrency limits (lease semaphore) and rate limits (GCRA, sliding window).

    @app.task(tier="standard")
    @limit_concurrency("payments-api", 10)
    @rate_limit("vendor:{customer_id}", "100/minute")
    def charge(customer_id: str, amount: int) -> None: ...

Algorithms (`algorithms.py`, registry `ALGORITHMS`) are pure functions, each with the Lua
script that runs it on Redis server time; see docs/overload.md.
"""

from resilience.ratelimit.algorithms import (
    ALGORITHMS,
    GCRA,
    LEASE,
    SLIDING_WINDOW,
    Algorithm,
    Decision,
    Lease,
    LimiterState,
    Params,
)
from resilience.ratelimit.backends import LimiterBackend
from resilience.ratelimit.backends.memory import MemoryBackend
from resilience.ratelimit.backends.redis import RedisBackend
from resilience.ratelimit.config import ConcurrencyLimitConfig, RateLimitConfig
from resilience.ratelimit.guards import (
    ConcurrencyGuard,
    RateLimitGuard,
    limit_concurrency,
    rate_limit,
)
from resilience.ratelimit.rates import Rate, parse

__all__ = [
    "ALGORITHMS", "GCRA", "LEASE", "SLIDING_WINDOW", "Algorithm", "ConcurrencyGuard",
    "ConcurrencyLimitConfig", "Decision", "Lease", "LimiterBackend", "LimiterState",
    "MemoryBackend", "Params", "Rate", "RateLimitConfig", "RateLimitGuard", "RedisBackend",
    "limit_concurrency", "parse", "rate_limit",
]
