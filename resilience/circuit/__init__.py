"""Circuit breakers shared by the fleet in Redis, gating dispatch to a failing dependency.

    @app.task(tier="standard")
    @circuit_breaker("payments-api", failure_rate_threshold=0.5, minimum_calls=20)
    def charge(order_id: str) -> None: ...
"""

from resilience.circuit.breaker import CircuitBreaker
from resilience.circuit.config import BreakerConfig, CountWindow, TimeWindow
from resilience.circuit.guard import BreakerGuard, circuit_breaker

__all__ = [
    "BreakerConfig",
    "BreakerGuard",
    "CircuitBreaker",
    "CountWindow",
    "TimeWindow",
    "circuit_breaker",
]
