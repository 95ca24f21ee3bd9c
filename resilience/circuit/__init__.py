"""Circuit breakers shared by the fleet in Redis, gating dispatch to a failing dependency.

    @app.task(tier="standard")
    @circuit_breaker("payments-api", failure_rate_threshold=0.5, minimum_calls=20)
    def charge(order_id: str) -> None: ...

The breaker lives in a `BreakerBackend`: `RedisBreakerBackend` (the default, fleet-wide)
or `MemoryBreakerBackend` (one process). See docs/failure.md.
"""

from resilience.circuit.backends import BreakerBackend, BreakerState, Permission, Verdict
from resilience.circuit.backends.memory import MemoryBreakerBackend
from resilience.circuit.backends.redis import RedisBreakerBackend
from resilience.circuit.breaker import CircuitBreaker
from resilience.circuit.config import AdmissionConfig, BreakerConfig, CountWindow, TimeWindow
from resilience.circuit.guard import BreakerGuard, circuit_breaker

__all__ = [
    "AdmissionConfig", "BreakerBackend", "BreakerConfig", "BreakerGuard", "BreakerState",
    "CircuitBreaker", "CountWindow", "MemoryBreakerBackend", "Permission", "RedisBreakerBackend",
    "TimeWindow", "Verdict", "circuit_breaker",
]
