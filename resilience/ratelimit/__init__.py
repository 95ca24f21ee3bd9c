"""Cluster-wide concurrency limits (lease semaphore) and rate limits (GCRA, sliding window).

    @app.task(tier="standard")
    @limit_concurrency("payments-api", 10)
    @rate_limit("vendor:{customer_id}", "100/minute")
    def charge(customer_id: str, amount: int) -> None: ...

Algorithms (`algorithms.py`) are pure functions; `backends/redis.py` runs each decision as
one Lua script on Redis server time; `backends/memory.py` serves one process and tests.
"""

from resilience.ratelimit.algorithms import Decision
from resilience.ratelimit.backends.memory import MemoryBackend
from resilience.ratelimit.backends.redis import RedisBackend
from resilience.ratelimit.guards import (
    ConcurrencyGuard,
    ConcurrencyLimit,
    ConcurrencyLimitConfig,
    RateLimit,
    RateLimitConfig,
    RateLimitGuard,
    limit_concurrency,
    rate_limit,
)
from resilience.ratelimit.rates import Rate, parse

# ConcurrencyLimit, RateLimit: deprecated aliases, removed in the next release.
__all__ = [
    "ConcurrencyGuard",
    "ConcurrencyLimit",
    "ConcurrencyLimitConfig",
    "Decision",
    "MemoryBackend",
    "Rate",
    "RateLimit",
    "RateLimitConfig",
    "RateLimitGuard",
    "RedisBackend",
    "limit_concurrency",
    "parse",
    "rate_limit",
]
